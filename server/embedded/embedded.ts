import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";

/**
 * Files Kiln reads at run time. Run from source they are in node_modules and beside the code; the
 * compiled binary (`npm run build:binary`, cmd/build-binary.ts) embeds them, and its generated
 * `files.generated.ts` maps each name (`pglite/pglite.wasm`, `bootstraps/node.mjs`, ...) to its
 * path inside the binary (`/$bunfs/root/...`, readable with node:fs and Bun.file, invisible to
 * other processes).
 */

/** True inside the compiled binary: every module of it lives under Bun's `/$bunfs/`. */
export const COMPILED = import.meta.url.includes("/$bunfs/");

interface Generated {
  FILES: Record<string, string>;
  VERSIONS: Record<string, string>;
}
let generated: Generated | null = null;

function load(): Generated | null {
  if (!COMPILED) return null;
  // A require, not an import: the file exists only while the binary is built, and source runs
  // (Bun, vitest) never reach this line.
  generated ??= require("./files.generated") as Generated;
  return generated;
}

/** The embedded file's path inside the binary, or null when running from source. */
export function embeddedFile(name: string): string | null {
  const g = load();
  if (!g) return null;
  const path = g.FILES[name];
  if (!path) throw new Error(`kiln binary: ${name} was not embedded at build time`);
  return path;
}

/** Embedded names under a prefix (`pglite-ext/`), with their paths. */
export function embeddedFilesUnder(prefix: string): [string, string][] {
  const g = load();
  return g ? Object.entries(g.FILES).filter(([n]) => n.startsWith(prefix)) : [];
}

/** The version of a bundled package (`@electric-sql/pglite`), recorded at build time. */
export function embeddedVersion(pkg: string): string | null {
  return load()?.VERSIONS[pkg] ?? null;
}

function cacheRoot(): string {
  return process.env.KILN_CACHE_DIR ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "kiln");
}

const extracted = new Map<string, string>();

/**
 * Files another process must read from disk (a sandboxed runtime's bootstraps, the namespace
 * script): written once to a content-addressed folder of the cache, `<cache>/embedded/<prefix>-<hash>`,
 * so a new binary with different files gets a new folder and a running Kiln's folder never changes.
 * Returns the folder; names under `prefix/` appear in it by their rest (`bootstraps/node.mjs` → `node.mjs`).
 */
export function extractedDir(prefix: string): string {
  const done = extracted.get(prefix);
  if (done) return done;
  const files = embeddedFilesUnder(`${prefix}/`).map(([name, path]) => ({ rel: name.slice(prefix.length + 1), bytes: readFileSync(path) }));
  const h = createHash("sha256");
  for (const f of files) h.update(f.rel).update("\0").update(f.bytes).update("\0");
  const dir = join(cacheRoot(), "embedded", `${prefix}-${h.digest("hex").slice(0, 16)}`);
  if (!existsSync(dir)) {
    const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
    for (const f of files) {
      const to = join(tmp, f.rel);
      mkdirSync(dirname(to), { recursive: true });
      writeFileSync(to, f.bytes);
      chmodSync(to, f.rel.endsWith(".sh") ? 0o755 : 0o644);
    }
    chmodSync(tmp, 0o755);
    try {
      renameSync(tmp, dir);
    } catch {
      // Another Kiln extracted the same files first.
      rmSync(tmp, { recursive: true, force: true });
    }
  }
  extracted.set(prefix, dir);
  return dir;
}

/**
 * A Bun Worker's script: beside the module from source (`sourceUrl`), or, in the binary, the extra
 * entry point of that name (`repoPath`, as cmd/build-binary.ts lists it; Bun stores it as .js).
 */
export function workerScript(sourceUrl: URL, repoPath: string): string {
  return COMPILED ? `/$bunfs/root/${repoPath.replace(/\.ts$/, ".js")}` : sourceUrl.href;
}
