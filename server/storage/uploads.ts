import { Readable } from "node:stream";
import { BlobTooLarge, type BlobStore } from "../backends/blobs/blob-store";
import type { Clock } from "../clock";
import { badRequest, conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import type { Logger } from "../log";
import { isoTime, type ControlStore, type Row } from "../store/store";
import { mimeAllowed, type BucketRow } from "./buckets";
import type { StorageLimits } from "./limits";
import type { ObjectRow, ObjectsService, StorageCaller } from "./objects";

const MB = 1024 * 1024;
export const MIN_PART = 5 * MB;
export const MAX_PART = 25 * MB;
export const MAX_PARTS = 10_000;
export const SESSION_TTL_MS = 7 * 86_400_000;

/**
 * A part written in place into the session's file is recorded with this blob key: the file's key and
 * the offset, after a `:` (never in a blob key, so it can name no blob of its own).
 */
const inPlaceKey = (dataKey: string, offset: number) => `${dataKey}:${offset}`;
const isInPlace = (blobKey: string) => blobKey.includes(":");

interface SessionRow extends Row {
  id: string;
  project_id: string;
  bucket_id: string;
  path: string;
  content_type: string;
  total_size: string | number;
  part_size: string | number;
  total_parts: number;
  owner_id: string | null;
  created_by_service: boolean;
  metadata: Record<string, unknown>;
  upsert: boolean;
  expires_at: Date | string;
  created_at: Date | string;
}

/**
 * The part size a session uses: the requested one (default 25 MB) clamped into 5-25 MB, then raised
 * (up to 25 MB) until the object fits in 10,000 parts.
 */
export function partSizeFor(totalSize: number, requested?: number): number {
  let size = Math.min(MAX_PART, Math.max(MIN_PART, requested ?? MAX_PART));
  if (Math.ceil(totalSize / size) > MAX_PARTS) size = Math.min(MAX_PART, Math.ceil(totalSize / MAX_PARTS));
  return size;
}

/**
 * Resumable uploads: a session (subject to the INSERT policy and the size limits, like an upload),
 * parts in any order (each streamed to its own blob; a re-upload replaces it), then completion,
 * which checks every part and concatenates them into the object's blob without holding it in memory.
 * Sessions live in the control store and their parts in the blob store, so both outlive Kiln
 * restarts; only the creating user (or a service key) may continue one, whatever token they show.
 * Sessions older than 7 days are removed by a job on the platform clock.
 */
export class UploadsService {
  /** Parts (`<session>/<n>`) being written in place by a request of this process. */
  private readonly writingInPlace = new Set<string>();

  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly blobs: BlobStore,
    private readonly objects: ObjectsService,
    private readonly limits: StorageLimits,
    private readonly log: Logger,
  ) {}

  private partKey(s: Pick<SessionRow, "project_id" | "bucket_id" | "id">, n: number): string {
    return `${s.project_id}/${s.bucket_id}/uploads/${s.id}/${n}`;
  }

  /** The session's one file, where the blob store writes parts in place (`putAt`). */
  private dataKey(s: Pick<SessionRow, "project_id" | "bucket_id" | "id">): string {
    return `${s.project_id}/${s.bucket_id}/uploads/${s.id}/data`;
  }

  async create(caller: StorageCaller, bucket: BucketRow, path: string, body: { content_type: string; total_size: number; part_size?: number; metadata?: Record<string, unknown>; upsert?: boolean }) {
    if (!mimeAllowed(bucket.allowed_mime_types, body.content_type)) throw badRequest(`invalid MIME type '${body.content_type}': this bucket allows ${bucket.allowed_mime_types.join(", ")}`);
    const partSize = partSizeFor(body.total_size, body.part_size);
    const totalParts = Math.max(1, Math.ceil(body.total_size / partSize));
    if (totalParts > MAX_PARTS) throw badRequest(`invalid request: total_size: at most ${MAX_PARTS} parts of ${MAX_PART} bytes`);
    const existing = await this.objects.find(bucket, path);
    if (existing && !body.upsert) throw conflict(`object '${path}' already exists (send upsert: true to replace it)`);
    const limit = await this.limits.forUpload(bucket, existing ? Number(existing.size) : 0);
    if (body.total_size > limit.bytes) throw limit.error();
    const owner = caller.kind === "user" ? caller.uid : null;
    await this.objects.authorize(caller, existing ? "UPDATE" : "INSERT", {
      bucket_id: bucket.id,
      name: path,
      owner_id: existing ? existing.owner_id : owner,
      size: body.total_size,
      mime_type: body.content_type,
      is_public: existing?.is_public ?? false,
      metadata: body.metadata ?? {},
    });
    const now = this.clock.nowMs();
    const [r] = await this.store.query<SessionRow>(
      `insert into storage_upload_sessions (id, project_id, bucket_id, path, content_type, total_size, part_size, total_parts, owner_id, created_by_service, metadata, upsert, expires_at, created_at)
       values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text::jsonb, $12, $13, $14) returning *`,
      [newId(), bucket.project_id, bucket.id, path, body.content_type, body.total_size, partSize, totalParts, owner, caller.kind === "service", JSON.stringify(body.metadata ?? {}), body.upsert ?? false, new Date(now + SESSION_TTL_MS).toISOString(), new Date(now).toISOString()],
    );
    return { session_id: r!.id, part_size: partSize, total_parts: totalParts, expires_at: isoTime(r!.expires_at) };
  }

  /** The caller's session on this path: 404 when absent, aborted, expired or elsewhere; 403 for someone else's. */
  private async session(caller: StorageCaller, bucket: BucketRow, path: string, id: string | null): Promise<SessionRow> {
    if (!id) throw badRequest("the X-Upload-Session header is required");
    const [s] = await this.store.query<SessionRow>(`select * from storage_upload_sessions where id = $1 and bucket_id = $2 and path = $3`, [id, bucket.id, path]);
    if (!s || new Date(s.expires_at).getTime() <= this.clock.nowMs()) throw notFound("upload session not found");
    if (caller.kind === "service") return s;
    const mine = s.owner_id !== null ? caller.kind === "user" && caller.uid === s.owner_id : caller.kind === "anon" && !s.created_by_service;
    if (!mine) throw forbidden("only the user who started this upload (or a service key) can continue it");
    return s;
  }

  async status(caller: StorageCaller, bucket: BucketRow, path: string, id: string | null) {
    const s = await this.session(caller, bucket, path, id);
    const parts = await this.store.query(`select part_number, etag, size::text as size from storage_upload_parts where session_id = $1 order by part_number`, [s.id]);
    const bytes = parts.reduce((n, p) => n + Number(p.size), 0);
    return {
      session_id: s.id,
      status: "uploading" as const,
      path: s.path,
      content_type: s.content_type,
      total_size: Number(s.total_size),
      part_size: Number(s.part_size),
      total_parts: s.total_parts,
      parts_uploaded: parts.length,
      bytes_uploaded: bytes,
      parts: parts.map((p) => ({ part_number: p.part_number as number, etag: p.etag as string, size: Number(p.size) })),
      expires_at: isoTime(s.expires_at),
      created_at: isoTime(s.created_at),
    };
  }

  /** The size part `n` must have: `part_size`, except the last, which holds the rest. */
  private expectedSize(s: SessionRow, n: number): number {
    const partSize = Number(s.part_size);
    return n < s.total_parts ? partSize : Number(s.total_size) - partSize * (s.total_parts - 1);
  }

  async putPart(caller: StorageCaller, bucket: BucketRow, path: string, id: string | null, partHeader: string | null, request: Request) {
    const s = await this.session(caller, bucket, path, id);
    if (!partHeader || !/^\d{1,5}$/.test(partHeader)) throw badRequest("the X-Part-Number header must be a part number from 1");
    const n = Number(partHeader);
    if (n < 1 || n > s.total_parts) throw badRequest(`X-Part-Number ${n} is out of range: this upload has parts 1-${s.total_parts}`);
    const expected = this.expectedSize(s, n);
    const declared = Number(request.headers.get("content-length") ?? NaN);
    if (Number.isFinite(declared) && declared !== expected) throw badRequest(`part ${n} must be ${expected} bytes (it is ${declared})`);
    if (!request.body && expected > 0) throw badRequest(`part ${n} must be ${expected} bytes (it is empty)`);
    const body = request.body ?? Readable.from([]);
    // Where the blob store can (files), a part's first accepted upload goes straight into the
    // session's one file at its offset (completion is then a link, not a copy): only while no row
    // holds the part (bytes accepted there are never written over) and no other request of this
    // process writes it. Kiln alone writes the files of its data dir. Any other upload of a part
    // gets a blob of its own and replaces the part only once it is whole.
    const claim = `${s.id}/${n}`;
    let inPlace = false;
    if (this.blobs.putAt && !this.writingInPlace.has(claim)) {
      this.writingInPlace.add(claim);
      const [had] = await this.store.query(`select 1 from storage_upload_parts where session_id = $1 and part_number = $2`, [s.id, n]);
      if (had) this.writingInPlace.delete(claim);
      else inPlace = true;
    }
    try {
      const key = inPlace ? inPlaceKey(this.dataKey(s), (n - 1) * Number(s.part_size)) : `${this.partKey(s, n)}.${newId()}`;
      let put: { size: number; md5: string };
      try {
        put = inPlace ? await this.blobs.putAt!(this.dataKey(s), (n - 1) * Number(s.part_size), body, { maxBytes: expected }) : await this.blobs.put(key, body, { maxBytes: expected });
      } catch (err) {
        if (err instanceof BlobTooLarge) throw badRequest(`part ${n} must be ${expected} bytes (more arrived)`);
        throw err;
      }
      const dropNew = () => (inPlace ? Promise.resolve() : this.blobs.delete(key));
      if (put.size !== expected) {
        await dropNew();
        throw badRequest(`part ${n} must be ${expected} bytes (it is ${put.size})`);
      }
      const [old] = await this.store.query<{ blob_key: string }>(`select blob_key from storage_upload_parts where session_id = $1 and part_number = $2`, [s.id, n]);
      const written = await this.store.query(
        `insert into storage_upload_parts (session_id, part_number, size, etag, blob_key, uploaded_at) select $1, $2, $3, $4, $5, $6
          where exists (select 1 from storage_upload_sessions where id = $1)
         on conflict (session_id, part_number) do update set size = excluded.size, etag = excluded.etag, blob_key = excluded.blob_key, uploaded_at = excluded.uploaded_at returning session_id`,
        [s.id, n, put.size, put.md5, key, this.clock.now().toISOString()],
      );
      if (!written.length) {
        await dropNew();
        throw notFound("upload session not found");
      }
      if (old && old.blob_key !== key && !isInPlace(old.blob_key)) await this.blobs.delete(old.blob_key).catch(() => {});
      return { part_number: n, etag: put.md5, size: put.size };
    } finally {
      // Held until the row is written: from then on the row keeps others out of the range.
      if (inPlace) this.writingInPlace.delete(claim);
    }
  }

  /** Every part present with its size: the parts become the object (ETag as S3 gives multipart objects). */
  async complete(caller: StorageCaller, bucket: BucketRow, path: string, id: string | null): Promise<ObjectRow> {
    const s = await this.session(caller, bucket, path, id);
    const parts = await this.store.query<{ part_number: number; size: string; etag: string; blob_key: string }>(
      `select part_number, size::text as size, etag, blob_key from storage_upload_parts where session_id = $1 order by part_number`,
      [s.id],
    );
    const have = new Set(parts.map((p) => p.part_number));
    const missing: number[] = [];
    for (let n = 1; n <= s.total_parts && missing.length < 10; n++) if (!have.has(n)) missing.push(n);
    if (missing.length) throw badRequest(`the upload is not complete: part${missing.length > 1 ? "s" : ""} ${missing.join(", ")}${missing.length === 10 ? ", ..." : ""} missing`);
    for (const p of parts) if (Number(p.size) !== this.expectedSize(s, p.part_number)) throw badRequest(`part ${p.part_number} has ${p.size} bytes, not ${this.expectedSize(s, p.part_number)}`);
    const existing = await this.objects.find(bucket, s.path);
    if (existing && !s.upsert) throw conflict(`object '${s.path}' already exists`);
    const limit = await this.limits.forUpload(bucket, existing ? Number(existing.size) : 0);
    if (Number(s.total_size) > limit.bytes) throw limit.error();
    const objectId = existing?.id ?? newId();
    const key = this.objects.blobKey(bucket, objectId);
    const partSize = Number(s.part_size);
    const { size } =
      this.blobs.finishAt && parts.some((p) => isInPlace(p.blob_key))
        ? await this.blobs.finishAt(
            this.dataKey(s),
            key,
            Number(s.total_size),
            parts.filter((p) => !isInPlace(p.blob_key)).map((p) => ({ key: p.blob_key, offset: (p.part_number - 1) * partSize })),
          )
        : await this.blobs.assemble(key, parts.map((p) => p.blob_key), { contentType: s.content_type });
    if (size !== Number(s.total_size)) {
      await this.blobs.delete(key);
      throw new HttpError(500, { error: `assembled ${size} bytes, expected ${s.total_size}` });
    }
    const etag = `${(await import("node:crypto")).createHash("md5").update(Buffer.from(parts.map((p) => p.etag).join(""), "hex")).digest("hex")}-${parts.length}`;
    let row: ObjectRow;
    try {
      row = await this.objects.commit(bucket, existing, { id: objectId, name: s.path, owner_id: existing ? existing.owner_id : s.owner_id, size, mime_type: s.content_type, etag, metadata: s.metadata, blob_key: key }, this.clock.now().toISOString());
    } catch (err) {
      await this.blobs.delete(key).catch(() => {});
      throw err;
    }
    await this.discard(s);
    return row;
  }

  async abort(caller: StorageCaller, bucket: BucketRow, path: string, id: string | null): Promise<void> {
    await this.discard(await this.session(caller, bucket, path, id));
  }

  private async discard(s: Pick<SessionRow, "id" | "project_id" | "bucket_id">): Promise<void> {
    await this.store.query(`delete from storage_upload_sessions where id = $1`, [s.id]);
    await this.blobs.deletePrefix(`${s.project_id}/${s.bucket_id}/uploads/${s.id}/`);
  }

  /** The cleanup job: sessions past their 7 days go, parts and all. */
  async removeExpired(): Promise<number> {
    const rows = await this.store.query<{ id: string; project_id: string; bucket_id: string }>(`select id, project_id, bucket_id from storage_upload_sessions where expires_at <= $1 limit 1000`, [
      this.clock.now().toISOString(),
    ]);
    for (const s of rows) await this.discard(s).catch((e) => this.log.error(`removing expired upload session ${s.id} failed`, e));
    return rows.length;
  }
}
