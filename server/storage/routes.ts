import type { ApplicationPrincipal, AuthRule } from "../auth/principal";
import type { Config } from "../config";
import { jsonBodyLimit, readJsonBody } from "../http/body";
import { errorSchema } from "../http/common-schemas";
import { badRequest } from "../http/errors";
import { parseInput, reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { bucketView, type BucketRow, type BucketsService } from "./buckets";
import { checkPath, INVALID_PATH, objectView, type ObjectsService, type StorageCaller } from "./objects";
import type { PoliciesService } from "./policies";
import {
  adminObjectListSchema,
  adminObjectsQuery,
  bucketListSchema,
  bucketOnlyParams,
  bucketParams,
  bucketSchema,
  createBucketBody,
  createPolicyBody,
  createSessionBody,
  listObjectsQuery,
  messageSchema,
  moveBody,
  objectListSchema,
  objectParams,
  objectSchema,
  partSchema,
  patchBucketBody,
  policyItemParams,
  policyListSchema,
  policyParams,
  policySchema,
  sessionCreatedSchema,
  sessionSchema,
  statsSchema,
  visibilityBody,
} from "./schemas";
import type { UploadsService } from "./uploads";

export interface StorageRouteDeps {
  config: Config;
  buckets: BucketsService;
  storageObjects: ObjectsService;
  storagePolicies: PoliciesService;
  uploads: UploadsService;
}

const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const read = { kind: "project", access: "read" } as const;
const write = { kind: "project", access: "write" } as const;
/** Objects: an end-user token or the anon key (policies apply), or a service key with the full service role (no policies). */
const OBJECTS = {
  kind: "application",
  fullServiceRole: true,
  unauthenticated: "storage requests need an end-user access token, the anon key or a service key",
  refused: "storage objects need an end-user access token, the anon key or a service key; platform and project tokens manage buckets under /projects/{projectId}/storage",
} as const satisfies AuthRule;
/** Policies: service keys only. */
const POLICIES = { kind: "application", serviceKeysOnly: true, fullServiceRole: true, refused: "storage policies are managed with a service key" } as const satisfies AuthRule;

function callerOf(p: ApplicationPrincipal): StorageCaller {
  if (p.kind === "service_key") return { kind: "service", projectId: p.projectId };
  if (p.kind === "user") return { kind: "user", projectId: p.projectId, uid: p.userId, email: p.email };
  return { kind: "anon", projectId: p.projectId };
}

/** The spec's management table: buckets, the admin object listing and stats (platform or project token). */
export function bucketRoutes(r: AreaRouter<StorageRouteDeps>): void {
  const tag = "Storage buckets";
  r.add({
    method: "POST",
    path: "/projects/{projectId}/storage/buckets",
    tag,
    summary: "Create a bucket: name (1-64 letters, digits, - and _), file_size_limit (bytes, null = unlimited), allowed_mime_types (wildcards such as image/*)",
    auth: write,
    params: projectIdParams,
    body: createBucketBody,
    responses: { 201: { description: "bucket", schema: bucketSchema }, ...errors },
    handler: async ({ deps, project, body }) => reply.created(bucketView(await deps.buckets.create(project.id, body))),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/storage/buckets",
    tag,
    summary: "List buckets",
    auth: read,
    params: projectIdParams,
    responses: { 200: { description: "buckets", schema: bucketListSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok({ buckets: (await deps.buckets.list(project.id)).map(bucketView) }),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/storage/buckets/{bucketName}",
    tag,
    summary: "Get a bucket",
    auth: read,
    params: bucketParams,
    responses: { 200: { description: "bucket", schema: bucketSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(bucketView(await deps.buckets.byName(project.id, params.bucketName))),
  });
  r.add({
    method: "PATCH",
    path: "/projects/{projectId}/storage/buckets/{bucketName}",
    tag,
    summary: "Change a bucket's file_size_limit and allowed_mime_types",
    auth: write,
    params: bucketParams,
    body: patchBucketBody,
    responses: { 200: { description: "bucket", schema: bucketSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => reply.ok(bucketView(await deps.buckets.update(project.id, params.bucketName, body))),
  });
  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/storage/buckets/{bucketName}",
    tag,
    summary: "Delete a bucket with every object, policy and upload session in it",
    auth: write,
    params: bucketParams,
    responses: { 200: { description: "deleted", schema: messageSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      await deps.buckets.delete(project.id, params.bucketName);
      return reply.ok({ message: `bucket '${params.bucketName}' deleted` });
    },
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/storage/objects",
    tag,
    summary: "Every object of the project, newest first, with its bucket_name (filter owner_id; page, limit 50, at most 100)",
    auth: read,
    params: projectIdParams,
    query: adminObjectsQuery,
    responses: { 200: { description: "objects", schema: adminObjectListSchema }, ...errors },
    handler: async ({ deps, project, query }) => {
      const page = query.page ?? 1;
      const limit = query.limit ?? 50;
      const res = await deps.storageObjects.adminList(project.id, { ownerId: query.owner_id, page, limit });
      return reply.ok({ data: res.data, page, limit, total: res.total, has_more: page * limit < res.total });
    },
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/storage/stats",
    tag,
    summary: "bucket_count, object_count and total_size (bytes)",
    auth: read,
    params: projectIdParams,
    responses: { 200: { description: "stats", schema: statsSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok(await deps.storageObjects.stats(project.id)),
  });
}

export function policyRoutes(r: AreaRouter<StorageRouteDeps>): void {
  const tag = "Storage policies";
  const bucketOf = (deps: StorageRouteDeps, projectId: string, id: string) => deps.buckets.byId(projectId, id);
  r.add({
    method: "POST",
    path: "/storage/buckets/{bucketId}/policies",
    tag,
    summary: "Create a policy: name (unique per bucket), operation (SELECT, INSERT, UPDATE, DELETE), definition (a SQL boolean expression over bucket_id, name, owner_id, size, mime_type, is_public, metadata with auth.uid(), auth.role(), auth.email(), storage.foldername(name), storage.filename(name), storage.extension(name))",
    auth: POLICIES,
    params: policyParams,
    body: createPolicyBody,
    responses: { 201: { description: "policy", schema: policySchema }, ...errors },
    handler: async ({ deps, principal, params, body }) => {
      const b = await bucketOf(deps, principal.projectId, params.bucketId);
      return reply.created(await deps.storagePolicies.create(principal.projectId, b.id, body));
    },
  });
  r.add({
    method: "GET",
    path: "/storage/buckets/{bucketId}/policies",
    tag,
    summary: "List a bucket's policies",
    auth: POLICIES,
    params: policyParams,
    responses: { 200: { description: "policies", schema: policyListSchema }, ...errors },
    handler: async ({ deps, principal, params }) => reply.ok({ policies: await deps.storagePolicies.list((await bucketOf(deps, principal.projectId, params.bucketId)).id) }),
  });
  r.add({
    method: "DELETE",
    path: "/storage/buckets/{bucketId}/policies/{policyId}",
    tag,
    summary: "Delete a policy",
    auth: POLICIES,
    params: policyItemParams,
    responses: { 200: { description: "deleted", schema: messageSchema }, ...errors },
    handler: async ({ deps, principal, params }) => {
      await deps.storagePolicies.delete((await bucketOf(deps, principal.projectId, params.bucketId)).id, params.policyId);
      return reply.ok({ message: "policy deleted" });
    },
  });
}

export function objectRoutes(r: AreaRouter<StorageRouteDeps>): void {
  const tag = "Storage objects";
  const objErrors = { ...errors, 413: errorSchema, 429: errorSchema };
  const target = async (deps: StorageRouteDeps, caller: StorageCaller, bucketName: string, path?: string): Promise<{ bucket: BucketRow; path: string }> => {
    const bucket = await deps.buckets.byName(caller.projectId, bucketName);
    return { bucket, path: path === undefined ? "" : checkPath(path) };
  };
  const json = async (deps: StorageRouteDeps, request: Request) => readJsonBody(request, jsonBodyLimit(deps.config), deps.config.maxJsonDepth);

  r.add({
    method: "GET",
    path: "/storage/{bucketName}",
    tag,
    summary: "List objects by name: prefix, limit (50, at most 1000), cursor; only those the caller may read",
    auth: OBJECTS,
    params: bucketOnlyParams,
    query: listObjectsQuery,
    responses: { 200: { description: "objects", schema: objectListSchema }, ...objErrors },
    handler: async ({ deps, principal, params, query }) => {
      const caller = callerOf(principal);
      const { bucket } = await target(deps, caller, params.bucketName);
      return reply.ok(await deps.storageObjects.list(caller, bucket, { prefix: query.prefix, limit: query.limit ?? 50, cursor: query.cursor }));
    },
  });

  for (const op of ["move", "copy"] as const) {
    r.add({
      method: "POST",
      path: `/storage/{bucketName}/${op}`,
      tag,
      summary: op === "move" ? "Rename an object: {from, to}; needs DELETE on the source and INSERT on the destination" : "Copy an object: {from, to}; needs SELECT on the source and INSERT on the destination",
      auth: OBJECTS,
      params: bucketOnlyParams,
      body: moveBody,
      responses: { [op === "move" ? 200 : 201]: { description: "the object", schema: objectSchema }, ...objErrors },
      handler: async ({ deps, principal, params, body }) => {
        const caller = callerOf(principal);
        const { bucket } = await target(deps, caller, params.bucketName);
        if (op === "move") return reply.ok(objectView(await deps.storageObjects.move(caller, bucket, body.from, body.to)));
        return reply.created(objectView(await deps.storageObjects.copy(caller, bucket, body.from, body.to)));
      },
    });
  }

  r.add({
    method: "POST",
    path: "/storage/{bucketName}/{path+}",
    tag,
    summary:
      "Upload (multipart/form-data: file, metadata JSON of at most 50 keys / 10KB; x-upsert: true replaces), start a resumable upload (application/json: content_type, total_size, part_size?), or complete one (X-Upload-Session with X-Upload-Complete: true)",
    auth: OBJECTS,
    params: objectParams,
    invalidParam: { path: INVALID_PATH },
    responses: {
      200: { description: "completed resumable upload: the object", schema: objectSchema },
      201: { description: "uploaded object, or a new upload session", schema: objectSchema.or(sessionCreatedSchema) },
      ...objErrors,
    },
    handler: async ({ deps, principal, params, request }) => {
      const caller = callerOf(principal);
      const { bucket, path } = await target(deps, caller, params.bucketName, params.path);
      const session = request.headers.get("x-upload-session");
      if (session || request.headers.get("x-upload-complete")) {
        if (request.headers.get("x-upload-complete")?.toLowerCase() !== "true") throw badRequest("complete a resumable upload with X-Upload-Session and X-Upload-Complete: true");
        return reply.ok(objectView(await deps.uploads.complete(caller, bucket, path, session)));
      }
      if (/^application\/json/i.test(request.headers.get("content-type") ?? "")) {
        const body = parseInput(createSessionBody, await json(deps, request), "body");
        return reply.created(await deps.uploads.create(caller, bucket, path, body));
      }
      const upsert = request.headers.get("x-upsert")?.toLowerCase() === "true";
      const { object } = await deps.storageObjects.upload(caller, bucket, path, request, { upsert });
      return reply.created(objectView(object));
    },
  });

  r.add({
    method: "PUT",
    path: "/storage/{bucketName}/{path+}",
    tag,
    summary: "Upload one part of a resumable upload: X-Upload-Session, X-Part-Number (from 1), application/octet-stream body (every part but the last is part_size bytes)",
    auth: OBJECTS,
    params: objectParams,
    invalidParam: { path: INVALID_PATH },
    responses: { 200: { description: "part", schema: partSchema }, ...objErrors },
    handler: async ({ deps, principal, params, request }) => {
      const caller = callerOf(principal);
      const { bucket, path } = await target(deps, caller, params.bucketName, params.path);
      return reply.ok(await deps.uploads.putPart(caller, bucket, path, request.headers.get("x-upload-session"), request.headers.get("x-part-number"), request));
    },
  });

  r.add({
    method: "GET",
    path: "/storage/{bucketName}/{path+}",
    tag,
    summary: "Download (Range: bytes=a-b, a- or -n gives 206; If-None-Match gives 304), or with X-Upload-Session the status of a resumable upload",
    auth: OBJECTS,
    alsoHead: true,
    params: objectParams,
    invalidParam: { path: INVALID_PATH },
    responses: {
      200: { description: "the bytes, or the upload session", schema: sessionSchema, contentType: "application/octet-stream" },
      206: { description: "a range of the bytes", contentType: "application/octet-stream" },
      304: { description: "unchanged (If-None-Match)" },
      416: errorSchema,
      ...objErrors,
    },
    handler: async ({ deps, principal, params, request }) => {
      const caller = callerOf(principal);
      const { bucket, path } = await target(deps, caller, params.bucketName, params.path);
      const session = request.headers.get("x-upload-session");
      if (session) return reply.ok(await deps.uploads.status(caller, bucket, path, session));
      return deps.storageObjects.download(caller, bucket, path, request);
    },
  });

  r.add({
    method: "DELETE",
    path: "/storage/{bucketName}/{path+}",
    tag,
    summary: "Delete an object (DELETE policy), or with X-Upload-Session abort a resumable upload",
    auth: OBJECTS,
    params: objectParams,
    invalidParam: { path: INVALID_PATH },
    responses: { 200: { description: "done", schema: messageSchema }, ...objErrors },
    handler: async ({ deps, principal, params, request }) => {
      const caller = callerOf(principal);
      const { bucket, path } = await target(deps, caller, params.bucketName, params.path);
      const session = request.headers.get("x-upload-session");
      if (session) {
        await deps.uploads.abort(caller, bucket, path, session);
        return reply.ok({ message: "upload aborted" });
      }
      await deps.storageObjects.delete(caller, bucket, path);
      return reply.ok({ message: `object '${path}' deleted` });
    },
  });

  r.add({
    method: "PATCH",
    path: "/storage/{bucketName}/{path+}/visibility",
    tag,
    summary: "Make an object public or private: {is_public}; only its owner or a service key",
    auth: OBJECTS,
    params: objectParams,
    invalidParam: { path: INVALID_PATH },
    body: visibilityBody,
    responses: { 200: { description: "the object", schema: objectSchema }, ...objErrors },
    handler: async ({ deps, principal, params, body }) => {
      const caller = callerOf(principal);
      const { bucket, path } = await target(deps, caller, params.bucketName, params.path);
      return reply.ok(objectView(await deps.storageObjects.setVisibility(caller, bucket, path, body.is_public)));
    },
  });
}
