import { createHash, randomUUID } from "node:crypto";
import { mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { Agent as HttpAgent } from "node:http";
import { Agent as HttpsAgent } from "node:https";
import { Readable } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { Client, CopyDestinationOptions, CopySourceOptions } from "minio";
import { BlobTooLarge, type BlobSource, type BlobStore, BufferPool, isBlobKey, noteBytesReceived } from "./blob-store";

export interface S3BlobStoreOptions {
  /** `http(s)://host:port` of the S3 endpoint. */
  endPoint: string;
  bucket: string;
  accessKey: string;
  secretKey: string;
  /** Signing region; when absent the client asks the bucket's location once. */
  region?: string;
  /** Key prefix inside the bucket (a `/` is added when missing): several Kilns can share a bucket. */
  prefix?: string;
  /**
   * Size of the first parts of a multipart upload (default and minimum: S3's 5 MiB). Every 1,000
   * parts the part size grows by this much, so the 10,000 parts S3 allows hold about 268 GiB at the
   * default, while an upload holds at most two parts in memory (10 MiB for objects up to 4.9 GiB).
   */
  partSize?: number;
  /**
   * The most bytes of part buffers every upload of the store holds at once, in use or kept for the
   * next upload (default 4 parts: 20 MiB at 5 MiB). Beyond it an upload waits for a buffer; each
   * upload holds one, and a second (to fill while the first uploads) when one is free.
   */
  bufferBytes?: number;
  /**
   * `copy` and `assemble` server-side through UploadPartCopy (true), or by streaming the bytes
   * through Kiln (false). Absent: server-side, falling back to streaming for good when the server
   * answers that it does not implement UploadPartCopy.
   */
  serverSideCopy?: boolean;
  /** Part copies (UploadPartCopy) run at once (default 4). */
  concurrency?: number;
  /**
   * Largest object `copy` copies in one CopyObject request (default and S3's maximum: 5 GiB); a larger
   * one is copied as a multipart upload of UploadPartCopy ranges of this size.
   */
  copyPartSize?: number;
  /**
   * Downloads larger than 1 MiB and up to `maxBytes` are first copied from S3 into a file in `dir` and
   * sent from there, so the response has its Content-Length (see `body`). A spooled file is removed
   * `keepMs` after it was written (the response has opened it by then; an open file outlives its
   * name), and `dir` is emptied at start. At most `totalBytes` (default 4 x `maxBytes`) are spooled at
   * once: beyond it, as beyond `maxBytes` or without a spool, downloads are streamed, without a length,
   * so many concurrent downloads cannot fill the disk.
   */
  spool?: { dir: string; maxBytes: number; keepMs?: number; totalBytes?: number };
}

const MiB = 1024 * 1024;
/** S3's floor for every part but the last. */
const MIN_PART = 5 * MiB;
const MAX_PARTS = 10_000;
/** An object that ends within this many bytes is sent in one PUT without taking a part buffer. */
const SMALL = MiB;
/** CopyObject and one UploadPartCopy copy at most 5 GiB. */
const MAX_COPY = 5 * 1024 * MiB;

/** Kiln's keys are its own ([A-Za-z0-9/_.-], no `..`): anything else is a programming error. */
function checkKey(key: string): void {
  if (!isBlobKey(key)) throw new Error(`bad blob key '${key}'`);
}

function s3Code(err: unknown): string | undefined {
  return (err as { code?: string } | null)?.code;
}
const isAbsent = (err: unknown) => ["NoSuchKey", "NotFound", "NoSuchObject"].includes(s3Code(err) ?? "");
/** Worth another try: the server is busy or failing, or the connection broke. */
const isTransient = (err: unknown) =>
  ["SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "ECONNRESET", "EPIPE", "ETIMEDOUT"].includes(s3Code(err) ?? "") ||
  /Retryable HTTP status|socket hang up/.test(String((err as Error | null)?.message));
/**
 * A server that does not implement UploadPartCopy answers NotImplemented (s3rver: 501, reported by
 * minio as MethodNotAllowed); assemble then concatenates the parts by streaming instead (tested with
 * serverSideCopy: false).
 */
const isUnsupported = (err: unknown) => ["NotImplemented", "MethodNotAllowed"].includes(s3Code(err) ?? "");

/**
 * Blobs in one S3 bucket through the `minio` client. Uploads are Kiln's own multipart uploads made
 * with the client's requests (its `putObject` on a stream of unknown length would buffer 560 MiB
 * parts, and would resume a stale unfinished upload of the same key): bytes are counted and
 * MD5-hashed as they arrive into part buffers shared by the store's uploads (at most two per upload,
 * `bufferBytes` in all), an upload that fails or passes `maxBytes` is aborted, and the object appears
 * only at CompleteMultipartUpload (atomic), so a key is never visible half-written. An object that
 * fits in one part is one PUT. Object bytes go out and come back through the runtime's `fetch` on
 * URLs the client presigns; the client's own requests carry the rest (initiate, complete, abort,
 * copy, list, delete, stat).
 */
export class S3BlobStore implements BlobStore {
  readonly kind = "s3" as const;
  readonly bucket: string;
  private readonly client: Client;
  /** Part buffers of every upload of this store, reused and bounded (see BufferPool). */
  readonly buffers: BufferPool;
  private readonly agent: HttpAgent;
  private readonly prefix: string;
  private readonly partSize: number;
  private readonly concurrency: number;
  private readonly copyPartSize: number;
  private serverCopy: boolean | undefined;

  constructor(private readonly opts: S3BlobStoreOptions) {
    const url = new URL(opts.endPoint);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new Error(`S3 endpoint must be http(s)://host:port, got '${opts.endPoint}'`);
    const useSSL = url.protocol === "https:";
    this.agent = useSSL ? new HttpsAgent({ keepAlive: true, maxSockets: 16 }) : new HttpAgent({ keepAlive: true, maxSockets: 16 });
    const clientOpts = {
      endPoint: url.hostname.replace(/^\[(.*)\]$/, "$1"),
      port: url.port ? Number(url.port) : useSSL ? 443 : 80,
      useSSL,
      accessKey: opts.accessKey,
      secretKey: opts.secretKey,
      region: opts.region,
      pathStyle: true,
      transportAgent: this.agent,
    };
    this.client = new Client(clientOpts);
    this.bucket = opts.bucket;
    const prefix = (opts.prefix ?? "").replace(/^\/+|\/+$/g, "");
    this.prefix = prefix ? `${prefix}/` : "";
    this.partSize = Math.max(MIN_PART, opts.partSize ?? MIN_PART);
    this.concurrency = Math.max(1, opts.concurrency ?? 4);
    this.buffers = new BufferPool(Math.max(this.partSize, opts.bufferBytes ?? 4 * this.partSize));
    this.copyPartSize = Math.min(MAX_COPY, Math.max(MIN_PART, opts.copyPartSize ?? MAX_COPY));
    this.serverCopy = opts.serverSideCopy;
    if (opts.spool) {
      // Whatever a previous run left (a crash between a spool and its removal).
      rmSync(opts.spool.dir, { recursive: true, force: true });
      mkdirSync(opts.spool.dir, { recursive: true });
      const keep = opts.spool.keepMs ?? 60_000;
      this.spoolSweep = setInterval(() => this.sweepSpool(), Math.max(100, keep / 2));
      this.spoolSweep.unref?.();
    }
  }

  private spoolSweep: ReturnType<typeof setInterval> | undefined;
  /** Bytes in the spool now: files being written or kept (reserved before a download is spooled). */
  private spooled = 0;
  /** Spool files still being written (a slow S3 GET): never swept, whatever their age. */
  private readonly writing = new Set<string>();

  /** Removes spooled downloads written more than `keepMs` before `now` (run every `keepMs / 2`). */
  sweepSpool(now = Date.now()): void {
    if (!this.opts.spool) return;
    const dir = this.opts.spool.dir;
    const cutoff = now - (this.opts.spool.keepMs ?? 60_000);
    try {
      for (const name of readdirSync(dir)) {
        const path = join(dir, name);
        if (this.writing.has(path)) continue;
        try {
          const st = statSync(path);
          if (st.mtimeMs >= cutoff) continue;
          rmSync(path, { force: true });
          this.spooled -= st.size;
        } catch {}
      }
    } catch {}
  }

  /** Whether copies run server-side: undefined until the first one ran (auto-detection). */
  get serverSideCopy(): boolean | undefined {
    return this.serverCopy;
  }

  /** Creates the bucket when it does not exist. */
  async init(): Promise<void> {
    if (await this.client.bucketExists(this.bucket)) return;
    try {
      await this.client.makeBucket(this.bucket, this.opts.region ?? "");
    } catch (err) {
      // Another Kiln made it in between.
      if (s3Code(err) !== "BucketAlreadyOwnedByYou") throw err;
    }
  }

  private name(key: string): string {
    checkKey(key);
    return this.prefix + key;
  }

  /** Part n (1-based) of an upload: the base size, one more base size every 1,000 parts. */
  private partSizeFor(n: number): number {
    return this.partSize * (1 + Math.floor((n - 1) / 1000));
  }

  async put(key: string, body: BlobSource, opts: { maxBytes?: number; contentType?: string } = {}): Promise<{ size: number; md5: string }> {
    return this.upload(this.name(key), body as AsyncIterable<Uint8Array>, opts);
  }

  private async upload(name: string, body: AsyncIterable<Buffer | Uint8Array | string>, opts: { maxBytes?: number; contentType?: string }): Promise<{ size: number; md5: string }> {
    const max = opts.maxBytes ?? Number.POSITIVE_INFINITY;
    const contentType = opts.contentType ?? "application/octet-stream";
    const md5 = createHash("md5");
    let size = 0;
    const it = body[Symbol.asyncIterator]();
    /** The next non-empty chunk, counted and hashed; null at the end. */
    const nextChunk = async (): Promise<Buffer | null> => {
      for (;;) {
        const r = await it.next();
        if (r.done) return null;
        const chunk = typeof r.value === "string" ? Buffer.from(r.value) : Buffer.isBuffer(r.value) ? r.value : Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength);
        if (chunk.length === 0) continue;
        size += chunk.length;
        if (size > max) throw new BlobTooLarge(max);
        md5.update(chunk);
        noteBytesReceived(chunk.length);
        return chunk;
      }
    };

    let uploadId: string | undefined;
    const etags: { part: number; etag: string }[] = [];
    // The upload's buffers (at most two): `cur` fills while `sending` (the previous part) uploads;
    // `idle` is the other one between parts.
    let cur: Buffer | undefined;
    let idle: Buffer | undefined;
    let sending: { buf: Buffer; done: Promise<void> } | undefined;
    let fill = 0;
    let partNumber = 0;
    /** Waits for the part in flight; its buffer becomes idle. */
    const settle = async (): Promise<void> => {
      if (!sending) return;
      const s = sending;
      await s.done;
      sending = undefined;
      idle = s.buf;
    };
    /** Starts uploading `cur` as the next part (the previous one finished first) and finds a buffer to fill next. */
    const ship = async (last = false): Promise<void> => {
      await settle();
      partNumber += 1;
      if (partNumber > MAX_PARTS) throw new Error(`object too large for ${MAX_PARTS} parts`);
      uploadId ??= await this.client.initiateNewMultipartUpload(this.bucket, name, { "Content-Type": contentType });
      const n = partNumber;
      const buf = cur!;
      const done = this.sendBytes(name, buf.subarray(0, fill), { partNumber: n, uploadId }).then((etag) => void etags.push({ part: n, etag }));
      done.catch(() => {}); // awaited by settle; never an unhandled rejection meanwhile
      sending = { buf, done };
      cur = undefined;
      fill = 0;
      if (last) return;
      const want = this.partSizeFor(n + 1);
      if (idle && idle.length === want) {
        cur = idle;
        idle = undefined;
        return;
      }
      if (idle) this.buffers.give(idle);
      idle = undefined;
      cur = this.buffers.tryTake(want) ?? undefined;
      if (cur) return;
      // No second buffer free: fill this one again once it is sent.
      await settle();
      const mine = idle!;
      idle = undefined;
      if (mine.length === want) cur = mine;
      else {
        this.buffers.give(mine);
        cur = await this.buffers.take(want);
      }
    };

    try {
      // The first bytes are gathered as they come: an object that ends within SMALL bytes is one PUT
      // and never takes a part buffer.
      const head: Buffer[] = [];
      let headBytes = 0;
      let chunk = await nextChunk();
      while (chunk && headBytes + chunk.length <= SMALL) {
        head.push(chunk);
        headBytes += chunk.length;
        chunk = await nextChunk();
      }
      if (!chunk) {
        const digest = md5.digest("hex");
        await this.sendBytes(name, Buffer.concat(head, headBytes), { contentType, md5: digest });
        return { size, md5: digest };
      }
      cur = await this.buffers.take(this.partSizeFor(1));
      for (const h of head) {
        cur.set(h, fill);
        fill += h.length;
      }
      head.length = 0;
      while (chunk) {
        const n = Math.min(chunk.length, cur!.length - fill);
        cur!.set(chunk.subarray(0, n), fill);
        fill += n;
        let rest: Buffer | null = chunk.subarray(n);
        if (fill === cur!.length) {
          // A full part is shipped only once more bytes follow, so a one-part object is a plain PUT
          // and the last part is never empty.
          if (rest.length === 0) rest = await nextChunk();
          if (!rest) break;
          await ship();
        }
        chunk = rest.length > 0 ? rest : await nextChunk();
      }
      const digest = md5.digest("hex");
      if (!uploadId) {
        // Everything fit in one part: one PUT.
        await this.sendBytes(name, cur!.subarray(0, fill), { contentType, md5: digest });
      } else {
        if (fill > 0) await ship(true);
        await settle();
        etags.sort((a, b) => a.part - b.part);
        await this.client.completeMultipartUpload(this.bucket, name, uploadId, etags);
      }
      return { size, md5: digest };
    } catch (err) {
      if (sending) await sending.done.catch(() => {});
      if (uploadId) await this.client.abortMultipartUpload(this.bucket, name, uploadId).catch(() => {});
      await it.return?.().catch(() => {}); // a Readable is destroyed
      throw err;
    } finally {
      // Only once nothing reads them any more: a part in flight was awaited above.
      for (const b of [cur, idle, sending?.buf]) if (b) this.buffers.give(b);
    }
  }

  /**
   * One PUT of bytes already in memory, an object or (with `partNumber`) one part of a multipart upload,
   * sent by the runtime's `fetch` to a URL the client presigns (computed locally: the payload is
   * UNSIGNED-PAYLOAD, as over HTTPS; its Content-MD5 lets the server check it) with the body as a
   * stream of 256 KiB views of the buffer. Measured (60 parts of 5 MiB, radosgw on loopback): the
   * client's node:http request with a signed payload grew RSS by 10 MiB at 42-51 MB/s, this by
   * 1.6 MiB at 59-71 MB/s; and it spends no SHA-256 on every byte. Retried here on transient
   * failures (a stream can be replayed only by its owner). Returns the ETag.
   */
  private async sendBytes(name: string, data: Buffer, opts: { contentType?: string; md5?: string; partNumber?: number; uploadId?: string }): Promise<string> {
    const query: Record<string, string> = opts.partNumber ? { partNumber: String(opts.partNumber), uploadId: opts.uploadId! } : {};
    const headers: Record<string, string> = {
      "Content-Length": String(data.length),
      "Content-MD5": opts.md5 ? Buffer.from(opts.md5, "hex").toString("base64") : createHash("md5").update(data).digest("base64"),
    };
    if (opts.contentType) headers["Content-Type"] = opts.contentType;
    for (let attempt = 1; ; attempt++) {
      try {
        const url = await this.client.presignedUrl("PUT", this.bucket, name, 15 * 60, query);
        const res = await fetch(url, { method: "PUT", headers, body: sliced(data), duplex: "half" } as RequestInit);
        if (res.status !== 200) {
          const text = await res.text().catch(() => "");
          const code = /<Code>([^<]*)<\/Code>/.exec(text)?.[1] ?? `HTTP ${res.status}`;
          throw Object.assign(new Error(`S3 PUT of ${opts.partNumber ? `part ${opts.partNumber} of ` : ""}'${name}' failed: HTTP ${res.status} ${code}`), { code, status: res.status });
        }
        await res.body?.cancel();
        const etag = res.headers.get("etag");
        if (!etag) throw new Error(`no ETag for ${opts.partNumber ? `part ${opts.partNumber} of ` : ""}'${name}'`);
        return etag.replace(/^"|"$/g, "");
      } catch (err) {
        if (attempt >= 3 || !isTransient(err)) throw err;
        await new Promise((r) => setTimeout(r, 200 * attempt));
      }
    }
  }

  /**
   * A GET signed by the client (a presigned URL, computed locally) and sent with the runtime's
   * `fetch`: through the client's getObject, Bun's node:http response hands over 512 KiB chunks and a
   * fresh process's RSS grew by 72-96 MiB over a 1 GiB download, against 31-41 MiB through fetch (64 KiB
   * chunks). Same request, same signature, same errors.
   */
  async get(key: string, range?: { start: number; end: number }): Promise<Readable | null> {
    const res = await this.request(key, range);
    return res && Readable.fromWeb(res.body as unknown as WebReadableStream);
  }

  /**
   * For an HTTP response (see `BlobStore.body`): up to 1 MiB the bytes as a Blob; up to the spool's
   * limit a file the GET was copied into (sent with sendfile); beyond it the GET's own web stream.
   * Bun.serve drops a Content-Length header from a response whose body is a stream and sends it
   * chunked (oven-sh/bun#10507, Bun 1.4.5); a Blob or a file always goes out with its length. The
   * price of a spooled download: its first byte leaves once S3 sent the last, and it takes its size
   * on disk for `keepMs`.
   */
  async body(key: string, range?: { start: number; end: number }): Promise<ReadableStream<Uint8Array> | Blob | null> {
    const res = await this.request(key, range);
    if (!res) return null;
    const length = Number(res.headers.get("content-length") ?? NaN);
    if (length <= SMALL) return await res.blob();
    const spool = this.opts.spool;
    if (!spool || !(length <= spool.maxBytes) || this.spooled + length > (spool.totalBytes ?? 4 * spool.maxBytes)) return res.body!;
    const path = join(spool.dir, randomUUID());
    this.spooled += length;
    this.writing.add(path);
    try {
      // Bun.write streams a Response's body into the file (64 KiB at a time), never whole in memory.
      const written = await Bun.write(path, res);
      if (written !== length) throw new Error(`S3 GET of '${key}' ended after ${written} of ${length} bytes`);
    } catch (err) {
      rmSync(path, { force: true });
      this.spooled -= length;
      throw err;
    } finally {
      this.writing.delete(path);
    }
    // Its keep time runs from its last write (its mtime): from the end of the GET.
    return Bun.file(path);
  }

  /** The GET's response (its body unread); null when the key is absent. */
  private async request(key: string, range?: { start: number; end: number }): Promise<Response | null> {
    const url = await this.client.presignedGetObject(this.bucket, this.name(key), 15 * 60);
    const res = await fetch(url, { headers: range ? { Range: `bytes=${range.start}-${range.end}` } : {} });
    if (res.ok && res.body && (range ? res.status === 206 : res.status === 200)) return res;
    const text = res.ok ? "" : await res.text().catch(() => "");
    if (res.ok) await res.body?.cancel();
    const code = /<Code>([^<]*)<\/Code>/.exec(text)?.[1];
    if (code === "NoSuchKey" || (res.status === 404 && !code)) return null;
    throw Object.assign(new Error(`S3 GET of '${key}' failed: HTTP ${res.status}${code ? ` ${code}` : range ? " (range ignored)" : ""}`), { code });
  }

  async stat(key: string): Promise<{ size: number } | null> {
    try {
      const s = await this.client.statObject(this.bucket, this.name(key));
      return { size: s.size };
    } catch (err) {
      if (isAbsent(err)) return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    await this.client.removeObject(this.bucket, this.name(key));
  }

  async deletePrefix(prefix: string): Promise<void> {
    if (!prefix.replace(/\/+$/, "")) throw new Error("refusing to delete every blob");
    if (!/^[A-Za-z0-9/_.-]+$/.test(prefix)) throw new Error(`bad blob prefix '${prefix}'`);
    const full = this.prefix + prefix;
    let batch: string[] = [];
    const flush = async () => {
      const names = batch;
      batch = [];
      const errors = await this.client.removeObjects(this.bucket, names);
      const failed = errors.find((e) => e?.Error && e.Error.Code !== "NoSuchKey");
      if (failed) throw new Error(`removing blobs under '${prefix}' failed: ${JSON.stringify(failed)}`);
    };
    for await (const item of this.client.listObjectsV2(this.bucket, full, true)) {
      if (!item.name) continue;
      batch.push(item.name);
      if (batch.length === 1000) await flush();
    }
    if (batch.length) await flush();
    // Uploads a crash left unfinished under the prefix hold storage too.
    try {
      for await (const u of this.client.listIncompleteUploads(this.bucket, full, true)) {
        await this.client.abortMultipartUpload(this.bucket, u.key, u.uploadId).catch((err) => {
          if (s3Code(err) !== "NoSuchUpload") throw err;
        });
      }
    } catch (err) {
      if (!isUnsupported(err)) throw err;
    }
  }

  /** The objects under this store's prefix (and `prefix`), with their LastModified. */
  async *list(prefix = ""): AsyncIterable<{ key: string; modifiedMs: number }> {
    if (prefix && !/^[A-Za-z0-9/_.-]+$/.test(prefix)) throw new Error(`bad blob prefix '${prefix}'`);
    for await (const item of this.client.listObjectsV2(this.bucket, this.prefix + prefix, true)) {
      if (!item.name || !item.name.startsWith(this.prefix)) continue;
      const key = item.name.slice(this.prefix.length);
      if (!isBlobKey(key)) continue;
      yield { key, modifiedMs: new Date(item.lastModified as Date | string).getTime() };
    }
  }

  /** Multipart uploads under this store's prefix begun before `beforeMs` (a crash mid-upload left them) are aborted. */
  async abortStaleUploads(beforeMs: number): Promise<number> {
    let n = 0;
    try {
      for await (const u of this.client.listIncompleteUploads(this.bucket, this.prefix, true)) {
        // Each item carries its Initiated time (not in minio's type).
        const initiated = new Date((u as unknown as { initiated?: Date | string }).initiated ?? NaN).getTime();
        if (!u.key || !u.uploadId || !(initiated < beforeMs)) continue;
        await this.client.abortMultipartUpload(this.bucket, u.key, u.uploadId).then(
          () => n++,
          (err) => {
            if (s3Code(err) !== "NoSuchUpload") throw err;
          },
        );
      }
    } catch (err) {
      if (!isUnsupported(err)) throw err;
    }
    return n;
  }

  async copy(from: string, to: string): Promise<void> {
    const src = this.name(from);
    const dst = this.name(to);
    const stat = await this.stat(from);
    if (!stat) throw new Error(`no blob '${from}'`);
    if (this.serverCopy !== false) {
      try {
        if (stat.size <= this.copyPartSize) {
          await this.client.copyObject(new CopySourceOptions({ Bucket: this.bucket, Object: src }), new CopyDestinationOptions({ Bucket: this.bucket, Object: dst }));
        } else {
          const ranges: { src: string; start: number; end: number }[] = [];
          for (let start = 0; start < stat.size; start += this.copyPartSize) ranges.push({ src, start, end: Math.min(stat.size, start + this.copyPartSize) - 1 });
          const { "content-type": ct } = (await this.client.statObject(this.bucket, src)).metaData as Record<string, string>;
          await this.copyParts(dst, ranges, ct);
        }
        this.serverCopy = true;
        return;
      } catch (err) {
        if (this.serverCopy === true || !isUnsupported(err)) throw err;
        this.serverCopy = false;
      }
    }
    const body = await this.get(from);
    if (!body) throw new Error(`no blob '${from}'`);
    await this.upload(dst, body, {});
  }

  /**
   * Server-side: one multipart upload whose parts are UploadPartCopy of the sources (no byte passes
   * through Kiln; needs every part but the last ≥ 5 MiB, which resumable uploads guarantee).
   * Otherwise (or when the server lacks UploadPartCopy) the parts' streams are concatenated into an
   * upload, at most two upload parts in memory.
   */
  async assemble(key: string, parts: string[], opts: { contentType?: string } = {}): Promise<{ size: number }> {
    const dst = this.name(key);
    const names = parts.map((p) => this.name(p));
    const sizes = await mapLimit(parts, 16, async (p) => {
      const s = await this.stat(p);
      if (!s) throw new Error(`no blob '${p}'`);
      return s.size;
    });
    const total = sizes.reduce((a, b) => a + b, 0);
    const copyable = total > 0 && sizes.every((s, i) => i === sizes.length - 1 || (s >= MIN_PART && s <= MAX_COPY));
    if (this.serverCopy !== false && copyable) {
      try {
        await this.copyParts(dst, names.map((src, i) => ({ src, start: 0, end: sizes[i] - 1 })), opts.contentType);
        this.serverCopy = true;
        return { size: total };
      } catch (err) {
        if (this.serverCopy === true || !isUnsupported(err)) throw err;
        this.serverCopy = false;
      }
    }
    const self = this;
    async function* concatenated(): AsyncGenerator<Buffer> {
      for (const p of parts) {
        const s = await self.get(p);
        if (!s) throw new Error(`no blob '${p}'`);
        yield* s as AsyncIterable<Buffer>;
      }
    }
    const { size } = await this.upload(dst, concatenated(), { contentType: opts.contentType });
    return { size };
  }

  /** A multipart upload made of UploadPartCopy requests (empty ranges are skipped; at least one is not). */
  private async copyParts(dst: string, ranges: { src: string; start: number; end: number }[], contentType?: string): Promise<void> {
    const copies = ranges.filter((r) => r.end >= r.start);
    const uploadId = await this.client.initiateNewMultipartUpload(this.bucket, dst, { "Content-Type": contentType ?? "application/octet-stream" });
    try {
      const etags = await mapLimit(copies, this.concurrency, async (r, i) => {
        const headers = { "x-amz-copy-source": encodeURI(`${this.bucket}/${r.src}`), "x-amz-copy-source-range": `bytes=${r.start}-${r.end}` };
        const res = await this.client.uploadPart({ bucketName: this.bucket, objectName: dst, uploadID: uploadId, partNumber: i + 1, headers }, "");
        return { part: i + 1, etag: res.etag };
      });
      await this.client.completeMultipartUpload(this.bucket, dst, uploadId, etags);
    } catch (err) {
      await this.client.abortMultipartUpload(this.bucket, dst, uploadId).catch(() => {});
      throw err;
    }
  }

  async close(): Promise<void> {
    clearInterval(this.spoolSweep);
    this.agent.destroy();
  }
}

/** A buffer as a request body: a stream of 256 KiB views of it (no copy). */
function sliced(data: Buffer, size = 256 * 1024): ReadableStream<Uint8Array> {
  let o = 0;
  return new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (o >= data.length) return ctl.close();
      ctl.enqueue(data.subarray(o, o + size));
      o += size;
    },
  });
}

async function mapLimit<T, R>(items: T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
