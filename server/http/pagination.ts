import * as z from "zod";
import { storableTime } from "./common-schemas";
import { badRequest } from "./errors";

export const MAX_LIMIT = 100;
export const DEFAULT_LIMIT = 10;

/** Query booleans arrive as text; only the two spellings people write are accepted. */
export const queryBool = z.enum(["true", "false", "1", "0"]).transform((v) => v === "true" || v === "1");

export const pageParam = z.coerce.number().int().min(1, "must be 1 or more");
export const limitParam = z.coerce.number().int().min(1, "must be 1 or more").max(MAX_LIMIT, `must be at most ${MAX_LIMIT}`);

export const offsetPaginationQuery = z.object({
  page: pageParam.optional(),
  limit: limitParam.optional(),
});

/** The spec's paginated list envelope. */
export function paginatedSchema<T extends z.ZodType>(item: T) {
  return z.object({
    data: z.array(item),
    page: z.number().int(),
    limit: z.number().int(),
    total: z.number().int(),
    has_more: z.boolean(),
    next: z.string().optional().describe("relative path of the next page, when more exist"),
  });
}

/** Builds the envelope, with `next` keeping every other query parameter the caller sent. */
export function paginated<T>(
  data: T[],
  o: { page: number; limit: number; total: number; path: string; query?: Record<string, string | undefined> },
) {
  const has_more = o.page * o.limit < o.total;
  const out: { data: T[]; page: number; limit: number; total: number; has_more: boolean; next?: string } = {
    data,
    page: o.page,
    limit: o.limit,
    total: o.total,
    has_more,
  };
  if (has_more) out.next = withQuery(o.path, { ...o.query, page: String(o.page + 1), limit: String(o.limit) });
  return out;
}

export function withQuery(path: string, q: Record<string, string | undefined>): string {
  const sp = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== "") sp.set(k, v);
  const s = sp.toString();
  return s ? `${path}?${s}` : path;
}

/**
 * Keyset cursors: an opaque base64url token holding the sort key of one row (its creation time and
 * id). Clients must treat it as opaque; a tampered or foreign cursor is a 400.
 */
export interface CursorAnchor {
  t: string;
  id: string;
}

export function encodeCursor(a: CursorAnchor): string {
  return Buffer.from(JSON.stringify({ v: 1, t: a.t, id: a.id })).toString("base64url");
}

/** What encodeCursor writes: a row's creation time as toISOString() gives it (offsets allowed). */
const CURSOR_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;

export function decodeCursor(token: string, field = "cursor"): CursorAnchor {
  try {
    const o = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
    // The anchor goes to the store as a timestamp and a text value: it must be one it can hold.
    if (o?.v === 1 && typeof o.t === "string" && CURSOR_TIME.test(o.t) && storableTime(Date.parse(o.t)) && typeof o.id === "string" && !o.id.includes("\0"))
      return { t: o.t, id: o.id };
  } catch {
    // fall through
  }
  throw badRequest(`invalid ${field}: pass back a value the API returned`);
}

/** Escapes LIKE wildcards so a search matches the text literally. */
export function likePattern(search: string): string {
  return `%${search.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}
