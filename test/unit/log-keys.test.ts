// The log store's segment keys (server/backends/logs/keys.ts): a segment's keys never rule out a line that
// matches (checked against PostgreSQL's own ILIKE and against the tail's predicate, on hostile
// text too), what a query requires, and how a batch is cut into segments.
import type { PGlite } from "@electric-sql/pglite";
import * as fc from "fast-check";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { fieldKey, KeySet, keysSatisfy, requiredKeys, SEGMENT_KEYS, SEGMENT_LINES, termKeys } from "../../server/backends/logs/keys";
import { parseQuery, toPredicate, type QueryNode } from "../../server/logs/query";
import { segmentsOf, type StoredLine } from "../../server/backends/logs/log-store";
import { freshPglite } from "../support/pglite";

const keysOf = (...bodies: string[]) => {
  const k = new KeySet();
  for (const b of bodies) k.addBody(b);
  return new Set(k.toArray());
};

// Characters that stress case folding and the ASCII boundary: KELVIN SIGN and I WITH DOT lower to
// ASCII letters in some locales, ſ and ß upper-case to ASCII, fullwidth letters, an emoji, combining marks.
const tricky = ["a", "b", "K", "k", "\u212a", "i", "I", "\u0130", "\u0131", "s", "S", "\u017f", "\u00df", "\u00e4", "\u00c4", "\uff21", "😀", "\u0307", " ", "%", "_", "\\", '"', "-", "1", "\t"];
const trickyString = (max: number) => fc.array(fc.constantFrom(...tricky), { maxLength: max }).map((a) => a.join(""));

describe("segment keys never hide a match", () => {
  let db: PGlite;
  beforeAll(async () => {
    db = await freshPglite();
    await db.waitReady;
  }, 60_000);
  afterAll(() => db?.close());

  test("whenever PostgreSQL's `body ILIKE '%term%'` holds, the body's keys hold every key of the term", async () => {
    const pairs = fc.sample(fc.tuple(trickyString(12), trickyString(5)), 4000);
    // Matches by construction too: the term cut out of the body, in other case.
    for (const [body] of fc.sample(fc.tuple(trickyString(12)), 1000)) {
      const from = Math.floor(body.length / 3);
      // Well-formed, as stored text and queries always are (a cut may split the emoji's surrogates).
      pairs.push([body, body.slice(from, from + 4).toUpperCase().toWellFormed()]);
      pairs.push([body, body.slice(from, from + 4).toLowerCase().toWellFormed()]);
    }
    await db.exec(`create table pairs (n integer, body text, term text)`);
    await db.query(`insert into pairs select * from jsonb_to_recordset($1::text::jsonb) as x(n integer, body text, term text)`, [
      JSON.stringify(pairs.map(([body, term], n) => ({ n, body, term }))),
    ]);
    const matched = (await db.query<{ n: number }>(`select n from pairs where body ilike '%' || replace(replace(replace(term, '\\', '\\\\'), '%', '\\%'), '_', '\\_') || '%'`)).rows;
    expect(matched.length).toBeGreaterThan(1000);
    for (const { n } of matched) {
      const [body, term] = pairs[n]!;
      const have = keysOf(body);
      for (const k of termKeys(term)) expect(have.has(k), `${JSON.stringify(body)} ILIKE ${JSON.stringify(term)}`).toBe(true);
    }
  });

  test("and whenever the tail's predicate (lower-cased substring) holds", () => {
    fc.assert(
      fc.property(trickyString(12), trickyString(5), (body, term) => {
        if (!body.toLowerCase().includes(term.toLowerCase())) return;
        const have = keysOf(body);
        for (const k of termKeys(term)) expect(have.has(k)).toBe(true);
      }),
      { numRuns: 5000 },
    );
  });

  test("a whole query: every line that matches lies in a segment whose keys satisfy what the query requires", () => {
    const line = fc.record({
      body: fc.oneof(trickyString(20), fc.constantFrom("payment failed", "Payment OK", "timeout after 30 s", "100% done_ok", '{"level":"error","msg":"boom"}')),
      level: fc.constantFrom("info", "warn", "error"),
      region: fc.constantFrom("eu", "us"),
      invocation_id: fc.constantFrom(null, "inv1", "inv2"),
      deployment_id: fc.constantFrom(null, "d1"),
      resource_name: fc.constantFrom("hello", "other"),
      resource_id: fc.constantFrom("f1", "f2"),
    });
    const queries = [
      "payment",
      "PAYMENT -failed",
      '"30 s"',
      "ment fa",
      "level:(error OR warn) payment",
      "NOT level:info",
      "invocation.id:inv1 OR level:warn",
      "deployment.id:d1 -level:warn",
      "boom level:error",
      "resource.name:hello (timeout OR payment)",
      "resource.id:f2 region:eu",
      "level:warning",
      "K\u0130",
      "ki",
    ].map((q) => parseQuery(q) as QueryNode);
    fc.assert(
      fc.property(fc.array(line, { minLength: 1, maxLength: 300 }), (ls) => {
        const stored: StoredLine[] = ls.map((l, i) => ({ ...l, id: String(i).padStart(5, "0"), project_id: "p", resource_type: "function", stream: "runtime", structured: false, at: 1000 + (i % 7) }));
        const segments = segmentsOf(stored, (i) => String(i));
        expect(segments.reduce((n, s) => n + s.lines.length, 0)).toBe(stored.length);
        for (const node of queries) {
          const need = requiredKeys(node);
          const matches = toPredicate(node);
          for (const s of segments) {
            const have = new Set(s.keys);
            if (s.lines.some(matches) && need) expect(keysSatisfy(need, (k) => have.has(k))).toBe(true);
          }
        }
      }),
      { numRuns: 200 },
    );
  });
});

