// Databases benchmark: create-to-active time; query API select-by-primary-key latency and throughput
// against the same query over the wire endpoint (postgres client) and in-process PGlite; Kiln's RSS
// with 1, 10 and 50 databases, idle and each touched once.
// pgbench against the embedded wire endpoint and a throwaway PostgreSQL 15 started in the same run
// (TPC-B and select-only, -c 8 -M prepared), against the same prepared point select in-process on
// PGlite; and /healthz plus another database's point select while one database runs a 10 s statement.
// Concurrency (issue 26): a pg.Pool of 20 running pg_sleep(0.05) at once against an embedded database
// (one statement at a time) and the PostgreSQL 15; pgbench's TPC-B transaction run in-process on
// PGlite (its seven statements prepared, one round trip each, as pgbench -M prepared sends them).
// Run: npm run bench:databases   (PGBENCH_SECONDS=5 by default; needs pgbench and PostgreSQL 15's binaries)
//      BENCH_ONLY=wire: only the wire sections (pool, pgbench, in-process), not create/latency/memory.
//      BENCH_ONLY=ceiling: PostgreSQL 15's TPC-B over one session (-c 1) against in-process PGlite, 3 rounds.
// Targets: create-to-active < 500 ms, query API p50 < 2 ms, query API throughput >= 60% of in-process
// PGlite, 50 touched databases < 1.5 GB RSS; TPC-B >= 50% of PostgreSQL 15 and >= 60% of the same
// transactions in-process; select-only >= 60% of in-process prepared selects; p99 < 10 ms for
// /healthz and another database during a long statement.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import postgres from "postgres";
import pg from "pg";
import { loadavg } from "node:os";
import { startPgServer } from "../test/support/postgres-server";
import { inProcessPointSelect, inProcessTpcb } from "./pglite-in-process";
import { pct, startKiln, TOKEN, wrkRps } from "./support";

const N = Number(process.env.QUERIES ?? 3000);

const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

/**
 * The ceiling of any wire endpoint over one session (BENCH_ONLY=ceiling): PostgreSQL 15 with one
 * client (pgbench -c 1 -M prepared TPC-B: real client round trips, one session) against the same
 * transactions in-process on PGlite, alternating in rounds so that both see the same load.
 */
async function ceiling(): Promise<void> {
  const server = await startPgServer();
  try {
    if (Bun.spawnSync(["pgbench", "-i", "-s", "1", "-q", server.url], { stderr: "pipe" }).exitCode !== 0) throw new Error("pgbench -i failed");
    const postmaster = Number(/pid=(\d+)/.exec(Bun.spawnSync(["ss", "-Htlnp", `sport = :${server.port}`]).stdout.toString())?.[1] ?? 0);
    const ratios: number[] = [];
    const cpuRatios: number[] = [];
    for (let round = 1; round <= 3; round++) {
      const load = loadavg()[0]!.toFixed(1);
      const server0 = postmaster ? serverCpuMs(postmaster) : 0;
      const pgOne = pgbench(server.url, ["-c", "1", "-M", "prepared", "-T", "3"]);
      const serverMs = postmaster ? serverCpuMs(postmaster) - server0 : 0;
      const local = await inProcessTpcb(3);
      if (!pgOne) continue;
      ratios.push(pgOne.tps / local.tps);
      // CPU per transaction: a one-client run is a strict ping-pong, so on an idle machine its time per
      // transaction is at least the CPU both sides spend on it (wake-ups add to that).
      const pgUs = ((pgOne.clientCpuMs + serverMs) * 1000) / Math.max(1, pgOne.transactions);
      const localUs = local.cpuUsPerTransaction;
      if (postmaster) cpuRatios.push(localUs / pgUs);
      console.log(
        `  round ${round} (load ${load}): PostgreSQL 15 TPC-B -c 1 -M prepared ${pgOne.tps.toFixed(0)} tps, in-process PGlite ${local.tps.toFixed(0)} tps: ${((pgOne.tps / local.tps) * 100).toFixed(0)}%; ` +
          `CPU per transaction: PostgreSQL 15 + pgbench ${pgUs.toFixed(0)} µs${postmaster ? "" : " (server not found: pgbench only)"}, in-process PGlite ${localUs.toFixed(0)} µs`,
      );
    }
    if (ratios.length) console.log(`  median: PostgreSQL 15 over one session reaches ${(pct(ratios, 50) * 100).toFixed(0)}% of in-process PGlite by tps (the TPC-B target is 60%)`);
    if (cpuRatios.length)
      console.log(`  median by CPU per transaction (the ceiling on an idle machine, where a one-client run costs at least its CPU): ${(pct(cpuRatios, 50) * 100).toFixed(0)}% of in-process PGlite`);
  } finally {
    await server.stop();
  }
}

