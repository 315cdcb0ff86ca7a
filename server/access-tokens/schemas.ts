import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema, queryBool } from "../http/pagination";

export const tokenParams = z.object({ projectId: z.string().min(1), tokenId: z.string().min(1) });

export const tokenSchema = z.object({
  id: z.string(),
  project_id: z.string(),
  name: z.string(),
  token_prefix: z.string(),
  scope: z.enum(["full", "read_only"]),
  status: z.enum(["active", "revoked", "expired"]),
  expires_at: timestamp.nullable(),
  created_at: timestamp,
  last_used_at: timestamp.nullable(),
  all_time_requests: z.number().int(),
});

export const createdTokenSchema = tokenSchema.extend({
  token_source: z.literal("api"),
  token: z.string().describe("the secret; shown only in this response"),
});

export const createTokenBody = z.object({
  name: z.string().trim().min(1, "must not be empty").max(128, "must be at most 128 characters"),
  scope: z.enum(["full", "read_only"]),
  expires_at: z.iso.datetime({ offset: true, message: "must be an RFC 3339 timestamp" }).optional(),
});

export const listTokensQuery = z.object({
  page: pageParam.optional(),
  limit: limitParam.optional(),
  search: z.string().max(256).optional(),
  include_revoked: queryBool.optional(),
});

export const tokenListSchema = paginatedSchema(tokenSchema);

export const daysQuery = z.object({
  days: z.coerce.number().int().min(1, "must be 1 or more").max(90, "must be at most 90").optional(),
  include_revoked: queryBool.optional(),
});

export const tokenUsageSchema = z.object({
  token_id: z.string(),
  name: z.string(),
  days: z.number().int(),
  daily: z.array(z.object({ day: z.string().describe("YYYY-MM-DD (UTC)"), requests: z.number().int() })),
  total_requests: z.number().int(),
});

export const allTokensUsageSchema = z.object({
  days: z.number().int(),
  data: z.array(tokenUsageSchema),
  total_requests: z.number().int(),
});
