// Databases benchmark: create-to-active time; query API select-by-primary-key latency and throughput
// against the same query over the wire endpoint (postgres client) and in-process PGlite; Kiln's RSS
// with 1, 10 and 50 databases, idle and each touched once.
// Run: npm run bench:databases
// Targets: create-to-active < 500 ms, query API p50 < 2 ms, query API throughput >= 60% of in-process
// PGlite, 50 touched databases < 1.5 GB RSS.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import postgres from "postgres";
import { pct, startKiln, TOKEN, wrkRps } from "./support";

const N = Number(process.env.QUERIES ?? 3000);

const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-db-"));
  const { url, proc } = await startKiln(dir);
  const api = async (method: string, path: string, body?: unknown, token = TOKEN) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
    return r.json() as Promise<any>;
  };
  const project = await api("POST", "/projects", { name: "bench" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key;

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
}

await main();
