import * as z from "zod";

/** One response of a route: its description, body schema and content type (OpenAPI). */
export interface ResponseSpec {
  description: string;
  schema?: z.ZodType;
  contentType?: string;
}

export const errorBody = z.union([
  z.object({ error: z.string() }),
  z.object({ code: z.string(), error: z.string().optional() }),
]);

/** Response entry for any error status: the spec's `{error}` or `{code}` body. */
export const errorSchema: ResponseSpec = { description: "error", schema: errorBody };

export const timestamp = z.string().describe("RFC 3339 timestamp, UTC");

/** 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z: what PostgreSQL's timestamptz and toISOString() share. */
export const EARLIEST_TIMESTAMP_MS = new Date("0001-01-01T00:00:00Z").getTime();
export const LATEST_TIMESTAMP_MS = new Date("9999-12-31T23:59:59.999Z").getTime();

/** Whether a time is one PostgreSQL and `toISOString()` both handle as a plain four-digit year. */
export function storableTime(ms: number): boolean {
  return Number.isFinite(ms) && ms >= EARLIEST_TIMESTAMP_MS && ms <= LATEST_TIMESTAMP_MS;
}

/**
 * An RFC 3339 timestamp given by a caller (query parameters, filters): with an offset or Z, and in
 * UTC between the years 0001 and 9999, so a store never sees one it cannot hold (year 0000 is a 400
 * naming the field, not a 500 from PostgreSQL).
 */
export const timestampInput = z.iso
  .datetime({ offset: true, message: "must be an RFC 3339 timestamp, such as 2024-01-31T12:00:00Z" })
  .refine((s) => storableTime(Date.parse(s)), "must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z")
  .describe("RFC 3339 timestamp");
