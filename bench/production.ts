// Production-profile sizing: one Kiln on a PostgreSQL 15 started for the run, run by a least-privilege
// role (LOGIN CREATEDB CREATEROLE, as docs/production.md sets it up), with what an operator sizes for:
// - start: time to the listening line, resident memory idle;
// - API writes: variables created by 8 concurrent clients for DURATION s (each a control-store write);
// - query API: selects of 100 rows through the HTTP query API by 8 clients (tenant pool, SET ROLE-free
//   service mode);
// - wire: pgbench select-only, 8 clients, prepared, through Kiln's wire proxy (as the tenant role) and
//   directly to PostgreSQL as the same tenant role, in one run, and the ratio;
// - resident memory after the load, and the server connections Kiln holds (by role).
// Run: npm run bench:production   (DURATION=5 by default). The load generator is fetch in this
// process (sharing the 2 cores with Kiln and PostgreSQL), pgbench a native client.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { tenantRoleName } from "../server/backends/databases/tenant-roles";
import { startPgServer } from "../test/support/postgres-server";
import { BENCH_SECRET_KEY, benchTenantPassword, operatorRole, pct, startKiln, TOKEN } from "./support";

const SECONDS = Number(process.env.DURATION ?? 5);
const CLIENTS = 8;

const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

/** `fn` by CLIENTS concurrent loops for SECONDS: requests per second and latency percentiles. */
async function load(fn: (i: number) => Promise<void>): Promise<{ rps: number; p50: number; p99: number; errors: number }> {
  const lat: number[] = [];
  let errors = 0;
  const end = performance.now() + SECONDS * 1000;
  let n = 0;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (performance.now() < end) {
        const t0 = performance.now();
        try {
          await fn(n++);
          lat.push(performance.now() - t0);
        } catch {
          errors++;
        }
      }
    }),
  );
  return { rps: lat.length / SECONDS, p50: pct(lat, 50), p99: pct(lat, 99), errors };
}

function pgbench(url: URL, script: string[]): number {
  const env = { ...process.env, PGPASSWORD: decodeURIComponent(url.password) };
  const args = ["-h", url.hostname, "-p", url.port, "-U", decodeURIComponent(url.username), ...script, decodeURIComponent(url.pathname.slice(1))];
  const out = spawnSync("pgbench", args, { env, encoding: "utf8" });
  const m = /tps = ([\d.]+)/.exec(out.stdout);
  if (!m) throw new Error(`pgbench failed: ${out.stderr || out.stdout}`);
  return Number(m[1]);
}

const pg = await startPgServer();
const dir = mkdtempSync(join(tmpdir(), "kiln-bench-production-"));
const { admin, kilnArgs } = await operatorRole(pg.url);
const t0 = performance.now();
const { url, proc } = await startKiln(dir, kilnArgs, { KILN_SECRET_KEY: BENCH_SECRET_KEY });
const startMs = performance.now() - t0;
await Bun.sleep(2000);
const idleRss = rssMb(proc.pid!);
try {
  const api = async (method: string, path: string, body?: unknown, token = TOKEN) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
    return r.json() as Promise<any>;
  };
  const project = await api("POST", "/projects", { name: "sizing" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key as string;
  await api("POST", `/projects/${project.id}/databases`, { name: "app" });
  let db: any;
  for (let i = 0; i < 300; i++) {
    db = await api("GET", `/projects/${project.id}/databases/app`);
    if (db.status === "active") break;
    await Bun.sleep(100);
  }
  const c = postgres(db.connection_string, { max: 1, onnotice: () => {} });
  await c.unsafe(`create table items (id int primary key, name text); insert into items select g, 'item ' || g from generate_series(1, 100) g`);
  await c.end();

  const writes = await load((i) => api("POST", `/projects/${project.id}/variables`, { name: `V_${i}_${Math.random().toString(36).slice(2, 8)}`.toUpperCase(), value: "x" }).then(() => {}));
  const queries = await load(() => api("POST", `/databases/app/query/select`, { table: "items", limit: 100 }, sk).then(() => {}));

  // pgbench's select-only tables, made through Kiln, then the same statements by both paths.
  const viaKiln = new URL(db.connection_string);
  const init = spawnSync("pgbench", ["-i", "-s", "1", "-h", viaKiln.hostname, "-p", viaKiln.port, "-U", decodeURIComponent(viaKiln.username), decodeURIComponent(viaKiln.pathname.slice(1))], {
    env: { ...process.env, PGPASSWORD: decodeURIComponent(viaKiln.password) },
    encoding: "utf8",
  });
  if (init.status !== 0) throw new Error(`pgbench -i: ${init.stderr}`);
  const role = tenantRoleName(db.id);
  const direct = new URL(pg.url);
  direct.username = role;
  direct.password = encodeURIComponent(benchTenantPassword(role));
  direct.pathname = `/kiln_${db.id}`;
  const args = ["-S", "-M", "prepared", "-c", String(CLIENTS), "-j", "2", "-T", String(SECONDS)];
  const wire = { kiln: pgbench(viaKiln, args), direct: pgbench(direct, args) };

  const loadedRss = rssMb(proc.pid!);
  const conns = await admin.unsafe(`select usename::text as role, count(*)::int as n from pg_stat_activity where usename is not null and pid <> pg_backend_pid() group by 1 order by 1`);

  console.log(`production profile, ${new Date().toISOString().slice(0, 10)}, ${SECONDS} s per load, ${CLIENTS} clients`);
  console.log(`start to listening: ${startMs.toFixed(0)} ms; RSS idle ${idleRss.toFixed(0)} MB, after the load ${loadedRss.toFixed(0)} MB`);
  console.log(`API writes (create variable): ${writes.rps.toFixed(0)}/s, p50 ${writes.p50.toFixed(1)} ms, p99 ${writes.p99.toFixed(1)} ms, errors ${writes.errors}`);
  console.log(`query API (select 100 rows): ${queries.rps.toFixed(0)}/s, p50 ${queries.p50.toFixed(1)} ms, p99 ${queries.p99.toFixed(1)} ms, errors ${queries.errors}`);
  console.log(`wire select-only (pgbench -S -M prepared -c ${CLIENTS}): through Kiln ${wire.kiln.toFixed(0)} tps, direct ${wire.direct.toFixed(0)} tps (${((100 * wire.kiln) / wire.direct).toFixed(0)}%)`);
  console.log(`server connections after the load: ${conns.map((r) => `${r.role === role ? "tenant role" : r.role} ${r.n}`).join(", ")}`);
} finally {
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  await admin.end();
  await pg.stop();
  rmSync(dir, { recursive: true, force: true });
}
