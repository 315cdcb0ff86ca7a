import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { KeysService } from "./service";
import { projectIdParams } from "../projects/schemas";
import {
  anonKeyListSchema,
  anonKeySchema,
  createAnonKeyBody,
  createdServiceKeySchema,
  createServiceKeyBody,
  keyParams,
  serviceKeyListSchema,
  serviceKeySchema,
  updateServiceKeyBody,
} from "./schemas";

const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const write = { kind: "project", access: "write" } as const;
/** Listing keys returns credentials: read-only project tokens are refused. */
const credentialRead = { kind: "project", access: "credential" } as const;

/** What the key routes use. */
export interface KeyRouteDeps {
  keys: KeysService;
}

export function keyRoutes(r: AreaRouter<KeyRouteDeps>): void {
  let tag = "Service keys";
  r.add({
    method: "POST",
    path: "/projects/{projectId}/service-keys",
    tag,
    summary: "Create a service key (full service role, or scoped by permissions)",
    auth: write,
    params: projectIdParams,
    body: createServiceKeyBody,
    responses: { 201: { description: "created", schema: createdServiceKeySchema }, ...errors },
    handler: async ({ deps, project, body }) => reply.created(await deps.keys.createServiceKey(project.id, body)),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/service-keys",
    tag,
    summary: "List service keys (no secrets)",
    auth: credentialRead,
    params: projectIdParams,
    responses: { 200: { description: "keys", schema: serviceKeyListSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok({ data: await deps.keys.listServiceKeys(project.id) }),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/service-keys/{keyId}",
    tag,
    summary: "Get one service key (no secret)",
    auth: credentialRead,
    params: keyParams,
    responses: { 200: { description: "key", schema: serviceKeySchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await deps.keys.getServiceKey(project.id, params.keyId)),
  });
  r.add({
    method: "PATCH",
    path: "/projects/{projectId}/service-keys/{keyId}",
    tag,
    summary: "Rename a service key or change its permissions (null: full service role)",
    auth: write,
    params: keyParams,
    body: updateServiceKeyBody,
    responses: { 200: { description: "updated", schema: serviceKeySchema }, ...errors },
    handler: async ({ deps, project, params, body }) => reply.ok(await deps.keys.updateServiceKey(project.id, params.keyId, body)),
  });
  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/service-keys/{keyId}",
    tag,
    summary: "Delete a service key",
    auth: write,
    params: keyParams,
    responses: { 204: { description: "deleted" }, ...errors },
    handler: async ({ deps, project, params }) => {
      await deps.keys.deleteServiceKey(project.id, params.keyId);
      return reply.noContent();
    },
  });

  tag = "Anon keys";
  r.add({
    method: "POST",
    path: "/projects/{projectId}/anon-keys",
    tag,
    summary: "Create an anon key",
    auth: write,
    params: projectIdParams,
    body: createAnonKeyBody,
    responses: { 201: { description: "created", schema: anonKeySchema }, ...errors },
    handler: async ({ deps, project, body }) => reply.created(await deps.keys.createAnonKey(project.id, body)),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/anon-keys",
    tag,
    summary: "List anon keys, with their keys",
    auth: credentialRead,
    params: projectIdParams,
    responses: { 200: { description: "keys", schema: anonKeyListSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok({ data: await deps.keys.listAnonKeys(project.id) }),
  });
  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/anon-keys/{keyId}",
    tag,
    summary: "Delete an anon key",
    auth: write,
    params: keyParams,
    responses: { 204: { description: "deleted" }, ...errors },
    handler: async ({ deps, project, params }) => {
      await deps.keys.deleteAnonKey(project.id, params.keyId);
      return reply.noContent();
    },
  });
}
