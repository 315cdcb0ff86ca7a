import * as z from "zod";
import { badRequest } from "../http/errors";
import { describeZodError } from "../http/route";

/**
 * The Query API (`POST /databases/{databaseName}/query/{operation}`) turned into one parameterized
 * SQL statement. Pure: no database, no I/O. Safety rests on two rules enforced here and nowhere else:
 * every table/column name matches IDENTIFIER and is emitted double-quoted, and every value becomes a
 * `$n` parameter. Nothing from the body is ever spliced into the text in any other way.
 *
 * Decisions:
 * - Unknown top-level fields are ignored (clients may send extra context), except fields that belong
 *   to another operation (`limit` on delete, `filters` on insert, ...): silently dropping those would
 *   change what the statement does, so they are a 400. Filter and order entries are strict, so a typo
 *   such as `valu` is a 400 rather than a filter that matches something else.
 * - `is` takes null, true or false (`is null`, `is true`, `is false`); anything else is a 400.
 * - The comparison operators reject a null value: `col = NULL` is never true, so such a filter can
 *   only have meant `is`. Likewise null inside an `in` array.
 * - insert accepts one object or an array of 1..1000 objects with the same columns (one statement,
 *   several value rows). `{}` inserts one row of defaults.
 * - Validation messages use the same format as every other request body (`describeZodError`), so a
 *   route that parses the body with `queryBodies` first and `buildQuery` itself say the same thing.
 */

export type QueryOperation = "select" | "insert" | "update" | "delete";
export const QUERY_OPERATIONS: readonly QueryOperation[] = ["select", "insert", "update", "delete"];

export interface BuiltQuery {
  text: string;
  params: unknown[];
}

/** PostgreSQL's own limit is 63 bytes; ASCII-only keeps characters and bytes the same. */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
const IDENTIFIER_RULE = "letters, digits and underscore, not starting with a digit, at most 63 characters";
const MAX_LIMIT = 10_000;
const MAX_INSERT_ROWS = 1000;
/** The wire protocol counts parameters in 16 bits. */
const MAX_PARAMS = 65_535;

const FILTER_OPERATORS = ["eq", "neq", "gt", "gte", "lt", "lte", "like", "ilike", "is", "in"] as const;
type FilterOperator = (typeof FILTER_OPERATORS)[number];
const COMPARISON_SQL: Partial<Record<FilterOperator, string>> = {
  eq: "=",
  neq: "<>",
  gt: ">",
  gte: ">=",
  lt: "<",
  lte: "<=",
  like: "like",
  ilike: "ilike",
};

// The echo is cut short so a megabyte-long "name" does not come back in the error.
const invalidIdentifier = (input: unknown) => {
  const shown = typeof input === "string" && input.length > 80 ? `${JSON.stringify(input.slice(0, 64))}…` : JSON.stringify(input);
  return `invalid identifier ${shown} (${IDENTIFIER_RULE})`;
};

const identifier = z
  .string({ error: (iss) => (iss.input === undefined ? "required" : "expected a string") })
  .regex(IDENTIFIER, { error: (iss) => invalidIdentifier(iss.input) });

/** What JSON can carry, minus the non-finite numbers JSON.parse makes of `1e400`. */
function jsonValueProblem(v: unknown): string | null {
  if (v === undefined) return "required";
  if (v === null || typeof v === "string" || typeof v === "boolean") return null;
  if (typeof v === "number") return Number.isFinite(v) ? null : "numbers must be finite";
  if (typeof v === "object") return null;
  return `unsupported value of type ${typeof v}`;
}

const columnValue = z
  .unknown()
  .describe("any JSON value; objects and arrays are sent as JSON text, for json/jsonb columns");

/**
 * Column → value. A record (not an object schema) because the columns are the caller's; the keys are
 * checked here so the message names the bad column. `continue: true` keeps the issue non-fatal, which
 * lets the insert union report it instead of a bare "Invalid input".
 */
