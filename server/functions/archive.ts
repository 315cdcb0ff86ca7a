import { createHash } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, posix } from "node:path";
import { Readable } from "node:stream";
import * as tar from "tar";
import yauzl from "yauzl";

/** Upload problems the caller must fix: a 400 with this message. */
export class ArchiveError extends Error {}

export interface ArchiveLimits {
  /** The uploaded archive (SOURCE_ARCHIVE_SIZE_LIMIT_MB). */
  uploadBytes: number;
  /** The normalized tar.gz Kiln stores (the same limit applies to it). */
  normalizedBytes: number;
  /** Everything unpacked, so a small archive cannot expand without bound. */
  extractedBytes: number;
}

export interface FunctionBuildConfig {
  function_root: string;
  install_root: string;
  entry: string | null;
  runtime: string;
  handler: string;
}

export interface NormalizedSource {
  tarGz: Uint8Array;
  sha256: string;
  files: string[];
  /** Installed dependency directories that were in the upload and are left out. */
  dropped: string[];
  /** `.service-dependencies` is reserved: the archive is accepted, its build must fail. */
  reservedPath: boolean;
  build: FunctionBuildConfig;
}

/** Directories of installed dependencies: the build installs them from the manifests instead. */
const DEPENDENCY_DIRS = new Set(["node_modules", "python_deps", ".venv", "vendor"]);
const MANIFESTS = ["package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "requirements.txt", "Pipfile", "Pipfile.lock", "pyproject.toml", "Gemfile", "Gemfile.lock"];
const ENTRY_FILES: Record<string, string[]> = { node: ["index.mjs", "index.js"], python: ["main.py"], ruby: ["main.rb"] };
export const RESERVED_PATH = ".service-dependencies";
export const BUILD_CONFIG_PATH = ".service/function-build.json";

export function runtimeFamily(runtime: string): "node" | "python" | "ruby" {
  return runtime.startsWith("nodejs") ? "node" : runtime.startsWith("python") ? "python" : "ruby";
}

interface Entry {
  data: Uint8Array;
  executable: boolean;
}

/** A path inside the archive, normalized; null for entries that carry nothing (directories, zip metadata). */
function cleanPath(raw: string): string | null {
  const p = raw.replace(/\\/g, "/");
  if (p.startsWith("/") || /^[A-Za-z]:/.test(p)) throw new ArchiveError(`archive entry has an absolute path: ${raw}`);
  const norm = posix.normalize(p).replace(/^(\.\/)+/, "");
  if (norm === ".." || norm.startsWith("../")) throw new ArchiveError(`archive entry escapes the archive root: ${raw}`);
  if (norm === "." || norm === "" || norm.endsWith("/")) return null;
  if (norm.startsWith("__MACOSX/") || norm.endsWith("/.DS_Store") || norm === ".DS_Store") return null;
  return norm;
}

class Budget {
  used = 0;
  constructor(private readonly limit: number) {}
  take(n: number) {
    this.used += n;
    if (this.used > this.limit) throw new ArchiveError(`archive unpacks to more than ${Math.floor(this.limit / 1_048_576)} MB`);
  }
}

function readZip(buf: Buffer, budget: Budget): Promise<Map<string, Entry>> {
  return new Promise((resolve, reject) => {
    const out = new Map<string, Entry>();
    yauzl.fromBuffer(buf, { lazyEntries: true, strictFileNames: false, validateEntrySizes: true }, (err, zip) => {
      if (err || !zip) return reject(new ArchiveError(`not a readable ZIP archive: ${err?.message ?? "unknown error"}`));
      zip.on("error", (e) => reject(e instanceof ArchiveError ? e : new ArchiveError(`not a readable ZIP archive: ${e.message}`)));
      zip.on("end", () => resolve(out));
      zip.on("entry", (entry: yauzl.Entry) => {
        try {
          const mode = (entry.externalFileAttributes >>> 16) & 0o170000;
          if (mode === 0o120000) throw new ArchiveError(`archive contains a symlink, which is not allowed: ${entry.fileName}`);
          const path = cleanPath(entry.fileName);
          if (!path || entry.fileName.endsWith("/")) return zip.readEntry();
          budget.take(entry.uncompressedSize);
          zip.openReadStream(entry, (e, stream) => {
            if (e || !stream) return reject(new ArchiveError(`cannot read ${entry.fileName}: ${e?.message}`));
            const chunks: Buffer[] = [];
            stream.on("data", (c: Buffer) => chunks.push(c));
            stream.on("error", (se) => reject(new ArchiveError(`cannot read ${entry.fileName}: ${se.message}`)));
            stream.on("end", () => {
              out.set(path, { data: Buffer.concat(chunks), executable: ((entry.externalFileAttributes >>> 16) & 0o111) !== 0 });
              zip.readEntry();
            });
          });
        } catch (e) {
          zip.close();
          reject(e);
        }
      });
      zip.readEntry();
    });
  });
}

function readTarGz(buf: Buffer, budget: Budget): Promise<Map<string, Entry>> {
  return new Promise((resolve, reject) => {
    const out = new Map<string, Entry>();
    let failed = false;
    const fail = (e: unknown) => {
      if (failed) return;
      failed = true;
      reject(e instanceof ArchiveError ? e : new ArchiveError(`not a readable tar.gz archive: ${(e as Error).message}`));
    };
    const parser = new tar.Parser({ strict: true });
    parser.on("entry", (entry: tar.ReadEntry) => {
      try {
        if (entry.type === "SymbolicLink" || entry.type === "Link")
          throw new ArchiveError(`archive contains a ${entry.type === "Link" ? "hard link" : "symlink"}, which is not allowed: ${entry.path}`);
        const path = cleanPath(entry.path);
        if (entry.type === "Directory" || !path) return entry.resume();
        if (entry.type !== "File" && entry.type !== "OldFile" && entry.type !== "ContiguousFile")
          throw new ArchiveError(`archive entry ${entry.path} is a ${entry.type}; only files and directories are allowed`);
        const chunks: Buffer[] = [];
        entry.on("data", (c: Buffer) => {
          try {
            budget.take(c.length);
            chunks.push(c);
          } catch (e) {
            fail(e);
          }
        });
        entry.on("end", () => out.set(path, { data: Buffer.concat(chunks), executable: ((entry.mode ?? 0o644) & 0o111) !== 0 }));
      } catch (e) {
        entry.resume();
        fail(e);
      }
    });
    parser.on("error", fail);
    parser.on("warn", (_code: string, message: string) => fail(new ArchiveError(`not a readable tar.gz archive: ${message}`)));
    parser.on("end", () => !failed && resolve(out));
    Readable.from([buf]).pipe(parser as unknown as NodeJS.WritableStream);
  });
}

/** Rule 6 of the spec: where the function lives, and where its dependencies install. */
export function inferRoots(files: string[], runtime: string): { function_root: string; install_root: string; entry: string | null } {
  const names = ENTRY_FILES[runtimeFamily(runtime)]!;
  const entries = files.filter((f) => names.includes(posix.basename(f)));
  let functionRoot = ".";
  if (entries.length === 1) functionRoot = posix.dirname(entries[0]!);
  else {
    const tops = new Set(files.map((f) => f.split("/")[0]));
    if (tops.size === 1 && files.every((f) => f.includes("/"))) functionRoot = [...tops][0]!;
  }
  const has = new Set(files);
  const inRoot = (dir: string, name: string) => (dir === "." ? name : `${dir}/${name}`);
  let installRoot = functionRoot;
  for (let dir = functionRoot; ; dir = posix.dirname(dir)) {
    if (MANIFESTS.some((m) => has.has(inRoot(dir, m)))) {
      installRoot = dir;
      break;
    }
    if (dir === ".") break;
  }
  // The entry file, relative to the function root.
  const entry = names.find((n) => has.has(inRoot(functionRoot, n))) ?? null;
  return { function_root: functionRoot, install_root: installRoot, entry };
}

/**
 * Turns an uploaded ZIP or tar.gz into the normalized source archive Kiln stores: no links, no paths
 * outside the root, no installed dependency directories, `.service/function-build.json` generated,
 * files in a fixed order with fixed metadata (the same source gives the same bytes).
 */
export async function normalizeSource(upload: Uint8Array, opts: { runtime: string; handler: string; limits: ArchiveLimits }): Promise<NormalizedSource> {
  const mb = (n: number) => Math.floor(n / 1_048_576);
  if (upload.byteLength > opts.limits.uploadBytes) throw new ArchiveError(`code archive is larger than the ${mb(opts.limits.uploadBytes)} MB limit`);
  const buf = Buffer.from(upload.buffer, upload.byteOffset, upload.byteLength);
  const budget = new Budget(opts.limits.extractedBytes);
  let entries: Map<string, Entry>;
  if (buf[0] === 0x50 && buf[1] === 0x4b) entries = await readZip(buf, budget);
  else if (buf[0] === 0x1f && buf[1] === 0x8b) entries = await readTarGz(buf, budget);
  else throw new ArchiveError("code must be a ZIP or tar.gz archive");

  const dropped = new Set<string>();
  for (const path of [...entries.keys()]) {
    const segs = path.split("/");
    const at = segs.findIndex((s) => DEPENDENCY_DIRS.has(s));
    if (at >= 0 && at < segs.length - 1) {
      dropped.add(segs.slice(0, at + 1).join("/"));
      entries.delete(path);
    }
  }
  entries.delete(BUILD_CONFIG_PATH); // generated below; an uploaded one is not trusted
  if (entries.size === 0) throw new ArchiveError("code archive contains no files");
  const files = [...entries.keys()].sort();
  const reservedPath = files.some((f) => f === RESERVED_PATH || f.startsWith(`${RESERVED_PATH}/`));
  const roots = inferRoots(files.filter((f) => !f.startsWith(`${RESERVED_PATH}/`)), opts.runtime);
  const build: FunctionBuildConfig = { ...roots, runtime: opts.runtime, handler: opts.handler };
  entries.set(BUILD_CONFIG_PATH, { data: Buffer.from(JSON.stringify(build, null, 2) + "\n"), executable: false });

  const dir = mkdtempSync(join(tmpdir(), "kiln-src-"));
  try {
    const all = [...entries.keys()].sort();
    for (const path of all) {
      const e = entries.get(path)!;
      const target = join(dir, path);
      mkdirSync(dirname(target), { recursive: true });
      writeFileSync(target, e.data);
      chmodSync(target, e.executable ? 0o755 : 0o644);
    }
    const chunks: Buffer[] = [];
    const stream = tar.c({ gzip: true, cwd: dir, portable: true, mtime: new Date(0), noDirRecurse: true }, all);
    for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
    const tarGz = Buffer.concat(chunks);
    if (tarGz.byteLength > opts.limits.normalizedBytes)
      throw new ArchiveError(`normalized source archive is larger than the ${mb(opts.limits.normalizedBytes)} MB limit`);
    return { tarGz, sha256: createHash("sha256").update(tarGz).digest("hex"), files: all, dropped: [...dropped].sort(), reservedPath, build };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Unpacks a normalized archive into `dir` (which must exist). */
export async function extractSource(tarGz: Uint8Array, dir: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const x = tar.x({ cwd: dir, strict: true, preservePaths: false });
    x.on("error", reject);
    x.on("close", () => resolve());
    x.on("finish", () => resolve());
    Readable.from([Buffer.from(tarGz)]).pipe(x as unknown as NodeJS.WritableStream);
  });
}
