import * as z from "zod";
import { errorSchema, timestamp } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { Restored, Snapshots } from "../snapshots/controller";

const snapshotSchema = z.object({ name: z.string(), created_at: timestamp, size_bytes: z.number().int() });
const restoredSchema = z.object({ name: z.string(), restored_at: timestamp });
const nameParams = z.object({ name: z.string() });

export interface SnapshotRouteDeps {
  snapshots: Snapshots;
}

/** The body the spec gives; how the restore went in `Kiln-Restore` (docs/testing.md). */
const restoredReply = (r: Restored) => reply.ok({ name: r.name, restored_at: r.restored_at }, { "Kiln-Restore": r.how });

const view = (m: { name: string; created_at: string; size_bytes: number }) => ({ name: m.name, created_at: m.created_at, size_bytes: m.size_bytes });

/**
 * Snapshots of the whole platform and reset to the seed (docs/testing.md). Platform token only: a
 * restore puts back every account's state. The production profile answers 400 (its state lives on
 * servers Kiln cannot copy as one).
 */
export function snapshotRoutes(r: AreaRouter<SnapshotRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/_kiln/snapshots",
    tag: "Testing",
    summary: "Take a snapshot of the whole platform: control store, databases and branches, objects, logs, locks, schedulers, durable executions, the clock",
    auth: { kind: "account" },
    body: z.object({ name: z.string().describe("1-63 letters, digits, '.', '_' or '-', starting with a letter or digit; 'seed' and 'start' are Kiln's own") }),
    responses: { 201: { description: "snapshot", schema: snapshotSchema }, 400: errorSchema, 401: errorSchema, 409: errorSchema },
    handler: async ({ deps, body }) => reply.created(view(await deps.snapshots.save(body.name))),
  });
  r.add({
    method: "GET",
    path: "/_kiln/snapshots",
    tag: "Testing",
    summary: "List snapshots, oldest first",
    auth: { kind: "account" },
    responses: { 200: { description: "snapshots", schema: z.object({ data: z.array(snapshotSchema) }) }, 400: errorSchema, 401: errorSchema },
    handler: ({ deps }) => reply.ok({ data: deps.snapshots.list().map(view) }),
  });
  r.add({
    method: "POST",
    path: "/_kiln/snapshots/{name}/restore",
    tag: "Testing",
    summary: "Put the whole platform back to a snapshot; answers once everything is back (requests meanwhile wait, or get 503 with Retry-After)",
    auth: { kind: "account" },
    params: nameParams,
    responses: { 200: { description: "restored", schema: restoredSchema }, 400: errorSchema, 401: errorSchema, 404: errorSchema, 409: errorSchema },
    handler: async ({ deps, params }) => restoredReply(await deps.snapshots.restore(params.name)),
  });
  r.add({
    method: "DELETE",
    path: "/_kiln/snapshots/{name}",
    tag: "Testing",
    summary: "Delete a snapshot",
    auth: { kind: "account" },
    params: nameParams,
    responses: { 204: { description: "deleted" }, 400: errorSchema, 401: errorSchema, 404: errorSchema },
    handler: async ({ deps, params }) => {
      await deps.snapshots.delete(params.name);
      return reply.noContent();
    },
  });
  r.add({
    method: "POST",
    path: "/_kiln/reset",
    tag: "Testing",
    summary: "Put the whole platform back to the state right after start (--resettable): the snapshot 'start'",
    auth: { kind: "account" },
    responses: { 200: { description: "restored", schema: restoredSchema }, 400: errorSchema, 401: errorSchema, 409: errorSchema },
    handler: async ({ deps }) => restoredReply(await deps.snapshots.reset()),
  });
}
