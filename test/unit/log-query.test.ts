// The log search grammar: what it accepts, the SQL it makes, the 400s it points, hostile input, and
// that search (SQL on PostgreSQL) and tail (the in-memory predicate) agree on every line.
import type { PGlite } from "@electric-sql/pglite";
import * as fc from "fast-check";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { normalizeLevel } from "../../server/logs/levels";
import { MAX_QUERY_DEPTH, MAX_QUERY_LENGTH, MAX_QUERY_TERMS, parseQuery, QueryError, toPredicate, toSql, type MatchableLine, type QueryNode } from "../../server/logs/query";
import { freshPglite } from "../support/pglite";

function sql(q: string): { where: string; params: unknown[] } {
  const node = parseQuery(q);
  const params: unknown[] = [];
  return { where: node ? toSql(node, params) : "true", params };
}

function errorOf(q: string): QueryError {
  try {
    parseQuery(q);
  } catch (e) {
    if (e instanceof QueryError) return e;
    throw e;
  }
  throw new Error(`expected ${JSON.stringify(q)} to be refused`);
}

describe("grammar", () => {
  test("blank is no condition; free text terms are ANDed substrings of the body", () => {
    expect(parseQuery("")).toBeNull();
    expect(parseQuery("   \t\n")).toBeNull();
    expect(parseQuery("timeout")).toEqual({ kind: "match", field: "body", value: "timeout" });
    expect(parseQuery("payment failed")).toEqual({
      kind: "and",
      items: [
        { kind: "match", field: "body", value: "payment" },
        { kind: "match", field: "body", value: "failed" },
      ],
    });
    expect(sql("payment failed")).toEqual({ where: "((body ilike $1) and (body ilike $2))", params: ["%payment%", "%failed%"] });
  });

  test("quoted phrases keep spaces, escapes and keywords", () => {
    expect(parseQuery('"card declined: AND OR"')).toEqual({ kind: "match", field: "body", value: "card declined: AND OR" });
    expect(parseQuery('"say \\"hi\\" \\\\ now"')).toEqual({ kind: "match", field: "body", value: 'say "hi" \\ now' });
    expect(parseQuery('body:"a b"')).toEqual({ kind: "match", field: "body", value: "a b" });
  });

  test("fields: body, invocation.id, level (normalised), region, resource.id, resource.name, deployment.id", () => {
    expect(sql("invocation.id:abc")).toEqual({ where: "coalesce(invocation_id = $1, false)", params: ["abc"] });
    expect(sql("level:WARNING")).toEqual({ where: "(level = $1)", params: ["warn"] });
    expect(sql("region:eu")).toEqual({ where: "(region = $1)", params: ["eu"] });
    expect(sql("resource.name:hello resource.id:f1 deployment.id:d1").params).toEqual(["hello", "f1", "d1"]);
    expect(sql("body:x_y%z").params).toEqual(["%x\\_y\\%z%"]);
    // A value may hold colons after the field's.
    expect(parseQuery("body:a:b")).toEqual({ kind: "match", field: "body", value: "a:b" });
    expect(parseQuery("Level:error")).toEqual({ kind: "match", field: "level", value: "error" });
  });

  test("OR groups of a field, and boolean operators with precedence NOT > AND > OR", () => {
    expect(sql("level:(error OR warn)")).toEqual({ where: "((level = $1) or (level = $2))", params: ["error", "warn"] });
    expect(parseQuery("a OR b c")).toEqual({
      kind: "or",
      items: [
        { kind: "match", field: "body", value: "a" },
        {
          kind: "and",
          items: [
            { kind: "match", field: "body", value: "b" },
            { kind: "match", field: "body", value: "c" },
          ],
        },
      ],
    });
    expect(parseQuery("NOT a AND b")).toEqual({
      kind: "and",
      items: [{ kind: "not", item: { kind: "match", field: "body", value: "a" } }, { kind: "match", field: "body", value: "b" }],
    });
    expect(sql("-level:info -(x OR y)").where).toBe("((not (level = $1)) and (not ((body ilike $2) or (body ilike $3))))");
    // Lower-case keywords are words; a '-' inside a word is a character; a lone '-' is a term.
    expect(parseQuery("a or b")).toMatchObject({ kind: "and", items: [{ value: "a" }, { value: "or" }, { value: "b" }] });
    expect(parseQuery("re-try")).toEqual({ kind: "match", field: "body", value: "re-try" });
    expect(parseQuery("a - b")).toMatchObject({ kind: "and", items: [{ value: "a" }, { value: "-" }, { value: "b" }] });
  });

  test("a NOT over a line without an invocation id (build lines) is true, never null", () => {
    expect(sql("-invocation.id:x").where).toBe("(not coalesce(invocation_id = $1, false))");
  });
});

