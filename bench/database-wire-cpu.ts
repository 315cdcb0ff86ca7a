// Kiln's CPU per statement on the embedded wire endpoint (issue 26's round-trip cost): node-postgres
// clients running prepared point selects, Kiln's process CPU read from /proc around the loop.
//   one client, 3,000 statements one after another (every hand-over pays full price);
//   8 clients at once, 3,000 statements each (batches of idle clients may share one hand-over).
// Prints Kiln's CPU by thread too: the main thread ("bun": listener, mux, accounting, its side of the
// hand-over), the database threads ("Worker": PGlite and its side), the rest (JSC's GC and JIT threads).
// Run: bun bench/database-wire-cpu.ts   (QUERIES=3000 measured and WARMUP=3000 before, per client)
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { startKiln, TOKEN } from "./support";
import { cpuByRole, cpuMs } from "./thread-cpu";

const N = Number(process.env.QUERIES ?? 3000);
/** Statements per client run unmeasured first: JSC compiles the path meanwhile (its JIT threads cost ~100 µs a statement in the first ~10k). */
const WARMUP = Number(process.env.WARMUP ?? 3000);

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-wirecpu-"));
  const { url, proc } = await startKiln(dir);
  const api = async (method: string, path: string, body?: unknown) =>
    (await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined })).json() as Promise<any>;
  const project = await api("POST", "/projects", { name: "bench" });
  let d = await api("POST", `/projects/${project.id}/databases`, { name: "db0" });
  while (d.status !== "active") {
    await new Promise((r) => setTimeout(r, 20));
    d = await api("GET", `/projects/${project.id}/databases/db0`);
  }
  console.log(`load average at start: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  const setup = new pg.Client({ connectionString: d.connection_string });
  await setup.connect();
  await setup.query("create table t (id int primary key, v text); insert into t select g, md5(g::text) from generate_series(1, 1000) g");
  await setup.end();
  const pid = proc.pid!;
  const loop = async (c: pg.Client, n = N) => {
    for (let i = 0; i < n; i++) await c.query({ name: "point", text: "select v from t where id = $1", values: [(i % 1000) + 1] });
  };
  for (const clients of [1, 8]) {
    const cs = await Promise.all(Array.from({ length: clients }, async () => {
      const c = new pg.Client({ connectionString: d.connection_string });
      await c.connect();
      await c.query({ name: "point", text: "select v from t where id = $1", values: [1] });
      return c;
    }));
    await Promise.all(cs.map((c) => loop(c, WARMUP)));
    const cpu0 = cpuMs(pid);
    const threads0 = cpuByRole(pid);
    const t0 = performance.now();
    await Promise.all(cs.map((c) => loop(c)));
    const wall = performance.now() - t0;
    const cpu = cpuMs(pid) - cpu0;
    const threads1 = cpuByRole(pid);
    const n = N * clients;
    const per = (k: keyof typeof threads1) => (((threads1[k] - threads0[k]) * 1000) / n).toFixed(0);
    console.log(`${clients} client(s) x ${N} prepared point selects: Kiln CPU ${((cpu * 1000) / n).toFixed(0)} µs/statement, wall ${((wall * 1000) / n).toFixed(0)} µs/statement (${((n / wall) * 1000).toFixed(0)}/s); by thread: main ${per("main")}, database ${per("database")}, other ${per("other")} µs`);
    await Promise.all(cs.map((c) => c.end()));
  }
  console.log(`load average at end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
}

await main();
