import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema } from "../http/pagination";

export const RUNTIMES = ["nodejs22.x", "nodejs24.x", "python3.10", "python3.11", "python3.12", "python3.13", "python3.14", "ruby3.3", "ruby3.4", "ruby4.0"] as const;
export const MAX_OPENAPI_BYTES = 256 * 1024;

export const functionParams = z.object({ projectId: z.string().min(1), functionId: z.string().min(1) });

export const functionSchema = z.object({
  id: z.string(),
  name: z.string(),
  status: z.enum(["provisioning", "active", "failed", "deleting"]),
  is_public: z.boolean(),
  invocation_mode: z.enum(["rpc", "http"]),
  http_auth_mode: z.enum(["service", "none"]),
  openapi_spec: z.record(z.string(), z.unknown()).nullable(),
  invoke_url: z.string().describe("the function's own address, reached by any HTTP client: <Kiln's address>/fn/<project-id>/<name> (also at http://<name>.<project-id>.fn.localhost:<port>, routed by host name)"),
  deployed_regions: z.array(z.string()),
  runtime: z.string(),
  handler: z.string(),
  pending_deployment_id: z.string().optional(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const functionListSchema = paginatedSchema(functionSchema);
export const listFunctionsQuery = z.object({ page: pageParam.optional(), limit: limitParam.optional() });

const boolField = z.enum(["true", "false"]).transform((v) => v === "true");
const openapi = z
  .record(z.string(), z.unknown())
  .refine((o) => typeof o.openapi === "string" && /^3\.[01]\./.test(o.openapi as string), "must be an OpenAPI 3.0 or 3.1 document (an `openapi` field of 3.0.x or 3.1.x)")
  .refine((o) => JSON.stringify(o).length <= MAX_OPENAPI_BYTES, "must be at most 256 KiB");

/** Multipart text fields of a deploy (the archive is checked separately). */
export const deployFields = z.object({
  name: z
    .string()
    .min(1, "is required")
    .max(63, "must be at most 63 characters")
    .regex(/^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/, "must be DNS-safe: lowercase letters, digits and hyphens, not starting or ending with a hyphen"),
  runtime: z.enum(RUNTIMES),
  handler: z.string().min(1).max(128).regex(/^[A-Za-z_$][A-Za-z0-9_$]*$/, "must be an identifier").optional(),
  is_public: boolField.optional(),
  invocation_mode: z.enum(["rpc", "http"]).optional(),
  http_auth_mode: z.enum(["service", "none"]).optional(),
  openapi_spec: z
    .string()
    .transform((s, ctx) => {
      try {
        return JSON.parse(s) as unknown;
      } catch {
        ctx.addIssue({ code: "custom", message: "must be JSON" });
        return z.NEVER;
      }
    })
    .pipe(openapi)
    .optional(),
});

export const patchFunctionBody = z.object({
  is_public: z.boolean().optional(),
  invocation_mode: z.enum(["rpc", "http"]).optional(),
  http_auth_mode: z.enum(["service", "none"]).optional(),
  openapi_spec: openapi.nullable().optional(),
});

export const deploymentSchema = z.object({
  id: z.string(),
  function_id: z.string(),
  kind: z.enum(["deploy", "delete"]),
  status: z.enum(["queued", "building", "succeeded", "failed", "superseded"]),
  runtime: z.string().nullable(),
  handler: z.string().nullable(),
  source_sha256: z.string().nullable(),
  /** The `batch_id` of the batch request that made this deployment; null for single deploys. */
  batch_id: z.string().nullable(),
  error: z.string().nullable(),
  build_log: z.object({ lines: z.number().int(), first_at: timestamp.nullable(), last_at: timestamp.nullable() }),
  created_at: timestamp,
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
});
export const deploymentListSchema = z.object({ data: z.array(deploymentSchema) });

export const invokeBody = z.object({ payload: z.unknown().optional() });
export const resolveQuery = z.object({ name: z.string().min(1) });
export const resolveSchema = z.object({ name: z.string(), function_id: z.string(), cache_ttl_seconds: z.number().int() });

export const batchEntries = z
  .array(
    z.object({
      name: z.string(),
      runtime: z.string(),
      handler: z.string().optional(),
      file_field: z.string().min(1, "names the multipart field holding this function's archive"),
    }),
  )
  .min(1, "must list at least one function")
  .max(100, "at most 100 functions per request");

export const batchResultSchema = z.object({
  batch_id: z.string(),
  functions: z.array(functionSchema),
  failed: z.array(z.object({ name: z.string(), error: z.string() })),
});