describe("syntax errors point at their position", () => {
  const cases: Array<[string, number, RegExp]> = [
    ['"unbalanced', 1, /unclosed '"'/],
    ['level:error "oops', 13, /unclosed '"'/],
    ["(a OR b", 1, /unclosed '\('/],
    ["a OR b)", 7, /unexpected '\)'/],
    [")", 1, /unexpected '\)'/],
    ["()", 1, /empty group/],
    ["a OR", 5, /expected a term after 'OR' \(at position 3\)/],
    ["OR a", 1, /'OR' needs a term before it/],
    ["a AND AND b", 7, /expected a term after 'AND'/],
    ["NOT", 4, /expected a term after 'NOT'/],
    ["level:", 1, /'level:' needs a value/],
    ["level: error", 1, /'level:' needs a value/],
    ["levle:error", 1, /unknown field 'levle'/],
    ["x http://example.com", 3, /unknown field 'http'.*put text with a colon in quotes/],
    ["level:(body:x)", 8, /field 'body:' inside the group of field 'level:'/],
    ['""', 1, /empty phrase/],
    ["(a) (b", 5, /unclosed '\('/],
    // Positions count characters, not UTF-16 units: the emoji is one.
    ["😀 (x", 3, /unclosed '\('/],
  ];
  for (const [q, position, problem] of cases) {
    test(JSON.stringify(q), () => {
      const e = errorOf(q);
      expect(e.position).toBe(position);
      expect(e.message).toMatch(problem);
      expect(e.message).toMatch(new RegExp(`^invalid query at position ${position}: `));
    });
  }
});

describe("hostile input", () => {
  test("deep nesting is refused at the level past the limit, not by the call stack", () => {
    const deep = "(".repeat(100_000) + "a" + ")".repeat(100_000);
    expect(errorOf(deep.slice(0, MAX_QUERY_LENGTH)).message).toMatch(new RegExp(`nests deeper than ${MAX_QUERY_DEPTH}`));
    expect(errorOf("(".repeat(MAX_QUERY_DEPTH + 1) + "a" + ")".repeat(MAX_QUERY_DEPTH + 1)).position).toBe(MAX_QUERY_DEPTH + 1);
    expect(parseQuery("(".repeat(MAX_QUERY_DEPTH) + "a" + ")".repeat(MAX_QUERY_DEPTH))).toEqual({ kind: "match", field: "body", value: "a" });
    expect(errorOf("NOT ".repeat(MAX_QUERY_DEPTH + 1) + "a").message).toMatch(/nests deeper/);
    expect(errorOf("-".repeat(MAX_QUERY_DEPTH + 1) + "a").message).toMatch(/nests deeper/);
  });

  test("huge input is refused by length before any work; many terms by count", () => {
    const huge = "a ".repeat(5_000_000);
    const t = performance.now();
    expect(errorOf(huge).message).toMatch(new RegExp(`longer than ${MAX_QUERY_LENGTH}`));
    expect(performance.now() - t).toBeLessThan(50);
    expect(errorOf("a ".repeat(MAX_QUERY_TERMS + 1)).message).toMatch(new RegExp(`more than ${MAX_QUERY_TERMS} terms`));
    expect(() => parseQuery("a ".repeat(MAX_QUERY_TERMS))).not.toThrow();
  });

  test("SQL metacharacters only ever become parameter values", () => {
    const evil = `'; drop table log_lines; -- $1 \\ %_ /*`;
    const s = sql(`"${evil.replaceAll("\\", "\\\\")}" OR level:"x');select(1"`);
    expect(s.where).toBe("((body ilike $1) or (level = $2))");
    expect(s.params).toEqual([`%'; drop table log\\_lines; -- $1 \\\\ \\%\\_ /*%`, "x');select(1"]);
  });

  test("NUL and lone surrogates become what the store keeps (U+FFFD); other unicode stays", () => {
    expect(parseQuery("a\u0000b")).toEqual({ kind: "match", field: "body", value: "a\uFFFDb" });
    expect(parseQuery("x\uD800y")).toEqual({ kind: "match", field: "body", value: "x\uFFFDy" });
    expect(parseQuery("región:x")).toMatchObject({ kind: "match", value: "región:x" });
    expect(parseQuery("日本語 ÄPFEL")).toMatchObject({ kind: "and", items: [{ value: "日本語" }, { value: "ÄPFEL" }] });
  });

  test("any string either parses or fails with a QueryError inside the input, never anything else", () => {
    const alphabet = fc.constantFrom("(", ")", '"', "\\", "-", ":", " ", "a", "level", "body", "OR", "AND", "NOT", "\u0000", "😀", "é", "%", "'", ";");
    fc.assert(
      fc.property(fc.array(alphabet, { maxLength: 40 }).map((xs) => xs.join("")), (q) => {
        try {
          const node = parseQuery(q);
          if (node) toSql(node, []);
        } catch (e) {
          expect(e).toBeInstanceOf(QueryError);
          expect((e as QueryError).position).toBeGreaterThanOrEqual(1);
          expect((e as QueryError).position).toBeLessThanOrEqual(Array.from(q).length + 1);
        }
      }),
      { numRuns: 3000 },
    );
  });
});

