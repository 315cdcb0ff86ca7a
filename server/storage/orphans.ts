import type { BlobStore } from "../backends/blobs/blob-store";
import type { ControlStore } from "../store/store";

/**
 * Blobs younger than this are never swept (default 24 h; `KILN_STORAGE_ORPHAN_GRACE_MS`). Every
 * write makes a fresh key, and its row (object or upload part) is committed right after the bytes
 * are durable; the grace period covers that gap with a wide margin: an S3 object made by a multipart
 * upload carries the time the upload began as its LastModified, so a slow upload's blob looks as old
 * as the upload is long; clocks of instances and the S3 server may also disagree by minutes.
 */
export const ORPHAN_GRACE_MS = 24 * 3_600_000;
/** Keys checked against the control store per query. */
const BATCH = 500;

export interface OrphanSweep {
  /** Blobs removed: no object row or live upload session refers to them. */
  removed: number;
  /** Blobs looked at. */
  seen: number;
  /** Unfinished S3 multipart uploads aborted. */
  aborted: number;
}

/**
 * Removes blobs that a crash or an interrupted request left behind: bytes durable under a key whose
 * row never got committed (a kill -9 between the two), a replaced or deleted object's bytes whose
 * removal after the commit was cut short, a bucket's or session's files whose removal after its rows
 * went was cut short. Kiln's keys have two shapes (`ObjectsService.blobKey`, `UploadsService`):
 *
 *   <project>/<bucket>/<object id>.<version>            referenced by storage_objects.blob_key
 *   <project>/<bucket>/uploads/<session>/<part or data> kept while the session's row exists
 *
 * Only blobs older than `graceMs` (by their own timestamp against this machine's clock), of a
 * project this control store knows (so a store sharing the bucket and prefix by mistake never loses
 * another deployment's objects), and of one of these shapes are candidates. A key is never referenced
 * anew long after its bytes were written (keys are never reused), so a candidate found unreferenced
 * stays unreferenced: the sweep is safe while uploads go on, here and on other instances.
 */
export async function sweepOrphanBlobs(d: {
  store: ControlStore;
  blobs: BlobStore;
  graceMs: number;
  /** Epoch ms on the machine's clock (blob timestamps are on it, not on the platform clock). */
  now?: number;
  /** Polled between batches: the sweep ends early when Kiln stops. */
  stopped?: () => boolean;
}): Promise<OrphanSweep> {
  const cutoff = (d.now ?? Date.now()) - d.graceMs;
  const out: OrphanSweep = { removed: 0, seen: 0, aborted: 0 };
  let batch: string[] = [];
  const check = async () => {
    const keys = batch;
    batch = [];
    for (const key of await unreferenced(d.store, keys)) {
      await d.blobs.delete(key);
      out.removed++;
    }
  };
  for await (const b of d.blobs.list()) {
    if (++out.seen % 1000 === 0 && d.stopped?.()) return out;
    if (!(b.modifiedMs < cutoff) || !shapeOf(b.key)) continue;
    batch.push(b.key);
    if (batch.length >= BATCH) {
      await check();
      if (d.stopped?.()) return out;
    }
  }
  if (batch.length) await check();
  if (d.blobs.abortStaleUploads && !d.stopped?.()) out.aborted = await d.blobs.abortStaleUploads(cutoff);
  return out;
}

type Shape = { kind: "object"; project: string } | { kind: "session"; project: string; session: string };

function shapeOf(key: string): Shape | null {
  const p = key.split("/");
  if (p.length === 3 && p[2]!.includes(".")) return { kind: "object", project: p[0]! };
  if (p.length === 5 && p[2] === "uploads") return { kind: "session", project: p[0]!, session: p[3]! };
  return null;
}

/** Of `keys` (all of a known shape), those of a known project that no row refers to. */
async function unreferenced(store: ControlStore, keys: string[]): Promise<string[]> {
  const shapes = new Map(keys.map((k) => [k, shapeOf(k)!]));
  const projects = [...new Set([...shapes.values()].map((s) => s.project))];
  const sessions = [...new Set([...shapes.values()].flatMap((s) => (s.kind === "session" ? [s.session] : [])))];
  const objectKeys = keys.filter((k) => shapes.get(k)!.kind === "object");
  const known = new Set((await store.query<{ id: string }>(`select id from projects where id = any($1::text[])`, [projects])).map((r) => r.id));
  const live = sessions.length ? new Set((await store.query<{ id: string }>(`select id from storage_upload_sessions where id = any($1::text[])`, [sessions])).map((r) => r.id)) : new Set<string>();
  const held = objectKeys.length
    ? new Set((await store.query<{ blob_key: string }>(`select blob_key from storage_objects where blob_key = any($1::text[])`, [objectKeys])).map((r) => r.blob_key))
    : new Set<string>();
  return keys.filter((k) => {
    const s = shapes.get(k)!;
    if (!known.has(s.project)) return false;
    return s.kind === "object" ? !held.has(k) : !live.has(s.session);
  });
}
