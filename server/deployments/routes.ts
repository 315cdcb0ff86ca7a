import * as z from "zod";
import { errorSchema, timestamp } from "../http/common-schemas";
import { DEFAULT_LIMIT, offsetPaginationQuery, paginated, paginatedSchema } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import type { DeploymentsService } from "./service";

export const deploymentItemSchema = z.object({
  id: z.string(),
  project_id: z.string(),
  resource: z.object({ type: z.enum(["function", "durable_function", "frontend"]), id: z.string(), name: z.string() }),
  kind: z.enum(["deploy", "redeploy", "delete"]).describe("redeploy: frontends only"),
  status: z.enum(["queued", "building", "succeeded", "failed", "superseded"]),
  runtime: z.string().nullable(),
  batch_id: z.string().nullable(),
  error: z.string().nullable(),
  created_at: timestamp,
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
});

const listQuery = offsetPaginationQuery.extend({ project_id: z.string().min(1).max(128).optional().describe("only this project's deployments") });

export function deploymentRoutes(r: AreaRouter<{ deployments: DeploymentsService }>): void {
  r.add({
    method: "GET",
    path: "/deployments",
    tag: "Projects",
    summary: "Deployments across the caller's projects, newest first (a project access token sees its own project's); query page, limit, project_id",
    auth: { kind: "management" },
    query: listQuery,
    responses: { 200: { description: "deployments", schema: paginatedSchema(deploymentItemSchema) }, 400: errorSchema, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal, query }) => {
      const page = query.page ?? 1;
      const limit = query.limit ?? DEFAULT_LIMIT;
      const res = await deps.deployments.list(principal, { projectId: query.project_id, page, limit });
      return reply.ok(paginated(res.data, { page, limit, total: res.total, path: "/deployments", query: { project_id: query.project_id } }));
    },
  });
}
