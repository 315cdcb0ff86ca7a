// Project locks benchmark: acquire / renew / release through the whole HTTP path (credential cache,
// quota count, lease rules), for the in-memory table (embedded Kiln) and the PostgreSQL table
// (Kiln with --database-url on a throwaway PostgreSQL started in the same run), and the ratio.
// Run: npm run bench:locks
// Targets: in-memory p50 < 1 ms per operation; PostgreSQL table >= 30% of the in-memory rate.
//
// The in-memory table journals every change in its data dir (server/locks/lease-journal.ts) and
// answers acquires and renewals after an fdatasync (shared by concurrent ones), so its figures
// include the disk's flush: the bench's data dirs are under the system's temporary folder, which
// must be a real disk (not tmpfs) for the figures to mean anything.
//
// - latency: one client, one operation at a time (acquire, renew, release of a fresh key), p50/p99
//   per operation after a warm-up;
// - rate: CLIENTS concurrent clients (default 8) for DURATION seconds (default 3) per table doing the
//   same cycle, in three rounds alternating between the two Kilns (both run for the whole bench), so
//   a change in the machine's other load meets both.
//
// The quota (600 operations per project per minute, every request counted) is respected, not
// disabled: the cycles are spread over PROJECTS projects (default 100), each used for at most 560
// operations, so no request is refused and the quota's own cost (a counter update per request: in
// memory, or in the operation's own statement on PostgreSQL) is part of every figure. The load generator is fetch in this process,
// which shares the 2 cores with Kiln.
import type { ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { startPgServer } from "../test/support/postgres-server";
import { pct, startKiln as startKilnWith, TOKEN } from "./support";

const CLIENTS = Number(process.env.CLIENTS ?? 8);
const SECONDS = Number(process.env.DURATION ?? 3);
const ROUNDS = 3;
const PROJECTS = Number(process.env.PROJECTS ?? 100);
const LATENCY_CYCLES = Number(process.env.CYCLES ?? 1500);
const BUDGET = 560;

type Op = "acquire" | "renew" | "release";
const OPS: Op[] = ["acquire", "renew", "release"];

const startKiln = (dataDir: string, databaseUrl?: string) => startKilnWith(dataDir, databaseUrl ? ["--database-url", databaseUrl, "--postgres-url", databaseUrl] : []);

interface Figures {
  latency: Record<Op, number[]>;
  rate: number;
  rateOps: number;
  refused: number;
}

/** Projects (each with a service key and a budget of operations under its quota), handed out in turn. */
class Projects {
  private next = 0;
  constructor(private readonly keys: { sk: string; left: number }[]) {}
  /** A service key with room for one more cycle, or null when every project's budget is spent. */
  take(): string | null {
    for (let i = 0; i < this.keys.length; i++) {
      const p = this.keys[this.next++ % this.keys.length]!;
      if (p.left >= 3) {
        p.left -= 3;
        return p.sk;
      }
    }
    return null;
  }
}

/** One Kiln under test: its projects, and acquire → renew → release cycles of fresh keys. */
async function target(url: string) {
  const admin = async (path: string, body: unknown) => {
    const r = await fetch(url + path, { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: JSON.stringify(body) });
    if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
    return (await r.json()) as any;
  };
  const keys: { sk: string; left: number }[] = [];
  for (let i = 0; i < PROJECTS; i++) {
    const p = await admin("/projects", { name: `bench-locks-${i}` });
    keys.push({ sk: (await admin(`/projects/${p.id}/service-keys`, { name: "bench" })).key, left: BUDGET });
  }
  const projects = new Projects(keys);
  const figures: Figures = { latency: { acquire: [], renew: [], release: [] }, rate: 0, rateOps: 0, refused: 0 };
  let rateMs = 0;
  let n = 0;

  const call = async (sk: string, op: Op, key: string, lockToken: string): Promise<number> => {
    const method = op === "acquire" ? "POST" : op === "renew" ? "PATCH" : "DELETE";
    const headers: Record<string, string> = { authorization: `Bearer ${sk}`, "X-Service-Lock-Token": lockToken, "X-Service-Request-Id": randomUUID() };
    let body: string | undefined;
    if (op !== "release") {
      headers["content-type"] = "application/json";
      body = '{"ttl_seconds":30}';
    }
    const t = performance.now();
    const res = await fetch(`${url}/locks/${key}/lease`, { method, headers, body });
    await res.arrayBuffer();
    const ms = performance.now() - t;
    if (res.status === 429) figures.refused++;
    else if (res.status >= 300) throw new Error(`${op} ${key}: ${res.status}`);
    return ms;
  };
  /** One acquire, renew, release of a fresh key; false when no project has budget left. */
  const cycle = async (record?: Record<Op, number[]>): Promise<boolean> => {
    const sk = projects.take();
    if (!sk) return false;
    const key = `bench:${++n}`;
    const lockToken = randomUUID();
    for (const op of OPS) {
      const ms = await call(sk, op, key, lockToken);
      record?.[op].push(ms);
    }
    return true;
  };

  return {
    figures,
    /** Warm-up (JIT, connections, the credential cache of every key), then one client at a time. */
    async latency() {
      for (let i = 0; i < Math.max(300, PROJECTS); i++) await cycle();
      for (let i = 0; i < LATENCY_CYCLES; i++) if (!(await cycle(figures.latency))) break;
    },
    /** CLIENTS concurrent clients for `seconds`; adds to the rate figures. */
    async rate(seconds: number) {
      let done = 0;
      const t0 = performance.now();
      const end = t0 + seconds * 1000;
      await Promise.all(
        Array.from({ length: CLIENTS }, async () => {
          while (performance.now() < end) {
            if (!(await cycle())) return;
            done += 3;
          }
        }),
      );
      rateMs += performance.now() - t0;
      figures.rateOps += done;
      figures.rate = figures.rateOps / (rateMs / 1000);
    },
  };
}

async function stop(proc: ChildProcess): Promise<void> {
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
}

async function main() {
  const pg = await startPgServer();
  const memDir = mkdtempSync(join(tmpdir(), "kiln-bench-locks-"));
  const pgDir = mkdtempSync(join(tmpdir(), "kiln-bench-locks-pg-"));
  const procs: ChildProcess[] = [];
  const results: Array<[string, Figures]> = [];
  try {
    const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
    await sql.unsafe("create database kiln_bench_locks");
    await sql.end();
    const u = new URL(pg.url);
    u.pathname = "/kiln_bench_locks";
    const mem = await startKiln(memDir);
    procs.push(mem.proc);
    const prod = await startKiln(pgDir, u.toString());
    procs.push(prod.proc);
    const memory = await target(mem.url);
    const postgresTable = await target(prod.url);
    await memory.latency();
    await postgresTable.latency();
    // The rate in alternating rounds, so a change in what else the machine runs meets both tables.
    for (let round = 0; round < ROUNDS; round++) {
      await memory.rate(SECONDS / ROUNDS);
      await postgresTable.rate(SECONDS / ROUNDS);
    }
    results.push(["in-memory table (embedded profile)", memory.figures], ["PostgreSQL table (production profile)", postgresTable.figures]);
  } finally {
    for (const p of procs) await stop(p);
    await pg.stop();
    rmSync(memDir, { recursive: true, force: true });
    rmSync(pgDir, { recursive: true, force: true });
  }

  const f = (x: number) => x.toFixed(2);
  for (const [name, r] of results) {
    console.log(`${name}:`);
    for (const op of OPS) console.log(`  ${op.padEnd(7)} p50 ${f(pct(r.latency[op], 50))} ms  p99 ${f(pct(r.latency[op], 99))} ms   (one client, ${r.latency[op].length} each)`);
    console.log(`  rate    ${r.rate.toFixed(0)} operations/s (${CLIENTS} clients, ${r.rateOps} operations, acquire/renew/release in equal parts)${r.refused ? `   ${r.refused} refused by the quota!` : ""}`);
  }
  const [memory, postgresTable] = [results[0]![1], results[1]![1]];
  console.log(`PostgreSQL table / in-memory table rate: ${((postgresTable.rate / memory.rate) * 100).toFixed(0)}%   (target >= 30%)`);
  const p50 = Math.max(...OPS.map((op) => pct(memory.latency[op], 50)));
  console.log(`in-memory p50, slowest operation: ${f(p50)} ms   (target < 1 ms)`);
}

await main();
