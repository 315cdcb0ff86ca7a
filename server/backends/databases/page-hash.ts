import { COMPILED } from "../../embedded/embedded";
import { closeSync, existsSync, openSync, readdirSync, readSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { backgroundPriority } from "./background-priority";

/**
 * A branch's divergence from its parent: a fingerprint of its pages at the fork (xxHash32 of each
 * 8 KB page of every relation file), compared with the pages later. The hashing runs in a process of
 * its own (`page-hash-main.ts`), so this module imports nothing but node:fs.
 */
/** PostgreSQL's page size (PGlite's build uses the default). */
export const PAGE_BYTES = 8192;

/** A relation's main fork segment under base/: `<relfilenode>` or `<relfilenode>.<n>`. */
const RELATION_FILE = /^\d+(\.\d+)?$/;

interface FileFingerprint {
  size: number;
  mtimeMs: number;
  /** xxHash32 of each page, base64 of a Uint32Array. */
  pages: string;
}
type DirFingerprint = Record<string, FileFingerprint>;

function relationFiles(dir: string): string[] {
  const base = join(dir, "base");
  if (!existsSync(base)) return [];
  const out: string[] = [];
  for (const db of readdirSync(base)) {
    const d = join(base, db);
    if (!statSync(d).isDirectory()) continue;
    for (const f of readdirSync(d)) if (RELATION_FILE.test(f)) out.push(join(d, f));
  }
  return out;
}

/** Pages read and hashed per read: 8 MB. */
const CHUNK_PAGES = 1024;
let readBuffer: Uint8Array | null = null;

/** xxHash32 of each 8 KB page of a file (synchronous: run in the page-hash process, below). */
function pageHashesSync(path: string, size: number): Uint32Array {
  const out = new Uint32Array(Math.ceil(size / PAGE_BYTES));
  // One buffer for every file (most relation files are a page or two: a fresh 8 MB each was most of the time).
  const buf = (readBuffer ??= new Uint8Array(CHUNK_PAGES * PAGE_BYTES));
  const fd = openSync(path, "r");
  try {
    let page = 0;
    for (;;) {
      const bytesRead = readSync(fd, buf, 0, buf.length, page * PAGE_BYTES);
      if (bytesRead <= 0) break;
      for (let at = 0; at < bytesRead && page < out.length; at += PAGE_BYTES) out[page++] = Bun.hash.xxHash32(buf.subarray(at, Math.min(at + PAGE_BYTES, bytesRead)));
      if (bytesRead < buf.length) break;
    }
    return out.subarray(0, page);
  } finally {
    closeSync(fd);
  }
}

/** Page hashes of every relation file of a data dir whose files are current (closed, or checkpointed). */
export function fingerprintDirSync(dir: string): string {
  const fp: DirFingerprint = {};
  for (const path of relationFiles(dir)) {
    const s = statSync(path);
    const hashes = pageHashesSync(path, s.size);
    fp[relative(dir, path)] = { size: s.size, mtimeMs: s.mtimeMs, pages: Buffer.from(hashes.buffer, hashes.byteOffset, hashes.byteLength).toString("base64") };
  }
  return JSON.stringify(fp);
}

/**
 * Bytes of relation pages in `dir` that differ from the fingerprint (changed pages, and pages of
 * files that grew or are new). Files untouched since the fingerprint (same size and mtime) are not read.
 */
export function divergenceOfDirSync(dir: string, fingerprint: string): number {
  const fp = JSON.parse(fingerprint) as DirFingerprint;
  let pages = 0;
  for (const path of relationFiles(dir)) {
    const key = relative(dir, path);
    const old = fp[key];
    let s;
    try {
      s = statSync(path);
    } catch {
      continue;
    }
    if (old && old.size === s.size && old.mtimeMs === s.mtimeMs) continue;
    const now = pageHashesSync(path, s.size);
    if (!old) {
      pages += now.length;
      continue;
    }
    const before = new Uint32Array(new Uint8Array(Buffer.from(old.pages, "base64")).buffer);
    for (let i = 0; i < now.length; i++) if (i >= before.length || before[i] !== now[i]) pages++;
  }
  return pages * PAGE_BYTES;
}

/** A file the fingerprint already holds as it is now (same size, same modification time). */
const unchanged = (old: FileFingerprint | undefined, s: { size: number; mtimeMs: number }) => !!old && old.size === s.size && old.mtimeMs === s.mtimeMs;

/**
 * The fingerprint brought up to date for files changed since it was taken (other size or mtime):
 * those are hashed again, new files added, removed ones dropped; the rest is kept as it was. A fork
 * uses it after the branch's first open, whose WAL replay rewrote the few pages written during the copy.
 */
export function refreshFingerprintSync(dir: string, fingerprint: string): string {
  const fp = JSON.parse(fingerprint) as DirFingerprint;
  const out: DirFingerprint = {};
  for (const path of relationFiles(dir)) {
    const key = relative(dir, path);
    const s = statSync(path);
    const old = fp[key];
    if (unchanged(old, s)) {
      out[key] = old!;
      continue;
    }
    const hashes = pageHashesSync(path, s.size);
    out[key] = { size: s.size, mtimeMs: s.mtimeMs, pages: Buffer.from(hashes.buffer, hashes.byteOffset, hashes.byteLength).toString("base64") };
  }
  return JSON.stringify(out);
}

const PAGE_HASH_MAIN = new URL("./page-hash-main.ts", import.meta.url).pathname;
/** The compiled binary runs page-hash-main.ts itself when its first argument is this (cmd/kiln.ts). */
export const PAGE_HASH_ARG = "__kiln-page-hash";

/**
 * Runs the page hashing in a process of its own at the lowest CPU priority (`backgroundPriority()`):
 * reading and hashing every page of a database is seconds of CPU at 1 GB, and on Kiln's event loop it would delay
 * every request and every wire message meanwhile (the parent's clients during a branch build, above
 * all). Falls back to this thread if no process can be started.
 */
async function inPageHashProcess(args: string[], stdin: string | null, here: () => string): Promise<string> {
  try {
    const proc = Bun.spawn([...(await backgroundPriority()), process.execPath, COMPILED ? PAGE_HASH_ARG : PAGE_HASH_MAIN, ...args], { stdin: stdin === null ? "ignore" : "pipe", stdout: "pipe", stderr: "pipe" });
    if (stdin !== null) {
      const w = proc.stdin as import("bun").FileSink;
      w.write(stdin);
      await w.end();
    }
    const [code, out, err] = await Promise.all([proc.exited, new Response(proc.stdout).text(), new Response(proc.stderr).text()]);
    if (code === 0) return out;
    throw new Error(`page hashing failed (${code}): ${err.trim().slice(0, 500)}`);
  } catch (err) {
    if ((err as Error).message?.startsWith("page hashing failed")) throw err;
    return here();
  }
}

/** `fingerprintDirSync` in the page-hash process. */
export async function fingerprintDir(dir: string): Promise<string> {
  return inPageHashProcess(["fingerprint", dir], null, () => fingerprintDirSync(dir));
}

/** `divergenceOfDirSync` in the page-hash process. */
export async function divergenceOfDir(dir: string, fingerprint: string): Promise<number> {
  return Number(await inPageHashProcess(["divergence", dir], fingerprint, () => String(divergenceOfDirSync(dir, fingerprint))));
}

/** Changed bytes up to which a refresh runs on this thread: a few files, hashed in milliseconds. */
const REFRESH_HERE_BYTES = 32 * 1024 * 1024;

/**
 * `refreshFingerprintSync`; here when little changed (the usual first open of a fork: the pages written
 * during its copy), which spares a branch's first client a process start at nice 10 on a busy machine;
 * in the page-hash process when a large file changed.
 */
export async function refreshFingerprint(dir: string, fingerprint: string): Promise<string> {
  const fp = JSON.parse(fingerprint) as DirFingerprint;
  let changed = 0;
  for (const path of relationFiles(dir)) {
    const s = statSync(path);
    if (!unchanged(fp[relative(dir, path)], s)) changed += s.size;
  }
  if (changed <= REFRESH_HERE_BYTES) return refreshFingerprintSync(dir, fingerprint);
  return inPageHashProcess(["refresh", dir], fingerprint, () => refreshFingerprintSync(dir, fingerprint));
}
