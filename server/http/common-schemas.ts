import * as z from "zod";
import type { ResponseSpec } from "./route";

export const errorBody = z.union([
  z.object({ error: z.string() }),
  z.object({ code: z.string(), error: z.string().optional() }),
]);

/** Response entry for any error status: the spec's `{error}` or `{code}` body. */
export const errorSchema: ResponseSpec = { description: "error", schema: errorBody };

export const timestamp = z.string().describe("RFC 3339 timestamp, UTC");
