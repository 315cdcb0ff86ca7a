import { errorSchema } from "../http/common-schemas";
import { badRequest } from "../http/errors";
import { parseInput, reply, type AreaRouter } from "../http/route";
import { validateLockKey } from "./lock-table";
import { leaseBody, leaseSchema, LOCK_TOKEN_HEADER, lockParams, lockStateSchema, REQUEST_ID_HEADER, UUID } from "./schemas";
import type { LocksService } from "./service";

/** What the lock routes use. */
export interface LockRouteDeps {
  locks: LocksService;
}

const tag = "Project locks";
/** Service keys only (full, or scoped with locks.manage); the project is the key's. */
const serviceKey = { kind: "application", serviceKeysOnly: true, permission: "locks.manage" } as const;
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 429: errorSchema, 503: errorSchema };
const conflicts = { 409: { ...errorSchema, description: "{code: lock_held} or {code: lock_ownership_lost}" } };

/** A UUID header: 400 naming it when it is missing or malformed. The lock token is kept lower-case. */
function uuidHeader(request: Request, name: string): string {
  const v = request.headers.get(name);
  if (v === null || v.trim() === "") throw badRequest(`missing ${name} header: send a UUID`);
  const id = v.trim();
  if (!UUID.test(id)) throw badRequest(`invalid ${name} header: must be a UUID such as 3f2b8c1e-5d7a-4e6b-9c0d-1a2b3c4d5e6f`);
  return id.toLowerCase();
}

/** The lock token: a UUID, and not the nil or max UUID (placeholders many workers would share). */
function lockTokenOf(request: Request): string {
  const token = uuidHeader(request, LOCK_TOKEN_HEADER);
  if (/^(0{8}-0{4}-0{4}-0{4}-0{12}|f{8}-f{4}-f{4}-f{4}-f{12})$/.test(token))
    throw badRequest(`invalid ${LOCK_TOKEN_HEADER} header: must be a random UUID, not the nil or max UUID`);
  return token;
}

/** The path's key, checked, and the request id every lock route needs (checked, otherwise unused: it only correlates attempts). */
function keyOf(params: { key: string }, request: Request): string {
  const problem = validateLockKey(params.key);
  if (problem) throw badRequest(`invalid request: path field 'key': ${problem}`);
  uuidHeader(request, REQUEST_ID_HEADER);
  return params.key;
}

/** Acquire and renew: key, request id, lock token, then `{ttl_seconds}`. */
function leaseInput(request: Request, params: { key: string }, body: unknown) {
  const key = keyOf(params, request);
  const lockToken = lockTokenOf(request);
  const { ttl_seconds } = parseInput(leaseBody, body, "body");
  return { key, lockToken, ttl: ttl_seconds };
}

const HEADERS = `headers ${LOCK_TOKEN_HEADER} (the holder's random UUID, kept for the lease's lifetime) and ${REQUEST_ID_HEADER} (a UUID)`;

export function lockRoutes(r: AreaRouter<LockRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/locks/{key}/lease",
    tag,
    summary: `Acquire a lease ({ttl_seconds}, 5 s to 90 days), or reset the expiry of your own to now + TTL (absolute); ${HEADERS}. 200 with expires_at and a fencing_token that rises whenever the lock changes hands`,
    auth: serviceKey,
    params: lockParams,
    body: leaseBody,
    bodyValidation: "handler",
    responses: { 200: { description: "the lease", schema: leaseSchema }, ...errors, ...conflicts },
    handler: async ({ deps, principal, request, params, body }) => {
      const now = deps.locks.now();
      const { key, lockToken, ttl } = await deps.locks.checked(principal.projectId, now, () => leaseInput(request, params, body));
      return reply.ok(await deps.locks.acquire(principal.projectId, key, lockToken, ttl, now));
    },
  });
  r.add({
    method: "PATCH",
    path: "/locks/{key}/lease",
    tag,
    summary: `Renew your lease ({ttl_seconds}): expiry becomes now + TTL; only more than one second before expires_at (else 409 lock_ownership_lost); ${HEADERS}`,
    auth: serviceKey,
    params: lockParams,
    body: leaseBody,
    bodyValidation: "handler",
    responses: { 200: { description: "the renewed lease", schema: leaseSchema }, ...errors, ...conflicts },
    handler: async ({ deps, principal, request, params, body }) => {
      const now = deps.locks.now();
      const { key, lockToken, ttl } = await deps.locks.checked(principal.projectId, now, () => leaseInput(request, params, body));
      return reply.ok(await deps.locks.renew(principal.projectId, key, lockToken, ttl, now));
    },
  });
  r.add({
    method: "DELETE",
    path: "/locks/{key}/lease",
    tag,
    summary: `Release your lease; 204 also when the lock is free or held under another lock token (a stale token never releases a newer lease); ${HEADERS}`,
    auth: serviceKey,
    params: lockParams,
    responses: { 204: { description: "released, or nothing of yours to release" }, ...errors },
    handler: async ({ deps, principal, request, params }) => {
      const now = deps.locks.now();
      const { key, lockToken } = await deps.locks.checked(principal.projectId, now, () => ({ key: keyOf(params, request), lockToken: lockTokenOf(request) }));
      await deps.locks.release(principal.projectId, key, lockToken, now);
      return reply.noContent();
    },
  });
  r.add({
    method: "GET",
    path: "/locks/{key}",
    tag,
    summary: `Read a lock: {held: false} when an acquire would succeed now, else {held: true, expires_at, fencing_token} (a lapsed lease stays held for one second of grace); header ${REQUEST_ID_HEADER} (a UUID)`,
    auth: serviceKey,
    params: lockParams,
    responses: { 200: { description: "the lock's state", schema: lockStateSchema }, ...errors },
    handler: async ({ deps, principal, request, params }) => {
      const now = deps.locks.now();
      const key = await deps.locks.checked(principal.projectId, now, () => keyOf(params, request));
      return reply.ok(await deps.locks.read(principal.projectId, key, now));
    },
  });
  r.add({
    method: "DELETE",
    path: "/locks/{key}",
    tag,
    summary: `Force release: frees the lock whoever holds it (breaks mutual exclusion: the holder learns at its next renewal); 204 also when free; header ${REQUEST_ID_HEADER} (a UUID)`,
    auth: serviceKey,
    params: lockParams,
    responses: { 204: { description: "released, or already free" }, ...errors },
    handler: async ({ deps, principal, request, params }) => {
      const now = deps.locks.now();
      const key = await deps.locks.checked(principal.projectId, now, () => keyOf(params, request));
      await deps.locks.forceRelease(principal.projectId, key, now);
      return reply.noContent();
    },
  });
}
