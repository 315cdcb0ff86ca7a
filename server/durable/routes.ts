import type { ApplicationPrincipal } from "../auth/principal";
import { deploymentListSchema } from "../functions/schemas";
import { INVOKE_AUTH, type InvokeDeps } from "../functions/invoke";
import { normalized, readDeploy } from "../functions/routes";
import type { FunctionRecord } from "../functions/service";
import { errorSchema } from "../http/common-schemas";
import { badRequest, forbidden, notFound } from "../http/errors";
import { DEFAULT_LIMIT, offsetPaginationQuery, paginated } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import type { DurableEngine } from "./engine";
import type { ExecutionsReader } from "./executions";
import {
  durableFunctionListSchema,
  durableFunctionParams,
  durableFunctionSchema,
  executionListSchema,
  executionParams,
  executionSchema,
  listExecutionsQuery,
  rerunBody,
  startBody,
  startedSchema,
} from "./schemas";
import { startedView } from "./executions";

/** What the routes use: the functions area's services (deploys, records), the engine and the reader. */
export type DurableRouteDeps = InvokeDeps & { durable: DurableEngine; executions: ExecutionsReader };

const tag = "Durable functions";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const read = { kind: "project", access: "read" } as const;
const write = { kind: "project", access: "write" } as const;

function view(fn: FunctionRecord) {
  return {
    id: fn.id,
    name: fn.name,
    status: fn.status as "provisioning" | "active" | "failed" | "deleting",
    runtime: fn.runtime,
    handler: fn.handler,
    ...(fn.pending_deployment_id ? { pending_deployment_id: fn.pending_deployment_id } : {}),
    created_at: fn.created_at,
    updated_at: fn.updated_at,
  };
}

/** The identity an end user's execution keeps (no token: the execution outlives it, and tokens are not stored). */
function identityOf(p: ApplicationPrincipal): Record<string, unknown> | null {
  return p.kind === "user" ? { user_id: p.userId, email: p.email, project_id: p.projectId, role: p.role } : null;
}