function row(what: string) {
  return z
    .record(z.string(), columnValue)
    .check((ctx) => {
      for (const [key, value] of Object.entries(ctx.value)) {
        const valueProblem = jsonValueProblem(value);
        const message = !IDENTIFIER.test(key) ? invalidIdentifier(key) : valueProblem && `column ${key}: ${valueProblem}`;
        if (message) ctx.issues.push({ code: "custom", message, input: ctx.value, continue: true });
      }
    })
    .describe(what);
}

const filterSchema = z
  .strictObject({
    column: identifier.describe("column to test"),
    operator: z.enum(FILTER_OPERATORS).describe("eq neq gt gte lt lte like (case-sensitive) ilike (case-insensitive) is (NULL/boolean check) in (list)"),
    // A refinement, not a missing-key default: zod's own message for an absent key is "expected nonoptional".
    value: columnValue.refine((v) => v !== undefined, "required").describe("the operand: null, true or false for `is`; an array for `in`; a string for `like`/`ilike`; otherwise any non-null JSON value"),
  })
  .check((ctx) => {
    const { operator, value } = ctx.value;
    const problem = filterValueProblem(operator, value);
    if (problem) ctx.issues.push({ code: "custom", message: problem, path: ["value"], input: value });
  })
  .describe("one condition; all filters must hold (AND)");

function filterValueProblem(operator: FilterOperator, value: unknown): string | null {
  if (value === undefined) return null; // already reported as "required" by the field itself
  switch (operator) {
    case "is":
      return value === null || value === true || value === false ? null : "operator 'is' needs null, true or false as value";
    case "in": {
      if (!Array.isArray(value)) return "operator 'in' needs an array value";
      for (const [i, v] of value.entries()) {
        if (v === null) return `operator 'in' cannot match null (element ${i}); add an 'is' filter instead`;
        const problem = jsonValueProblem(v);
        if (problem) return `element ${i}: ${problem}`;
      }
      return null;
    }
    case "like":
    case "ilike":
      return typeof value === "string" ? null : `operator '${operator}' needs a string value`;
    default:
      if (value === null) return `operator '${operator}' cannot compare with null; use operator 'is'`;
      return jsonValueProblem(value);
  }
}

const orderSchema = z
  .strictObject({
    column: identifier.describe("column to sort by"),
    ascending: z.boolean({ error: (iss) => (iss.input === undefined ? "required" : "expected a boolean") }).describe("true for ascending, false for descending"),
    nulls_first: z.boolean().optional().describe("put NULLs first (true) or last (false); omitted: PostgreSQL's default (last when ascending, first when descending)"),
  })
  .describe("one sort key; earlier entries take precedence");

const table = identifier.describe("table name, resolved through the search path (no schema qualifier)");

const filtersOptional = z.array(filterSchema).optional().describe("conditions, combined with AND; omit or [] for every row");

function filtersRequired(op: QueryOperation) {
  const message = `${op} requires at least one filter`;
  return z
    .array(filterSchema, { error: (iss) => (iss.input === undefined ? message : "expected an array") })
    .min(1, message)
    .describe(`conditions, combined with AND; at least one is required so ${op} never touches every row by accident`);
}

const OPERATION_FIELDS: Record<QueryOperation, readonly string[]> = {
  select: ["table", "select", "filters", "order", "limit", "offset"],
  insert: ["table", "values"],
  update: ["table", "values", "filters"],
  delete: ["table", "filters"],
};
const ALL_FIELDS = new Set(Object.values(OPERATION_FIELDS).flat());

/** Loose so unknown fields pass; a field of another operation is rejected (see the header). */
function body<S extends z.core.$ZodLooseShape>(op: QueryOperation, shape: S, description: string) {
  return z
    .looseObject(shape)
    .check((ctx) => {
      for (const key of Object.keys(ctx.value)) {
        if (ALL_FIELDS.has(key) && !OPERATION_FIELDS[op].includes(key))
          ctx.issues.push({ code: "custom", message: `not accepted by ${op}`, path: [key], input: ctx.value[key] });
      }
    })
    .describe(description);
}

