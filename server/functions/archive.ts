import { createHash } from "node:crypto";
import { createReadStream, mkdtempSync, rmSync } from "node:fs";
import { mkdir, open, type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, posix } from "node:path";
import { pipeline, Readable, type Transform } from "node:stream";
import { createGunzip, createGzip, createInflateRaw } from "node:zlib";
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

/** Fixed limits on an archive's entries (docs/functions.md, "Archive rules"). */
export const ENTRY_LIMITS = {
  /** Entries of any kind: files, directories, dropped dependencies (tar extended headers are not entries). */
  entries: 100_000,
  /** One path component, in UTF-8 bytes (the file system's NAME_MAX). */
  componentBytes: 255,
  /** A whole path after normalization, in UTF-8 bytes. */
  pathBytes: 1024,
  /** Path components, the file's name included. */
  depth: 64,
} as const;

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
const PLATFORM_DIR = ".service";

/** File contents kept in memory while normalizing; beyond this they go to a temporary folder. */
const MEMORY_BYTES = 8 * 1_048_576;
/** A tar extended header (pax or GNU long name) may hold at most this much. */
const META_BYTES = 1_048_576;
/** Compressed input is fed to zlib in slices this size; zlib's output chunks are CHUNK bytes. */
const SLICE = 64 * 1024;
const CHUNK = 64 * 1024;

/**
 * Streaming leaves a garbage buffer behind for every chunk. Bun's collector paces itself by the heap,
 * and Kiln's heap is large (PGlite), so hundreds of MB of spent chunks piled up before a collection
 * (measured: 500 MB unpacked, +490 MB resident). Every GC_EVERY bytes streamed, an asynchronous
 * collection is asked for (measured: a bomb +20-40 MB, and faster). V8 (Node) counts buffer memory itself.
 */
const GC_EVERY = 8 * 1_048_576;
let streamed = 0;
function streamedBytes(n: number): void {
  streamed += n;
  if (streamed < GC_EVERY) return;
  streamed = 0;
  (globalThis as { Bun?: { gc(force: boolean): void } }).Bun?.gc(false);
}

export function runtimeFamily(runtime: string): "node" | "python" | "ruby" {
  return runtime.startsWith("nodejs") ? "node" : runtime.startsWith("python") ? "python" : "ruby";
}

const mib = (n: number) => Math.floor(n / 1_048_576);

/** An entry name for a message: quoted, control characters escaped, long names shortened. */
function show(name: string): string {
  const cut = name.length > 120;
  const text = (cut ? `${name.slice(0, 100)}…` : name).replace(/[\x00-\x1f\x7f]/g, (c) => (c === "\0" ? "\\0" : `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`));
  return cut ? `'${text}' (${Buffer.byteLength(name)} bytes)` : `'${text}'`;
}

/**
 * An entry name checked and normalized: `\` read as `/`, empty and `.` components dropped. "" for the
 * archive root (a `./` directory entry, say).
 */
function cleanName(raw: string, kind: "file" | "dir"): string {
  if (raw.includes("\0")) throw new ArchiveError(`archive entry name contains a NUL byte: ${show(raw)}`);
  const p = raw.replace(/\\/g, "/");
  if (p.startsWith("/") || /^[A-Za-z]:/.test(p)) throw new ArchiveError(`archive entry ${show(raw)} has an absolute path`);
  const parts = p.split("/").filter((s) => s !== "" && s !== ".");
  if (parts.includes("..")) throw new ArchiveError(`archive entry ${show(raw)} escapes the archive root ('..' is not allowed in entry names)`);
  if (parts.length > ENTRY_LIMITS.depth) throw new ArchiveError(`archive entry ${show(raw)} is nested ${parts.length} levels deep; the limit is ${ENTRY_LIMITS.depth}`);
  if (parts.some((s) => Buffer.byteLength(s) > ENTRY_LIMITS.componentBytes))
    throw new ArchiveError(`archive entry name has a component longer than ${ENTRY_LIMITS.componentBytes} bytes: ${show(raw)}`);
  const path = parts.join("/");
  if (Buffer.byteLength(path) > ENTRY_LIMITS.pathBytes) throw new ArchiveError(`archive entry name is longer than ${ENTRY_LIMITS.pathBytes} bytes: ${show(raw)}`);
  if (!path && kind === "file") throw new ArchiveError(`archive has a file entry with an empty name (${show(raw)})`);
  return path;
}

