import type { Readable } from "node:stream";

/**
 * What `put` reads: a Node stream (a multipart file from busboy) or any async iterable of bytes, such
 * as a request's own web stream (a resumable part), read as it is: wrapping it in a Node stream
 * first costs a layer of objects per chunk.
 */
export type BlobSource = Readable | AsyncIterable<Uint8Array>;

/**
 * Where object bytes live: files under the data dir (embedded default) or any S3 endpoint
 * (production profile). Keys are Kiln's own (never user paths): `<project>/<object id>` and the like,
 * of [A-Za-z0-9/_.-]. Everything streams: no method may hold a whole object in memory.
 *
 * Durability: `put` and `assemble` resolve only once the bytes are durable (filesystem: written to a
 * temporary file, fsynced, renamed into place), and a key is never visible half-written, so object
 * metadata committed after them never points at partial bytes.
 */
export interface BlobStore {
  readonly kind: "filesystem" | "s3";
  /**
   * Stores a stream under `key` (replacing what was there). Counts bytes as they arrive and aborts
   * with `BlobTooLarge` (nothing stored) once more than `maxBytes` arrived.
   * Returns the size and the MD5 hex digest of the bytes. On failure the source is ended (a Node
   * stream destroyed, a web stream cancelled).
   */
  put(key: string, body: BlobSource, opts?: { maxBytes?: number; contentType?: string }): Promise<{ size: number; md5: string }>;
  /** Streams the bytes (inclusive byte range when given); null when the key is absent. */
  get(key: string, range?: { start: number; end: number }): Promise<Readable | null>;
  /**
   * The bytes as the HTTP response body, where the backend has a better one than a Node stream: a
   * sized Blob for a file (the server sends it with sendfile, without copying through JavaScript), or
   * the S3 response's own web stream (handed straight to the response, so the socket's backpressure
   * reaches the S3 connection; through a Node stream and back, chunks pile up ahead of a slow client),
   * or a small S3 object's bytes as a Blob (a stream body goes out without its Content-Length).
   * Null when absent; undefined when not supported.
   */
  body?(key: string, range?: { start: number; end: number }): Promise<Blob | ReadableStream<Uint8Array> | null>;
  /** Size in bytes, or null when absent. */
  stat(key: string): Promise<{ size: number } | null>;
  /** Removes the key; absent keys are fine. */
  delete(key: string): Promise<void>;
  /** Removes every key starting with `prefix` (a project's or a bucket's objects, a session's parts). */
  deletePrefix(prefix: string): Promise<void>;
  copy(from: string, to: string): Promise<void>;
  /**
   * Concatenates `parts` (keys, in order) into `key`, streaming, then the whole is durable at once;
   * the parts are left in place (the caller deletes them).
   */
  assemble(key: string, parts: string[], opts?: { contentType?: string }): Promise<{ size: number }>;
  /**
   * Optional (the filesystem): the parts of a resumable upload written straight into one file at
   * their offsets, so that completing it is a link, not a copy of every byte. Writes `body` into `key`
   * at `offset` (the file made when absent), durable on return. The caller sees to it that nothing
   * else writes that range meanwhile and that the range holds no bytes it accepted before: a part
   * uploaded again goes to a key of its own (`put`), named in `finishAt`.
   */
  putAt?(key: string, offset: number, body: BlobSource, opts?: { maxBytes?: number }): Promise<{ size: number; md5: string }>;
  /**
   * Completes a `putAt` file: `patches` (keys holding ranges uploaded again) copied in at their
   * offsets, checked to hold exactly `size` bytes, made durable and visible as `to` as well, all at
   * once. The file under `key` stays until the caller deletes it, so deleting `to` undoes this.
   */
  finishAt?(key: string, to: string, size: number, patches: { key: string; offset: number }[]): Promise<{ size: number }>;
  /**
   * Every blob whose key starts with `prefix` (all when empty), with when its bytes were last
   * written (epoch ms: a file's mtime, an S3 object's LastModified, on the backend's clock), in no
   * promised order. Names that are not Kiln keys (and the filesystem's temporaries) are left out.
   * For the sweep of blobs a crash left unreferenced (`server/storage/orphans.ts`).
   */
  list(prefix?: string): AsyncIterable<{ key: string; modifiedMs: number }>;
  /**
   * Optional (S3): removes uploads a crash left unfinished that began before `beforeMs` (epoch ms,
   * the backend's clock): they are invisible to `list` but hold storage. Answers how many went.
   */
  abortStaleUploads?(beforeMs: number): Promise<number>;
  close(): Promise<void>;
}

/** A Kiln blob key ([A-Za-z0-9/_.-], no empty, `.` or `..` parts). */
export function isBlobKey(key: string): boolean {
  return /^[A-Za-z0-9_.-]+(\/[A-Za-z0-9_.-]+)*$/.test(key) && !key.split("/").some((p) => p === "." || p === "..");
}

