import { errorSchema } from "../http/common-schemas";
import { preflight } from "../http/cors";
import { type BodyLimit, jsonTooDeep, readMultipartBody, tooDeep } from "../http/body";
import { badRequest, HttpError, notFound } from "../http/errors";
import { DEFAULT_LIMIT, paginated } from "../http/pagination";
import { parseInput, reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { invokeUrl } from "./http-mode";
import { deployedRegions } from "./regions";
import { INVOKE_AUTH, invoke, mayInvoke, type InvokeDeps } from "./invoke";
import {
  batchEntries,
  batchResultSchema,
  deployFields,
  deploymentListSchema,
  functionListSchema,
  functionParams,
  functionSchema,
  invokeBody,
  listFunctionsQuery,
  patchFunctionBody,
  resolveQuery,
  resolveSchema,
} from "./schemas";
import type { FunctionRecord } from "./records";

const tag = "Functions";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const MB = 1_048_576;

/** A function as the API shows it (also the MCP tools' answer). */
export function functionView(deps: Pick<InvokeDeps, "config" | "address">, fn: FunctionRecord) {
  return {
    id: fn.id,
    name: fn.name,
    status: fn.status as "provisioning" | "active" | "failed" | "deleting",
    is_public: fn.is_public,
    invocation_mode: fn.invocation_mode,
    http_auth_mode: fn.http_auth_mode,
    openapi_spec: fn.openapi_spec,
    invoke_url: invokeUrl(deps, fn),
    deployed_regions: deployedRegions(deps.config.regions, fn),
    runtime: fn.runtime,
    handler: fn.handler,
    ...(fn.pending_deployment_id ? { pending_deployment_id: fn.pending_deployment_id } : {}),
    created_at: fn.created_at,
    updated_at: fn.updated_at,
  };
}

/**
 * A deploy's multipart body, read within the route's limit (the archive limit plus room for the
 * other fields). JSON held in text fields (openapi_spec, the batch's functions) is checked for
 * nesting before anything parses it.
 */
async function readDeployForm(deps: InvokeDeps, request: Request, limit: BodyLimit, what: string): Promise<FormData> {
  if (!/multipart\/form-data/i.test(request.headers.get("content-type") ?? "")) throw badRequest(what);
  const form = await readMultipartBody(request, limit);
  for (const field of ["openapi_spec", "functions"]) {
    const v = form.get(field);
    if (typeof v === "string" && jsonTooDeep(v, deps.config.maxJsonDepth)) throw tooDeep(deps.config.maxJsonDepth, `body field '${field}'`);
  }
  return form;
}

/** The multipart deploy body: text fields through the zod schema, the archive as bytes. */
export async function readDeploy(deps: InvokeDeps, request: Request, limit: BodyLimit) {
  const form = await readDeployForm(deps, request, limit, "deploy with multipart/form-data (fields name, runtime, code, ...)");
  const fields: Record<string, string> = {};
  for (const [k, v] of form.entries()) if (typeof v === "string") fields[k] = v;
  const parsed = parseInput(deployFields, fields, "body");
  const code = form.get("code");
  if (!code || typeof code === "string") throw badRequest("invalid request: body field 'code': an archive file (ZIP or tar.gz) is required");
  return { fields: parsed, archive: new Uint8Array(await code.arrayBuffer()) };
}

/** Rules 4–6 for one upload; archive problems are the caller's 400. */
export async function normalized(deps: InvokeDeps, archive: Uint8Array, runtime: string, handler?: string) {
  // tar and yauzl load with the first deploy, not with Kiln.
  const { ArchiveError, normalizeSource } = await import("./archive");
  const limit = deps.config.sourceArchiveLimitMb * MB;
  try {
    return await normalizeSource(archive, { runtime, handler: handler ?? "handler", limits: { uploadBytes: limit, normalizedBytes: limit, extractedBytes: limit * 10 } });
  } catch (err) {
    if (err instanceof ArchiveError) throw badRequest(err.message);
    throw err;
  }
}

export function functionRoutes(r: AreaRouter<InvokeDeps>): void {
  r.add({
    method: "GET",
    path: "/projects/{projectId}/functions",
    tag,
    summary: "List functions",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    query: listFunctionsQuery,
    responses: { 200: { description: "functions", schema: functionListSchema }, ...errors },
    handler: async ({ deps, project, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.functions.list(project.id, page, limit);
      return reply.ok(paginated(res.data.map((f) => functionView(deps, f)), { page, limit, total: res.total, path: `/projects/${project.id}/functions` }));
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/functions",
    tag,
    summary: "Create or update a function from a source archive (multipart: name, runtime, code, handler, is_public, invocation_mode, http_auth_mode, openapi_spec)",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    bodyLimit: "deploy",
    responses: { 200: { description: "existing function, deployment started or queued", schema: functionSchema }, 201: { description: "new function", schema: functionSchema }, ...errors },
    handler: async ({ deps, project, request, bodyLimit }) => {
      const { fields, archive } = await readDeploy(deps, request, bodyLimit);
      const source = await normalized(deps, archive, fields.runtime, fields.handler);
      const { created, fn } = await deps.functions.deploy(project.id, fields, source);
      return { status: created ? 201 : 200, body: functionView(deps, fn) };
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/functions/batch",
    tag,
    summary: "Deploy up to 100 functions (multipart: `functions` JSON array of {name, runtime, handler?, file_field} and one archive field each)",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    bodyLimit: "deploy",
    responses: { 200: { description: "accepted functions, and those that failed before their deployment started", schema: batchResultSchema }, ...errors },
    handler: async ({ deps, project, request, bodyLimit }) => {
      const form = await readDeployForm(deps, request, bodyLimit, "deploy with multipart/form-data (field functions and one file per function)");
      let list: unknown;
      try {
        list = JSON.parse(String(form.get("functions") ?? ""));
      } catch {
        throw badRequest("invalid request: body field 'functions': must be a JSON array");
      }
      const entries = parseInput(batchEntries, list, "body");
      const accepted = [];
      const failed: { name: string; error: string }[] = [];
      const batchId = crypto.randomUUID();
      for (const entry of entries) {
        try {
          const fields = parseInput(deployFields.pick({ name: true, runtime: true, handler: true }), entry, "body");
          const file = form.get(entry.file_field);
          if (!file || typeof file === "string") throw badRequest(`no archive in the multipart field '${entry.file_field}'`);
          const source = await normalized(deps, new Uint8Array(await file.arrayBuffer()), fields.runtime, fields.handler);
          const { fn } = await deps.functions.deploy(project.id, fields, source, { batchId });
          accepted.push(functionView(deps, fn));
        } catch (err) {
          // Deployments already started keep running; this one never started, so nothing to undo.
          if (err instanceof HttpError) failed.push({ name: String(entry.name), error: String((err.body as { error?: string; code?: string }).error ?? (err.body as { code?: string }).code) });
          else throw err;
        }
      }
      return reply.ok({ batch_id: batchId, functions: accepted, failed });
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/functions/{functionId}",
    tag,
    summary: "Get a function",
    auth: { kind: "project", access: "read" },
    params: functionParams,
    responses: { 200: { description: "function", schema: functionSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(functionView(deps, await deps.functions.get(project.id, params.functionId))),
  });

  r.add({
    method: "PATCH",
    path: "/projects/{projectId}/functions/{functionId}",
    tag,
    summary: "Update invocation settings",
    auth: { kind: "project", access: "write" },
    params: functionParams,
    body: patchFunctionBody,
    responses: { 200: { description: "function", schema: functionSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => reply.ok(functionView(deps, await deps.functions.update(await deps.functions.get(project.id, params.functionId), body))),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/functions/{functionId}",
    tag,
    summary: "Delete a function (asynchronous; queued behind a running deployment)",
    auth: { kind: "project", access: "write" },
    params: functionParams,
    responses: { 202: { description: "deletion accepted", schema: functionSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await deps.functions.get(project.id, params.functionId);
      return reply.accepted(functionView(deps, await deps.functions.requestDelete(fn)));
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/functions/{functionId}/deployments",
    tag,
    summary: "Deployment history with status and build-log metadata",
    auth: { kind: "project", access: "read" },
    params: functionParams,
    responses: { 200: { description: "deployments", schema: deploymentListSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await deps.functions.get(project.id, params.functionId);
      return reply.ok({ data: await deps.functions.deployments(fn.id) });
    },
  });

  r.add({
    method: "POST",
    path: "/functions/{functionId}/invoke",
    tag: "Invocation",
    summary: "Invoke a function by RPC: body {payload}; service key, end-user token, or anon key (functions.invoke, public functions)",
    auth: INVOKE_AUTH,
    params: functionParams.pick({ functionId: true }),
    body: invokeBody,
    bodyValidation: "handler",
    bodyLimit: "invoke",
    responses: { 200: { description: "the function's response (status and headers are the function's)" }, ...errors, 502: errorSchema, 503: errorSchema, 504: errorSchema },
    handler: async ({ deps, principal, arrivedAt, params, body }) => {
      const handlerStart = performance.now();
      const fn = deps.functions.cachedForInvocation(params.functionId) ?? (await deps.functions.forInvocation(params.functionId));
      // A durable function is started as an execution, never invoked (its id is not found here).
      if (!fn || fn.project_id !== principal.projectId || fn.kind === "durable") throw notFound("function not found");
      mayInvoke(principal, fn);
      const parsed = invokeBody.safeParse(body);
      if (!parsed.success || typeof body !== "object" || body === null || Array.isArray(body)) throw badRequest("invalid request: the body must be a JSON object {payload: ...}");
      return invoke(deps, fn, principal, parsed.data.payload, arrivedAt, handlerStart);
    },
  });

  r.add({
    method: "OPTIONS",
    path: "/functions/{functionId}/invoke",
    tag: "Invocation",
    summary: "CORS preflight for RPC invocation",
    auth: { kind: "none" },
    params: functionParams.pick({ functionId: true }),
    responses: { 204: { description: "preflight" } },
    handler: ({ request }) => preflight(request, ["POST"]),
  });

  r.add({
    method: "GET",
    path: "/functions/resolve",
    tag: "Invocation",
    summary: "Resolve a function name in the caller's project (same credential rules as invocation)",
    auth: { ...INVOKE_AUTH, refused: "resolving a function needs a service key, an end-user access token or an anon key" },
    query: resolveQuery,
    responses: { 200: { description: "resolved", schema: resolveSchema }, ...errors },
    handler: async ({ deps, principal, query }) => {
      const fn = await deps.functions.byName(principal.projectId, query.name);
      if (!fn || fn.status === "deleting") throw notFound("function not found");
      mayInvoke(principal, fn);
      return reply.ok({ name: fn.name, function_id: fn.id, cache_ttl_seconds: 60 });
    },
  });
}
