import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { METRICS } from "./service";

export const MAX_METRIC_QUERIES = 10;

/** POST /projects/{projectId}/metrics/query (spec: "Metrics query body"). */
export const metricsQueryBody = z.object({
  time_range: z.object({ window: z.enum(["30m", "1h", "24h", "7d"], { error: "time_range.window must be one of 30m, 1h, 24h, 7d" }) }),
  queries: z
    .array(
      z.object({
        id: z.string().min(1, "id is required").max(128),
        metric: z.enum(METRICS, { error: `metric must be one of ${METRICS.join(", ")}` }),
        group_by: z.enum(["region", "resource_type"], { error: "group_by must be 'region' or 'resource_type'" }).optional(),
      }),
    )
    .min(1, "send at least one query")
    .max(MAX_METRIC_QUERIES, `at most ${MAX_METRIC_QUERIES} queries per request`)
    .refine((qs) => new Set(qs.map((q) => q.id)).size === qs.length, "query ids must be unique"),
});

export const metricsResultSchema = z.object({
  observed_at: timestamp,
  fresh_through: timestamp.describe("every sample up to this instant is in the results; newer ones may be missing (data_status partial)"),
  window: z.object({ from: timestamp, to: timestamp }),
  results: z.array(
    z.object({
      id: z.string(),
      metric: z.enum(METRICS),
      unit: z.enum(["count", "ratio", "ms"]),
      data_status: z.enum(["complete", "partial", "no_data"]),
      values: z.array(z.object({ dimensions: z.record(z.string(), z.string()), value: z.number() })),
    }),
  ),
});

export const usageQuery = z.object({
  month: z
    .string()
    .regex(/^\d{4}-(0[1-9]|1[0-2])$/, "month must be YYYY-MM, e.g. 2025-01")
    .refine((m) => Number(m.slice(0, 4)) >= 1970, "month must be 1970-01 or later")
    .optional(),
});

const series = z.array(z.object({ timestamp, value: z.number() }));
export const usageSchema = z.object({
  project_id: z.string(),
  month: z.string(),
  metrics: z.array(z.object({ metric: z.string(), total: z.number(), all_time: z.number(), daily: series, hourly: series })),
  frontends: z.array(z.object({ frontend_id: z.string(), frontend_name: z.string(), requests: z.number() })),
});
