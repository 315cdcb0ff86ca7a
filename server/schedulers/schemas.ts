import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { paginatedSchema } from "../http/pagination";
import { projectIdParams } from "../projects/schemas";

export const schedulerParams = projectIdParams.extend({ functionId: z.string().min(1), schedulerId: z.string().min(1) });
export const schedulerFunctionParams = projectIdParams.extend({ functionId: z.string().min(1) });

const schedule = z.object({
  kind: z.literal("cron", { error: "schedule.kind must be 'cron'" }),
  cron_expression: z.string(),
});
const payload = z.record(z.string(), z.unknown(), { error: "payload must be a JSON object (it becomes the function's event)" });
const regions = z.array(z.string().min(1)).length(1, "regions must hold exactly one deployed region (schedulers never fan out)");
const name = z.string().trim().min(1, "name is required").max(128, "name must be at most 128 characters");

export const createSchedulerBody = z.object({
  name,
  enabled: z.boolean().optional(),
  schedule,
  payload: payload.optional(),
  regions: regions.optional(),
});
export type CreateSchedulerBody = z.infer<typeof createSchedulerBody>;

/** Every field optional; `regions: null` goes back to a region Kiln chooses. */
export const patchSchedulerBody = z
  .object({ name: name.optional(), enabled: z.boolean().optional(), schedule: schedule.optional(), payload: payload.optional(), regions: regions.nullable().optional() })
  .refine((b) => Object.keys(b).length > 0, "send at least one of name, enabled, schedule, payload, regions");
export type PatchSchedulerBody = z.infer<typeof patchSchedulerBody>;

export const schedulerSchema = z.object({
  id: z.string(),
  function_id: z.string(),
  function_kind: z.enum(["standard", "durable"]),
  name: z.string(),
  enabled: z.boolean(),
  schedule: z.object({ kind: z.literal("cron"), cron_expression: z.string() }),
  payload: z.record(z.string(), z.unknown()),
  /** The regions given on create or update; empty when Kiln chooses. */
  regions: z.array(z.string()),
  /** The region that runs the ticks: the given one, else a deployed region chosen at random; null until the function is deployed. */
  region: z.string().nullable(),
  next_run_at: timestamp.nullable(),
  last_run_at: timestamp.nullable(),
  created_at: timestamp,
  updated_at: timestamp,
});
export type SchedulerView = z.infer<typeof schedulerSchema>;
export const schedulerListSchema = paginatedSchema(schedulerSchema);

export const runSchema = z.object({
  id: z.string(),
  scheduler_id: z.string(),
  status: z.enum(["running", "succeeded", "failed"]),
  scheduled_for: timestamp,
  started_at: timestamp,
  finished_at: timestamp.nullable(),
  duration_ms: z.number().nullable(),
  /** Find the run's log lines with log search (`invocation.id:`). */
  invocation_id: z.string().nullable(),
  /** The function's answer status, when it answered. */
  http_status: z.number().int().nullable(),
  region: z.string().nullable(),
  error: z.string().nullable(),
});
export const runListSchema = paginatedSchema(runSchema);
