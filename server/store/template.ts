import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { cp } from "node:fs/promises";
import { createHash } from "node:crypto";
import { homedir } from "node:os";
import { basename, join } from "node:path";
import { createRequire } from "node:module";
import { embeddedFilesUnder, embeddedVersion } from "../embedded/embedded";
import { migrate, migrationsFingerprint, type Migration } from "./migrations";
import { openPglite, PgliteStore, type PgliteExtensions } from "./pglite-store";

/**
 * A fresh PGlite runs initdb for seconds. Instead, Kiln makes one closed, prepared data dir per
 * (kind, PGlite version, content) in a cache folder, once (at `npm ci` through postinstall, or at
 * first use), and every new instance is a copy of it: tens of milliseconds instead of seconds. The
 * compiled binary carries its templates as archives (cmd/build-binary.ts), so even its first start
 * on a new machine unpacks one (~0.1 s) instead of running initdb.
 */
const pglitePkg = { version: embeddedVersion("@electric-sql/pglite") ?? (createRequire(import.meta.url)("@electric-sql/pglite/package.json") as { version: string }).version };

export function cacheRoot(): string {
  return process.env.KILN_CACHE_DIR ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "kiln");
}

export interface TemplateSpec {
  /** Names the template family (`control`, `database`). */
  kind: string;
  /** Changes whenever `prepare` would produce something different. */
  fingerprint: string;
  prepare: (store: PgliteStore) => Promise<void>;
  /** Databases the copies never need (a control store never creates databases; user ones might). */
  drop: string[];
  /** PGlite extensions `prepare` needs loaded (the log store's pg_trgm); copies must load them too. */
  extensions?: PgliteExtensions;
}

const TEMPLATE_FORMAT = 4;

function templateDir(spec: TemplateSpec): string {
  return join(cacheRoot(), "templates", `${spec.kind}-v${TEMPLATE_FORMAT}-pglite${pglitePkg.version}-${spec.fingerprint}`);
}

/** The file name of a template's archive (`control-v4-pglite0.5.16-<fingerprint>.tar.gz`). */
export function templateArchiveName(spec: TemplateSpec): string {
  return `${basename(templateDir(spec))}.tar.gz`;
}

/** Writes the template's archive into `outDir` (made first if missing); returns its path. */
export async function writeTemplateArchive(spec: TemplateSpec, outDir: string): Promise<string> {
  const dir = await ensureTemplate(spec);
  mkdirSync(outDir, { recursive: true });
  const file = join(outDir, templateArchiveName(spec));
  const { c: tar } = await import("tar");
  await tar({ gzip: true, cwd: dir, file, portable: true }, readdirSync(dir));
  return file;
}

/** Unpacks the binary's archive of this template into `tmp`; false when the binary has none (or runs from source). */
async function unpackEmbedded(spec: TemplateSpec, tmp: string): Promise<boolean> {
  const name = `templates/${templateArchiveName(spec)}`;
  const file = embeddedFilesUnder("templates/").find(([n]) => n === name)?.[1];
  if (!file) return false;
  mkdirSync(tmp, { recursive: true });
  const { x: untar } = await import("tar");
  // A file inside the binary is read whole (tar's own file reader does not see Bun's /$bunfs).
  const unpack = untar({ cwd: tmp });
  await new Promise<void>((ok, fail) => {
    unpack.on("error", fail);
    unpack.on("close", () => ok());
    unpack.end(readFileSync(file));
  });
  return true;
}

/** Makes the template if it is missing; safe against concurrent makers (atomic rename). */
export async function ensureTemplate(spec: TemplateSpec): Promise<string> {
  const dir = templateDir(spec);
  if (existsSync(join(dir, "PG_VERSION"))) return dir;
  mkdirSync(join(dir, ".."), { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  if (await unpackEmbedded(spec, tmp)) {
    try {
      renameSync(tmp, dir);
    } catch {
      rmSync(tmp, { recursive: true, force: true });
    }
    return dir;
  }
  // 1 MB WAL segments instead of 16 MB keep every copy of the template small.
  const db = await openPglite(tmp, { initDbStartParams: ["--wal-segsize=1"], ...(spec.extensions ? { extensions: spec.extensions } : {}) });
  const store = new PgliteStore(db);
  await spec.prepare(store);
  await slim(store, tmp, spec.drop);
  try {
    renameSync(tmp, dir);
  } catch {
    // Another process finished first; its template is as good as ours.
    rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}

/**
 * Every copy costs its size in writes, so templates are kept small: unneeded template databases go,
 * and after a clean shutdown the WAL segments past the current one are only pre-allocated spares,
 * which PostgreSQL recreates when it needs them.
 */
async function slim(store: PgliteStore, dir: string, drop: string[]): Promise<void> {
  for (const name of drop) {
    await store.query(`update pg_database set datistemplate = false where datname = $1`, [name]);
    await store.query(`drop database ${name}`);
  }
  await store.query(`checkpoint`);
  const [{ seg }] = (await store.query(`select pg_walfile_name(pg_current_wal_insert_lsn()) as seg`)) as [{ seg: string }];
  await store.close();
  // Keep the current segment and the next (the shutdown checkpoint may spill into it).
  const keepUpTo = (BigInt(`0x${seg}`) + 1n).toString(16).toUpperCase().padStart(24, "0");
  const wal = join(dir, "pg_wal");
  for (const f of readdirSync(wal)) if (/^[0-9A-F]{24}$/.test(f) && f > keepUpTo) rmSync(join(wal, f));
}

/** The system `cp` copies the hundreds of small files several times faster than node:fs's recursive cp. */
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
export async function createFromTemplate(spec: TemplateSpec, target: string): Promise<void> {
  const tpl = await ensureTemplate(spec);
  const tmp = `${target}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  await copyDir(tpl, tmp);
  renameSync(tmp, target);
}

export function fingerprintOf(parts: string[]): string {
  const h = createHash("sha256");
  for (const p of parts) h.update(p).update("\0");
  return h.digest("hex").slice(0, 16);
}

/** The control store's template: migrated to the given schema, with no template databases. */
export function controlTemplate(schema: readonly Migration[]): TemplateSpec {
  return {
    kind: "control",
    fingerprint: migrationsFingerprint(schema),
    prepare: async (store) => {
      await migrate(store, schema);
    },
    drop: ["template0", "template1"],
  };
}
