// What extensions cost a database's open (embedded engine): a fresh database (a template copy) opened on
// its own thread as Kiln opens it, with the extension bundles mounted and without, alternating, median of
// RUNS; then a database that uses pgcrypto, hstore and vector: its open, and the first call of each
// (the module is read and compiled then, once per open instance).
// Run: bun bench/database-extensions.ts   (RUNS=10 by default)
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DATABASE_TEMPLATE } from "../server/backends/databases/embedded";
import { EXTENSION_CONF } from "../server/backends/databases/extension-mount";
import { extensionFiles } from "../server/backends/databases/extensions";
import { PgliteThread } from "../server/backends/databases/pglite-thread";
import { runOverProtocol } from "../server/backends/databases/protocol-query";
import { createFromTemplate } from "../server/store/template";

const RUNS = Number(process.env.RUNS ?? 10);
const CONF = ["shared_buffers=8MB", "work_mem=4MB", "maintenance_work_mem=16MB"];
const root = mkdtempSync(join(tmpdir(), "kiln-bench-ext-"));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ms = (x: number) => `${x.toFixed(1)} ms`;

try {
  let t = performance.now();
  const files = await extensionFiles();
  console.log(`bundles unpacked (or found) at ${files.dir}: ${ms(performance.now() - t)}`);
  // Warm: the first thread of the process compiles PGlite's WebAssembly.
  await createFromTemplate(DATABASE_TEMPLATE, join(root, "warm"));
  await (await PgliteThread.open(join(root, "warm"), CONF)).close();

  const plain: number[] = [];
  const mounted: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    for (const withExt of i % 2 ? [true, false] : [false, true]) {
      const dir = join(root, `db-${i}-${withExt}`);
      await createFromTemplate(DATABASE_TEMPLATE, dir);
      t = performance.now();
      const db = withExt ? await PgliteThread.open(dir, [...CONF, ...EXTENSION_CONF], () => 0, { extensions: files }) : await PgliteThread.open(dir, CONF);
      await runOverProtocol(db, [], "select 1", []);
      (withExt ? mounted : plain).push(performance.now() - t);
      await db.close();
    }
  }
  console.log(`open + first statement, no extension in use: without the mount ${ms(median(plain))}, with it ${ms(median(mounted))} (median of ${RUNS})`);

  const dir = join(root, "uses");
  await createFromTemplate(DATABASE_TEMPLATE, dir);
  const open = () => PgliteThread.open(dir, [...CONF, ...EXTENSION_CONF], () => 0, { extensions: files });
  let db = await open();
  for (const e of ["pgcrypto", "hstore", "vector"]) await runOverProtocol(db, [], `create extension ${e}`, []);
  await db.close();
  const calls: Record<string, string> = { pgcrypto: "select crypt('x', gen_salt('md5'))", hstore: "select 'a=>1'::hstore -> 'a'", vector: "select '[1,2]'::vector <-> '[2,3]'::vector" };
  const first: Record<string, number[]> = { open: [], pgcrypto: [], hstore: [], vector: [] };
  for (let i = 0; i < Math.max(3, Math.floor(RUNS / 2)); i++) {
    t = performance.now();
    db = await open();
    await runOverProtocol(db, [], "select 1", []);
    first.open!.push(performance.now() - t);
    for (const [e, sql] of Object.entries(calls)) {
      t = performance.now();
      await runOverProtocol(db, [], sql, []);
      first[e]!.push(performance.now() - t);
    }
    await db.close();
  }
  console.log(`database using pgcrypto, hstore, vector: open + first statement ${ms(median(first.open!))}; first call after open: ${Object.keys(calls).map((e) => `${e} ${ms(median(first[e]!))}`).join(", ")}`);
} finally {
  rmSync(root, { recursive: true, force: true });
}
