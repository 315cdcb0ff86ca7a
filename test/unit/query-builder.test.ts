import type { PGlite } from "@electric-sql/pglite";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import * as z from "zod";
import { type BuiltQuery, buildQuery, QUERY_OPERATIONS, type QueryOperation, queryBodies } from "../../server/databases/query-builder";
import { HttpError } from "../../server/http/errors";
import { freshPglite } from "../support/pglite";

const IDENT_RULE = "(letters, digits and underscore, not starting with a digit, at most 63 characters)";

/** Asserts a 400 whose message contains every fragment, and returns the message. */
function rejects(op: QueryOperation, body: unknown, ...fragments: string[]): string {
  return rejectsWith({ schemaToo: true }, op, body, ...fragments);
}

function rejectsWith(opts: { schemaToo: boolean }, op: QueryOperation, body: unknown, ...fragments: string[]): string {
  let err: unknown;
  try {
    buildQuery(op, body);
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${op} ${JSON.stringify(body)} to be rejected`).toBeInstanceOf(HttpError);
  expect((err as HttpError).status).toBe(400);
  const message = (err as HttpError).message;
  for (const f of fragments) expect(message).toContain(f);
  // The schemas given to the route must agree with the builder.
  if (opts.schemaToo) expect(queryBodies[op].safeParse(body).success).toBe(false);
  return message;
}

const where = (filter: Record<string, unknown>): BuiltQuery => buildQuery("select", { table: "t", filters: [filter] });

describe("filter operators", () => {
  test.each([
    ["eq", "="],
    ["neq", "<>"],
    ["gt", ">"],
    ["gte", ">="],
    ["lt", "<"],
    ["lte", "<="],
  ])("%s compares with %s and a parameter", (operator, sql) => {
    expect(where({ column: "age", operator, value: 18 })).toEqual({ text: `select * from "t" where "age" ${sql} $1`, params: [18] });
  });

  test("like is case-sensitive, ilike is not; the pattern is a parameter", () => {
    expect(where({ column: "name", operator: "like", value: "A%" })).toEqual({ text: `select * from "t" where "name" like $1`, params: ["A%"] });
    expect(where({ column: "name", operator: "ilike", value: "%a_" })).toEqual({ text: `select * from "t" where "name" ilike $1`, params: ["%a_"] });
  });

  test("is takes null, true or false as keywords, never as parameters", () => {
    expect(where({ column: "deleted_at", operator: "is", value: null })).toEqual({ text: `select * from "t" where "deleted_at" is null`, params: [] });
    expect(where({ column: "active", operator: "is", value: true })).toEqual({ text: `select * from "t" where "active" is true`, params: [] });
    expect(where({ column: "active", operator: "is", value: false })).toEqual({ text: `select * from "t" where "active" is false`, params: [] });
  });

  test("in expands to one parameter per element; an empty list matches nothing", () => {
    expect(where({ column: "id", operator: "in", value: [3, 1, 2] })).toEqual({ text: `select * from "t" where "id" in ($1, $2, $3)`, params: [3, 1, 2] });
    expect(where({ column: "id", operator: "in", value: ["a"] })).toEqual({ text: `select * from "t" where "id" in ($1)`, params: ["a"] });
    expect(where({ column: "id", operator: "in", value: [] })).toEqual({ text: `select * from "t" where false`, params: [] });
    // The column does not reach the text, but is still checked.
    rejects("select", { table: "t", filters: [{ column: "a b", operator: "in", value: [] }] }, 'invalid identifier "a b"');
  });

  test("filters AND together and number their parameters in order", () => {
    const q = buildQuery("select", {
      table: "t",
      filters: [
        { column: "a", operator: "eq", value: "x" },
        { column: "b", operator: "in", value: [1, 2] },
        { column: "c", operator: "is", value: null },
        { column: "d", operator: "lt", value: 5 },
      ],
    });
    expect(q).toEqual({ text: `select * from "t" where "a" = $1 and "b" in ($2, $3) and "c" is null and "d" < $4`, params: ["x", 1, 2, 5] });
  });

  test("values keep their type, except objects and arrays, which are sent as JSON text", () => {
    expect(where({ column: "a", operator: "eq", value: true }).params).toEqual([true]);
    expect(where({ column: "a", operator: "eq", value: 1.5 }).params).toEqual([1.5]);
    expect(where({ column: "a", operator: "eq", value: "1" }).params).toEqual(["1"]);
    expect(where({ column: "meta", operator: "eq", value: { k: [1, null] } }).params).toEqual(['{"k":[1,null]}']);
    expect(where({ column: "meta", operator: "eq", value: [1, "x"] }).params).toEqual(['[1,"x"]']);
    expect(where({ column: "meta", operator: "in", value: [{ a: 1 }, 2] }).params).toEqual(['{"a":1}', 2]);
  });
});

describe("select", () => {
  test("all columns, a column list, reserved words as names", () => {
    expect(buildQuery("select", { table: "users" })).toEqual({ text: `select * from "users"`, params: [] });
    expect(buildQuery("select", { table: "users", select: ["id", "name"] })).toEqual({ text: `select "id", "name" from "users"`, params: [] });
    expect(buildQuery("select", { table: "order", select: ["select", "from"] }).text).toBe(`select "select", "from" from "order"`);
    expect(buildQuery("select", { table: "Users", select: ["MixedCase", "_x9"] }).text).toBe(`select "MixedCase", "_x9" from "Users"`);
  });

  test("order: ascending, descending, nulls first/last/absent", () => {
    const order = (o: Record<string, unknown>) => buildQuery("select", { table: "t", order: [o] }).text;
    expect(order({ column: "a", ascending: true })).toBe(`select * from "t" order by "a" asc`);
    expect(order({ column: "a", ascending: false })).toBe(`select * from "t" order by "a" desc`);
    expect(order({ column: "a", ascending: true, nulls_first: true })).toBe(`select * from "t" order by "a" asc nulls first`);
    expect(order({ column: "a", ascending: true, nulls_first: false })).toBe(`select * from "t" order by "a" asc nulls last`);
    expect(order({ column: "a", ascending: false, nulls_first: true })).toBe(`select * from "t" order by "a" desc nulls first`);
    expect(order({ column: "a", ascending: false, nulls_first: false })).toBe(`select * from "t" order by "a" desc nulls last`);
    expect(
      buildQuery("select", { table: "t", order: [{ column: "a", ascending: false }, { column: "b", ascending: true, nulls_first: true }] }).text,
    ).toBe(`select * from "t" order by "a" desc, "b" asc nulls first`);
    expect(buildQuery("select", { table: "t", order: [], filters: [] })).toEqual({ text: `select * from "t"`, params: [] });
  });

  test("limit and offset are parameters after the filter parameters", () => {
    expect(buildQuery("select", { table: "t", limit: 10 })).toEqual({ text: `select * from "t" limit $1`, params: [10] });
    expect(buildQuery("select", { table: "t", offset: 20 })).toEqual({ text: `select * from "t" offset $1`, params: [20] });
    expect(buildQuery("select", { table: "t", limit: 0, offset: 0 })).toEqual({ text: `select * from "t" limit $1 offset $2`, params: [0, 0] });
    expect(buildQuery("select", { table: "t", limit: 10_000 }).params).toEqual([10_000]);
  });

  test("every clause together", () => {
    const q = buildQuery("select", {
      table: "users",
      select: ["id", "name"],
      filters: [
        { column: "age", operator: "gte", value: 18 },
        { column: "name", operator: "ilike", value: "a%" },
      ],
      order: [{ column: "name", ascending: true, nulls_first: true }],
      limit: 10,
      offset: 5,
    });
    expect(q).toEqual({
      text: `select "id", "name" from "users" where "age" >= $1 and "name" ilike $2 order by "name" asc nulls first limit $3 offset $4`,
      params: [18, "a%", 10, 5],
    });
  });
});

describe("insert", () => {
  test("one row", () => {
    expect(buildQuery("insert", { table: "users", values: { name: "Ann", age: 30, active: true, note: null } })).toEqual({
      text: `insert into "users" ("name", "age", "active", "note") values ($1, $2, $3, $4) returning *`,
      params: ["Ann", 30, true, null],
    });
  });

  test("json values become JSON text", () => {
    expect(buildQuery("insert", { table: "t", values: { meta: { a: [1] }, list: [] } }).params).toEqual(['{"a":[1]}', "[]"]);
  });

  test("several rows: one column list from the first row, values in that order whatever the key order", () => {
    expect(buildQuery("insert", { table: "t", values: [{ a: 1, b: "x" }, { b: "y", a: 2 }, { a: 3, b: null }] })).toEqual({
      text: `insert into "t" ("a", "b") values ($1, $2), ($3, $4), ($5, $6) returning *`,
      params: [1, "x", 2, "y", 3, null],
    });
    expect(buildQuery("insert", { table: "t", values: [{ a: 1 }] })).toEqual({ text: `insert into "t" ("a") values ($1) returning *`, params: [1] });
  });

  test("an empty object inserts a row of defaults", () => {
    expect(buildQuery("insert", { table: "t", values: {} })).toEqual({ text: `insert into "t" default values returning *`, params: [] });
  });
});

describe("update and delete", () => {
  test("update sets values first, then filters", () => {
    expect(
      buildQuery("update", {
        table: "users",
        values: { name: "Bo", meta: { x: 1 } },
        filters: [
          { column: "id", operator: "eq", value: 7 },
          { column: "deleted_at", operator: "is", value: null },
        ],
      }),
    ).toEqual({ text: `update "users" set "name" = $1, "meta" = $2 where "id" = $3 and "deleted_at" is null returning *`, params: ["Bo", '{"x":1}', 7] });
  });

  test("delete", () => {
    expect(buildQuery("delete", { table: "users", filters: [{ column: "id", operator: "in", value: [1, 2] }] })).toEqual({
      text: `delete from "users" where "id" in ($1, $2) returning *`,
      params: [1, 2],
    });
    // An empty `in` is a filter that matches nothing: allowed, and deletes nothing.
    expect(buildQuery("delete", { table: "t", filters: [{ column: "id", operator: "in", value: [] }] }).text).toBe(`delete from "t" where false returning *`);
  });
});

describe("validation", () => {
  const f = (column: string, operator: string, value?: unknown) => (value === undefined ? { column, operator } : { column, operator, value });

  test("operation and body shape", () => {
    expect(() => buildQuery("merge" as QueryOperation, { table: "t" })).toThrow(/unknown query operation "merge"/);
    rejects("select", undefined, "body: expected object");
    rejects("select", null, "body: expected object");
    rejects("select", [], "body: expected object");
    rejects("select", "select * from t", "body: expected object");
    rejects("select", {}, "body field 'table': required");
    rejects("select", { table: 5 }, "body field 'table': expected a string");
    rejects("insert", { table: "t" }, "body field 'values'");
  });

  test("messages follow the common body format", () => {
    expect(rejects("select", { table: "na me" })).toBe(`invalid request: body field 'table': invalid identifier "na me" ${IDENT_RULE}`);
    expect(rejects("select", { table: "x".repeat(100_000) })).toBe(`invalid request: body field 'table': invalid identifier "${"x".repeat(64)}"… ${IDENT_RULE}`);
  });

  test("select list, limit, offset", () => {
    rejects("select", { table: "t", select: [] }, "body field 'select'", "at least one column");
    rejects("select", { table: "t", select: "id" }, "body field 'select'");
    rejects("select", { table: "t", select: ["*"] }, "body field 'select.0'", 'invalid identifier "*"');
    rejects("select", { table: "t", limit: 10_001 }, "body field 'limit': must be from 0 to 10000");
    rejects("select", { table: "t", limit: -1 }, "body field 'limit': must be from 0 to 10000");
    rejects("select", { table: "t", limit: 1.5 }, "body field 'limit': must be an integer");
    rejects("select", { table: "t", limit: "10" }, "body field 'limit'");
    rejects("select", { table: "t", offset: -1 }, "body field 'offset': must not be negative");
    rejects("select", { table: "t", offset: 0.5 }, "body field 'offset': must be an integer");
    rejects("select", { table: "t", offset: null }, "body field 'offset'");
  });

  test("order entries", () => {
    rejects("select", { table: "t", order: { column: "a", ascending: true } }, "body field 'order'");
    rejects("select", { table: "t", order: [{ column: "a" }] }, "body field 'order.0.ascending': required");
    rejects("select", { table: "t", order: [{ column: "a", ascending: "asc" }] }, "body field 'order.0.ascending': expected a boolean");
    rejects("select", { table: "t", order: [{ column: "a", ascending: true, nulls_first: "yes" }] }, "body field 'order.0.nulls_first'");
    rejects("select", { table: "t", order: [{ ascending: true }] }, "body field 'order.0.column': required");
    rejects("select", { table: "t", order: [{ column: "a", ascending: true, nullsFirst: true }] }, "body field 'order.0'", 'Unrecognized key: "nullsFirst"');
  });

  test("filter entries", () => {
    const sel = (filter: unknown) => ({ table: "t", filters: [filter] });
    rejects("select", { table: "t", filters: { column: "a", operator: "eq", value: 1 } }, "body field 'filters'");
    rejects("select", sel(f("a", "like")), "body field 'filters.0.value': required");
    rejects("select", sel({ operator: "eq", value: 1 }), "body field 'filters.0.column': required");
    rejects("select", sel({ column: "a", value: 1 }), "body field 'filters.0.operator'");
    rejects("select", sel(f("a", "EQ", 1)), "body field 'filters.0.operator'");
    rejects("select", sel(f("a", "or", 1)), "body field 'filters.0.operator'");
    rejects("select", sel(f("a", "not", 1)), "body field 'filters.0.operator'");
    rejects("select", sel({ column: "a", operator: "eq", valu: 1 }), "body field 'filters.0'");
    rejects("select", sel({ column: "a", operator: "eq", value: 1, or: [] }), "body field 'filters.0'", 'Unrecognized key: "or"');
  });

  test("filter values per operator", () => {
    const sel = (filter: unknown) => ({ table: "t", filters: [filter] });
    for (const op of ["eq", "neq", "gt", "gte", "lt", "lte"]) {
      rejects("select", sel(f("a", op, null)), "body field 'filters.0.value'", `operator '${op}' cannot compare with null; use operator 'is'`);
    }
    for (const op of ["like", "ilike"]) {
      for (const v of [null, 1, true, ["a"], { a: 1 }]) rejects("select", sel(f("a", op, v)), `operator '${op}' needs a string value`);
    }
    for (const v of ["null", 0, 1, "true", [], {}]) rejects("select", sel(f("a", "is", v)), "operator 'is' needs null, true or false as value");
    for (const v of [1, "1,2", null, { 0: 1 }]) rejects("select", sel(f("a", "in", v)), "body field 'filters.0.value': operator 'in' needs an array value");
    rejects("select", sel(f("a", "in", [1, null])), "operator 'in' cannot match null (element 1)");
    // JSON.parse turns an out-of-range number into Infinity.
    rejects("select", JSON.parse('{"table":"t","filters":[{"column":"a","operator":"eq","value":1e400}]}'), "numbers must be finite");
    rejects("select", JSON.parse('{"table":"t","filters":[{"column":"a","operator":"in","value":[1,-1e999]}]}'), "element 1: numbers must be finite");
  });

  test("update and delete need at least one filter", () => {
    rejects("update", { table: "t", values: { a: 1 } }, "body field 'filters': update requires at least one filter");
    rejects("update", { table: "t", values: { a: 1 }, filters: [] }, "body field 'filters': update requires at least one filter");
    rejects("delete", { table: "t" }, "body field 'filters': delete requires at least one filter");
    rejects("delete", { table: "t", filters: [] }, "body field 'filters': delete requires at least one filter");
    rejects("delete", { table: "t", filters: null }, "body field 'filters'");
  });

  test("insert and update values", () => {
    const eq = [f("id", "eq", 1)];
    rejects("update", { table: "t", filters: eq }, "body field 'values'");
    rejects("update", { table: "t", values: {}, filters: eq }, "body field 'values': must set at least one column");
    rejects("update", { table: "t", values: [{ a: 1 }], filters: eq }, "body field 'values'");
    rejects("update", { table: "t", values: "a = 1", filters: eq }, "body field 'values'");
    rejects("insert", { table: "t", values: 3 }, "body field 'values': expected an object of column values, or an array of such objects");
    rejects("insert", { table: "t", values: null }, "body field 'values'");
    rejects("insert", { table: "t", values: [] }, "body field 'values': must contain at least one row");
    rejects("insert", { table: "t", values: [1] }, "body field 'values'");
    rejects("insert", { table: "t", values: [{}] }, "body field 'values.0': a row of a multi-row insert needs at least one column");
    rejects("insert", { table: "t", values: [{ a: 1 }, {}] }, "body field 'values.1'");
    rejects("insert", { table: "t", values: [{ a: 1, b: 2 }, { a: 1 }] }, "body field 'values.1': every row needs the same columns as the first row (a, b)");
    rejects("insert", { table: "t", values: [{ a: 1 }, { a: 1, c: 2 }] }, "body field 'values.1'");
    rejects("insert", { table: "t", values: Array.from({ length: 1001 }, () => ({ a: 1 })) }, "at most 1000 rows per insert");
    rejects("insert", JSON.parse('{"table":"t","values":{"a":1e400}}'), "body field 'values': column a: numbers must be finite");
  });

  test("too many parameters for one statement", () => {
    // Only the builder counts parameters; the schema alone accepts this body.
    rejectsWith({ schemaToo: false }, "select", { table: "t", filters: [f("id", "in", Array.from({ length: 65_536 }, (_, i) => i))] }, "at most 65535");
    expect(buildQuery("select", { table: "t", filters: [f("id", "in", Array.from({ length: 65_535 }, (_, i) => i))] }).params).toHaveLength(65_535);
  });
});

describe("unknown fields", () => {
  test("unknown top-level fields are ignored", () => {
    expect(buildQuery("select", { table: "t", database: "main", comment: "x" })).toEqual({ text: `select * from "t"`, params: [] });
    expect(buildQuery("delete", { table: "t", filters: [{ column: "id", operator: "eq", value: 1 }], returning: "id" }).text).toBe(
      `delete from "t" where "id" = $1 returning *`,
    );
  });

  test("a field of another operation is rejected instead of silently changing the statement", () => {
    const eq = [{ column: "id", operator: "eq", value: 1 }];
    rejects("delete", { table: "t", filters: eq, limit: 1 }, "body field 'limit': not accepted by delete");
    rejects("delete", { table: "t", filters: eq, order: [] }, "body field 'order': not accepted by delete");
    rejects("update", { table: "t", values: { a: 1 }, filters: eq, limit: 1 }, "body field 'limit': not accepted by update");
    rejects("insert", { table: "t", values: { a: 1 }, filters: eq }, "body field 'filters': not accepted by insert");
    rejects("insert", { table: "t", values: { a: 1 }, select: ["a"] }, "body field 'select': not accepted by insert");
    rejects("select", { table: "t", values: { a: 1 } }, "body field 'values': not accepted by select");
    rejects("delete", { table: "t", filters: eq, values: { a: 1 } }, "body field 'values': not accepted by delete");
  });
});

describe("injection", () => {
  const payloads = [
    "users; drop table x",
    '"users"',
    'a"b',
    'a""b',
    "a'b",
    "a b",
    "1abc",
    "--",
    "a--b",
    "a/*b*/",
    "",
    " ",
    "*",
    "a-b",
    "a.b",
    "public.users",
    "users\n",
    "\tusers",
    "a\u0000b",
    "a$1",
    "café",
    "ユーザー",
    "naïve_column",
    "ＡＢＣ", // fullwidth letters
    "\u0430dmin", // Cyrillic a
    "a".repeat(64),
    "_".repeat(64),
    "a".repeat(10_000),
  ];

  /** Every place a name from the body reaches SQL, as a body with the payload in it. */
  const places: [string, QueryOperation, (p: string) => unknown][] = [
    ["table (select)", "select", (p) => ({ table: p })],
    ["table (insert)", "insert", (p) => ({ table: p, values: { a: 1 } })],
    ["table (update)", "update", (p) => ({ table: p, values: { a: 1 }, filters: [{ column: "id", operator: "eq", value: 1 }] })],
    ["table (delete)", "delete", (p) => ({ table: p, filters: [{ column: "id", operator: "eq", value: 1 }] })],
    ["select entry", "select", (p) => ({ table: "t", select: ["id", p] })],
    ["filter column (select)", "select", (p) => ({ table: "t", filters: [{ column: p, operator: "eq", value: 1 }] })],
    ["filter column (is)", "select", (p) => ({ table: "t", filters: [{ column: p, operator: "is", value: null }] })],
    ["filter column (in)", "select", (p) => ({ table: "t", filters: [{ column: p, operator: "in", value: [1] }] })],
    ["filter column (update)", "update", (p) => ({ table: "t", values: { a: 1 }, filters: [{ column: p, operator: "eq", value: 1 }] })],
    ["filter column (delete)", "delete", (p) => ({ table: "t", filters: [{ column: "id", operator: "eq", value: 1 }, { column: p, operator: "like", value: "x" }] })],
    ["order column", "select", (p) => ({ table: "t", order: [{ column: p, ascending: true }] })],
    ["insert values key", "insert", (p) => ({ table: "t", values: { a: 1, [p]: 2 } })],
    ["multi-row insert values key", "insert", (p) => ({ table: "t", values: [{ [p]: 1 }, { [p]: 2 }] })],
    ["update values key", "update", (p) => ({ table: "t", values: { [p]: 1 }, filters: [{ column: "id", operator: "eq", value: 1 }] })],
  ];

  for (const [place, op, bodyWith] of places) {
    test(`names in ${place} outside the identifier rule are 400s`, () => {
      for (const p of payloads) rejects(op, bodyWith(p), "invalid identifier", p.length > 80 ? `${JSON.stringify(p.slice(0, 64))}…` : JSON.stringify(p));
      // The boundary: 63 characters is PostgreSQL's limit and still fine.
      expect(() => buildQuery(op, bodyWith("a".repeat(63)))).not.toThrow();
      expect(buildQuery(op, bodyWith("Ab_9")).text).toContain(`"Ab_9"`);
    });
  }

  test("an identifier is only ever emitted double-quoted", () => {
    const q = buildQuery("update", {
      table: "drop",
      values: { table: 1 },
      filters: [{ column: "where", operator: "eq", value: 2 }],
    });
    expect(q.text).toBe(`update "drop" set "table" = $1 where "where" = $2 returning *`);
  });

  const evil = "'; drop table x; --";
  const evilBodies: [QueryOperation, unknown][] = [
    ["select", { table: "t", filters: [{ column: "a", operator: "eq", value: evil }] }],
    ["select", { table: "t", filters: [{ column: "a", operator: "neq", value: evil }] }],
    ["select", { table: "t", filters: [{ column: "a", operator: "like", value: `%${evil}%` }] }],
    ["select", { table: "t", filters: [{ column: "a", operator: "ilike", value: evil }] }],
    ["select", { table: "t", filters: [{ column: "a", operator: "in", value: ["ok", evil] }] }],
    ["select", { table: "t", filters: [{ column: "a", operator: "gt", value: { [evil]: evil } }] }],
    ["insert", { table: "t", values: { a: evil, b: [evil], c: { k: evil } } }],
    ["insert", { table: "t", values: [{ a: evil }, { a: `${evil}"` }] }],
    ["update", { table: "t", values: { a: evil }, filters: [{ column: "id", operator: "eq", value: evil }] }],
    ["delete", { table: "t", filters: [{ column: "id", operator: "in", value: [evil, `"${evil}"`] }] }],
  ];

  test("values appear only in params, never in the text", () => {
    for (const [op, body] of evilBodies) {
      const q = buildQuery(op, body);
      expect(q.text).not.toContain("drop");
      // No literal of any kind: the text is keywords, quoted identifiers and $n placeholders.
      expect(q.text).not.toMatch(/[';]|--/);
      expect(q.params.some((p) => typeof p === "string" && p.includes(evil))).toBe(true);
    }
  });

  test("the text of any built query is keywords, quoted identifiers and placeholders only", () => {
    // Strip the parts that may vary; what remains must be a fixed vocabulary.
    const vocabulary = new Set(["select", "from", "where", "and", "order", "by", "asc", "desc", "nulls", "first", "last", "limit", "offset", "insert", "into", "values", "default", "returning", "update", "set", "delete", "in", "is", "null", "true", "false", "like", "ilike", "=", "<>", ">", ">=", "<", "<=", "*", ",", "(", ")"]);
    const samples: [QueryOperation, unknown][] = [
      ...evilBodies,
      ["select", { table: "t", select: ["a", "b"], filters: [{ column: "a", operator: "is", value: true }, { column: "b", operator: "in", value: [] }], order: [{ column: "a", ascending: false, nulls_first: true }], limit: 1, offset: 2 }],
      ["insert", { table: "t", values: {} }],
    ];
    for (const [op, body] of samples) {
      const tokens = buildQuery(op, body)
        .text.replace(/"[A-Za-z_][A-Za-z0-9_]{0,62}"/g, " ")
        .replace(/\$\d+/g, " ")
        .replace(/([(),])/g, " $1 ")
        .split(/\s+/)
        .filter(Boolean);
      for (const t of tokens) expect(vocabulary.has(t), `unexpected token ${JSON.stringify(t)}`).toBe(true);
    }
  });
});

describe("schemas", () => {
  test("cover every operation", () => {
    expect([...QUERY_OPERATIONS]).toEqual(["select", "insert", "update", "delete"]);
    expect(Object.keys(queryBodies).sort()).toEqual([...QUERY_OPERATIONS].sort());
  });

  test("turn into self-contained, described JSON Schema for the OpenAPI document", () => {
    for (const op of QUERY_OPERATIONS) {
      const s = z.toJSONSchema(queryBodies[op], { target: "openapi-3.0", io: "input", unrepresentable: "any" }) as Record<string, any>;
      const text = JSON.stringify(s);
      // A $ref would point into a `definitions` block that the OpenAPI document does not have.
      expect(text).not.toContain("$ref");
      expect(s.description).toBeTruthy();
      expect(s.required).toContain("table");
      for (const [name, field] of Object.entries(s.properties as Record<string, any>)) expect(field.description, `${op}.${name}`).toBeTruthy();
    }
    const select = z.toJSONSchema(queryBodies.select, { target: "openapi-3.0", io: "input" }) as any;
    expect(select.properties.filters.items.required).toEqual(["column", "operator", "value"]);
    expect(select.properties.filters.items.properties.operator.enum).toEqual(["eq", "neq", "gt", "gte", "lt", "lte", "like", "ilike", "is", "in"]);
  });

  test("what a route parsed with the schema builds the same query as the raw body", () => {
    const body = { table: "t", select: ["a"], filters: [{ column: "a", operator: "in", value: [1, { j: 2 }] }], order: [{ column: "a", ascending: true }], limit: 3, extra: true };
    const parsed = queryBodies.select.parse(body);
    expect(buildQuery("select", parsed)).toEqual(buildQuery("select", body));
  });
});

// The texts above are only worth something if PostgreSQL accepts them and infers the parameter types
// as intended (integer `in` lists, jsonb from JSON text, limit as a parameter).
describe("runs on PostgreSQL (PGlite)", () => {
  let db: PGlite;
  const run = async (op: QueryOperation, body: unknown) => {
    const q = buildQuery(op, body);
    return (await db.query<Record<string, unknown>>(q.text, q.params)).rows;
  };

  beforeAll(async () => {
    db = await freshPglite();
    await db.exec(`create table "order" (id serial primary key, name text, age int, active boolean, meta jsonb, "select" text default 'd')`);
  }, 60_000);
  afterAll(async () => {
    await db?.close();
  });

  test("insert, select, update, delete round-trip", async () => {
    const inserted = await run("insert", {
      table: "order",
      values: [
        { name: "Ann", age: 30, active: true, meta: { tags: ["a"] } },
        { name: "bob", age: null, active: false, meta: [1] },
        { name: "'; drop table x; --", age: 5, active: null, meta: null },
      ],
    });
    expect(inserted.map((r) => r.id)).toEqual([1, 2, 3]);
    expect(inserted[0]!.meta).toEqual({ tags: ["a"] });
    expect((await run("insert", { table: "order", values: {} }))[0]).toMatchObject({ id: 4, name: null, select: "d" });

    const picked = await run("select", {
      table: "order",
      select: ["id", "name", "select"],
      filters: [{ column: "id", operator: "in", value: [1, 2, 3] }],
      order: [{ column: "age", ascending: false, nulls_first: true }],
      limit: 2,
      offset: 1,
    });
    expect(picked).toEqual([
      { id: 1, name: "Ann", select: "d" },
      { id: 3, name: "'; drop table x; --", select: "d" },
    ]);
    expect((await run("select", { table: "order", filters: [{ column: "meta", operator: "eq", value: { tags: ["a"] } }] })).map((r) => r.id)).toEqual([1]);
    expect((await run("select", { table: "order", filters: [{ column: "active", operator: "is", value: false }] })).map((r) => r.id)).toEqual([2]);
    expect((await run("select", { table: "order", filters: [{ column: "age", operator: "is", value: null }, { column: "name", operator: "ilike", value: "B%" }] })).map((r) => r.id)).toEqual([2]);
    expect(await run("select", { table: "order", filters: [{ column: "id", operator: "in", value: [] }] })).toEqual([]);
    expect(await run("select", { table: "order", limit: 0 })).toEqual([]);

    const updated = await run("update", { table: "order", values: { age: 31, meta: { v: 2 } }, filters: [{ column: "name", operator: "like", value: "A%" }] });
    expect(updated).toMatchObject([{ id: 1, age: 31, meta: { v: 2 } }]);
    expect((await run("delete", { table: "order", filters: [{ column: "id", operator: "gte", value: 3 }] })).map((r) => r.id).sort()).toEqual([3, 4]);
    expect((await run("select", { table: "order", select: ["id"], order: [{ column: "id", ascending: true }] })).map((r) => r.id)).toEqual([1, 2]);
  });
});