/** Where a kept file's content is until the normalized archive is written. */
type Content = { kind: "memory"; data: Buffer } | { kind: "disk"; file: string } | { kind: "zip"; entry: yauzl.Entry } | { kind: "pending" };

interface FileEntry {
  path: string;
  size: number;
  executable: boolean;
  content: Content;
}

/**
 * The archive's entries as they are admitted one by one: counts, the unpacked-size budget, the
 * tree (no file where a directory must be, no name twice), and what is kept, dropped or ignored.
 */
class Plan {
  private entries = 0;
  private unpacked = 0;
  readonly files = new Map<string, FileEntry>();
  /** Every directory the kept entries need, with the first entry that needed it. */
  private readonly dirs = new Map<string, string>();
  readonly dropped = new Set<string>();

  constructor(
    private readonly extractedBytes: number,
    private readonly dependencyDirs: ReadonlySet<string> = DEPENDENCY_DIRS,
  ) {}

  /** Counts an entry; call before anything else about it, so a huge entry count stops early. */
  count(): void {
    if (++this.entries > ENTRY_LIMITS.entries) throw new ArchiveError(`archive has more than ${ENTRY_LIMITS.entries} entries`);
  }

  /** Takes `size` unpacked bytes (declared by the entry's header) from the budget. */
  take(size: number, raw: string | null): void {
    this.unpacked += size;
    if (this.unpacked > this.extractedBytes)
      throw new ArchiveError(
        `archive unpacks to more than ${mib(this.extractedBytes)} MB (the limit is reached ${raw === null ? "outside the entries' data: extended headers or what follows the end of the archive" : `at entry ${show(raw)}`})`,
      );
  }

  /** The kept file for this entry, or null when it is a directory, dropped or ignored. */
  admit(raw: string, kind: "file" | "dir", size: number, executable: boolean): FileEntry | null {
    this.take(size, raw);
    const path = cleanName(raw, kind);
    if (!path) return null;
    const segs = path.split("/");
    const last = segs[segs.length - 1]!;
    if (segs[0] === "__MACOSX" || last === ".DS_Store") return null;
    // Installed dependencies: a folder named so (and all below it) is left out; a file named so is kept.
    const at = segs.findIndex((s, i) => this.dependencyDirs.has(s) && (kind === "dir" || i < segs.length - 1));
    if (at >= 0) {
      if (kind === "file") this.dropped.add(segs.slice(0, at + 1).join("/"));
      return null;
    }
    if (segs[0] === PLATFORM_DIR) {
      if (kind === "dir" && segs.length === 1) return null;
      // An uploaded build file (from an archive Kiln normalized before, say) is replaced by the generated one.
      if (kind === "file" && path === BUILD_CONFIG_PATH) return null;
      throw new ArchiveError(
        `archive entry ${show(path)} is reserved: '${PLATFORM_DIR}' is the platform's directory (Kiln writes ${BUILD_CONFIG_PATH}); rename it`,
      );
    }
    return this.place(path, kind, size, executable);
  }

  private place(path: string, kind: "file" | "dir", size: number, executable: boolean): FileEntry | null {
    if (kind === "file") {
      if (this.files.has(path)) throw new ArchiveError(`archive entry ${show(path)} appears more than once`);
      const needer = this.dirs.get(path);
      if (needer !== undefined) throw new ArchiveError(`archive entry ${show(path)} is a file, but ${show(needer)} needs it to be a directory`);
    } else if (this.files.has(path)) {
      throw new ArchiveError(`archive entry ${show(`${path}/`)} is a directory, but the archive also has ${show(path)} as a file`);
    }
    const needer = kind === "file" ? path : `${path}/`;
    // Ancestors, deepest first; once one is known, all above it were checked when it was added.
    for (let d = kind === "dir" ? path : posix.dirname(path); d !== "."; d = posix.dirname(d)) {
      if (this.files.has(d)) throw new ArchiveError(`archive entry ${show(needer)} needs ${show(d)} to be a directory, but it is a file`);
      if (this.dirs.has(d)) break;
      this.dirs.set(d, needer);
    }
    if (kind === "dir") return null;
    const entry: FileEntry = { path, size, executable, content: { kind: "pending" } };
    this.files.set(path, entry);
    return entry;
  }
}