const selectBody = body(
  "select",
  {
    table,
    select: z
      .array(identifier)
      .min(1, "must list at least one column; omit it for all columns")
      .optional()
      .describe("columns to return; omit for all columns"),
    filters: filtersOptional,
    order: z.array(orderSchema).optional().describe("sort keys"),
    limit: z
      .number()
      .int("must be an integer")
      .min(0, `must be from 0 to ${MAX_LIMIT}`)
      .max(MAX_LIMIT, `must be from 0 to ${MAX_LIMIT}`)
      .optional()
      .describe(`maximum number of rows, 0 to ${MAX_LIMIT}`),
    offset: z
      .number()
      .int("must be an integer")
      .min(0, "must not be negative")
      .max(Number.MAX_SAFE_INTEGER)
      .optional()
      .describe("rows to skip before the first returned row"),
  },
  "select rows from a table",
);

const insertRows = z
  .array(row("one row"))
  .min(1, "must contain at least one row")
  .check((ctx) => {
    // Here rather than .max(): inside the union zod reports a failed .max() only as "Invalid input".
    if (ctx.value.length > MAX_INSERT_ROWS)
      return void ctx.issues.push({ code: "custom", message: `at most ${MAX_INSERT_ROWS} rows per insert`, input: ctx.value, continue: true });
    // One statement, one column list: every row must name the same columns.
    const first = Object.keys(ctx.value[0] ?? {});
    const expected = [...first].sort().join(",");
    ctx.value.forEach((r, i) => {
      const keys = Object.keys(r);
      if (keys.length === 0) ctx.issues.push({ code: "custom", message: "a row of a multi-row insert needs at least one column", path: [i], input: r, continue: true });
      else if (i > 0 && [...keys].sort().join(",") !== expected)
        ctx.issues.push({ code: "custom", message: `every row needs the same columns as the first row (${first.join(", ")})`, path: [i], input: r, continue: true });
    });
  })
  .meta({ maxItems: MAX_INSERT_ROWS, description: `several rows (1 to ${MAX_INSERT_ROWS}), all with the same columns` });

const insertBody = body(
  "insert",
  {
    table,
    values: z
      .union([row("one row; {} inserts a row of column defaults"), insertRows], {
        error: "expected an object of column values, or an array of such objects",
      })
      .describe("the row to insert (column → value), or an array of rows"),
  },
  "insert rows and return them",
);

const updateBody = body(
  "update",
  {
    table,
    values: row("columns to set (column → new value)").refine((v) => Object.keys(v).length > 0, "must set at least one column"),
    filters: filtersRequired("update"),
  },
  "update the rows matching every filter and return them",
);

const deleteBody = body(
  "delete",
  { table, filters: filtersRequired("delete") },
  "delete the rows matching every filter and return them",
);

export const queryBodies = {
  select: selectBody,
  insert: insertBody,
  update: updateBody,
  delete: deleteBody,
} satisfies { [K in QueryOperation]: z.ZodType };

type Filter = z.infer<typeof filterSchema>;
type Order = z.infer<typeof orderSchema>;

/** Collects values and hands out their `$n` placeholders. */
class Params {
  readonly values: unknown[] = [];
  add(v: unknown): string {
    // Objects and arrays go as JSON text so both drivers send text and PostgreSQL casts it to the
    // column's json/jsonb type; everything else keeps its type and lets PostgreSQL infer.
    this.values.push(v !== null && typeof v === "object" ? JSON.stringify(v) : v);
    return `$${this.values.length}`;
  }
}

/**
 * Safe because the name matched IDENTIFIER, which has no quote in it. The schemas already checked;
 * checking again costs nothing and keeps a future caller from quoting something unchecked.
 */
function quote(name: string): string {
  if (!IDENTIFIER.test(name)) throw new Error(`unchecked identifier reached the query builder: ${JSON.stringify(name)}`);
  return `"${name}"`;
}

