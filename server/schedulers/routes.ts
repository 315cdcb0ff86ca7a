import type { FunctionsService } from "../functions/service";
import { errorSchema } from "../http/common-schemas";
import { DEFAULT_LIMIT, offsetPaginationQuery, paginated } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import type { ProjectRecord } from "../projects/record";
import { projectIdParams } from "../projects/schemas";
import {
  createSchedulerBody,
  patchSchedulerBody,
  runListSchema,
  schedulerFunctionParams,
  schedulerListSchema,
  schedulerParams,
  schedulerSchema,
} from "./schemas";
import { schedulerView, type FunctionKind, type SchedulersService } from "./service";

export interface SchedulerRouteDeps {
  schedulers: SchedulersService;
  functions: FunctionsService;
}

const tag = "Function schedulers";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const read = { kind: "project", access: "read" } as const;
const write = { kind: "project", access: "write" } as const;

/** The spec's scheduler routes under one function collection (standard functions; durable ones reuse this). */
export function schedulerRoutes(r: AreaRouter<SchedulerRouteDeps>, collection: "functions" | "durable-functions", kind: FunctionKind): void {
  const base = `/projects/{projectId}/${collection}/{functionId}/schedulers`;
  // The other collection's function ids are not found here.
  const functionOf = (deps: SchedulerRouteDeps, project: ProjectRecord, functionId: string) => deps.functions.get(project.id, functionId, kind);

  r.add({
    method: "GET",
    path: base,
    tag,
    summary: "List a function's schedulers",
    auth: read,
    params: schedulerFunctionParams,
    query: offsetPaginationQuery,
    responses: { 200: { description: "schedulers", schema: schedulerListSchema }, ...errors },
    handler: async ({ deps, project, params, query }) => {
      const fn = await functionOf(deps, project, params.functionId);
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.schedulers.list(fn.id, page, limit);
      return reply.ok(paginated(res.data.map(schedulerView), { page, limit, total: res.total, path: `/projects/${project.id}/${collection}/${fn.id}/schedulers` }));
    },
  });

  r.add({
    method: "POST",
    path: base,
    tag,
    summary: "Create a scheduler: {name, enabled, schedule: {kind: cron, cron_expression}, payload, regions?} (5-field cron in UTC, at most once a minute, at least once every 31 days)",
    auth: write,
    params: schedulerFunctionParams,
    body: createSchedulerBody,
    responses: { 201: { description: "created", schema: schedulerSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => {
      const fn = await functionOf(deps, project, params.functionId);
      return reply.created(schedulerView(await deps.schedulers.create(fn, kind, body)));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{schedulerId}`,
    tag,
    summary: "Get a scheduler",
    auth: read,
    params: schedulerParams,
    responses: { 200: { description: "scheduler", schema: schedulerSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await functionOf(deps, project, params.functionId);
      return reply.ok(schedulerView(await deps.schedulers.get(fn.id, params.schedulerId)));
    },
  });

  r.add({
    method: "PATCH",
    path: `${base}/{schedulerId}`,
    tag,
    summary: "Update a scheduler (any of name, enabled, schedule, payload, regions; regions null lets Kiln choose)",
    auth: write,
    params: schedulerParams,
    body: patchSchedulerBody,
    responses: { 200: { description: "scheduler", schema: schedulerSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => {
      const fn = await functionOf(deps, project, params.functionId);
      return reply.ok(schedulerView(await deps.schedulers.update(fn, params.schedulerId, body)));
    },
  });

  r.add({
    method: "DELETE",
    path: `${base}/{schedulerId}`,
    tag,
    summary: "Delete a scheduler and its run history",
    auth: write,
    params: schedulerParams,
    responses: { 204: { description: "deleted" }, ...errors },
    handler: async ({ deps, project, params }) => {
      const fn = await functionOf(deps, project, params.functionId);
      await deps.schedulers.delete(fn.id, params.schedulerId);
      return reply.noContent();
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{schedulerId}/runs`,
    tag,
    summary: "A scheduler's runs, newest first: status, duration, and the invocation id for log search (the last 1,000 are kept)",
    auth: read,
    params: schedulerParams,
    query: offsetPaginationQuery,
    responses: { 200: { description: "runs", schema: runListSchema }, ...errors },
    handler: async ({ deps, project, params, query }) => {
      const fn = await functionOf(deps, project, params.functionId);
      const s = await deps.schedulers.get(fn.id, params.schedulerId);
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.schedulers.runs(s.id, page, limit);
      return reply.ok(paginated(res.data, { page, limit, total: res.total, path: `/projects/${project.id}/${collection}/${fn.id}/schedulers/${s.id}/runs` }));
    },
  });
}

/** Every scheduler of a project, standard and durable, each with `function_kind`. */
export function projectSchedulerRoutes(r: AreaRouter<SchedulerRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/projects/{projectId}/schedulers",
    tag,
    summary: "List every scheduler of the project, of standard and durable functions, each with function_kind",
    auth: read,
    params: projectIdParams,
    query: offsetPaginationQuery,
    responses: { 200: { description: "schedulers", schema: schedulerListSchema }, ...errors },
    handler: async ({ deps, project, query }) => {
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.schedulers.listProject(project.id, page, limit);
      return reply.ok(paginated(res.data.map(schedulerView), { page, limit, total: res.total, path: `/projects/${project.id}/schedulers` }));
    },
  });
}