/** Decompresses `input` through `z` with back-pressure: memory holds a slice and a chunk, never the whole output. */
function inflateStream(z: Transform, input: AsyncIterable<Buffer> | Buffer[]): AsyncIterable<Buffer> {
  async function* slices() {
    for await (const c of input) for (let i = 0; i < c.length; i += SLICE) yield c.subarray(i, i + SLICE);
  }
  pipeline(Readable.from(slices(), { highWaterMark: 1 }), z, () => {});
  return z as AsyncIterable<Buffer>;
}

/** Pulls exact byte counts out of a stream of chunks. */
class ByteReader {
  private buf: Buffer = Buffer.alloc(0);
  private readonly it: AsyncIterator<Buffer>;
  constructor(source: AsyncIterable<Buffer>) {
    this.it = source[Symbol.asyncIterator]();
  }
  private async more(): Promise<boolean> {
    const r = await this.it.next();
    if (r.done) return false;
    streamedBytes(r.value.length);
    this.buf = this.buf.length ? Buffer.concat([this.buf, r.value]) : r.value;
    return true;
  }
  /** Exactly n bytes; null at a clean end (nothing left); "short" when the stream ends inside them. */
  async exactly(n: number): Promise<Buffer | null | "short"> {
    while (this.buf.length < n) if (!(await this.more())) return this.buf.length ? "short" : null;
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }
  /** The next n bytes, chunk by chunk; throws `short` when the stream ends first. */
  async *chunks(n: number, short: () => Error): AsyncGenerator<Buffer> {
    while (n > 0) {
      if (!this.buf.length && !(await this.more())) throw short();
      const take = Math.min(n, this.buf.length);
      const out = this.buf.subarray(0, take);
      this.buf = this.buf.subarray(take);
      n -= take;
      yield out;
    }
  }
  /** Everything left, chunk by chunk. */
  async *rest(): AsyncGenerator<Buffer> {
    if (this.buf.length) yield this.buf;
    this.buf = Buffer.alloc(0);
    while (await this.more()) {
      const b = this.buf;
      this.buf = Buffer.alloc(0);
      yield b;
    }
  }
  async close(): Promise<void> {
    await this.it.return?.();
  }
}

type Sink = (data: Buffer) => void | Promise<void>;

interface TarHeader {
  path: string;
  /** The typeflag; "0" for regular files (also written as NUL). */
  type: string;
  size: number;
  mode: number;
}

const TAR_TYPES: Record<string, string> = { "1": "a hard link", "2": "a symlink", "3": "a character device", "4": "a block device", "6": "a FIFO" };

function tarNumber(b: Buffer, off: number, len: number, what: string): number {
  if (b[off]! & 0x80) {
    // base-256 (GNU): big-endian, the top bit of the first byte marks it; negative numbers have no use here
    if (b[off] === 0xff) throw new ArchiveError(`not a readable tar.gz archive: a negative ${what} in an entry header`);
    let v = b[off]! & 0x7f;
    for (let i = off + 1; i < off + len; i++) v = v * 256 + b[i]!;
    return v;
  }
  const s = b.toString("latin1", off, off + len).replace(/[\0 ]+$/, "").replace(/^ +/, "");
  if (!/^[0-7]*$/.test(s)) throw new ArchiveError(`not a readable tar.gz archive: an entry header has an invalid ${what}`);
  return s ? parseInt(s, 8) : 0;
}

const cstring = (b: Buffer, off: number, len: number) => {
  const end = b.indexOf(0, off);
  return b.toString("utf8", off, end < 0 || end > off + len ? off + len : end);
};

/** pax records: `<length> <key>=<value>\n`. */
function paxRecords(b: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let i = 0;
  while (i < b.length && b[i] !== 0) {
    const sp = b.indexOf(0x20, i);
    const digits = sp < 0 ? "" : b.toString("latin1", i, sp);
    const len = /^[0-9]{1,8}$/.test(digits) ? parseInt(digits, 10) : NaN;
    if (!(len > sp - i + 1) || i + len > b.length || b[i + len - 1] !== 0x0a) throw new ArchiveError("not a readable tar.gz archive: a malformed pax extended header");
    const rec = b.subarray(sp + 1, i + len - 1);
    const eq = rec.indexOf(0x3d);
    if (eq < 0) throw new ArchiveError("not a readable tar.gz archive: a malformed pax extended header");
    out.set(rec.toString("utf8", 0, eq), rec.toString("utf8", eq + 1));
    i += len;
  }
  return out;
}