function whereClause(filters: Filter[] | undefined, params: Params): string {
  if (!filters?.length) return "";
  const conditions = filters.map((f) => {
    const col = quote(f.column);
    if (f.operator === "is") return `${col} is ${f.value === null ? "null" : f.value ? "true" : "false"}`;
    if (f.operator === "in") {
      const items = f.value as unknown[];
      // One parameter per element (not `= any($1)`): a text[] parameter would not compare with an
      // integer column, while each `$n` here is inferred from the column. `in ()` is not SQL.
      return items.length ? `${col} in (${items.map((v) => params.add(v)).join(", ")})` : "false";
    }
    return `${col} ${COMPARISON_SQL[f.operator]} ${params.add(f.value)}`;
  });
  return ` where ${conditions.join(" and ")}`;
}

function orderClause(order: Order[] | undefined): string {
  if (!order?.length) return "";
  const keys = order.map((o) => {
    const nulls = o.nulls_first === undefined ? "" : o.nulls_first ? " nulls first" : " nulls last";
    return `${quote(o.column)} ${o.ascending ? "asc" : "desc"}${nulls}`;
  });
  return ` order by ${keys.join(", ")}`;
}

function buildSelect(b: z.infer<typeof selectBody>, params: Params): string {
  const columns = b.select ? b.select.map(quote).join(", ") : "*";
  let text = `select ${columns} from ${quote(b.table)}${whereClause(b.filters, params)}${orderClause(b.order)}`;
  if (b.limit !== undefined) text += ` limit ${params.add(b.limit)}`;
  if (b.offset !== undefined) text += ` offset ${params.add(b.offset)}`;
  return text;
}

function buildInsert(b: z.infer<typeof insertBody>, params: Params): string {
  const rows = Array.isArray(b.values) ? b.values : [b.values];
  const columns = Object.keys(rows[0]!);
  if (columns.length === 0) return `insert into ${quote(b.table)} default values returning *`;
  const tuples = rows.map((r) => `(${columns.map((c) => params.add(r[c])).join(", ")})`);
  return `insert into ${quote(b.table)} (${columns.map(quote).join(", ")}) values ${tuples.join(", ")} returning *`;
}

function buildUpdate(b: z.infer<typeof updateBody>, params: Params): string {
  const set = Object.entries(b.values).map(([c, v]) => `${quote(c)} = ${params.add(v)}`);
  return `update ${quote(b.table)} set ${set.join(", ")}${whereClause(b.filters, params)} returning *`;
}

function buildDelete(b: z.infer<typeof deleteBody>, params: Params): string {
  return `delete from ${quote(b.table)}${whereClause(b.filters, params)} returning *`;
}

/**
 * Validates a request body for `op` and builds its statement. Every problem is a 400 naming the
 * field; the body may be raw JSON or what `queryBodies[op]` already parsed.
 */
export function buildQuery(op: QueryOperation, body: unknown): BuiltQuery {
  if (!QUERY_OPERATIONS.includes(op)) throw badRequest(`unknown query operation ${JSON.stringify(op)}; expected one of ${QUERY_OPERATIONS.join(", ")}`);
  const parsed = queryBodies[op].safeParse(body);
  if (!parsed.success) throw badRequest(describeZodError("body", parsed.error));
  const params = new Params();
  const text =
    op === "select"
      ? buildSelect(parsed.data as z.infer<typeof selectBody>, params)
      : op === "insert"
        ? buildInsert(parsed.data as z.infer<typeof insertBody>, params)
        : op === "update"
          ? buildUpdate(parsed.data as z.infer<typeof updateBody>, params)
          : buildDelete(parsed.data as z.infer<typeof deleteBody>, params);
  if (params.values.length > MAX_PARAMS)
    throw badRequest(`query needs ${params.values.length} values; at most ${MAX_PARAMS} fit in one statement`);
  return { text, params: params.values };
}