async function main() {
  if (process.env.BENCH_ONLY === "ceiling") {
    console.log(`load average at start: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
    await ceiling();
    console.log(`load average at end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-db-"));
  const { url, proc } = await startKiln(dir);
  const api = async (method: string, path: string, body?: unknown, token = TOKEN) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
    return r.json() as Promise<any>;
  };
  const project = await api("POST", "/projects", { name: "bench" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key;
  console.log(`load average at start: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  if (process.env.BENCH_ONLY === "wire") {
    const d = await api("POST", `/projects/${project.id}/databases`, { name: "db0" });
    let g = d;
    while (g.status !== "active") {
      await new Promise((r) => setTimeout(r, 20));
      g = await api("GET", `/projects/${project.id}/databases/${d.name}`);
    }
    const lines = await pgbenchSection(url, api, project.id, g.connection_string);
    proc.kill("SIGTERM");
    await new Promise((r) => proc.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
    for (const line of lines) console.log(line);
    console.log(`load average at end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
    return;
  }

  // create -> active
  const createMs: number[] = [];
  let main: any;
  for (let i = 0; i < 10; i++) {
    const t0 = performance.now();
    const d = await api("POST", `/projects/${project.id}/databases`, { name: `db${i}` });
    let g = d;
    while (g.status !== "active") {
      await new Promise((r) => setTimeout(r, 2));
      g = await api("GET", `/projects/${project.id}/databases/${d.name}`);
      if (g.status === "failed") throw new Error("database failed");
    }
    createMs.push(performance.now() - t0);
    if (i === 0) main = g;
  }

  // data
  const wire = postgres(main.connection_string, { max: 1, onnotice: () => {} });
  await wire`create table t (id int primary key, v text)`;
  await wire`insert into t select g, md5(g::text) from generate_series(1, 1000) g`;

  const queryApi = (id: number) =>
    fetch(`${url}/databases/db0/query/select`, {
      method: "POST",
      headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" },
      body: JSON.stringify({ table: "t", filters: [{ column: "id", operator: "eq", value: id }] }),
    }).then((r) => r.json());
  const lat = async (fn: (i: number) => Promise<unknown>) => {
    for (let i = 0; i < 200; i++) await fn((i % 1000) + 1); // warm up
    const xs: number[] = [];
    const t0 = performance.now();
    for (let i = 0; i < N; i++) {
      const s = performance.now();
      await fn((i % 1000) + 1);
      xs.push(performance.now() - s);
    }
    return { p50: pct(xs, 50), p99: pct(xs, 99), rps: N / ((performance.now() - t0) / 1000) };
  };
  /** Requests per second with `workers` callers at once (HTTP latency overlaps; the database does not). */
  const concurrent = async (fn: (i: number) => Promise<unknown>, workers: number) => {
    let next = 0;
    const t0 = performance.now();
    await Promise.all(Array.from({ length: workers }, async () => {
      while (next < N) await fn((next++ % 1000) + 1);
    }));
    return N / ((performance.now() - t0) / 1000);
  };
  const viaApi = await lat(queryApi);
  const apiConcurrent =
    wrkRps(`${url}/databases/db0/query/select`, { "Content-Type": "application/json", Authorization: `Bearer ${sk}` }, '{"table":"t","filters":[{"column":"id","operator":"eq","value":500}]}') ??
    (await concurrent(queryApi, 8));
  const viaWire = await lat((id) => wire`select * from t where id = ${id}`);
  await wire.end();

  // in-process PGlite with the same table
  const local = await PGlite.create();
  await local.exec(`create table t (id int primary key, v text); insert into t select g, md5(g::text) from generate_series(1, 1000) g;`);
  const viaLocal = await lat((id) => local.query(`select * from t where id = $1`, [id]));
  await local.close();


  // memory with 1, 10, 50 databases
  const mem: string[] = [];
  const rssOf = async () => {
    await new Promise((r) => setTimeout(r, 500));
    return rssMb(proc.pid!).toFixed(0);
  };
  for (const target of [1, 10, 50]) {
    const p = await api("POST", "/projects", { name: `mem-${target}` });
    const key = (await api("POST", `/projects/${p.id}/service-keys`, { name: "m" })).key;
    for (let i = 0; i < target; i++) await api("POST", `/projects/${p.id}/databases`, { name: `m${i}` });
    for (;;) {
      const list = await api("GET", `/projects/${p.id}/databases`);
      if (list.data.every((d: any) => d.status === "active")) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const idle = await rssOf();
    for (let i = 0; i < target; i++)
      await fetch(`${url}/databases/m${i}/query/select`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ table: "pg_class", select: ["relname"], limit: 1 }),
      });
    mem.push(`${target} database(s): idle ${idle} MB, each touched once ${await rssOf()} MB`);
    await api("DELETE", `/projects/${p.id}`);
  }

  const bench = await pgbenchSection(url, api, project.id, main.connection_string);

  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  rmSync(dir, { recursive: true, force: true });

  const f = (x: number) => x.toFixed(2);
  console.log(`create -> active (10 databases): median ${pct(createMs, 50).toFixed(0)} ms, max ${Math.max(...createMs).toFixed(0)} ms   (target < 500 ms)`);
  console.log(`select by primary key, ${N} sequential requests:`);
  console.log(`  query API (HTTP):      p50 ${f(viaApi.p50)} ms  p99 ${f(viaApi.p99)} ms  ${viaApi.rps.toFixed(0)} req/s   (target p50 < 2 ms)`);
  console.log(`  wire (postgres client): p50 ${f(viaWire.p50)} ms  p99 ${f(viaWire.p99)} ms  ${viaWire.rps.toFixed(0)} req/s`);
  console.log(`  in-process PGlite:     p50 ${f(viaLocal.p50)} ms  p99 ${f(viaLocal.p99)} ms  ${viaLocal.rps.toFixed(0)} req/s`);
  console.log(`  query API with 8 concurrent callers (${Bun.which("wrk") ? "wrk" : "fetch client"}): ${apiConcurrent.toFixed(0)} req/s`);
  console.log(`  query API / in-process throughput: sequential ${((viaApi.rps / viaLocal.rps) * 100).toFixed(0)}%, 8 concurrent ${((apiConcurrent / viaLocal.rps) * 100).toFixed(0)}%   (target >= 60%)`);
  console.log(`RSS of the Kiln process (target: 50 touched < 1500 MB):`);
  for (const m of mem) console.log(`  ${m}`);
  for (const line of bench) console.log(line);
  console.log(`load average at end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
}

const PGBENCH_SECONDS = Number(process.env.PGBENCH_SECONDS ?? 5);

/** tps of one pgbench run (with its failures), or null when pgbench could not run. */
function pgbench(cs: string, args: string[], sslmode = "disable"): { tps: number; failed: number; transactions: number; clientCpuMs: number } | null {
  // libpq's default (sslmode=prefer) takes TLS wherever it is offered: Kiln's wire listener offers it,
  // the throwaway PostgreSQL 15 does not; so the compared runs are plaintext unless asked.
  const r = Bun.spawnSync(["pgbench", ...args, cs], { stderr: "pipe", stdout: "pipe", env: { ...process.env, PGSSLMODE: sslmode } });
  const transactions = Number(/number of transactions actually processed: (\d+)/.exec(r.stdout.toString())?.[1] ?? 0);
  const clientCpuMs = Number(r.resourceUsage.cpuTime.user + r.resourceUsage.cpuTime.system) / 1000;
  const out = r.stdout.toString() + r.stderr.toString();
  const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(out);
  if (r.exitCode !== 0 || !tps) {
    console.error(`pgbench ${args.join(" ")} failed:\n${out}`);
    return null;
  }
  return { tps: Number(tps[1]), failed: Number(/number of failed transactions: (\d+)/.exec(out)?.[1] ?? 0), transactions, clientCpuMs };
}

/** CPU ms of a PostgreSQL server: the postmaster, its live children and the children it has reaped (a finished backend). */
function serverCpuMs(postmaster: number): number {
  const fields = (pid: number | string) => {
    try {
      return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    } catch {
      return null;
    }
  };
  const own = fields(postmaster);
  if (!own) return 0;
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14]);
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const f = fields(pid);
    if (f && Number(f[1]) === postmaster) ticks += Number(f[11]) + Number(f[12]);
  }
  return ticks * 10; // USER_HZ 100
}

/**
 * 20 clients of a pg.Pool each running `select pg_sleep(0.05)` at once: the wall time of the round
 * (median of 5, connections opened first). An embedded database runs one statement at a time (~1 s);
 * PostgreSQL runs them side by side (~0.05 s).
 */
async function poolOfTwenty(cs: string): Promise<number | null> {
  const pool = new pg.Pool({ connectionString: cs, max: 20 });
  pool.on("error", () => {});
  try {
    const clients = await Promise.all(Array.from({ length: 20 }, () => pool.connect()));
    for (const c of clients) c.release();
    const rounds: number[] = [];
    for (let r = 0; r < 5; r++) {
      const t0 = performance.now();
      await Promise.all(Array.from({ length: 20 }, () => pool.query("select pg_sleep(0.05)")));
      rounds.push(performance.now() - t0);
    }
    return pct(rounds, 50);
  } catch (e) {
    console.error(`pool of 20 failed: ${e}`);
    return null;
  } finally {
    await pool.end().catch(() => {});
  }
}

async function pgbenchSection(url: string, api: (m: string, p: string, b?: unknown, t?: string) => Promise<any>, projectId: string, cs: string): Promise<string[]> {
  if (!Bun.which("pgbench")) return ["pgbench: not installed (apt-get install postgresql-client-15), section skipped"];
  const out: string[] = [`pgbench, ${PGBENCH_SECONDS} s runs, scale 1, plaintext unless said (${Bun.which("pgbench")}):`];
  const T = String(PGBENCH_SECONDS);
  const run = (target: string) => {
    if (Bun.spawnSync(["pgbench", "-i", "-s", "1", "-q", target], { stderr: "pipe" }).exitCode !== 0) return null;
    // Unmeasured warm-up: the JIT compiles the wire path (and PGlite's hot WebAssembly) during the
    // first seconds of traffic; a long-running endpoint's steady state is what is compared.
    pgbench(target, ["-c", "8", "-j", "2", "-M", "prepared", "-T", "3"]);
    return {
      tpcb: pgbench(target, ["-c", "8", "-j", "2", "-M", "prepared", "-T", T]),
      select: pgbench(target, ["-c", "8", "-j", "2", "-S", "-M", "prepared", "-T", T]),
      // One session at a time with real client round trips: what a single-session engine is bound by.
      tpcbOne: pgbench(target, ["-c", "1", "-M", "prepared", "-T", T]),
    };
  };
  const kiln = run(cs);
  // What libpq picks by default against Kiln (TLS, since the listener offers it).
  const kilnTls = {
    tpcb: pgbench(cs, ["-c", "8", "-j", "2", "-M", "prepared", "-T", T], "require"),
    select: pgbench(cs, ["-c", "8", "-j", "2", "-S", "-M", "prepared", "-T", T], "require"),
  };
  const kilnPool = await poolOfTwenty(cs);
  const server = await startPgServer().catch((e) => (console.error(`PostgreSQL 15 could not start: ${e}`), null));
  const real = server ? run(server.url) : null;
  const realPool = server ? await poolOfTwenty(server.url) : null;
  await server?.stop();
  const local = await inProcessPointSelect(PGBENCH_SECONDS);
  const localTpcb = (await inProcessTpcb(PGBENCH_SECONDS)).tps;
  const ms = (x: number | null) => (x === null ? "failed" : `${x.toFixed(0)} ms`);
  out.push(`  pg.Pool of 20, pg_sleep(0.05) each, at once (median of 5 rounds): embedded ${ms(kilnPool)}, PostgreSQL 15 ${ms(realPool)}`);
  const r = (x: { tps: number; failed: number } | null | undefined) => (x ? `${x.tps.toFixed(0)} tps${x.failed ? ` (${x.failed} failed)` : ""}` : "failed");
  const ratio = (a?: { tps: number } | null, b?: number) => (a && b ? `${((a.tps / b) * 100).toFixed(0)}%` : "n/a");
  out.push(`  TPC-B -c 8 -M prepared:      Kiln ${r(kiln?.tpcb)}, PostgreSQL 15 ${r(real?.tpcb)}: ${ratio(kiln?.tpcb, real?.tpcb?.tps)}   (target >= 50%)`);
  out.push(`  TPC-B in-process on PGlite (prepared, one call per statement): ${localTpcb.toFixed(0)} tps; Kiln ${ratio(kiln?.tpcb, localTpcb)} of it   (target >= 60%)`);
  out.push(
    `  TPC-B -c 1 -M prepared (one session, the ceiling of a single-session engine over the wire): Kiln ${r(kiln?.tpcbOne)}, PostgreSQL 15 ${r(real?.tpcbOne)}; ` +
      `PostgreSQL 15 -c 1 is ${ratio(real?.tpcbOne, localTpcb)} of in-process PGlite, Kiln -c 8 is ${ratio(kiln?.tpcb, real?.tpcbOne?.tps)} of PostgreSQL 15 -c 1`,
  );
  out.push(`  select-only -c 8 -M prepared: Kiln ${r(kiln?.select)}, PostgreSQL 15 ${r(real?.select)}`);
  out.push(`  the same over TLS (sslmode=require; libpq's default 'prefer' takes it against Kiln): TPC-B Kiln ${r(kilnTls.tpcb)}, select-only Kiln ${r(kilnTls.select)} (the runs above are plaintext, as PostgreSQL 15's)`);
  out.push(`  in-process PGlite point select: query API ${local.api.toFixed(0)}/s, raw prepared protocol ${local.raw.toFixed(0)}/s`);
  out.push(`  select-only / in-process: ${ratio(kiln?.select, local.api)} of the query API, ${ratio(kiln?.select, local.raw)} of raw prepared protocol   (target >= 60% of raw prepared)`);
  out.push(...(await longStatementSection(url, api, projectId, cs)));
  return out;
}

/** While one database runs a 10 s statement: /healthz and another database's query-API point select. */
async function longStatementSection(url: string, api: (m: string, p: string, b?: unknown, t?: string) => Promise<any>, projectId: string, cs: string): Promise<string[]> {
  const sk = (await api("POST", `/projects/${projectId}/service-keys`, { name: "long" })).key;
  const other = await api("POST", `/projects/${projectId}/databases`, { name: "other" });
  for (let g = other; g.status !== "active"; g = await api("GET", `/projects/${projectId}/databases/other`)) await new Promise((r) => setTimeout(r, 10));
  const wire = postgres(cs, { max: 1, onnotice: () => {} });
  const statement = wire`select count(*) from generate_series(1, 1000000000)`;
  const long = statement.catch(() => null);
  const started = performance.now();
  await new Promise((r) => setTimeout(r, 200));
  const health: number[] = [];
  const select: number[] = [];
  const deadline = started + 10_000;
  while (performance.now() < deadline) {
    let t = performance.now();
    await fetch(`${url}/healthz`);
    health.push(performance.now() - t);
    t = performance.now();
    await fetch(`${url}/databases/other/query/select`, {
      method: "POST",
      headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" },
      body: JSON.stringify({ table: "pg_class", select: ["relname"], limit: 1 }),
    });
    select.push(performance.now() - t);
  }
  const stillRunning = (await Promise.race([long.then(() => false), Promise.resolve(true)])) as boolean;
  statement.cancel(); // a CancelRequest: the database thread restarts, as a cancelled backend would
  await long;
  await wire.end({ timeout: 1 }).catch(() => {});
  return [
    `while one database runs a statement for ${stillRunning ? "over 10 s" : "less than the window (make it longer)"}:`,
    `  /healthz:                         p50 ${pct(health, 50).toFixed(2)} ms  p99 ${pct(health, 99).toFixed(2)} ms  (${health.length} requests; target p99 < 10 ms)`,
    `  another database's point select:  p50 ${pct(select, 50).toFixed(2)} ms  p99 ${pct(select, 99).toFixed(2)} ms  (${select.length} requests; target p99 < 10 ms)`,
  ];
}

await main();
