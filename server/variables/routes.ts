import { errorSchema } from "../http/common-schemas";
import { DEFAULT_LIMIT, paginated } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import type { VariablesService } from "./service";
import { projectIdParams } from "../projects/schemas";
import { createVariableBody, listVariablesQuery, updateVariableBody, variableListSchema, variableParams, variableSchema } from "./schemas";

const tag = "Variables";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const write = { kind: "project", access: "write" } as const;
/** Variable values are credentials: read-only project tokens may not read them. */
const credentialRead = { kind: "project", access: "credential" } as const;

/** What the variable routes use. */
export interface VariableRouteDeps {
  variables: VariablesService;
}

export function variableRoutes(r: AreaRouter<VariableRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/variables",
    tag,
    summary: "Create a variable (status provisioning until propagated)",
    auth: write,
    params: projectIdParams,
    body: createVariableBody,
    responses: { 201: { description: "created", schema: variableSchema }, ...errors },
    handler: async ({ deps, project, body }) => reply.created(await deps.variables.create(project.id, body)),
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/variables",
    tag,
    summary: "List variables with their values",
    auth: credentialRead,
    params: projectIdParams,
    query: listVariablesQuery,
    responses: { 200: { description: "variables", schema: variableListSchema }, ...errors },
    handler: async ({ deps, project, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.variables.list(project.id, page, limit);
      return reply.ok(paginated(res.data, { page, limit, total: res.total, path: `/projects/${project.id}/variables` }));
    },
  });
  r.add({
    method: "GET",
    path: "/projects/{projectId}/variables/{variableId}",
    tag,
    summary: "Get a variable by id or name",
    auth: credentialRead,
    params: variableParams,
    responses: { 200: { description: "variable", schema: variableSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await deps.variables.get(project.id, params.variableId)),
  });
  r.add({
    method: "PATCH",
    path: "/projects/{projectId}/variables/{variableId}",
    tag,
    summary: "Change a variable's value or name (starts a new sync)",
    auth: write,
    params: variableParams,
    body: updateVariableBody,
    responses: { 200: { description: "updated", schema: variableSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => reply.ok(await deps.variables.update(project.id, params.variableId, body)),
  });
  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/variables/{variableId}",
    tag,
    summary: "Delete a variable",
    auth: write,
    params: variableParams,
    responses: { 204: { description: "deleted" }, ...errors },
    handler: async ({ deps, project, params }) => {
      await deps.variables.delete(project.id, params.variableId);
      return reply.noContent();
    },
  });
}
