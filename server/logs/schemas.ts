import * as z from "zod";
import { timestamp, timestampInput } from "../http/common-schemas";
import { MAX_SEARCH_LIMIT } from "./service";

const ids = (what: string) => z.array(z.string().min(1, `${what} must not be empty`).max(128)).max(100, `at most 100 ${what}`);

/** POST /projects/{projectId}/logs/search (spec: "Log search"). */
export const logSearchBody = z.object({
  resource: z.object({
    type: z.enum(["function", "frontend"], { error: "resource.type must be 'function' or 'frontend'" }),
    ids: ids("resource ids").optional(),
    deployments: z.object({ ids: ids("deployment ids") }).optional(),
  }),
  q: z.string().optional().describe("query: free text, \"phrases\", body:, invocation.id:, level:(error OR warn), region:, resource.id:, resource.name:, deployment.id:, AND/OR/NOT, -negation, ( )"),
  limit: z.number().int().min(1, "must be 1 or more").max(MAX_SEARCH_LIMIT, `must be at most ${MAX_SEARCH_LIMIT}`).optional(),
  cursor: z.string().min(1).max(512).optional(),
  start_time: timestampInput.optional(),
  end_time: timestampInput.optional(),
});
export type LogSearchBody = z.infer<typeof logSearchBody>;

export const logEntrySchema = z.object({
  id: z.string().describe("opaque log entry id"),
  timestamp,
  level: z.string().describe("trace, debug, info, warn, error or fatal (structured lines' own levels are mapped to these)"),
  body: z.union([z.string(), z.record(z.string(), z.unknown())]).describe("the line's text, or the object of a structured (JSON) line"),
  resource: z.object({ type: z.enum(["function", "frontend"]), id: z.string(), name: z.string() }),
  region: z.string(),
  invocation_id: z.string().nullable().describe("the invocation that printed the line; null for build lines"),
  deployment_id: z.string().nullable(),
});

export const logSearchResultSchema = z.object({
  data: z.array(logEntrySchema),
  limit: z.number().int(),
  has_more: z.boolean(),
  next_cursor: z.string().optional().describe("opaque; send it back as `cursor` with the same filters for the next (older) page"),
});

const csv = z
  .string()
  .max(20_000)
  .transform((s) => s.split(",").map((x) => x.trim()).filter(Boolean))
  .pipe(ids("ids"));

/** GET /projects/{projectId}/logs/tail: the search filters as query parameters. */
export const logTailQuery = z.object({
  type: z.enum(["function", "frontend"], { error: "type must be 'function' or 'frontend'" }).optional(),
  ids: csv.optional().describe("comma-separated resource ids"),
  deployment_ids: csv.optional().describe("comma-separated deployment ids: their build lines"),
  q: z.string().optional(),
  start_time: timestampInput.optional(),
  end_time: timestampInput.optional(),
  backlog: z.coerce.number().int().min(0).max(MAX_SEARCH_LIMIT, `must be at most ${MAX_SEARCH_LIMIT}`).optional().describe("stored lines to send first (newest, oldest first), default 0"),
});
