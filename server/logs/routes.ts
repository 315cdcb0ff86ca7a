import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { logSearchBody, logSearchResultSchema, logTailQuery } from "./schemas";
import type { LogsService } from "./service";

const tag = "Logs";
const read = { kind: "project", access: "read" } as const;
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };

export function logRoutes(r: AreaRouter<{ logs: LogsService }>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/logs/search",
    tag,
    summary:
      "Search log lines, newest first: resource {type, ids?, deployments.ids? (build lines)}, q (grammar in docs/observability.md), start_time/end_time (inclusive), limit (default 100, max 1000), cursor",
    auth: read,
    params: projectIdParams,
    body: logSearchBody,
    responses: { 200: { description: "log search result", schema: logSearchResultSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, body }) =>
      reply.ok(
        await deps.logs.search(project.id, {
          resourceType: body.resource.type,
          resourceIds: body.resource.ids,
          deploymentIds: body.resource.deployments?.ids,
          q: body.q,
          startTime: body.start_time,
          endTime: body.end_time,
          limit: body.limit,
          cursor: body.cursor,
        }),
      ),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/logs/tail",
    tag,
    summary:
      "Live tail (Server-Sent Events): the search filters as query parameters (type, ids, deployment_ids, q, start_time, end_time) and backlog=N stored lines first; each line is `event: log` with the entry as data",
    auth: read,
    params: projectIdParams,
    query: logTailQuery,
    responses: { 200: { description: "an event stream of log entries", contentType: "text/event-stream" }, 429: errorSchema, ...errors },
    handler: async ({ deps, project, query, request }) => {
      const stream = await deps.logs.tailStream(
        project.id,
        {
          resourceType: query.type ?? "function",
          resourceIds: query.ids,
          deploymentIds: query.deployment_ids,
          q: query.q,
          startTime: query.start_time,
          endTime: query.end_time,
          backlog: query.backlog ?? 0,
        },
        request.signal,
      );
      return new Response(stream, { status: 200, headers: { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no" } });
    },
  });
}
