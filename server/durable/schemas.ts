import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema } from "../http/pagination";

export const EXECUTION_STATUSES = ["queued", "running", "sleeping", "completed", "failed", "stopped"] as const;
export type ExecutionStatus = (typeof EXECUTION_STATUSES)[number];
export const STEP_STATUSES = ["completed", "failed", "retrying", "sleeping"] as const;

export const durableFunctionParams = z.object({ projectId: z.string().min(1), functionId: z.string().min(1) });
export const executionParams = durableFunctionParams.extend({ executionId: z.string().min(1) });

/** The durable function resource (docs/durable-functions.md). */
export const durableFunctionSchema = z.object({
  id: z.string(),
  name: z.string(),
  status: z.enum(["provisioning", "active", "failed", "deleting"]),
  runtime: z.string(),
  handler: z.string(),
  pending_deployment_id: z.string().optional(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const durableFunctionListSchema = paginatedSchema(durableFunctionSchema);

export const startBody = z.object({ input: z.unknown().optional() });
export const rerunBody = z.object({ from_step: z.string().min(1, "names a step of the execution") });

export const startedSchema = z.object({
  id: z.string(),
  durable_function_id: z.string(),
  status: z.enum(EXECUTION_STATUSES),
  created_at: timestamp,
});

export const stepSchema = z.object({
  name: z.string(),
  type: z.enum(["run", "sleep"]).describe("step.run, or step.sleep / step.sleepUntil"),
  status: z.enum(STEP_STATUSES),
  attempts: z.number().int().describe("times the step's body ran (0 for sleeps)"),
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
  output: z.unknown().describe("the step's result, as replays return it (null until completed)"),
  error: z.string().nullable().describe("the last attempt's error"),
  wake_at: timestamp.nullable().describe("sleeping: when it ends; retrying: when the next attempt runs"),
});

export const executionSchema = z.object({
  id: z.string(),
  durable_function_id: z.string(),
  status: z.enum(EXECUTION_STATUSES),
  input: z.unknown(),
  output: z.unknown(),
  error: z.string().nullable(),
  steps: z.array(stepSchema),
  rerun_of: z.string().nullable().describe("the execution this one re-ran from a step"),
  wake_at: timestamp.nullable().describe("queued or sleeping: when it runs next"),
  created_at: timestamp,
  updated_at: timestamp,
  finished_at: timestamp.nullable(),
});
export const executionSummarySchema = executionSchema.omit({ steps: true });
export const executionListSchema = paginatedSchema(executionSummarySchema);
export const listExecutionsQuery = z.object({ page: pageParam.optional(), limit: limitParam.optional(), status: z.enum(EXECUTION_STATUSES).optional() });
