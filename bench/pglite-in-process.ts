// issue 26's in-process baselines: pgbench's workloads run on PGlite in the calling thread, with no
// wire, no thread and no mux (the engine's own limit), for the benches' "Kiln / in process" ratios.
import { PGlite } from "@electric-sql/pglite";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { concatBytes, MessageBuilder } from "../server/backends/databases/wire/protocol";
import { createFromTemplate, type TemplateSpec } from "../server/store/template";

const EMPTY_CLUSTER: TemplateSpec = { kind: "test-empty-cluster", fingerprint: "1", prepare: async () => {}, drop: [] };

/** A fresh PGlite data dir (an empty cluster, copied from the template cache) under a new temporary folder. */
export async function emptyClusterDir(prefix: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  rmSync(dir, { recursive: true });
  await createFromTemplate(EMPTY_CLUSTER, dir);
  return dir;
}

/**
 * The prepared point select of pgbench -S in-process on PGlite, the engine's own limit (one
 * WebAssembly session): through PGlite's query API, and as raw protocol (Bind/Execute/Sync of a
 * named statement, what a prepared-mode client sends), on pgbench's table at scale 1.
 */
export async function inProcessPointSelect(seconds: number): Promise<{ api: number; raw: number }> {
  const db = await PGlite.create();
  await db.exec(`create table pgbench_accounts (aid int primary key, bid int, abalance int, filler char(84));
    insert into pgbench_accounts select g, 1, 0, '' from generate_series(1, 100000) g;`);
  const aid = () => 1 + Math.floor(Math.random() * 100000);
  const rate = async (fn: () => Promise<unknown>) => {
    for (let i = 0; i < 500; i++) await fn();
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      await fn();
      n++;
    }
    return n / ((performance.now() - t0) / 1000);
  };
  const sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
  const api = await rate(() => db.query(sql, [aid()]));
  const m = () => new MessageBuilder();
  await db.execProtocolRaw(concatBytes([m().cstring("s").cstring(sql).int16(0).build(0x50), m().build(0x53)]));
  const tail = concatBytes([m().cstring("").int32(0).build(0x45), m().build(0x53)]);
  const raw = await rate(() => {
    const v = Buffer.from(String(aid()));
    const bind = m().cstring("").cstring("s").int16(0).int16(1).int32(v.length).bytes(v).int16(0).build(0x42);
    return db.execProtocolRaw(concatBytes([bind, tail]), { syncToFs: false });
  });
  await db.close();
  return { api, raw };
}

/**
 * pgbench's TPC-B transaction in-process on PGlite (scale 1), single session: its seven statements
 * (BEGIN, three UPDATEs, the SELECT, the INSERT, END) prepared once and each sent as Bind/Execute/Sync,
 * one call per statement, as pgbench -M prepared sends one round trip per statement. Transactions/s.
 */
export async function inProcessTpcb(seconds: number): Promise<{ tps: number; cpuUsPerTransaction: number }> {
  const db = await PGlite.create();
  await db.exec(`create table pgbench_branches (bid int primary key, bbalance int, filler char(88));
    create table pgbench_tellers (tid int primary key, bid int, tbalance int, filler char(84));
    create table pgbench_accounts (aid int primary key, bid int, abalance int, filler char(84));
    create table pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22));
    insert into pgbench_branches values (1, 0, '');
    insert into pgbench_tellers select g, 1, 0, '' from generate_series(1, 10) g;
    insert into pgbench_accounts select g, 1, 0, '' from generate_series(1, 100000) g;`);
  const m = () => new MessageBuilder();
  const statements = [
    "BEGIN",
    "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2",
    "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
    "UPDATE pgbench_tellers SET tbalance = tbalance + $1 WHERE tid = $2",
    "UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2",
    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
    "END",
  ];
  await db.execProtocolRaw(concatBytes([...statements.map((sql, i) => m().cstring(`t${i}`).cstring(sql).int16(0).build(0x50)), m().build(0x53)]));
  const tail = concatBytes([m().cstring("").int32(0).build(0x45), m().build(0x53)]);
  const call = (i: number, params: number[]) => {
    const b = m().cstring("").cstring(`t${i}`).int16(0).int16(params.length);
    for (const p of params) {
      const v = Buffer.from(String(p));
      b.int32(v.length).bytes(v);
    }
    return db.execProtocolRaw(concatBytes([b.int16(0).build(0x42), tail]), { syncToFs: false });
  };
  const rand = (n: number) => 1 + Math.floor(Math.random() * n);
  const tx = async () => {
    const aid = rand(100000), tid = rand(10), bid = 1, delta = Math.floor(Math.random() * 10001) - 5000;
    await call(0, []);
    await call(1, [delta, aid]);
    await call(2, [aid]);
    await call(3, [delta, tid]);
    await call(4, [delta, bid]);
    await call(5, [tid, bid, aid, delta]);
    await call(6, []);
  };
  for (let i = 0; i < 200; i++) await tx();
  let n = 0;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  while (performance.now() - t0 < seconds * 1000) {
    await tx();
    n++;
  }
  const tps = n / ((performance.now() - t0) / 1000);
  const cpu = process.cpuUsage(cpu0);
  await db.close();
  return { tps, cpuUsPerTransaction: (cpu.user + cpu.system) / Math.max(1, n) };
}