describe("what a query requires", () => {
  test("terms need their trigrams, fields their value's key; negations, short terms and OR with either need nothing", () => {
    expect(requiredKeys(parseQuery("ab") as QueryNode)).toBeNull();
    expect(requiredKeys(parseQuery("-payment") as QueryNode)).toBeNull();
    expect(requiredKeys(parseQuery("payment OR ab") as QueryNode)).toBeNull();
    expect(requiredKeys(parseQuery("level:warning") as QueryNode)).toEqual({ kind: "all", keys: [fieldKey("level", "warn")] });
    const both = requiredKeys(parseQuery("abcd level:error -x") as QueryNode);
    expect(both).toEqual({ kind: "all", keys: [...termKeys("abcd"), fieldKey("level", "error")] });
    expect(termKeys("ABcd")).toEqual(termKeys("abcd"));
    expect(termKeys("abcd")).toHaveLength(2);
    // Windows never cross a non-ASCII character.
    expect(termKeys("ab\u00e4cd")).toEqual([]);
    expect(requiredKeys(parseQuery("level:error OR level:warn") as QueryNode)).toEqual({
      kind: "or",
      items: [
        { kind: "all", keys: [fieldKey("level", "error")] },
        { kind: "all", keys: [fieldKey("level", "warn")] },
      ],
    });
    // A term of 4,000 characters requires a bounded, spread subset of its trigrams.
    const long = Array.from({ length: 4000 }, (_, i) => String.fromCharCode(97 + ((i * 7) % 26))).join("");
    const ks = termKeys(long);
    expect(ks.length).toBeLessThanOrEqual(24);
    const have = keysOf(long);
    expect(ks.every((k) => have.has(k))).toBe(true);
    // Trigram keys and field keys never collide.
    expect(fieldKey("level", "x")).toBeLessThan(0);
    expect(Math.min(...termKeys("~~~ zz"))).toBeGreaterThanOrEqual(0);
  });
});

describe("segments", () => {
  const base = { project_id: "p", resource_type: "function" as const, resource_id: "f", resource_name: "fn", deployment_id: "d1", invocation_id: "i", region: "local", level: "info", structured: false };
  test("by project, resource type, stream (and deployment, for builds), in time order, at most SEGMENT_LINES lines and SEGMENT_KEYS keys each", () => {
    const lines: StoredLine[] = [];
    for (let i = 0; i < 300; i++) lines.push({ ...base, id: `a${String(i).padStart(4, "0")}`, stream: "runtime", body: `line ${i}`, at: 5000 - i });
    lines.push({ ...base, id: "b1", project_id: "q", stream: "runtime", body: "other project", at: 1 });
    lines.push({ ...base, id: "c1", stream: "build", body: "build one", at: 2 });
    lines.push({ ...base, id: "c2", stream: "build", deployment_id: "d2", body: "build two", at: 3 });
    const segs = segmentsOf(lines, (i) => `s${i}`);
    const full = Math.floor(300 / SEGMENT_LINES);
    expect(segs.map((s) => s.lines.length)).toEqual([...Array(full).fill(SEGMENT_LINES), 300 - full * SEGMENT_LINES, 1, 1, 1]);
    expect(segs.map((s) => s.seg)).toEqual(segs.map((_, i) => `s${i}`));
    const first = segs[0]!.lines;
    expect(first[0]!.at).toBe(5000 - 299);
    expect(first.every((l, i) => i === 0 || l.at >= first[i - 1]!.at)).toBe(true);
    expect(segs[full + 1]!.lines[0]!.project_id).toBe("q");
    expect(segs[full + 2]!.lines[0]!.deployment_id).toBe("d1");
    expect(segs[full + 3]!.lines[0]!.deployment_id).toBe("d2");
    // Bodies with many distinct trigrams close a segment early.
    const noisy: StoredLine[] = Array.from({ length: 100 }, (_, i) => ({ ...base, id: `n${i}`, stream: "runtime", at: i, body: Array.from({ length: 200 }, () => String.fromCharCode(33 + Math.floor(Math.random() * 94))).join("") }));
    const cut = segmentsOf(noisy, String);
    expect(cut.length).toBeGreaterThan(1);
    for (const s of cut.slice(0, -1)) expect(s.keys.length).toBeGreaterThanOrEqual(SEGMENT_KEYS);
    for (const s of cut) expect(s.lines.length).toBeLessThanOrEqual(SEGMENT_LINES);
    expect(cut.reduce((n, s) => n + s.lines.length, 0)).toBe(100);
  });
});