/**
 * Reads a tar stream header by header: pax and GNU long-name headers applied, each entry handed to
 * `onEntry`, whose returned sink gets the entry's data (or it is skipped). The first zero block ends
 * the archive; what follows is read to the end (so a broken compressed stream is still found).
 * Unpacked bytes that are no entry's data (extended headers, what follows the end) are reported to
 * `onOther`. A stream ending inside a header or an entry's data is an ArchiveError.
 */
async function readTar(
  source: AsyncIterable<Buffer>,
  onEntry: (h: TarHeader, index: number) => Sink | null | Promise<Sink | null>,
  onOther: (bytes: number) => void,
): Promise<void> {
  const r = new ByteReader(source);
  try {
    let index = 0;
    let longName: string | null = null;
    let pax: Map<string, string> | null = null;
    let metas = 0;
    for (;;) {
      const block = await r.exactly(512);
      if (block === null) {
        if (longName !== null || pax) throw new ArchiveError("not a readable tar.gz archive: it ends after an extended header, before its entry");
        return; // no end-of-archive blocks, but every entry is whole
      }
      if (block === "short") throw new ArchiveError(`not a readable tar.gz archive: it is truncated inside the header of entry #${index + 1}`);
      if (block.every((x) => x === 0)) {
        for await (const c of r.rest()) onOther(c.length);
        return;
      }
      let sum = 0;
      let signed = 0;
      for (let i = 0; i < 512; i++) {
        const v = i >= 148 && i < 156 ? 0x20 : block[i]!;
        sum += v;
        signed += (v << 24) >> 24;
      }
      const chk = tarNumber(block, 148, 8, "checksum");
      if (chk !== sum && chk !== signed) throw new ArchiveError(`not a readable tar.gz archive: the header of entry #${index + 1} has a bad checksum`);
      const type = block[156] === 0 ? "0" : String.fromCharCode(block[156]!);
      let size = tarNumber(block, 124, 12, "size");
      if (type === "x" || type === "g" || type === "L" || type === "K") {
        if (++metas > 8) throw new ArchiveError("not a readable tar.gz archive: more than 8 extended headers in a row");
        if (size > META_BYTES) throw new ArchiveError(`not a readable tar.gz archive: an extended header larger than ${mib(META_BYTES)} MiB`);
        onOther(size);
        const body = await r.exactly(size);
        if (body === null || body === "short") throw new ArchiveError("not a readable tar.gz archive: it is truncated inside an extended header");
        if ((await r.exactly((512 - (size % 512)) % 512)) === "short") throw new ArchiveError("not a readable tar.gz archive: it is truncated inside an extended header");
        if (type === "x") pax = new Map([...(pax ?? []), ...paxRecords(body)]);
        else if (type === "L") longName = body.toString("utf8").replace(/\0+$/, "");
        // "g" (global pax) and "K" (long link target) carry nothing a kept entry needs.
        continue;
      }
      metas = 0;
      const ustar = block.toString("latin1", 257, 263) === "ustar\0";
      const name = cstring(block, 0, 100);
      const prefix = ustar ? cstring(block, 345, 155) : "";
      let path = longName ?? (prefix ? `${prefix}/${name}` : name);
      if (pax?.has("path")) path = pax.get("path")!;
      if (pax?.has("size")) {
        const s = pax.get("size")!;
        if (!/^[0-9]{1,20}$/.test(s)) throw new ArchiveError("not a readable tar.gz archive: a pax header has an invalid size");
        size = Number(s);
      }
      longName = null;
      pax = null;
      const header: TarHeader = { path, type, size, mode: tarNumber(block, 100, 8, "mode") };
      const sink = await onEntry(header, index++);
      const short = () => new ArchiveError(`not a readable tar.gz archive: it is truncated inside entry ${show(path)}`);
      for await (const c of r.chunks(size, short)) if (sink) await sink(c);
      const pad = await r.exactly((512 - (size % 512)) % 512);
      if (pad === "short" || (pad === null && size % 512)) throw short();
    }
  } finally {
    await r.close();
  }
}