/** More bytes arrived than the caller allowed; nothing was stored. */
export class BlobTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`more than ${limit} bytes`);
  }
}

/** Received bytes between two looks at memory. */
const CHECK_EVERY = 8 * 1024 * 1024;
/** RSS growth over the lowest RSS seen that brings a full collection. */
const FULL_GC_GROWTH = 24 * 1024 * 1024;
let receivedSinceCheck = 0;
let floorRss = Number.POSITIVE_INFINITY;

/**
 * Counts bytes a backend received from a request (over all uploads at once). Each received chunk is
 * a fresh buffer that is garbage once hashed and copied, and Bun's collector, left alone, lets them
 * pile up on Kiln's large heap (measured: a 300 MB upload grew RSS 86 MB). Every 8 MB: a hint to
 * the collector (Bun.gc(false)), unless RSS stands more than 24 MB over the lowest RSS seen, when a
 * full collection runs (Bun.gc(true), which also returns freed pages) and its RSS becomes the new
 * floor. The hints alone do not bound it: they promote chunks still in use, which then wait for a
 * full collection (measured: 4 resumable parts of 25 MB in flight, 300 MB: +105 to +110 MB with
 * hints every 8 MB, +228 to +276 MB with hints every 1-2 MB, +30 to +39 MB with this rule), while a
 * full collection every 8 MB costs 10-40 ms each. So the full ones run only when growth shows that
 * garbage is piling up, at most once per 24 MB of growth.
 */
export function noteBytesReceived(n: number): void {
  receivedSinceCheck += n;
  if (receivedSinceCheck < CHECK_EVERY) return;
  receivedSinceCheck = 0;
  const rss = process.memoryUsage.rss();
  if (rss < floorRss) floorRss = rss;
  if (rss - floorRss > FULL_GC_GROWTH) {
    Bun.gc(true);
    floorRss = process.memoryUsage.rss();
  } else Bun.gc(false);
}

/**
 * Buffers shared by the uploads of a blob store, reused and bounded. A fresh buffer per part or per
 * upload is garbage the collector leaves lying on Kiln's large heap (measured on S3: 3 resumable
 * parts of 25 MB in flight, each a 5-part upload with two new 5 MiB buffers, grew Kiln's RSS by
 * 136-165 MB over 300 MB; the buffers went only at the next full collection). At most `limit` bytes
 * are out or kept at once: `take` waits for room (first come, first served), `tryTake` answers null
 * instead (and when others wait), and one buffer is always granted when none is out, so a request
 * larger than the limit still proceeds alone. Kept buffers are dropped 30 s after the last came back.
 */
export class BufferPool {
  private free: Buffer[] = [];
  private out = 0;
  private waiting: Array<{ size: number; resolve: (b: Buffer) => void }> = [];
  private trim: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly limit: number,
    /** Buffers over SharedArrayBuffers (another thread may read them). */
    private readonly opts: { shared?: boolean } = {},
  ) {}

  private kept(): number {
    let n = 0;
    for (const b of this.free) n += b.length;
    return n;
  }

  /** A kept buffer of `size`, or a new one within the limit (or when none is out); else null. */
  private grab(size: number): Buffer | null {
    const i = this.free.findIndex((b) => b.length === size);
    if (i >= 0) {
      this.out += size;
      return this.free.splice(i, 1)[0]!;
    }
    // Kept buffers of other sizes make room first.
    while (this.free.length && this.out + this.kept() + size > this.limit) this.free.pop();
    if (this.out > 0 && this.out + size > this.limit) return null;
    this.out += size;
    return this.opts.shared ? Buffer.from(new SharedArrayBuffer(size)) : Buffer.allocUnsafeSlow(size);
  }

  /** A buffer of `size` bytes now, or null (when that would pass the limit, or others wait). */
  tryTake(size: number): Buffer | null {
    clearTimeout(this.trim);
    return this.waiting.length ? null : this.grab(size);
  }

  /** A buffer of `size` bytes, once there is room. */
  take(size: number): Promise<Buffer> {
    const b = this.tryTake(size);
    if (b) return Promise.resolve(b);
    return new Promise<Buffer>((resolve) => this.waiting.push({ size, resolve }));
  }

  /** Back to the pool: no one may read or write `b` any more. */
  give(b: Buffer): void {
    this.out -= b.length;
    if (this.out + this.kept() + b.length <= this.limit) this.free.push(b);
    while (this.waiting.length) {
      const got = this.grab(this.waiting[0]!.size);
      if (!got) break;
      this.waiting.shift()!.resolve(got);
    }
    if (this.out === 0) {
      clearTimeout(this.trim);
      this.trim = setTimeout(() => (this.free = []), 30_000);
      this.trim.unref?.();
    }
  }

  /** Bytes handed out and kept, and how many wait (tests). */
  get usage(): { out: number; kept: number; waiting: number } {
    return { out: this.out, kept: this.kept(), waiting: this.waiting.length };
  }
}
