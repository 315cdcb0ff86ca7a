import { cpSync, existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
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
  return join(cacheRoot(), "templates", `control-pglite${pglitePkg.version}-${migrationsFingerprint()}`);
}

/** Makes the template if it is missing; safe against concurrent makers (atomic rename). */
export async function ensureControlTemplate(): Promise<string> {
  const dir = controlTemplateDir();
  if (existsSync(join(dir, "PG_VERSION"))) return dir;
  mkdirSync(join(dir, ".."), { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  const db = await openPglite(tmp);
  const store = new PgliteStore(db);
  await migrate(store);
  await store.close();
  try {
    renameSync(tmp, dir);
  } catch {
    // Another process finished first; its template is as good as ours.
    rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}

/** Fills `target` (which must not exist) with a copy of the template. */
export async function createFromTemplate(target: string): Promise<void> {
  const tpl = await ensureControlTemplate();
  const tmp = `${target}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  cpSync(tpl, tmp, { recursive: true });
  renameSync(tmp, target);
}
