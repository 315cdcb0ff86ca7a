import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { cacheRoot } from "../../store/template";
import { COMPILED, embeddedFilesUnder, embeddedVersion } from "../../embedded/embedded";
import type { ExtensionFiles } from "./extension-mount";

/**
 * PostgreSQL extensions for the embedded engine: every bundle PGlite ships (its contrib modules in
 * `@electric-sql/pglite`'s dist, pgvector in `@electric-sql/pglite-pgvector`), unpacked once per machine
 * into the cache folder and mounted, read-only, into each database's PGlite at open. PostgreSQL finds
 * them through two settings (PostgreSQL 18's `extension_control_path` and `dynamic_library_path`), so
 * nothing is read until a statement needs it: `pg_available_extensions` reads the small control files,
 * `create extension` the scripts, and the first call of an extension's C function in an open instance
 * reads and compiles its module. A database that uses none pays one mount at open (under a millisecond).
 * Which extensions a database uses is in its own catalog, so it travels with the data into branches,
 * backups and restores, and is there again at every open.
 */

const require = createRequire(import.meta.url);
/** Bumped when the unpacked layout changes. */
const LAYOUT = 1;

function bundles(): { files: string[]; key: string } {
  // The compiled binary: the same bundles, embedded (cmd/build-binary.ts).
  const embedded = embeddedFilesUnder("pglite-ext/");
  if (embedded.length) return { files: embedded.map(([, path]) => path), key: `v${LAYOUT}-pglite${embeddedVersion("@electric-sql/pglite")}-pgvector${embeddedVersion("@electric-sql/pglite-pgvector")}` };
  const pgliteDist = dirname(require.resolve("@electric-sql/pglite"));
  const pgvectorDist = dirname(require.resolve("@electric-sql/pglite-pgvector"));
  const version = (dist: string) => (JSON.parse(readFileSync(join(dist, "..", "package.json"), "utf8")) as { version: string }).version;
  const files = [
    ...readdirSync(pgliteDist)
      .filter((f) => f.endsWith(".tar.gz"))
      .map((f) => join(pgliteDist, f)),
    join(pgvectorDist, "vector.tar.gz"),
  ];
  return { files, key: `v${LAYOUT}-pglite${version(pgliteDist)}-pgvector${version(pgvectorDist)}` };
}

/** Only what PostgreSQL reads: control files, scripts, modules, text-search data (no headers, no docs). */
const WANTED = /^(share\/postgresql\/|lib\/postgresql\/)/;

async function unpack(): Promise<ExtensionFiles> {
  const { files, key } = bundles();
  const dir = join(cacheRoot(), "extensions", key);
  if (!existsSync(join(dir, "share"))) {
    // tar loads only when there is something to unpack (once per machine), not at every start.
    const { x: untar } = await import("tar");
    mkdirSync(dirname(dir), { recursive: true });
    const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
    try {
      mkdirSync(tmp, { recursive: true });
      for (const file of files) {
        if (!COMPILED) {
          await untar({ file, cwd: tmp, filter: (path) => WANTED.test(path) });
          continue;
        }
        // A file inside the binary is read whole (tar's own file reader does not see Bun's /$bunfs).
        const unpack = untar({ cwd: tmp, filter: (path: string) => WANTED.test(path) });
        await new Promise<void>((ok, fail) => {
          unpack.on("error", fail);
          unpack.on("close", () => ok());
          unpack.end(readFileSync(file));
        });
      }
      try {
        renameSync(tmp, dir);
      } catch {
        // Another process unpacked them first: the same files.
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }
  const tsearch = join(dir, "share", "postgresql", "tsearch_data");
  const shareLinks = existsSync(tsearch) ? readdirSync(tsearch).map((f) => `tsearch_data/${f}`) : [];
  return { dir, shareLinks };
}

let unpacked: Promise<ExtensionFiles> | null = null;

/** The unpacked bundles (unpacked at the first call on a machine: ~1.5 MB of archives, once). */
export function extensionFiles(): Promise<ExtensionFiles> {
  unpacked ??= unpack().catch((err) => {
    unpacked = null;
    throw err;
  });
  return unpacked;
}