describe("search (SQL) and tail (predicate) agree", () => {
  let db: PGlite;
  const lines: Array<MatchableLine & { id: number }> = [];
  beforeAll(async () => {
    db = await freshPglite();
    await db.exec(`create table log_lines (id integer, body text not null, invocation_id text, level text not null, region text not null,
      resource_id text not null, resource_name text not null, deployment_id text)`);
    const bodies = ["payment failed", "Payment OK", "timeout after 30 s", "100% done_ok", "ÄPFEL und Birnen", "say \"hi\"", "{\"level\":\"error\",\"msg\":\"boom\"}", "a:b c", "-"];
    let id = 0;
    for (const body of bodies)
      for (const level of ["info", "warn", "error"])
        for (const inv of [null, "inv1"]) lines.push({ id: id++, body, level, invocation_id: inv, region: inv ? "eu" : "us", resource_id: "f1", resource_name: "hello", deployment_id: inv ? null : "d1" });
    for (const l of lines)
      await db.query(`insert into log_lines values ($1, $2, $3, $4, $5, $6, $7, $8)`, [l.id, l.body, l.invocation_id, l.level, l.region, l.resource_id, l.resource_name, l.deployment_id]);
  }, 60_000);
  afterAll(() => db?.close());

  const queries = [
    "payment",
    "PAYMENT -failed",
    '"30 s"',
    "100%",
    "done_ok",
    "_",
    "äpfel",
    'body:"say \\"hi\\""',
    "level:(error OR warn) payment",
    "NOT level:info",
    "-invocation.id:inv1",
    "invocation.id:inv1 OR level:warn",
    "deployment.id:d1 -level:warn",
    "boom level:error",
    '"a:b"',
    "resource.name:hello -(timeout OR payment)",
    "level:warning",
    "-",
  ];
  for (const q of queries) {
    test(q, async () => {
      const node = parseQuery(q) as QueryNode;
      const params: unknown[] = [];
      const where = toSql(node, params);
      const viaSql = (await db.query<{ id: number }>(`select id from log_lines where ${where} order by id`, params)).rows.map((r) => r.id);
      const pred = toPredicate(node);
      const inMemory = lines.filter(pred).map((l) => l.id);
      expect(viaSql).toEqual(inMemory);
      expect(viaSql.length).toBeGreaterThan(0);
      expect(viaSql.length).toBeLessThan(lines.length);
    });
  }

  test("levels normalise the same way on both sides", () => {
    expect(normalizeLevel("WARNING")).toBe("warn");
    expect(normalizeLevel("Critical")).toBe("fatal");
    expect(normalizeLevel("custom-level-that-is-long")).toBe("custom-level-tha");
  });
});
