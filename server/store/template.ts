import { existsSync, mkdirSync, readdirSync, renameSync, rmSync } from "node:fs";
import { cp } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import { createRequire } from "node:module";
import { migrate, migrationsFingerprint } from "./migrations";
import { openPglite, PgliteStore } from "./pglite-store";

/**
 * A fresh PGlite runs initdb for seconds. Instead, Kiln makes one closed, fully migrated data dir
 * per (PGlite version, schema) in a cache folder, once (at `npm ci` through postinstall, or at the
 * first start), and every new store is a copy of it: tens of milliseconds instead of seconds.
 */
const pglitePkg = createRequire(import.meta.url)("@electric-sql/pglite/package.json") as { version: string };

export function cacheRoot(): string {
  return process.env.KILN_CACHE_DIR ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "kiln");
}

export function controlTemplateDir(): string {
  return join(cacheRoot(), "templates", `control-v3-pglite${pglitePkg.version}-${migrationsFingerprint()}`);
}

/** Makes the template if it is missing; safe against concurrent makers (atomic rename). */
export async function ensureControlTemplate(): Promise<string> {
  const dir = controlTemplateDir();
  if (existsSync(join(dir, "PG_VERSION"))) return dir;
  mkdirSync(join(dir, ".."), { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  // 1 MB WAL segments instead of 16 MB keep every copy of the template small.
  const db = await openPglite(tmp, { initDbStartParams: ["--wal-segsize=1"] });
  const store = new PgliteStore(db);
  await migrate(store);
  await slim(store, tmp);
  try {
    renameSync(tmp, dir);
  } catch {
    // Another process finished first; its template is as good as ours.
    rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}

/**
 * Every start with a fresh data dir copies the template, so it is kept small (about a third of a
 * plain initdb): the control store never creates databases, so template0/template1 go, and after a
 * clean shutdown the WAL segments past the current one are only pre-allocated spares, which
 * PostgreSQL recreates when it needs them.
 */
async function slim(store: PgliteStore, dir: string): Promise<void> {
  await store.query(`update pg_database set datistemplate = false where datname in ('template0', 'template1')`);
  await store.query(`drop database template0`);
  await store.query(`drop database template1`);
  await store.query(`checkpoint`);
  const [{ seg }] = (await store.query(`select pg_walfile_name(pg_current_wal_insert_lsn()) as seg`)) as [{ seg: string }];
  await store.close();
  // Keep the current segment and the next (the shutdown checkpoint may spill into it).
  const keepUpTo = (BigInt(`0x${seg}`) + 1n).toString(16).toUpperCase().padStart(24, "0");
  const wal = join(dir, "pg_wal");
  for (const f of readdirSync(wal)) if (/^[0-9A-F]{24}$/.test(f) && f > keepUpTo) rmSync(join(wal, f));
}

/** The system `cp` copies the ~400 files several times faster than node:fs's recursive cp. */
async function copyDir(from: string, to: string): Promise<void> {
  try {
    const proc = Bun.spawn(["cp", "-R", from, to], { stdout: "ignore", stderr: "ignore" });
    if ((await proc.exited) === 0) return;
  } catch {
    // no cp on this system: fall through
  }
  rmSync(to, { recursive: true, force: true });
  await cp(from, to, { recursive: true });
}

/** Fills `target` (which must not exist) with a copy of the template. */
export async function createFromTemplate(target: string): Promise<void> {
  const tpl = await ensureControlTemplate();
  const tmp = `${target}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  await copyDir(tpl, tmp);
  renameSync(tmp, target);
}
