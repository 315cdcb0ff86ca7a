import { createHash, type Hash, randomBytes } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, rmSync } from "node:fs";
import { copyFile, type FileHandle, link, open, readdir, rename, rm, stat } from "node:fs/promises";
import { dirname, join, sep } from "node:path";
import type { Readable } from "node:stream";
import { BlobTooLarge, type BlobSource, type BlobStore, BufferPool, isBlobKey, noteBytesReceived } from "./blob-store";
import { md5Thread } from "./md5-thread";

/** Kiln's keys are its own ([A-Za-z0-9/_.-], no `..`): anything else is a programming error. */
function checkKey(key: string): void {
  if (!isBlobKey(key)) throw new Error(`bad blob key '${key}'`);
}

/** Bytes gathered before each write (fewer, larger writes than the stream's own chunks). */
const WRITE_BUFFER = 1024 * 1024;
/** Written bytes between two background fdatasyncs during an upload (see FileWriter). */
const SYNC_EVERY = 64 * 1024 * 1024;

/**
 * Writes a stream's chunks to a file through two buffers of WRITE_BUFFER bytes from the store's
 * pool (shared memory): one fills (a copy, cheaper than a write per chunk: each write is a trip to
 * the thread pool) while the other is written and, on the MD5 thread, hashed, so the copy into the
 * page cache and the hashing overlap the next chunks' arrival instead of holding the event loop.
 * Every SYNC_EVERY bytes an fdatasync starts in the background, so the disk writes back while the
 * upload goes on and the final one has little left to do. `write` answers a promise only when the
 * caller must wait (both buffers busy). An upload of one buffer or less is hashed right here (a
 * round trip to the thread would cost more than its MD5), as is everything when the thread failed.
 */
class FileWriter {
  private cur: Buffer | null = null;
  private fill = 0;
  private spare: Buffer | null = null;
  private inflight: { buf: Buffer; done: Promise<unknown> } | null = null;
  private syncing: Promise<void> | null = null;
  private syncedTo: number;
  /** The running hash on the MD5 thread, once a buffer went there; else the hash here. */
  private threadHash: number | null = null;
  private localHash: Hash | null = null;

  constructor(
    private readonly fh: FileHandle,
    private readonly pool: BufferPool,
    /** Where the first byte goes. */
    private pos = 0,
  ) {
    this.syncedTo = pos;
  }

  write(chunk: Uint8Array): Promise<void> | undefined {
    if (this.cur && chunk.byteLength < this.cur.length - this.fill) {
      this.cur.set(chunk, this.fill);
      this.fill += chunk.byteLength;
      return undefined;
    }
    return this.writeSlow(chunk);
  }

  private async writeSlow(chunk: Uint8Array): Promise<void> {
    let off = 0;
    while (off < chunk.byteLength) {
      if (!this.cur) {
        // The buffer in flight comes back first: a wait on the pool never holds a buffer (no deadlock).
        if (!this.spare) await this.settle();
        this.cur = this.spare ?? (await this.pool.take(WRITE_BUFFER));
        this.spare = null;
      }
      const n = Math.min(chunk.byteLength - off, this.cur.length - this.fill);
      this.cur.set(chunk.subarray(off, off + n), this.fill);
      this.fill += n;
      off += n;
      if (this.fill === this.cur.length) await this.flush(false);
    }
  }

  /** Hashes `len` bytes of `buf`: on the MD5 thread (resolves once read) or right here. */
  private hash(buf: Buffer, len: number, last: boolean): Promise<void> | undefined {
    const offload = this.threadHash !== null || (!last && !this.localHash && md5Thread.usable && buf.buffer instanceof SharedArrayBuffer);
    if (offload) {
      this.threadHash ??= md5Thread.begin();
      return md5Thread.update(this.threadHash, buf, len);
    }
    (this.localHash ??= createHash("md5")).update(buf.subarray(0, len));
    return undefined;
  }

