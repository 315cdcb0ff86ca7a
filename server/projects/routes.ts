import { errorSchema } from "../http/common-schemas";
import { badRequest } from "../http/errors";
import { DEFAULT_LIMIT, withQuery } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import type { AccountsService } from "../accounts/service";
import type { ProjectsService } from "./service";
import { createProjectBody, listProjectsQuery, projectIdParams, projectListSchema, projectSchema, updateProjectBody } from "./schemas";
import { projectView } from "./service";

const tag = "Projects";


/** What the project routes use. */
export interface ProjectRouteDeps {
  projects: ProjectsService;
  accounts: AccountsService;
}

export function projectRoutes(r: AreaRouter<ProjectRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/projects",
    tag,
    summary: "List projects (offset or cursor mode)",
    auth: { kind: "account" },
    query: listProjectsQuery,
    responses: { 200: { description: "projects", schema: projectListSchema }, 400: errorSchema, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal, query: q }) => {
      const { accountId } = principal;
      if (q.page !== undefined && (q.cursor !== undefined || q.ending_before !== undefined))
        throw badRequest("page cannot be combined with cursor or ending_before");
      if (q.cursor !== undefined && q.ending_before !== undefined) throw badRequest("send either cursor or ending_before, not both");
      const cursorMode = q.cursor !== undefined || q.ending_before !== undefined || (q.limit !== undefined && q.page === undefined);
      if (!cursorMode && q.offset !== undefined) throw badRequest("offset applies to cursor mode only (send limit, cursor or ending_before)");
      const limit = q.limit ?? DEFAULT_LIMIT;
      if (!cursorMode) {
        const page = q.page ?? 1;
        const res = await deps.projects.list(accountId, { mode: "offset", page, limit, search: q.search });
        const has_more = page * limit < res.total;
        return reply.ok({
          data: res.data.map((p) => projectView(p)),
          page,
          limit,
          total: res.total,
          has_more,
          ...(has_more ? { next: withQuery("/projects", { page: String(page + 1), limit: String(limit), search: q.search }) } : {}),
        });
      }
      const res = await deps.projects.list(accountId, {
        mode: "cursor",
        limit,
        cursor: q.cursor,
        endingBefore: q.ending_before,
        offset: q.offset ?? 0,
        search: q.search,
      });
      const onward = q.ending_before ? res.prev_cursor : res.next_cursor;
      return reply.ok({
        data: res.data.map((p) => projectView(p)),
        limit,
        total: res.total,
        has_more: res.has_more,
        ...(res.next_cursor ? { next_cursor: res.next_cursor } : {}),
        ...(res.prev_cursor ? { prev_cursor: res.prev_cursor } : {}),
        ...(onward
          ? { next: withQuery("/projects", { [q.ending_before ? "ending_before" : "cursor"]: onward, limit: String(limit), search: q.search }) }
          : {}),
      });
    },
  });

  r.add({
    method: "POST",
    path: "/projects",
    tag,
    summary: "Create a project",
    auth: { kind: "account" },
    body: createProjectBody,
    responses: { 201: { description: "created", schema: projectSchema }, 400: errorSchema, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal, body }) => {
      const p = principal;
      const project = await deps.projects.create(p.accountId, p.plan, body);
      return reply.created(projectView(project, { detail: true }));
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}",
    tag,
    summary: "Get a project",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    responses: { 200: { description: "project", schema: projectSchema }, 401: errorSchema, 403: errorSchema, 404: errorSchema },
    handler: ({ project }) => reply.ok(projectView(project, { detail: true })),
  });

  r.add({
    method: "PATCH",
    path: "/projects/{projectId}",
    tag,
    summary: "Update a project's name or region policy",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    body: updateProjectBody,
    responses: {
      200: { description: "updated", schema: projectSchema },
      400: errorSchema,
      401: errorSchema,
      403: errorSchema,
      404: errorSchema,
      409: errorSchema,
    },
    handler: async ({ deps, principal, project, body }) => {
      const plan = await deps.accounts.ownerPlan(principal, project.account_id);
      return reply.ok(projectView(await deps.projects.update(project, plan, body), { detail: true }));
    },
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}",
    tag,
    summary: "Delete a project and everything it owns (asynchronous)",
    auth: { kind: "project", access: "write", allowDeleting: true },
    params: projectIdParams,
    responses: { 202: { description: "deletion started", schema: projectSchema }, 401: errorSchema, 403: errorSchema, 404: errorSchema },
    handler: async ({ deps, project }) => reply.accepted(projectView(await deps.projects.requestDelete(project), { detail: true })),
  });
}
