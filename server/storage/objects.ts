import { Readable } from "node:stream";
import busboy from "busboy";
import { BlobTooLarge, type BlobStore } from "../backends/blobs/blob-store";
import type { Clock } from "../clock";
import { badRequest, conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import { isoTime, isUniqueViolation, type ControlStore, type Row } from "../store/store";
import { mimeAllowed, type BucketRow } from "./buckets";
import { addUsage, type StorageLimits } from "./limits";
import { DENIED, type PoliciesService, type PolicyCaller, type PolicyCandidate, type PolicyOperation } from "./policies";

/** Who acts on objects: a service key (no policies), an end user, or the anon key (role anon). */
export type StorageCaller =
  | { kind: "service"; projectId: string }
  | { kind: "user"; projectId: string; uid: string; email: string }
  | { kind: "anon"; projectId: string };

export interface ObjectRow extends Row {
  id: string;
  project_id: string;
  bucket_id: string;
  name: string;
  owner_id: string | null;
  size: string | number;
  mime_type: string;
  etag: string;
  is_public: boolean;
  metadata: Record<string, unknown>;
  blob_key: string;
  created_at: Date | string;
  updated_at: Date | string;
}

export const INVALID_PATH = "invalid or missing object path";
const MAX_PATH_BYTES = 1024;
const MAX_METADATA_KEYS = 50;
const MAX_METADATA_BYTES = 10 * 1024;

/** Object paths: no `..` segment, NUL or control character, no leading `/`, no empty segment. */
export function checkPath(path: string | undefined | null): string {
  if (!path || path.startsWith("/") || Buffer.byteLength(path) > MAX_PATH_BYTES) throw badRequest(INVALID_PATH);
  // biome-ignore lint: control characters are exactly what is refused
  if (/[\u0000-\u001f\u007f]/.test(path) || !path.isWellFormed()) throw badRequest(INVALID_PATH);
  if (path.split("/").some((s) => s === ".." || s === "." || s === "")) throw badRequest(INVALID_PATH);
  return path;
}

export function checkMetadata(value: unknown): Record<string, unknown> {
  if (value === undefined || value === null) return {};
  if (typeof value !== "object" || Array.isArray(value)) throw badRequest("invalid request: metadata must be a JSON object");
  const keys = Object.keys(value);
  if (keys.length > MAX_METADATA_KEYS) throw badRequest(`invalid request: metadata may have at most ${MAX_METADATA_KEYS} keys (it has ${keys.length})`);
  const bytes = Buffer.byteLength(JSON.stringify(value));
  if (bytes > MAX_METADATA_BYTES) throw badRequest(`invalid request: metadata may be at most 10KB serialized (it is ${bytes} bytes)`);
  return value as Record<string, unknown>;
}

export function objectView(o: ObjectRow, bucketName?: string) {
  return {
    id: o.id,
    bucket_id: o.bucket_id,
    ...(bucketName !== undefined ? { bucket_name: bucketName } : {}),
    name: o.name,
    owner_id: o.owner_id,
    size: Number(o.size),
    mime_type: o.mime_type,
    etag: o.etag,
    is_public: o.is_public,
    metadata: o.metadata,
    created_at: isoTime(o.created_at),
    updated_at: isoTime(o.updated_at),
  };
}

export function policyCaller(c: StorageCaller): PolicyCaller {
  return c.kind === "user" ? { role: "authenticated", uid: c.uid, email: c.email } : { role: "anon", uid: null, email: null };
}

function candidateOf(o: Pick<ObjectRow, "bucket_id" | "name" | "owner_id" | "size" | "mime_type" | "is_public" | "metadata">): PolicyCandidate {
  return { bucket_id: o.bucket_id, name: o.name, owner_id: o.owner_id, size: Number(o.size), mime_type: o.mime_type, is_public: o.is_public, metadata: o.metadata };
}

/**
 * The request's web stream into busboy, with backpressure, without a Node stream around it (a layer
 * of objects per chunk). The whole body is read even after a refusal, as piping did: busboy discards it.
 */
async function feed(body: ReadableStream<Uint8Array>, bb: busboy.Busboy): Promise<void> {
  const reader = body.getReader();
  for (;;) {
    // busboy gave up on a malformed body: stop reading it, as an unpiped stream would.
    if (bb.destroyed) return void (await reader.cancel().catch(() => {}));
    const { done, value } = await reader.read();
    if (done) break;
    if (!bb.write(value) && !bb.destroyed)
      await new Promise<void>((resolve) => {
        const go = () => {
          bb.off("drain", go);
          bb.off("close", go);
          resolve();
        };
        bb.on("drain", go);
        bb.on("close", go);
      });
  }
  if (!bb.destroyed) bb.end();
}

/** A parsed `Range` header: one range, inclusive; suffix ranges count from the end. */
export type RangeRequest = { kind: "none" } | { kind: "range"; start: number; end: number } | { kind: "unsatisfiable" };

export function parseRange(header: string | null, size: number): RangeRequest {
  if (header === null) return { kind: "none" };
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === "" && m[2] === "")) throw badRequest(`invalid range header '${header.slice(0, 100)}': use bytes=start-end, bytes=start- or bytes=-suffix (one range)`);
  if (m[1] === "") {
    const n = Number(m[2]);
    if (n === 0 || size === 0) return { kind: "unsatisfiable" };
    return { kind: "range", start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (m[2] !== "" && Number(m[2]) < start) throw badRequest(`invalid range header '${header.slice(0, 100)}': the end is before the start`);
  if (start >= size) return { kind: "unsatisfiable" };
  return { kind: "range", start, end };
}

/**
 * Objects: uploads streamed to the blob store (never held whole in memory), downloads with ranges,
 * listing, move, copy, visibility, deletion. A service key passes every check; end users and the
 * anon key need a policy of the bucket for the operation (SELECT, INSERT, UPDATE, DELETE) that
 * holds, except that public objects download with only the anon key.
 */
export class ObjectsService {
  /** Rows written since the table's statistics were last gathered (see the storage area's analyze job). */
  writesSinceAnalyze = 0;

  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly blobs: BlobStore,
    private readonly policies: PoliciesService,
    private readonly limits: StorageLimits,
  ) {}

  blobKey(bucket: BucketRow, objectId: string, version = newId()): string {
    return `${bucket.project_id}/${bucket.id}/${objectId}.${version}`;
  }

  async find(bucket: BucketRow, path: string): Promise<ObjectRow | null> {
    const [r] = await this.store.query<ObjectRow>(`select * from storage_objects where bucket_id = $1 and name = $2`, [bucket.id, path]);
    return r ?? null;
  }

  async get(bucket: BucketRow, path: string): Promise<ObjectRow> {
    const o = await this.find(bucket, path);
    if (!o) throw notFound("object not found");
    return o;
  }

  /** A policy check unless the caller is a service key. */
  async authorize(caller: StorageCaller, op: PolicyOperation, candidate: PolicyCandidate): Promise<void> {
    if (caller.kind === "service") return;
    await this.policies.require(op, policyCaller(caller), candidate);
  }

  /** The fast refusal before any byte is read: no policy at all for the operation. */
  private async mayEverInsert(caller: StorageCaller, bucket: BucketRow): Promise<void> {
    if (caller.kind === "service") return;
    if (!(await this.policies.expression(bucket.id, "INSERT"))) throw forbidden(DENIED);
  }

  /**
   * A multipart upload (field `file`, optional `metadata` JSON object): the bytes stream into a new
   * blob under the smallest of the limits, then the INSERT (or, replacing with `upsert`, UPDATE)
   * policy decides on the object as it would be, then its row is committed. A refusal after the
   * bytes arrived removes them.
   */
  async upload(caller: StorageCaller, bucket: BucketRow, path: string, request: Request, opts: { upsert: boolean }): Promise<{ object: ObjectRow; created: boolean }> {
    const contentType = request.headers.get("content-type") ?? "";
    if (!/^multipart\/form-data/i.test(contentType)) throw badRequest("upload with multipart/form-data (field 'file'), or start a resumable upload with application/json");
    if (!request.body) throw badRequest("the upload has no body");
    await this.mayEverInsert(caller, bucket);
    const existing = await this.find(bucket, path);
    if (existing && !opts.upsert) throw conflict(`object '${path}' already exists (send x-upsert: true to replace it)`);
    const limit = await this.limits.forUpload(bucket, existing ? Number(existing.size) : 0);
    const declared = Number(request.headers.get("content-length") ?? NaN);
    // Multipart framing adds a little: a declared body far past the limit cannot hold a file within it.
    if (Number.isFinite(declared) && declared > limit.bytes + 64 * 1024) throw limit.error();

    const objectId = existing?.id ?? newId();
    const key = this.blobKey(bucket, objectId);
    let fileInfo: { size: number; md5: string; mime: string } | null = null;
    let metadataText: string | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        let bb: busboy.Busboy;
        try {
          bb = busboy({ headers: { "content-type": contentType }, limits: { files: 1, fields: 20, fieldSize: 64 * 1024, parts: 25 } });
        } catch {
          return reject(badRequest("the multipart body could not be read (missing boundary?)"));
        }
        let pending: Promise<void> = Promise.resolve();
        let failed = false;
        const fail = (e: unknown) => {
          if (failed) return;
          failed = true;
          reject(e);
        };
        bb.on("field", (name, value, info) => {
          if (info.valueTruncated) return fail(badRequest(`multipart field '${name}' is too long`));
          if (name === "metadata") metadataText = value;
        });
        bb.on("file", (name, stream, info) => {
          if (name !== "file" || fileInfo || failed) {
            stream.resume();
            return;
          }
          const mime = (info.mimeType || "application/octet-stream").toLowerCase();
          if (!mimeAllowed(bucket.allowed_mime_types, mime)) {
            stream.resume();
            return fail(badRequest(`invalid MIME type '${mime}': this bucket allows ${bucket.allowed_mime_types.join(", ")}`));
          }
          pending = this.blobs.put(key, stream, { maxBytes: limit.bytes, contentType: mime }).then(
            (r) => {
              fileInfo = { ...r, mime };
            },
            (e) => {
              stream.resume();
              fail(e instanceof BlobTooLarge ? limit.error() : e);
            },
          );
        });
        bb.on("error", () => fail(badRequest("the multipart body could not be read")));
        bb.on("close", () => void pending.then(() => (failed ? undefined : resolve()), fail));
        void feed(request.body!, bb).catch(() => {
          fail(badRequest("request body could not be read: the connection ended before it was complete"));
          bb.destroy(); // ends the file stream too, so its put gives up
        });
      });
      if (!fileInfo) throw badRequest("invalid request: the multipart field 'file' is required");
      const file: { size: number; md5: string; mime: string } = fileInfo;
      let metadata: Record<string, unknown> = {};
      if (metadataText !== undefined) {
        let parsed: unknown;
        try {
          parsed = JSON.parse(metadataText);
        } catch {
          throw badRequest("invalid request: metadata must be a JSON object");
        }
        metadata = checkMetadata(parsed);
      }
      const owner = caller.kind === "user" ? caller.uid : null;
      const candidate: PolicyCandidate = { bucket_id: bucket.id, name: path, owner_id: existing ? existing.owner_id : owner, size: file.size, mime_type: file.mime, is_public: existing?.is_public ?? false, metadata };
      await this.authorize(caller, existing ? "UPDATE" : "INSERT", candidate);
      const at = this.clock.now().toISOString();
      const row = await this.commit(bucket, existing, { id: objectId, name: path, owner_id: candidate.owner_id, size: file.size, mime_type: file.mime, etag: file.md5, metadata, blob_key: key }, at);
      return { object: row, created: !existing };
    } catch (err) {
      await this.blobs.delete(key).catch(() => {});
      throw err;
    }
  }

  /** The row for new bytes (already durable under `blob_key`); the replaced blob goes after the commit. */
  async commit(
    bucket: BucketRow,
    existing: ObjectRow | null,
    o: { id: string; name: string; owner_id: string | null; size: number; mime_type: string; etag: string; metadata: Record<string, unknown>; blob_key: string },
    at: string,
  ): Promise<ObjectRow> {
    let row: ObjectRow;
    try {
      row = await this.store.transaction(async (tx) => {
        if (existing) {
          const [r] = await tx.query<ObjectRow>(
            `update storage_objects set size = $2, mime_type = $3, etag = $4, metadata = $5::text::jsonb, blob_key = $6, updated_at = $7 where id = $1 and blob_key = $8 returning *`,
            [existing.id, o.size, o.mime_type, o.etag, JSON.stringify(o.metadata), o.blob_key, at, existing.blob_key],
          );
          if (!r) throw conflict(`object '${o.name}' changed during the upload; try again`);
          await addUsage(tx, bucket.project_id, o.size - Number(existing.size));
          return r;
        }
        const [r] = await tx.query<ObjectRow>(
          `insert into storage_objects (id, project_id, bucket_id, name, owner_id, size, mime_type, etag, is_public, metadata, blob_key, created_at, updated_at)
           values ($1, $2, $3, $4, $5, $6, $7, $8, false, $9::text::jsonb, $10, $11, $11) returning *`,
          [o.id, bucket.project_id, bucket.id, o.name, o.owner_id, o.size, o.mime_type, o.etag, JSON.stringify(o.metadata), o.blob_key, at],
        );
        await addUsage(tx, bucket.project_id, o.size);
        return r!;
      });
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`object '${o.name}' already exists`);
      throw err;
    }
    this.writesSinceAnalyze++;
    if (existing && existing.blob_key !== o.blob_key) await this.blobs.delete(existing.blob_key).catch(() => {});
    return row;
  }

  /** May this caller read this object: public objects with any application credential, else the SELECT policy. */
  async authorizeRead(caller: StorageCaller, o: ObjectRow): Promise<void> {
    if (o.is_public) return;
    await this.authorize(caller, "SELECT", candidateOf(o));
  }

  async download(caller: StorageCaller, bucket: BucketRow, path: string, request: Request): Promise<Response> {
    const o = await this.get(bucket, path);
    await this.authorizeRead(caller, o);
    const size = Number(o.size);
    const etag = `"${o.etag}"`;
    const base: Record<string, string> = { ETag: etag, "Accept-Ranges": "bytes", "Content-Type": o.mime_type, "Last-Modified": new Date(o.updated_at).toUTCString() };
    const inm = request.headers.get("if-none-match");
    if (inm && inm.split(",").some((t) => t.trim() === etag || t.trim() === "*" || t.trim() === `W/${etag}`)) return new Response(null, { status: 304, headers: base });
    const range = parseRange(request.headers.get("range"), size);
    if (range.kind === "unsatisfiable") return new Response(JSON.stringify({ error: `range not satisfiable: the object has ${size} bytes` }), { status: 416, headers: { "Content-Range": `bytes */${size}`, "Content-Type": "application/json" } });
    const head = request.method === "HEAD";
    const length = range.kind === "range" ? range.end - range.start + 1 : size;
    if (!head) await this.limits.chargeDownload(bucket.project_id, length);
    const slice = range.kind === "range" ? { start: range.start, end: range.end } : undefined;
    const headers = { ...base, "Content-Length": String(length), ...(slice ? { "Content-Range": `bytes ${slice.start}-${slice.end}/${size}` } : {}) };
    const status = slice ? 206 : 200;
    if (head || length === 0) return new Response(null, { status, headers });
    // A file goes out with sendfile; an S3 object as the S3 response's own stream (or, small, as bytes).
    const body = this.blobs.body ? await this.blobs.body(o.blob_key, slice) : await this.blobs.get(o.blob_key, slice);
    if (!body) throw new HttpError(500, { error: "the object's bytes are missing" });
    return new Response(body instanceof Blob || body instanceof ReadableStream ? body : (Readable.toWeb(body) as unknown as ReadableStream), { status, headers });
  }

  async delete(caller: StorageCaller, bucket: BucketRow, path: string): Promise<void> {
    const o = await this.get(bucket, path);
    await this.authorize(caller, "DELETE", candidateOf(o));
    const gone = await this.store.transaction(async (tx) => {
      const rows = await tx.query(`delete from storage_objects where id = $1 returning id`, [o.id]);
      if (rows.length) await addUsage(tx, o.project_id, -Number(o.size));
      return rows.length > 0;
    });
    if (!gone) throw notFound("object not found");
    this.writesSinceAnalyze++;
    await this.blobs.delete(o.blob_key);
  }

  /**
   * Names in order after an opaque cursor, under a prefix; for callers other than service keys only
   * the objects the SELECT policies allow (evaluated in the same query, so a page is never short for
   * policy reasons while more allowed objects follow).
   */
  async list(caller: StorageCaller, bucket: BucketRow, q: { prefix?: string; limit: number; cursor?: string }) {
    let after = "";
    if (q.cursor) {
      try {
        after = Buffer.from(q.cursor, "base64url").toString("utf8");
      } catch {
        throw badRequest("invalid request: query field 'cursor': not a cursor this API returned");
      }
      if (!after.startsWith("n:")) throw badRequest("invalid request: query field 'cursor': not a cursor this API returned");
      after = after.slice(2);
    }
    const prefix = q.prefix ?? "";
    const params: unknown[] = [bucket.id, after, q.limit + 1];
    let where = `bucket_id = $1 and name > $2`;
    if (prefix) {
      params.push(`${prefix.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
      where += ` and name like $${params.length}`;
    }
    const sql = (policy: string | null) => `select * from storage_objects where ${where}${policy ? ` and (is_public or (${policy}))` : ""} order by name limit $3`;
    let rows: ObjectRow[];
    if (caller.kind === "service") rows = await this.store.query<ObjectRow>(sql(null), params);
    else {
      const expr = await this.policies.expression(bucket.id, "SELECT");
      rows = expr ? await this.policies.asCaller(policyCaller(caller), (tx) => tx.query<ObjectRow>(sql(expr), params)) : await this.store.query<ObjectRow>(sql("false"), params);
    }
    const more = rows.length > q.limit;
    const page = rows.slice(0, q.limit);
    return { objects: page.map((o) => objectView(o)), next_cursor: more ? Buffer.from(`n:${page.at(-1)!.name}`).toString("base64url") : null };
  }

  async move(caller: StorageCaller, bucket: BucketRow, from: string, to: string): Promise<ObjectRow> {
    const src = await this.get(bucket, checkPath(from));
    checkPath(to);
    if (from === to) return src;
    await this.authorize(caller, "DELETE", candidateOf(src));
    await this.authorize(caller, "INSERT", { ...candidateOf(src), name: to });
    try {
      const [r] = await this.store.query<ObjectRow>(`update storage_objects set name = $2, updated_at = $3 where id = $1 returning *`, [src.id, to, this.clock.now().toISOString()]);
      if (!r) throw notFound("object not found");
      return r;
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`object '${to}' already exists`);
      throw err;
    }
  }

  async copy(caller: StorageCaller, bucket: BucketRow, from: string, to: string): Promise<ObjectRow> {
    const src = await this.get(bucket, checkPath(from));
    checkPath(to);
    if (await this.find(bucket, to)) throw conflict(`object '${to}' already exists`);
    await this.authorizeRead(caller, src);
    const owner = caller.kind === "user" ? caller.uid : null;
    await this.authorize(caller, "INSERT", { ...candidateOf(src), name: to, owner_id: owner, is_public: false });
    const limit = await this.limits.forUpload(bucket);
    if (Number(src.size) > limit.bytes) throw limit.error();
    const id = newId();
    const key = this.blobKey(bucket, id);
    await this.blobs.copy(src.blob_key, key);
    try {
      return await this.commit(bucket, null, { id, name: to, owner_id: owner, size: Number(src.size), mime_type: src.mime_type, etag: src.etag, metadata: src.metadata, blob_key: key }, this.clock.now().toISOString());
    } catch (err) {
      await this.blobs.delete(key).catch(() => {});
      throw err;
    }
  }

  async setVisibility(caller: StorageCaller, bucket: BucketRow, path: string, isPublic: boolean): Promise<ObjectRow> {
    const o = await this.get(bucket, path);
    if (caller.kind !== "service" && !(caller.kind === "user" && o.owner_id !== null && o.owner_id === caller.uid))
      throw forbidden("only the object's owner or a service key can change its visibility");
    const [r] = await this.store.query<ObjectRow>(`update storage_objects set is_public = $2, updated_at = $3 where id = $1 returning *`, [o.id, isPublic, this.clock.now().toISOString()]);
    return r!;
  }

  /** The management listing: every object of the project, newest first, with its bucket's name. */
  async adminList(projectId: string, q: { ownerId?: string; page: number; limit: number }) {
    const params: unknown[] = [projectId];
    let where = "o.project_id = $1";
    if (q.ownerId) {
      params.push(q.ownerId);
      where += ` and o.owner_id = $${params.length}`;
    }
    const [{ total }] = (await this.store.query(`select count(*)::int as total from storage_objects o where ${where}`, params)) as [{ total: number }];
    const rows = await this.store.query<ObjectRow & { bucket_name: string }>(
      `select o.*, b.name as bucket_name from storage_objects o join storage_buckets b on b.id = o.bucket_id where ${where} order by o.created_at desc, o.id desc limit ${q.limit} offset ${(q.page - 1) * q.limit}`,
      params,
    );
    return { data: rows.map((r) => objectView(r, r.bucket_name)), total };
  }

  async stats(projectId: string) {
    const [b] = (await this.store.query(`select count(*)::int as n from storage_buckets where project_id = $1`, [projectId])) as [{ n: number }];
    const [o] = (await this.store.query(`select count(*)::int as n, coalesce(sum(size), 0)::text as bytes from storage_objects where project_id = $1`, [projectId])) as [{ n: number; bytes: string }];
    return { bucket_count: b.n, object_count: o.n, total_size: Number(o.bytes) };
  }
}
