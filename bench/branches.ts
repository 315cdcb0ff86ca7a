// Branches, backups and restores benchmark. For parents of 10 MB, 100 MB and 1 GB (SIZES=10,100,1000)
// under a light write load (one client, a transaction every ~20 ms: update a row, append a row):
// - branch create-to-active (POST 202 -> the branch's updated_at as it turns active), and the parent's transaction latency
//   (p50/p99/max) while the branch is taken against the same load before it;
// - backup (synchronous POST) and the parent's latency meanwhile;
// - restore from that backup (POST 202 -> completed; the load stops first: a restore ends connections),
//   and a point-in-time restore to an instant 1 s before the load stopped (production: with
//   KILN_POSTGRES_PITR=on, from the engine's own base backup of the server and WAL archive).
// Run: npm run bench:branches   (ENGINE=postgres runs the production engine on a throwaway PostgreSQL)
// The loaded parent is checkpointed and the filesystem synced before measuring (see below).
// Targets: branch active in < 1 s at 100 MB; parent p99 during a branch create within 2x of before.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { startPgServer } from "../test/support/postgres-server";
import { pct, startKiln as startKilnWith, TOKEN } from "./support";

const SIZES = (process.env.SIZES ?? "10,100,1000").split(",").map(Number);
const ENGINE = process.env.ENGINE ?? "embedded";

const startKiln = (dataDir: string, args: string[]) => startKilnWith(dataDir, args, ENGINE === "postgres" ? { KILN_POSTGRES_PITR: "on" } : {});