  /** Starts writing (and hashing) the filled buffer once the previous one is done; the other fills next. */
  private async flush(last: boolean): Promise<void> {
    await this.settle();
    const buf = this.cur!;
    const len = this.fill;
    const at = this.pos;
    this.pos += len;
    const written = writeAll(this.fh, buf, len, at);
    const hashed = this.hash(buf, len, last);
    const done = hashed ? Promise.all([written, hashed]) : written;
    done.catch(() => {}); // awaited by settle
    this.inflight = { buf, done };
    this.cur = this.spare ?? this.pool.tryTake(WRITE_BUFFER);
    this.spare = null;
    this.fill = 0;
    if (this.pos - this.syncedTo >= SYNC_EVERY && !this.syncing) {
      this.syncedTo = this.pos;
      // After this write: fdatasync covers what was written before it started.
      const s = written.then(() => this.fh.datasync());
      s.catch(() => {});
      this.syncing = s.finally(() => (this.syncing = null));
    }
  }

  /** Waits for the write in flight; its buffer becomes the spare. */
  private async settle(): Promise<void> {
    if (!this.inflight) return;
    const { buf, done } = this.inflight;
    await done;
    this.inflight = null;
    this.spare = buf;
  }

  /** Writes what is left, waits for every write (and background sync); the MD5 hex of every byte. */
  async end(): Promise<string> {
    try {
      if (this.fill > 0) await this.flush(true);
      await this.settle();
      await this.syncing;
      if (this.threadHash !== null) {
        const hash = this.threadHash;
        this.threadHash = null;
        return await md5Thread.digest(hash);
      }
      return (this.localHash ?? createHash("md5")).digest("hex");
    } finally {
      await this.abort();
    }
  }

  /** Waits for what is in flight and gives the buffers back. */
  async abort(): Promise<void> {
    await this.inflight?.done.catch(() => {});
    await this.syncing?.catch(() => {});
    for (const b of [this.cur, this.spare, this.inflight?.buf]) if (b) this.pool.give(b);
    this.cur = this.spare = null;
    this.inflight = null;
    if (this.threadHash !== null) md5Thread.drop(this.threadHash);
    this.threadHash = null;
  }
}

