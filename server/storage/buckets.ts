import type { Clock } from "../clock";
import { badRequest, conflict, notFound } from "../http/errors";
import { newId } from "../ids";
import { isoTime, isUniqueViolation, type ControlStore, type Row } from "../store/store";
import type { BlobStore } from "../backends/blobs/blob-store";

export interface BucketRow extends Row {
  id: string;
  project_id: string;
  name: string;
  file_size_limit: string | number | null;
  allowed_mime_types: string[];
  created_at: Date | string;
  updated_at: Date | string;
}

/** Bucket names that would shadow a fixed storage route (`/storage/buckets/{id}/policies`). */
const RESERVED = new Set(["buckets"]);

export function bucketView(b: BucketRow) {
  return {
    id: b.id,
    name: b.name,
    project_id: b.project_id,
    file_size_limit: b.file_size_limit === null ? null : Number(b.file_size_limit),
    allowed_mime_types: b.allowed_mime_types,
    created_at: isoTime(b.created_at),
    updated_at: isoTime(b.updated_at),
  };
}

export function checkBucketName(name: string): void {
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) throw badRequest("invalid request: body field 'name': 1-64 letters, digits, '-' or '_'");
  if (RESERVED.has(name)) throw badRequest(`invalid request: body field 'name': '${name}' is reserved (it is a storage route)`);
}

/** `image/png` matches `image/png`, `image/*` and `*\/*`; an empty list allows every type. */
export function mimeAllowed(allowed: readonly string[], mime: string): boolean {
  if (!allowed.length) return true;
  const [type] = mime.toLowerCase().split(";")[0]!.trim().split("/");
  const m = mime.toLowerCase().split(";")[0]!.trim();
  return allowed.some((a) => {
    const x = a.toLowerCase();
    return x === m || x === "*/*" || (x.endsWith("/*") && x.slice(0, -2) === type);
  });
}

export class BucketsService {
  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly blobs: BlobStore,
  ) {}

  async create(projectId: string, body: { name: string; file_size_limit?: number | null; allowed_mime_types?: string[] }): Promise<BucketRow> {
    checkBucketName(body.name);
    const at = this.clock.now().toISOString();
    try {
      const [r] = await this.store.query<BucketRow>(
        `insert into storage_buckets (id, project_id, name, file_size_limit, allowed_mime_types, created_at, updated_at) values ($1, $2, $3, $4, $5::text::jsonb, $6, $6) returning *`,
        [newId(), projectId, body.name, body.file_size_limit ?? null, JSON.stringify(body.allowed_mime_types ?? []), at],
      );
      return r!;
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`bucket '${body.name}' already exists`);
      throw err;
    }
  }

  list(projectId: string): Promise<BucketRow[]> {
    return this.store.query<BucketRow>(`select * from storage_buckets where project_id = $1 order by name`, [projectId]);
  }

  async byName(projectId: string, name: string): Promise<BucketRow> {
    const [r] = await this.store.query<BucketRow>(`select * from storage_buckets where project_id = $1 and name = $2`, [projectId, name]);
    if (!r) throw notFound("bucket not found");
    return r;
  }

  async byId(projectId: string, id: string): Promise<BucketRow> {
    const [r] = await this.store.query<BucketRow>(`select * from storage_buckets where project_id = $1 and id = $2`, [projectId, id]);
    if (!r) throw notFound("bucket not found");
    return r;
  }

  async update(projectId: string, name: string, patch: { file_size_limit?: number | null; allowed_mime_types?: string[] }): Promise<BucketRow> {
    const cur = await this.byName(projectId, name);
    const [r] = await this.store.query<BucketRow>(
      `update storage_buckets set file_size_limit = $2, allowed_mime_types = $3::text::jsonb, updated_at = $4 where id = $1 returning *`,
      [
        cur.id,
        patch.file_size_limit === undefined ? cur.file_size_limit : patch.file_size_limit,
        JSON.stringify(patch.allowed_mime_types ?? cur.allowed_mime_types),
        this.clock.now().toISOString(),
      ],
    );
    return r!;
  }

  /** The bucket, its objects (rows, then bytes), policies and upload sessions. */
  async delete(projectId: string, name: string): Promise<void> {
    const b = await this.byName(projectId, name);
    await this.store.transaction(async (tx) => {
      // The bucket's objects leave the project's running total with it (their rows go by cascade).
      const [{ bytes }] = (await tx.query(`select coalesce(sum(size), 0)::text as bytes from storage_objects where bucket_id = $1`, [b.id])) as [{ bytes: string }];
      await tx.query(`delete from storage_buckets where id = $1`, [b.id]);
      await tx.query(`update storage_project_usage set bytes = bytes - $2 where project_id = $1`, [projectId, Number(bytes)]);
    });
    await this.blobs.deletePrefix(`${projectId}/${b.id}/`);
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from storage_buckets where project_id = $1`, [projectId]);
    await this.store.query(`delete from storage_bandwidth where project_id = $1`, [projectId]);
    await this.store.query(`delete from storage_project_usage where project_id = $1`, [projectId]);
    await this.blobs.deletePrefix(`${projectId}/`);
  }
}