const ms = (x: number) => `${x.toFixed(x < 10 ? 1 : 0)} ms`;

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-branches-"));
  const pg = ENGINE === "postgres" ? await startPgServer() : null;
  const { url, proc } = await startKiln(dir, pg ? ["--postgres-url", pg.url] : []);
  // A bench cut short (a timeout, Ctrl-C) must not leave its Kiln running.
  process.on("exit", () => proc.kill("SIGKILL"));
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => process.exit(130));
  const api = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
    const text = await r.text();
    if (r.status >= 400) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return (text ? JSON.parse(text) : undefined) as any;
  };
  const until = async (path: string, ok: (x: any) => boolean, pollMs = 10) => {
    for (;;) {
      const x = await api("GET", path);
      if (ok(x)) return x;
      if (x.status === "failed" || x.status === "exhausted") throw new Error(`${path}: ${JSON.stringify(x)}`);
      await new Promise((r) => setTimeout(r, pollMs));
    }
  };
  const project = await api("POST", "/projects", { name: "bench-branches" });
  const rows: string[][] = [];
  console.log(`engine: ${ENGINE}`);

  for (const mb of SIZES) {
    const name = `p${mb}`;
    const d = await api("POST", `/projects/${project.id}/databases`, { name });
    const db = await until(`/projects/${project.id}/databases/${d.name}`, (x) => x.status === "active");
    const c = postgres(db.connection_string, { max: 1, onnotice: () => {} });
    // ~1 KB rows of random text (stored as they are: below the TOAST threshold).
    const pad = Array.from({ length: 32 }, () => "md5(random()::text)").join(" || ");
    await c`create table bulk (id int primary key, pad text)`;
    const total = Math.round((mb * 1_048_576) / 1150);
    const t0 = performance.now();
    for (let from = 1; from <= total; from += 50_000) await c.unsafe(`insert into bulk select g, ${pad} from generate_series(${from}, ${Math.min(total, from + 49_999)}) g`);
    await c`create table log (n bigint generated always as identity primary key, at timestamptz default now(), id int)`;
    // The bulk load's dirty pages go to disk first: what follows measures a parent under light load,
    // not the kernel's writeback of the load itself.
    await c`checkpoint`;
    Bun.spawnSync(["sync"]);
    const size = (await api("GET", `/projects/${project.id}/databases/${name}/stats`)).current_storage_bytes as number;
    console.log(`${name}: loaded ${total} rows in ${ms(performance.now() - t0)}; ${(size / 1_048_576).toFixed(0)} MB on disk`);

    // The light write load, recording each transaction's start and latency.
    const samples: { at: number; ms: number }[] = [];
    let stop = false;
    const writer = (async () => {
      while (!stop) {
        const id = 1 + Math.floor(Math.random() * total);
        const s = performance.now();
        await c.begin(async (tx) => {
          await tx`update bulk set pad = md5(random()::text) || pad where id = ${id}`;
          await tx`insert into log (id) values (${id})`;
        });
        samples.push({ at: s, ms: performance.now() - s });
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const window = (a: number, b: number) => samples.filter((x) => x.at + x.ms >= a && x.at <= b).map((x) => x.ms);
    const before0 = performance.now();
    await new Promise((r) => setTimeout(r, 3000));
    const before = window(before0, performance.now());

    const b0 = performance.now();
    await api("POST", `/projects/${project.id}/databases/${name}/branches`, { name: "b" });
    // Polled every 50 ms (a client polling every 10 ms took a tenth of Kiln's main thread, which the
    // parent's clients share), and timed by when Kiln made it active (its updated_at, same machine clock).
    const branch = await until(`/projects/${project.id}/databases/${name}/branches/b`, (x) => x.status === "active", 50);
    const b1 = Date.parse(branch.updated_at) - performance.timeOrigin;
    const during = window(b0, b1);
    // BENCH_DEBUG=1: the slow transactions during the build, on the same clock as KILN_TRACE_SNAPSHOT's lines.
    if (process.env.BENCH_DEBUG)
      for (const x of samples.filter((x) => x.at + x.ms >= b0 && x.at <= b1 && x.ms > 30))
        console.log(`  slow tx: started ${(x.at - b0).toFixed(0)} ms into the build (at ${Math.round(performance.timeOrigin + x.at)}), ${x.ms.toFixed(0)} ms`);
    if (process.env.BENCH_DEBUG) console.log(`  build: ${Math.round(performance.timeOrigin + b0)} -> ${Math.round(performance.timeOrigin + b1)}`);
    // The branch opens and holds the parent's rows.
    const bc = postgres(branch.connection_string, { max: 1, onnotice: () => {} });
    const [{ n }] = await bc`select count(*)::int as n from bulk`;
    await bc.end();
    if (n !== total) throw new Error(`branch has ${n} rows, expected ${total}`);

    const k0 = performance.now();
    const backup = await api("POST", `/projects/${project.id}/databases/${name}/backups`, { name: "bk" });
    const k1 = performance.now();
    const duringBackup = window(k0, k1);
    if (process.env.BENCH_DEBUG)
      for (const x of samples.filter((x) => x.at + x.ms >= k0 && x.at <= k1 && x.ms > 30))
        console.log(`  slow tx during the backup: started ${(x.at - k0).toFixed(0)} ms into it (at ${Math.round(performance.timeOrigin + x.at)}), ${x.ms.toFixed(0)} ms`);
    // Writes go on after the backup: a point-in-time restore replays them up to an instant.
    await new Promise((r) => setTimeout(r, 2000));
    const instant = new Date(Date.now() - 1000).toISOString();
    stop = true;
    await writer;
    await c.end();

    let pitMs: number | null = null;
    {
      // Production: the instant must be in the archive first (it trails now by a second or two).
      await until(`/projects/${project.id}/databases/${name}/backups`, (x) => !!x.restore_window && x.restore_window.latest_restore_at >= instant);
      const p0 = performance.now();
      const pit = await api("POST", `/projects/${project.id}/databases/${name}/restores`, { restore_to: instant });
      await until(`/projects/${project.id}/databases/${name}/restores/${pit.id}`, (x) => x.status === "completed");
      pitMs = performance.now() - p0;
    }

    const r0 = performance.now();
    const restore = await api("POST", `/projects/${project.id}/databases/${name}/restores`, { backup_name: "bk" });
    await until(`/projects/${project.id}/databases/${name}/restores/${restore.id}`, (x) => x.status === "completed");
    const r1 = performance.now();

    const line = (xs: number[]) => (xs.length ? `${ms(pct(xs, 50))} / ${ms(pct(xs, 99))} / ${ms(Math.max(...xs))} (${xs.length} tx)` : "no tx");
    console.log(`  branch create-to-active ${ms(b1 - b0)}`);
    console.log(`  parent tx p50/p99/max before: ${line(before)}`);
    console.log(`  parent tx p50/p99/max during the branch: ${line(during)}`);
    console.log(`  backup ${ms(k1 - k0)} (${(backup.size_bytes / 1_048_576).toFixed(0)} MB); parent tx during it: ${line(duringBackup)}`);
    if (pitMs !== null) console.log(`  point-in-time restore (${ENGINE === "embedded" ? `base ${backup.name} + ~3 s of WAL` : "the server's base backup + its archived WAL"}) ${ms(pitMs)}`);
    console.log(`  restore ${ms(r1 - r0)}`);
    rows.push([`${mb} MB`, ms(b1 - b0), `${ms(pct(before, 99))} -> ${during.length ? ms(pct(during, 99)) : "-"}`, ms(k1 - k0), ms(r1 - r0), pitMs === null ? "-" : ms(pitMs)]);
    await api("DELETE", `/projects/${project.id}/databases/${name}`);
  }

  console.log(`\n| parent | branch active | parent p99 before -> during branch | backup | restore | point-in-time restore |\n|---|---|---|---|---|---|`);
  for (const r of rows) console.log(`| ${r.join(" | ")} |`);
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  await pg?.stop();
  rmSync(dir, { recursive: true, force: true });
}

await main();
