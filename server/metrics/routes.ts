import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { metricsQueryBody, metricsResultSchema, usageQuery, usageSchema } from "./schemas";
import type { MetricsService } from "./service";
import type { Clock } from "../clock";

const read = { kind: "project", access: "read" } as const;
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };

export function metricsRoutes(r: AreaRouter<{ metrics: MetricsService; clock: Clock }>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/metrics/query",
    tag: "Projects",
    summary:
      "Runtime metrics over a window ending at the most recent completed UTC minute: request_count, server_error_count, availability (ratio), p95_latency (ms, from histograms), optionally grouped by region or resource_type; at most 10 queries",
    auth: read,
    params: projectIdParams,
    body: metricsQueryBody,
    responses: { 200: { description: "metrics query result", schema: metricsResultSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, body }) => reply.ok(await deps.metrics.query(project.id, body.time_range.window, body.queries)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/usage",
    tag: "Projects",
    summary: "Usage of a UTC month (query month=YYYY-MM, default the current one): each metric's total, all-time figure and daily and hourly series",
    auth: read,
    params: projectIdParams,
    query: usageQuery,
    responses: { 200: { description: "project usage", schema: usageSchema }, ...errors },
    handler: async ({ deps, project, query }) => reply.ok(await deps.metrics.usage(project.id, query.month ?? deps.clock.now().toISOString().slice(0, 7))),
  });
}