/** The routes of docs/durable-functions.md: the collection, executions, and their inspection. */
export function durableRoutes(r: AreaRouter<DurableRouteDeps>): void {
  const base = "/projects/{projectId}/durable-functions";
  const get = (deps: DurableRouteDeps, projectId: string, id: string) => deps.functions.get(projectId, id, "durable");

  r.add({
    method: "GET",
    path: base,
    tag,
    summary: "List durable functions",
    auth: read,
    params: projectIdParams,
    query: offsetPaginationQuery,
    responses: { 200: { description: "durable functions", schema: durableFunctionListSchema }, ...errors },
    handler: async ({ deps, project, query }) => {
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.functions.list(project.id, page, limit, "durable");
      return reply.ok(paginated(res.data.map(view), { page, limit, total: res.total, path: `/projects/${project.id}/durable-functions` }));
    },
  });

  r.add({
    method: "POST",
    path: base,
    tag,
    summary: "Create or update a durable function from a source archive (multipart: name, runtime, code, handler), as standard functions deploy",
    auth: write,
    params: projectIdParams,
    bodyLimit: "deploy",
    responses: { 200: { description: "existing durable function, deployment started or queued", schema: durableFunctionSchema }, 201: { description: "new durable function", schema: durableFunctionSchema }, ...errors },
    handler: async ({ deps, project, request, bodyLimit }) => {
      const { fields, archive } = await readDeploy(deps, request, bodyLimit);
      const source = await normalized(deps, archive, fields.runtime, fields.handler);
      const { created, fn } = await deps.functions.deploy(project.id, { name: fields.name, runtime: fields.runtime, handler: fields.handler }, source, { kind: "durable" });
      return { status: created ? 201 : 200, body: view(fn) };
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{functionId}`,
    tag,
    summary: "Get a durable function",
    auth: read,
    params: durableFunctionParams,
    responses: { 200: { description: "durable function", schema: durableFunctionSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(view(await get(deps, project.id, params.functionId))),
  });

  r.add({
    method: "DELETE",
    path: `${base}/{functionId}`,
    tag,
    summary: "Delete a durable function (asynchronous); its unfinished executions are stopped",
    auth: write,
    params: durableFunctionParams,
    responses: { 202: { description: "deletion accepted", schema: durableFunctionSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.accepted(view(await deps.functions.requestDelete(await get(deps, project.id, params.functionId)))),
  });

  r.add({
    method: "GET",
    path: `${base}/{functionId}/deployments`,
    tag,
    summary: "Deployment history with status and build-log metadata",
    auth: read,
    params: durableFunctionParams,
    responses: { 200: { description: "deployments", schema: deploymentListSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok({ data: await deps.functions.deployments((await get(deps, project.id, params.functionId)).id) }),
  });

  // --- executions -------------------------------------------------------------------------------

  r.add({
    method: "POST",
    path: "/durable-functions/{functionId}/executions",
    tag,
    summary: "Start an execution: body {input}; service key or end-user token (the handler gets the user's identity in __service_auth)",
    auth: { ...INVOKE_AUTH, refused: "starting a durable execution needs a service key or an end-user access token" },
    params: durableFunctionParams.pick({ functionId: true }),
    body: startBody,
    bodyLimit: "invoke",
    responses: { 202: { description: "execution accepted", schema: startedSchema }, ...errors },
    handler: async ({ deps, principal, params, body }) => {
      if (principal.kind === "anon_key") throw forbidden("anon keys cannot start durable executions; use a service key or an end-user access token");
      const fn = await deps.functions.byId(params.functionId);
      if (!fn || fn.kind !== "durable" || fn.project_id !== principal.projectId || fn.status === "deleting") throw notFound("durable function not found");
      return reply.accepted(startedView(await deps.durable.start(fn, body.input, identityOf(principal))));
    },
  });

  r.add({
    method: "POST",
    path: `${base}/{functionId}/executions`,
    tag,
    summary: "Start an execution: body {input} (platform token or full-scope project token)",
    auth: write,
    params: durableFunctionParams,
    body: startBody,
    bodyLimit: "invoke",
    responses: { 202: { description: "execution accepted", schema: startedSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => {
      const fn = await get(deps, project.id, params.functionId);
      if (fn.status === "deleting") throw notFound("durable function not found");
      return reply.accepted(startedView(await deps.durable.start(fn, body.input, null)));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{functionId}/executions`,
    tag,
    summary: "List executions, newest first (filter: status)",
    auth: read,
    params: durableFunctionParams,
    query: listExecutionsQuery,
    responses: { 200: { description: "executions", schema: executionListSchema }, ...errors },
    handler: async ({ deps, project, params, query }) => {
      const fn = await get(deps, project.id, params.functionId);
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.executions.list(fn.id, { page, limit, status: query.status });
      return reply.ok(paginated(res.data, { page, limit, total: res.total, path: `/projects/${project.id}/durable-functions/${fn.id}/executions`, query: { status: query.status } }));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{functionId}/executions/{executionId}`,
    tag,
    summary: "Get an execution with its steps",
    auth: read,
    params: executionParams,
    responses: { 200: { description: "execution", schema: executionSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await get(deps, project.id, params.functionId);
      return reply.ok(await deps.executions.get(fn.id, params.executionId));
    },
  });

  r.add({
    method: "POST",
    path: `${base}/{functionId}/executions/{executionId}/stop`,
    tag,
    summary: "Stop an execution (409 once it has finished)",
    auth: write,
    params: executionParams,
    responses: { 200: { description: "the stopped execution", schema: executionSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await get(deps, project.id, params.functionId);
      await deps.executions.get(fn.id, params.executionId); // 404 first
      await deps.durable.stop(project.id, params.executionId);
      return reply.ok(await deps.executions.get(fn.id, params.executionId));
    },
  });

  r.add({
    method: "POST",
    path: `${base}/{functionId}/executions/{executionId}/rerun`,
    tag,
    summary: "Start a new execution with the same input that reuses this one's journal up to a step: body {from_step}",
    auth: write,
    params: executionParams,
    body: rerunBody,
    responses: { 202: { description: "the new execution", schema: startedSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => {
      const fn = await get(deps, project.id, params.functionId);
      if (fn.status === "deleting") throw notFound("durable function not found");
      const of = await deps.executions.row(fn.id, params.executionId);
      const fromSeq = await deps.executions.stepSeq(of.id as string, body.from_step);
      if (fromSeq === null) throw badRequest(`invalid request: body field 'from_step': the execution has no step named "${body.from_step}"`);
      return reply.accepted(startedView(await deps.durable.start(fn, of.input, of.identity ?? null, { of, fromSeq })));
    },
  });
}