async function syncDir(dir: string): Promise<void> {
  const dh = await open(dir, "r");
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

async function writeAll(fh: FileHandle, buf: Buffer, len: number, at: number): Promise<void> {
  for (let off = 0; off < len; ) {
    const { bytesWritten } = await fh.write(buf, off, len - off, at + off);
    off += bytesWritten;
  }
}

/**
 * Blobs as files under one folder (`<data-dir>/blobs/storage`). A write goes to a temporary file in
 * the same folder, is fdatasynced, renamed into place, and the folder fsynced: a crash leaves either
 * the old bytes or the new, never a partial file under the key (temporaries are swept at start).
 * Resumable uploads may instead write their parts in place into one file (`putAt`, `finishAt`).
 */
export class FilesystemBlobStore implements BlobStore {
  readonly kind = "filesystem" as const;
  /** Write buffers of every upload (two each), reused: see FileWriter. */
  readonly buffers = new BufferPool(16 * WRITE_BUFFER, { shared: true });

  constructor(private readonly root: string) {
    mkdirSync(root, { recursive: true });
  }

  private path(key: string): string {
    checkKey(key);
    return join(this.root, ...key.split("/"));
  }

  /** Temporaries a crash left behind (`.tmp-*` files) are removed. */
  async sweep(): Promise<void> {
    const walk = async (dir: string): Promise<void> => {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch {
        return;
      }
      for (const e of entries) {
        const p = join(dir, e.name);
        if (e.isDirectory()) await walk(p);
        else if (e.name.startsWith(".tmp-")) await rm(p, { force: true });
      }
    };
    await walk(this.root);
  }

  /** Every file under `prefix` with its mtime (temporaries and names that are no keys left out). */
  async *list(prefix = ""): AsyncIterable<{ key: string; modifiedMs: number }> {
    const trimmed = prefix.replace(/\/+$/, "");
    // The folder holding the prefix's last part; only its entries starting with that part count.
    const parts = trimmed ? trimmed.split("/") : [];
    const base = prefix.endsWith("/") || !parts.length ? "" : parts.pop()!;
    const walk = async function* (dir: string, rel: string[], filter: string): AsyncGenerator<{ key: string; modifiedMs: number }> {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch {
        return;
      }
      for (const e of entries) {
        if (!e.name.startsWith(filter) || e.name.startsWith(".tmp-")) continue;
        const p = join(dir, e.name);
        if (e.isDirectory()) yield* walk(p, [...rel, e.name], "");
        else if (e.isFile()) {
          const key = [...rel, e.name].join("/");
          if (!isBlobKey(key)) continue;
          try {
            yield { key, modifiedMs: (await stat(p)).mtimeMs };
          } catch {
            // removed meanwhile
          }
        }
      }
    };
    if (parts.length && !isBlobKey(parts.join("/"))) throw new Error(`bad blob prefix '${prefix}'`);
    yield* walk(join(this.root, ...parts), parts, base);
  }

  private tmpFor(path: string): string {
    return join(dirname(path), `.tmp-${randomBytes(8).toString("hex")}`);
  }

  /** fsync the file, rename it into place, fsync the folder: the rename is then durable too. */
  private async commit(tmp: string, path: string): Promise<void> {
    const fh = await open(tmp, "r");
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    await this.publish(tmp, path);
  }

  /** Renames an fsynced temporary into place and fsyncs the folder. */
  private async publish(tmp: string, path: string): Promise<void> {
    await rename(tmp, path);
    await syncDir(dirname(path));
  }

  /** Writes `body` into `fh` from `start` (counted, hashed, at most `max` bytes), then fdatasyncs it. */
  private async writeFrom(fh: FileHandle, body: BlobSource, start: number, max: number): Promise<{ size: number; md5: string }> {
    let size = 0;
    const out = new FileWriter(fh, this.buffers, start);
    let md5: string;
    try {
      for await (const c of body as AsyncIterable<Uint8Array | string>) {
        const chunk = typeof c === "string" ? Buffer.from(c) : c;
        size += chunk.byteLength;
        noteBytesReceived(chunk.byteLength);
        if (size > max) throw new BlobTooLarge(max);
        const wait = out.write(chunk);
        if (wait) await wait;
      }
      md5 = await out.end();
    } catch (err) {
      await out.abort();
      throw err;
    }
    // Data and size: what reading the bytes back needs (the folder's fsync covers the name).
    await fh.datasync();
    return { size, md5 };
  }

  async put(key: string, body: BlobSource, opts: { maxBytes?: number } = {}): Promise<{ size: number; md5: string }> {
    const path = this.path(key);
    mkdirSync(dirname(path), { recursive: true });
    const tmp = this.tmpFor(path);
    try {
      const fh = await open(tmp, "w");
      let put: { size: number; md5: string };
      try {
        put = await this.writeFrom(fh, body, 0, opts.maxBytes ?? Number.POSITIVE_INFINITY);
      } finally {
        await fh.close();
      }
      await this.publish(tmp, path);
      return put;
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
  }

  /**
   * Writes `body` into the file `key` at `offset` (the file made when absent, never truncated) and
   * resolves once the bytes are durable. The caller sees to it that nothing else writes that range
   * meanwhile and that it holds no bytes already accepted (see `BlobStore.putAt`).
   */
  async putAt(key: string, offset: number, body: BlobSource, opts: { maxBytes?: number } = {}): Promise<{ size: number; md5: string }> {
    const path = this.path(key);
    await this.ensureFile(path);
    const fh = await open(path, "r+");
    try {
      return await this.writeFrom(fh, body, offset, opts.maxBytes ?? Number.POSITIVE_INFINITY);
    } finally {
      await fh.close();
    }
  }

  /** Files being made for `putAt`: their folder's fsync is under way, and other writers wait for it. */
  private readonly making = new Map<string, Promise<void>>();

  /** Makes an empty file at `path` unless there is one, durably (folder fsynced) before anyone writes it. */
  private ensureFile(path: string): Promise<void> {
    const making = this.making.get(path);
    if (making) return making;
    if (existsSync(path)) return Promise.resolve();
    const made = (async () => {
      mkdirSync(dirname(path), { recursive: true });
      try {
        await (await open(path, "wx")).close();
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      }
      await syncDir(dirname(path));
    })().finally(() => this.making.delete(path));
    this.making.set(path, made);
    return made;
  }

  /**
   * Completes a file written by `putAt`: copies `patches` (ranges stored under keys of their own) in
   * at their offsets, checks that it holds exactly `size` bytes, fsyncs it and links it as `to` (the
   * file stays under `key` too, untouched if the caller gives up: deleting `to` undoes this).
   */
  async finishAt(key: string, to: string, size: number, patches: { key: string; offset: number }[]): Promise<{ size: number }> {
    const path = this.path(key);
    const dst = this.path(to);
    const fh = await open(path, "r+");
    try {
      const buf = await this.buffers.take(WRITE_BUFFER);
      try {
        for (const p of patches) {
          const src = await open(this.path(p.key), "r");
          try {
            for (let at = p.offset; ; ) {
              const { bytesRead } = await src.read(buf, 0, buf.length, null);
              if (!bytesRead) break;
              await writeAll(fh, buf, bytesRead, at);
              at += bytesRead;
            }
          } finally {
            await src.close();
          }
        }
      } finally {
        this.buffers.give(buf);
      }
      const { size: have } = await fh.stat();
      if (have !== size) throw new Error(`'${key}' holds ${have} bytes, not ${size}`);
      // A link keeps the file's mtime, the session's last part: the object's blob is new as of now
      // (the sweep of unreferenced blobs spares files younger than its grace period).
      const now = new Date();
      await fh.utimes(now, now);
      await fh.sync();
    } finally {
      await fh.close();
    }
    mkdirSync(dirname(dst), { recursive: true });
    await link(path, dst);
    await syncDir(dirname(dst));
    return { size };
  }

  async get(key: string, range?: { start: number; end: number }): Promise<Readable | null> {
    const path = this.path(key);
    try {
      await stat(path);
    } catch {
      return null;
    }
    return createReadStream(path, range ? { start: range.start, end: range.end, highWaterMark: 256 * 1024 } : { highWaterMark: 256 * 1024 });
  }

  async body(key: string, range?: { start: number; end: number }): Promise<Blob | null> {
    const path = this.path(key);
    if (!(await this.stat(key))) return null;
    const file = Bun.file(path);
    return range ? file.slice(range.start, range.end + 1) : file;
  }

  async stat(key: string): Promise<{ size: number } | null> {
    try {
      const s = await stat(this.path(key));
      return s.isFile() ? { size: s.size } : null;
    } catch {
      return null;
    }
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true });
  }

  async deletePrefix(prefix: string): Promise<void> {
    const trimmed = prefix.replace(/\/+$/, "");
    if (!trimmed) throw new Error("refusing to delete every blob");
    const path = this.path(trimmed);
    if (prefix.endsWith("/")) return rm(path, { recursive: true, force: true });
    // A bare prefix: every file and folder in its parent whose name starts with its last part.
    const parent = dirname(path);
    const base = path.slice(parent.length + sep.length);
    let entries: string[] = [];
    try {
      entries = await readdir(parent);
    } catch {
      return;
    }
    for (const e of entries) if (e.startsWith(base)) await rm(join(parent, e), { recursive: true, force: true });
  }

  async copy(from: string, to: string): Promise<void> {
    const src = this.path(from);
    const dst = this.path(to);
    mkdirSync(dirname(dst), { recursive: true });
    const tmp = this.tmpFor(dst);
    try {
      await copyFile(src, tmp);
      await this.commit(tmp, dst);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
  }

  async assemble(key: string, parts: string[]): Promise<{ size: number }> {
    const path = this.path(key);
    mkdirSync(dirname(path), { recursive: true });
    const tmp = this.tmpFor(path);
    let size = 0;
    try {
      // One reused buffer: reading ahead of the disk through streams piles up garbage chunks.
      const out = await open(tmp, "w");
      const buf = Buffer.allocUnsafe(1024 * 1024);
      try {
        for (const part of parts) {
          const src = await open(this.path(part), "r");
          try {
            for (;;) {
              const { bytesRead } = await src.read(buf, 0, buf.length, null);
              if (!bytesRead) break;
              await out.write(buf, 0, bytesRead);
              size += bytesRead;
            }
          } finally {
            await src.close();
          }
        }
      } finally {
        await out.close();
      }
      await this.commit(tmp, path);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    return { size };
  }

  async close(): Promise<void> {}
}