/** What a tar entry is: a file or directory, or an ArchiveError naming what it is instead. */
function tarKind(h: TarHeader): "file" | "dir" {
  if (h.type === "5") return "dir";
  if (h.type === "0" || h.type === "7") return h.path.endsWith("/") ? "dir" : "file";
  const what = TAR_TYPES[h.type];
  if (h.type === "1" || h.type === "2") throw new ArchiveError(`archive entry ${show(h.path)} is ${what}; links are not allowed`);
  if (what) throw new ArchiveError(`archive entry ${show(h.path)} is ${what}; only files and directories are allowed`);
  throw new ArchiveError(`archive entry ${show(h.path)} has an unsupported tar entry type '${h.type}'; only files and directories are allowed`);
}

/** Writes all of `data` at the handle's position: a write may take fewer bytes than it is given. */
async function writeAll(handle: FileHandle, data: Buffer): Promise<void> {
  for (let at = 0; at < data.length; ) at += (await handle.write(data, at, data.length - at)).bytesWritten;
}

/** Where content beyond MEMORY_BYTES goes: one temporary folder, one flat file per entry. */
class Spool {
  private dir: string | null = null;
  memory = 0;
  file(index: number): string {
    this.dir ??= mkdtempSync(join(tmpdir(), "kiln-src-"));
    return join(this.dir, String(index));
  }
  remove(): void {
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }
}

/** An ArchiveError as is, a zlib error as a tar.gz format problem; anything else (the spool's disk) is Kiln's. */
const tarGzError = (e: unknown) =>
  e instanceof ArchiveError || !/^Z_/.test(String((e as { code?: unknown })?.code)) ? e : new ArchiveError(`not a readable tar.gz archive: ${(e as Error).message}`);

/**
 * tar.gz: a first pass checks every entry (and keeps contents in memory while they fit in
 * MEMORY_BYTES); when they do not, a second pass writes the rest to the spool. A bomb is refused in
 * the first pass, having been counted, never stored.
 */
async function readTarGz(buf: Buffer, plan: Plan, spool: Spool): Promise<void> {
  const later = new Map<number, FileEntry>();
  const handles = new Set<FileHandle>();
  try {
    await readTar(inflateStream(createGunzip({ chunkSize: CHUNK }), [buf]), (h, index) => {
      plan.count();
      const file = plan.admit(h.path, tarKind(h), h.size, (h.mode & 0o111) !== 0);
      if (!file) return null;
      if (spool.memory + h.size > MEMORY_BYTES) {
        later.set(index, file);
        return null;
      }
      spool.memory += h.size;
      const data = Buffer.allocUnsafe(h.size);
      file.content = { kind: "memory", data };
      let at = 0;
      return (c) => {
        at += c.copy(data, at);
      };
    }, (n) => plan.take(n, null));
    if (!later.size) return;
    await readTar(inflateStream(createGunzip({ chunkSize: CHUNK }), [buf]), (_h, index) => {
      const file = later.get(index);
      if (!file) return null;
      const path = spool.file(index);
      file.content = { kind: "disk", file: path };
      let handle: FileHandle | null = null;
      let written = 0;
      return async (c) => {
        if (!handle) handles.add((handle = await open(path, "w")));
        await writeAll(handle, c);
        if ((written += c.length) === file.size) {
          handles.delete(handle);
          await handle.close();
        }
      };
    }, () => {});
  } catch (e) {
    throw tarGzError(e);
  } finally {
    await Promise.all([...handles].map((h) => h.close().catch(() => {})));
  }
}

const ZIP_TYPES: Record<number, string> = { 0o120000: "a symlink", 0o020000: "a character device", 0o060000: "a block device", 0o010000: "a FIFO", 0o140000: "a socket" };

