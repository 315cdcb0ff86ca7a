import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema } from "../http/pagination";

export const MAX_VARIABLE_VALUE_BYTES = 64 * 1024;

export const variableParams = z.object({ projectId: z.string().min(1), variableId: z.string().min(1) });

export const variableSchema = z.object({
  id: z.string(),
  project_id: z.string(),
  name: z.string(),
  value: z.string(),
  status: z.enum(["provisioning", "active"]).describe("provisioning until the value has reached every function worker"),
  current_sync_id: z.string(),
  created_at: timestamp,
  updated_at: timestamp,
});

const name = z
  .string()
  .min(1, "must not be empty")
  .max(128, "must be at most 128 characters")
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "must be an environment variable name: letters, digits and _, not starting with a digit");
const value = z
  .string()
  .refine((v) => Buffer.byteLength(v) <= MAX_VARIABLE_VALUE_BYTES, `must be at most ${MAX_VARIABLE_VALUE_BYTES} bytes`);

export const createVariableBody = z.object({ name, value });
export const updateVariableBody = z.object({ name: name.optional(), value: value.optional() });
export const listVariablesQuery = z.object({ page: pageParam.optional(), limit: limitParam.optional() });
export const variableListSchema = paginatedSchema(variableSchema);
