/**
 * The control store: where Kiln keeps accounts, projects, tokens, keys and variables.
 * Services speak SQL through this small interface; the engines (embedded PGlite, a real PostgreSQL
 * server) differ only in how they connect. Both see the same schema and the same migrations, so the
 * SQL in the services is written once and must run unchanged on both.
 *
 * Conventions that keep both engines returning the same JS values:
 * - timestamps are `timestamptz`, written from JS (ISO strings) and read back as Date;
 * - counters are `integer` (never int8, which the two drivers return differently);
 * - structured values are `jsonb`, passed as JSON text with an explicit `::jsonb` cast.
 */
export type Row = Record<string, any>;

export interface Sql {
  query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]>;
}

export interface ControlStore extends Sql {
  readonly kind: "pglite" | "postgres";
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T>;
  /**
   * Appends rows with COPY (text format), for high-volume append-only tables such as logs: a row
   * costs about half of what it costs in a multi-row INSERT. Values are text (PostgreSQL casts
   * them to the column types, as it would `$n` parameters) or null.
   */
  copyRows(table: string, columns: readonly string[], rows: ReadonlyArray<ReadonlyArray<string | null>>): Promise<void>;
  close(): Promise<void>;
}

const COPY_ESCAPES: Record<string, string> = { "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t" };
const COPY_SPECIAL = /[\\\n\r\t]/;
const COPY_SPECIALS = /[\\\n\r\t]/g;

/** The body of a `COPY ... FROM` in text format: tab-separated, `\N` for null, one row a line. */
export function copyText(rows: ReadonlyArray<ReadonlyArray<string | null>>): string {
  let out = "";
  for (const row of rows) {
    for (let i = 0; i < row.length; i++) {
      const v = row[i];
      if (i) out += "\t";
      out += v === null || v === undefined ? "\\N" : COPY_SPECIAL.test(v) ? v.replace(COPY_SPECIALS, (c) => COPY_ESCAPES[c]!) : v;
    }
    out += "\n";
  }
  return out;
}

/**
 * Text PostgreSQL can store: a NUL character (which a function or an installer may well print) is
 * refused by every text column and would fail the whole write, so it becomes U+FFFD.
 */
export function storableText(s: string): string {
  return s.includes("\0") ? s.replaceAll("\0", "\uFFFD") : s;
}

/** A timestamp column as the API writes it (RFC 3339, UTC). */
export function isoTime(v: unknown): string {
  return new Date(v as string).toISOString();
}

export function isoTimeOrNull(v: unknown): string | null {
  return v ? isoTime(v) : null;
}

/** A unique index refused the row (SQLSTATE 23505); both drivers report it the same way. */
export function isUniqueViolation(err: unknown): boolean {
  return (err as { code?: string })?.code === "23505";
}