/** ZIP: the central directory is checked first (names, types, declared sizes); contents are read while writing. */
async function readZip(buf: Buffer, plan: Plan): Promise<yauzl.ZipFile> {
  const zip = await new Promise<yauzl.ZipFile>((resolve, reject) =>
    yauzl.fromBuffer(buf, { lazyEntries: true, decodeStrings: false, validateEntrySizes: true }, (err, z) =>
      err || !z ? reject(new ArchiveError(`not a readable ZIP archive: ${err?.message ?? "unknown error"}`)) : resolve(z),
    ),
  );
  if (zip.entryCount > ENTRY_LIMITS.entries) {
    zip.close();
    throw new ArchiveError(`archive has more than ${ENTRY_LIMITS.entries} entries`);
  }
  await new Promise<void>((resolve, reject) => {
    let settled = false;
    const fail = (e: unknown) => {
      if (settled) return;
      settled = true;
      zip.close();
      reject(e instanceof ArchiveError ? e : new ArchiveError(`not a readable ZIP archive: ${(e as Error).message}`));
    };
    zip.on("error", fail);
    zip.on("end", () => {
      settled = true;
      resolve();
    });
    zip.on("entry", (entry: yauzl.Entry) => {
      try {
        plan.count();
        const name = yauzl.getFileNameLowLevel(entry.generalPurposeBitFlag, entry.fileName as unknown as Buffer, entry.extraFields, false);
        const unixMode = entry.externalFileAttributes >>> 16;
        const what = ZIP_TYPES[unixMode & 0o170000];
        if (what) throw new ArchiveError(`archive entry ${show(name)} is ${what}; ${(unixMode & 0o170000) === 0o120000 ? "links are not allowed" : "only files and directories are allowed"}`);
        const kind = name.endsWith("/") || (unixMode & 0o170000) === 0o040000 ? "dir" : "file";
        const file = plan.admit(name, kind, entry.uncompressedSize, (unixMode & 0o111) !== 0);
        if (file) {
          if (entry.isEncrypted()) throw new ArchiveError(`archive entry ${show(file.path)} is encrypted, which is not supported`);
          if (entry.compressionMethod !== 0 && entry.compressionMethod !== 8)
            throw new ArchiveError(`archive entry ${show(file.path)} uses ZIP compression method ${entry.compressionMethod}; only stored (0) and deflate (8) are supported`);
          file.content = { kind: "zip", entry };
        }
        zip.readEntry();
      } catch (e) {
        fail(e);
      }
    });
    zip.readEntry();
  });
  return zip;
}

/** A zip entry's content, decompressed here (so its declared size is checked as it streams). */
async function* zipContent(zip: yauzl.ZipFile, file: FileEntry, entry: yauzl.Entry): AsyncGenerator<Buffer> {
  const raw = await new Promise<Readable>((resolve, reject) =>
    zip.openReadStream(entry, { decodeFileData: false } as yauzl.ZipFileOptions, (err, s) =>
      err || !s ? reject(new ArchiveError(`archive entry ${show(file.path)} cannot be read: ${err?.message ?? "unknown error"}`)) : resolve(s),
    ),
  );
  try {
    yield* entry.compressionMethod === 8 ? inflateStream(createInflateRaw({ chunkSize: CHUNK }), raw) : raw;
  } catch (e) {
    throw e instanceof ArchiveError ? e : new ArchiveError(`archive entry ${show(file.path)} cannot be read: ${(e as Error).message}`);
  } finally {
    raw.destroy();
  }
}

function tarOctal(n: number, width: number): string {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

/** A ustar header with fixed metadata; a pax header first when the path does not fit in 100 bytes. */
function tarHeader(path: string, size: number, executable: boolean): Buffer {
  const block = (name: string, type: string, len: number) => {
    const b = Buffer.alloc(512);
    b.write(name, 0, 100, "utf8");
    b.write(tarOctal(type === "x" ? 0o644 : executable ? 0o755 : 0o644, 8), 100, "latin1");
    b.write(tarOctal(0, 8), 108, "latin1");
    b.write(tarOctal(0, 8), 116, "latin1");
    b.write(len < 0o77777777777 ? tarOctal(len, 12) : tarOctal(0, 12), 124, "latin1");
    b.write(tarOctal(0, 12), 136, "latin1");
    b.write("        ", 148, "latin1");
    b.write(type, 156, "latin1");
    b.write("ustar\x0000", 257, "latin1");
    let sum = 0;
    for (const x of b) sum += x;
    b.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "latin1");
    return b;
  };
  const records: string[] = [];
  if (Buffer.byteLength(path) > 100) records.push(`path=${path}`);
  if (size >= 0o77777777777) records.push(`size=${size}`);
  if (!records.length) return block(path, "0", size);
  const paxBody = Buffer.from(records.map(paxRecord).join(""));
  const pad = Buffer.alloc((512 - (paxBody.length % 512)) % 512);
  return Buffer.concat([block("././@PaxHeader", "x", paxBody.length), paxBody, pad, block(truncateUtf8(path, 100), "0", size)]);
}

