import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import { queryBodies } from "./query-builder";
import { QUERY_RESPONSES, runQuery, type DatabaseRouteDeps } from "./query-runner";
import {
  branchDeletingSchema,
  branchListSchema,
  branchParams,
  branchQueryParams,
  branchSchema,
  createBranchBody,
  databaseParams,
  extendBranchBody,
  queryResultSchema,
  resetPasswordSchema,
} from "./schemas";

const tag = "Database branches";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const read = { kind: "project", access: "read" } as const;
/** A single branch carries its connection string: read-only project tokens may not read it. */
const credentialRead = { kind: "project", access: "credential" } as const;
const write = { kind: "project", access: "write" } as const;
const base = "/projects/{projectId}/databases/{databaseName}/branches";

export function branchRoutes(r: AreaRouter<DatabaseRouteDeps>): void {
  r.add({
    method: "GET",
    path: base,
    tag,
    summary: "List a database's branches in every state (no connection strings)",
    auth: read,
    params: databaseParams,
    responses: { 200: { description: "branches", schema: branchListSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      return reply.ok({ data: (await deps.branches.list(d)).map((b) => deps.branches.view(b, d)) });
    },
  });

  r.add({
    method: "POST",
    path: base,
    tag,
    summary: "Create a branch: a copy of the database as it is now, taken while it keeps serving (202, provisioning, then active)",
    auth: write,
    params: databaseParams,
    body: createBranchBody,
    responses: { 202: { description: "provisioning", schema: branchSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, principal, project, params, body }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      const b = await deps.branches.create(d, await deps.accounts.ownerPlan(principal, project.account_id), body);
      return reply.accepted(deps.branches.view(b, d));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/{branchName}`,
    tag,
    summary: "Get a branch, with its own connection string while active",
    auth: credentialRead,
    params: branchParams,
    responses: { 200: { description: "branch", schema: branchSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      const b = await deps.branches.measured(await deps.branches.get(d, params.branchName));
      return reply.ok(deps.branches.view(b, d, { connection: true }));
    },
  });

  r.add({
    method: "PATCH",
    path: `${base}/{branchName}`,
    tag,
    summary: "Replace a branch's lifetime: counted again from now, and kept for later resets",
    auth: write,
    params: branchParams,
    body: extendBranchBody,
    responses: { 200: { description: "branch", schema: branchSchema }, ...errors },
    handler: async ({ deps, project, params, body }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      const b = await deps.branches.extend(d, params.branchName, body.ttl_seconds);
      return reply.ok(deps.branches.view(b, d, { connection: true }));
    },
  });

  r.add({
    method: "POST",
    path: `${base}/{branchName}/reset`,
    tag,
    summary: "Discard the branch's writes and fork it again from the parent (202); same name, connection string and lifetime",
    auth: write,
    params: branchParams,
    responses: { 202: { description: "provisioning", schema: branchSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, params }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      return reply.accepted(deps.branches.view(await deps.branches.reset(d, params.branchName), d));
    },
  });

  r.add({
    method: "POST",
    path: `${base}/{branchName}/reset-password`,
    tag,
    summary: "New password for the branch; its old one opens no new connections; the parent's credentials are unchanged",
    auth: write,
    params: branchParams,
    responses: { 200: { description: "new credentials", schema: resetPasswordSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      return reply.ok(await deps.branches.resetPassword(d, params.branchName));
    },
  });

  r.add({
    method: "DELETE",
    path: `${base}/{branchName}`,
    tag,
    summary: "Delete a branch (202): its connections end at once, its data goes in the background; repeatable until it is gone (then 404)",
    auth: write,
    params: branchParams,
    responses: { 202: { description: "deleting", schema: branchDeletingSchema }, ...errors },
    handler: async ({ deps, project, params }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      await deps.branches.delete(d, params.branchName);
      return reply.accepted({ status: "deleting" as const, message: `branch '${params.branchName}' is being deleted; its connections have ended` });
    },
  });

  for (const operation of ["select", "insert", "update", "delete"] as const) {
    r.add({
      method: "POST",
      path: `/databases/{databaseName}/branches/{branchName}/query/${operation}`,
      tag: "Query API",
      summary: `${operation} rows on a branch: service key (bypasses RLS) or end-user token (the owner's grants, then RLS); anon keys are refused; a missing branch reads as a missing database`,
      auth: { kind: "none" },
      params: branchQueryParams,
      body: queryBodies[operation],
      bodyValidation: "handler",
      responses: QUERY_RESPONSES,
      handler: ({ deps, guard, request, ip, arrivedAt, params, body }) =>
        runQuery(
          deps,
          guard,
          request,
          ip,
          arrivedAt,
          params.databaseName,
          (access, started) => deps.branches.query(access.projectId, params.databaseName, params.branchName, access.mode, operation, body, started),
          { anonAllowed: false },
        ),
    });
  }
}