function paxRecord(kv: string): string {
  const body = ` ${kv}\n`;
  let len = Buffer.byteLength(body);
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

/** The longest prefix of `s` that is at most `bytes` bytes of UTF-8. */
function truncateUtf8(s: string, bytes: number): string {
  let out = "";
  for (const ch of s) {
    if (Buffer.byteLength(out + ch) > bytes) break;
    out += ch;
  }
  return out;
}

/** Writes the normalized tar.gz: files sorted, fixed metadata, stopping once it passes `limit`. */
async function writeTarGz(files: FileEntry[], zip: yauzl.ZipFile | null, limit: number): Promise<Buffer> {
  const gz = createGzip();
  const out: Buffer[] = [];
  let total = 0;
  let failure: Error | null = null;
  const tooBig = () => new ArchiveError(`normalized source archive is larger than the ${mib(limit)} MB limit`);
  gz.on("data", (c: Buffer) => {
    total += c.length;
    if (total > limit) failure ??= tooBig();
    else out.push(c);
  });
  gz.on("error", (e) => (failure ??= e));
  const waitDrain = () =>
    new Promise<void>((resolve) => {
      const done = () => {
        gz.off("drain", done);
        gz.off("close", done);
        resolve();
      };
      gz.once("drain", done);
      gz.once("close", done);
    });
  // The tar stream goes to gzip in blocks of exactly CHUNK bytes at fixed offsets (the last one
  // shorter), whatever the pieces it is made of. Bun's zlib, unlike Node's, compresses the same bytes
  // differently when they are split into writes differently (measured: 16 KiB or 66,048-byte writes
  // give other bytes than 64 KiB ones), so writing the pieces as they came (a whole in-memory file, the
  // spool's read chunks, a ZIP entry's inflate chunks) made the same source give another tar.gz and
  // sha256 depending on where its contents had been. Each block is a fresh buffer the pieces are copied
  // into at once, so no piece (a stream's chunk, a view of the upload) is held or read after write() returns.
  let block = Buffer.allocUnsafeSlow(CHUNK);
  let filled = 0;
  const send = async (b: Buffer) => {
    if (failure) throw failure;
    if (!gz.write(b)) await waitDrain();
    if (failure) throw failure;
  };
  const write = async (b: Buffer) => {
    for (let i = 0; i < b.length; ) {
      const n = b.copy(block, filled, i);
      filled += n;
      i += n;
      if (filled === CHUNK) {
        const full = block;
        block = Buffer.allocUnsafeSlow(CHUNK);
        filled = 0;
        await send(full);
      }
    }
  };
  const flush = async () => {
    if (failure) throw failure;
    if (!filled) return;
    const last = block.subarray(0, filled);
    block = Buffer.allocUnsafeSlow(CHUNK);
    filled = 0;
    await send(last);
  };
  try {
    for (const f of files) {
      await write(tarHeader(f.path, f.size, f.executable));
      const c = f.content;
      const source: AsyncIterable<Buffer> | Buffer[] =
        c.kind === "memory" ? [c.data] : c.kind === "disk" ? createReadStream(c.file, { highWaterMark: CHUNK }) : c.kind === "zip" ? zipContent(zip!, f, c.entry) : [];
      let n = 0;
      for await (const chunk of source) {
        n += chunk.length;
        if (c.kind !== "memory") streamedBytes(chunk.length);
        if (n > f.size) throw new ArchiveError(`archive entry ${show(f.path)} unpacks to more than the ${f.size} bytes its header declares`);
        await write(chunk);
      }
      if (n !== f.size) throw new ArchiveError(`archive entry ${show(f.path)} unpacks to ${n} bytes, but its header declares ${f.size}`);
      if (f.size % 512) await write(Buffer.alloc(512 - (f.size % 512)));
    }
    await write(Buffer.alloc(1024));
    await flush();
    await new Promise<void>((resolve) => {
      gz.once("end", resolve);
      gz.once("close", resolve);
      gz.end();
    });
    if (failure) throw failure;
    return Buffer.concat(out);
  } finally {
    gz.destroy();
  }
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
 *
 * Every entry is checked as it is read (docs/functions.md, "Archive rules"), and unpacked bytes are
 * counted against `extractedBytes` from the entries' headers before their data is read, so a bomb
 * is refused without being unpacked into memory; contents are held in memory up to 8 MiB, the rest
 * in a temporary folder (tar.gz) or read from the upload while writing (ZIP).
 */
export async function normalizeSource(
  upload: Uint8Array,
  opts: {
    runtime: string;
    handler: string;
    limits: ArchiveLimits;
    /** Folders left out as installed dependencies (a static site's `vendor/` is content): the functions' set by default. */
    dependencyDirs?: readonly string[];
  },
): Promise<NormalizedSource> {
  if (upload.byteLength > opts.limits.uploadBytes) throw new ArchiveError(`code archive is larger than the ${mib(opts.limits.uploadBytes)} MB limit`);
  const buf = Buffer.from(upload.buffer, upload.byteOffset, upload.byteLength);
  const plan = new Plan(opts.limits.extractedBytes, opts.dependencyDirs ? new Set(opts.dependencyDirs) : DEPENDENCY_DIRS);
  const spool = new Spool();
  let zip: yauzl.ZipFile | null = null;
  try {
    if (buf[0] === 0x50 && buf[1] === 0x4b) zip = await readZip(buf, plan);
    else if (buf[0] === 0x1f && buf[1] === 0x8b) await readTarGz(buf, plan, spool);
    else throw new ArchiveError("code must be a ZIP or tar.gz archive");

    if (plan.files.size === 0) throw new ArchiveError("code archive contains no files");
    const sources = [...plan.files.keys()].sort();
    const reservedPath = sources.some((f) => f === RESERVED_PATH || f.startsWith(`${RESERVED_PATH}/`));
    const roots = inferRoots(sources.filter((f) => !f.startsWith(`${RESERVED_PATH}/`)), opts.runtime);
    const build: FunctionBuildConfig = { ...roots, runtime: opts.runtime, handler: opts.handler };
    const config = Buffer.from(JSON.stringify(build, null, 2) + "\n");
    plan.files.set(BUILD_CONFIG_PATH, { path: BUILD_CONFIG_PATH, size: config.length, executable: false, content: { kind: "memory", data: config } });
    const all = [...plan.files.keys()].sort();
    const tarGz = await writeTarGz(
      all.map((p) => plan.files.get(p)!),
      zip,
      opts.limits.normalizedBytes,
    );
    return { tarGz, sha256: createHash("sha256").update(tarGz).digest("hex"), files: all, dropped: [...plan.dropped].sort(), reservedPath, build };
  } finally {
    zip?.close();
    spool.remove();
  }
}

/**
 * Unpacks a normalized archive (one normalizeSource made: regular files only) into `dir`, which must
 * exist, streaming each file to disk.
 */
export async function extractSource(tarGz: Uint8Array, dir: string): Promise<void> {
  const made = new Set<string>();
  const handles = new Set<FileHandle>();
  try {
    await readTar(
      inflateStream(createGunzip({ chunkSize: CHUNK }), [Buffer.from(tarGz.buffer, tarGz.byteOffset, tarGz.byteLength)]),
      async (h) => {
        if (h.type !== "0") throw new ArchiveError(`normalized archive has an entry of type '${h.type}': ${show(h.path)}`);
        const target = join(dir, cleanName(h.path, "file"));
        const parent = dirname(target);
        if (!made.has(parent)) {
          await mkdir(parent, { recursive: true });
          made.add(parent);
        }
        const handle = await open(target, "w");
        handles.add(handle);
        await handle.chmod(h.mode & 0o111 ? 0o755 : 0o644);
        let written = 0;
        const done = async () => {
          handles.delete(handle);
          await handle.close();
        };
        if (h.size === 0) {
          await done();
          return null;
        }
        return async (c) => {
          await writeAll(handle, c);
          if ((written += c.length) === h.size) await done();
        };
      },
      () => {},
    );
  } finally {
    await Promise.all([...handles].map((h) => h.close().catch(() => {})));
  }
}
