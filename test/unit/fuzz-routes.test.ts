// Property-based fuzzing of every route of the router against a real Kiln: hostile path parameters,
// query values and bodies (arbitrary JSON, deep nesting, huge numbers, NUL bytes, wrong types,
// invalid dates, long strings), each sent with a credential the route accepts, so the input gets
// past authentication into validation and the services. No answer may be a 5xx, none may hang.
//
// Bounded: KILN_FUZZ_MS (default 5000) of fuzzing across all routes, each request at most
// KILN_FUZZ_REQUEST_MS (10000). A failure prints the route, the request and Kiln's log (the stack);
// KILN_FUZZ_SEED=<seed> replays a run.
import fc from "fast-check";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { resolveConfig } from "../../server/config";
import { jsonTooDeep } from "../../server/http/body";
import type { RouteDef } from "../../server/http/route";
import { buildRouter } from "../../server/main";
import { createProject, createToken, eventually, removeDir, startKiln, type TestKiln } from "../support/kiln";

const BUDGET_MS = Number(process.env.KILN_FUZZ_MS ?? 5000);
const REQUEST_MS = Number(process.env.KILN_FUZZ_REQUEST_MS ?? 10_000);
const MIN_RUNS = 3;
const MAX_RUNS = Number(process.env.KILN_FUZZ_MAX_RUNS ?? 400);
const SEED = process.env.KILN_FUZZ_SEED ? Number(process.env.KILN_FUZZ_SEED) : undefined;

// ---------------------------------------------------------------------------------------------
// What a fuzzed request is: plain data, so a failure prints it and fast-check can shrink it.

type Body = { kind: "none" } | { kind: "text"; text: string; contentType: string } | { kind: "multipart"; fields: [string, string][]; files: [string, number][] };

interface Case {
  params: Record<string, string>;
  /** Sent percent-encoded unless raw (then as given: "%zz", "%00"). */
  rawParams: boolean;
  query: [string, string][];
  body: Body;
  credential: string;
}

// ---------------------------------------------------------------------------------------------
// Hostile values.

const deepText = (depth: number, open = "[", close = "]", inner = "") => open.repeat(depth) + inner + close.repeat(depth);
const deepObjectText = (depth: number) => '{"a":'.repeat(depth) + "1" + "}".repeat(depth);

const HOSTILE_STRINGS = [
  "",
  " ",
  "\u0000",
  "a\u0000b",
  "\ud800",
  "\udfff\ud800",
  "😀",
  "\u202e",
  "%00",
  "%",
  "%zz",
  "..",
  "../../etc/passwd",
  "' or 1=1 --",
  '"',
  "\\",
  "\\u0000",
  "$1",
  "<script>",
  "null",
  "true",
  "[]",
  "{}",
  "0",
  "-1",
  "-0",
  "1.5",
  "1e400",
  "-1e400",
  "NaN",
  "Infinity",
  "0x10",
  "9007199254740993",
  "99999999999999999999999999999999",
  "-99999999999999999999999999999999",
  "2147483648",
  "0000-01-01T00:00:00Z",
  "0000-12-31T23:59:59+14:00",
  "9999-12-31T23:59:59-14:00",
  "10000-01-01T00:00:00Z",
  "+275760-09-13T00:00:00Z",
  "-000001-01-01T00:00:00Z",
  "2024-02-30T00:00:00Z",
  "2024-13-01T00:00:00Z",
  "2024-01-01T24:00:00Z",
  "2024-01-01T23:59:60Z",
  "2024-01-01",
  "2024-01-01T00:00:00",
  "1970-01-01T00:00:00Z",
  "eyJ2IjoxLCJ0IjoiMDAwMC0wMS0wMVQwMDowMDowMFoiLCJpZCI6IngifQ", // a cursor {v:1,t:"0000-01-01T00:00:00Z",id:"x"}
  "eyJ2IjoxLCJ0IjoiMjAyNC0wMS0wMVQwMDowMDowMFoiLCJpZCI6Ilx1MDAwMCJ9", // a cursor whose id holds a NUL
  "x".repeat(64),
  "a".repeat(257),
  "z".repeat(5000),
];
const LONG_LENGTHS = [65_536, 300_000];

function hostileString(max = 64): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 4, arbitrary: fc.constantFrom(...HOSTILE_STRINGS) },
    { weight: 2, arbitrary: fc.string({ maxLength: max }) },
    { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: max }) },
    { weight: 1, arbitrary: fc.string({ unit: fc.constantFrom("\u0000", "\ud800", "%", "/", "'", '"', "\\", "a"), maxLength: 12 }) },
  );
}

const hostileNumber = fc.oneof(
  fc.constantFrom(0, -0, -1, 1.5, 1e308, -1e308, 5e-324, 2 ** 31, -(2 ** 31) - 1, 2 ** 53, 2 ** 53 + 2, 1e21, -1e21, Number.MAX_SAFE_INTEGER),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
);

/** Any JSON value, with hostile leaves; never deeper than a few levels (deep nesting is made as text). */
const hostileJson: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    hostileString(),
    hostileNumber,
    fc.boolean(),
    fc.constant(null),
    fc.array(tie("value"), { maxLength: 4 }),
    fc.dictionary(fc.oneof(hostileString(12), fc.constantFrom("name", "id", "value", "payload", "table", "email")), tie("value"), { maxKeys: 4 }),
  ),
})).value;

/** JSON text of one value: some that JSON.stringify cannot make (1e999, deep nesting). */
function valueText(plausible: string[]): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 6, arbitrary: hostileJson.map((v) => JSON.stringify(v)) },
    { weight: 3, arbitrary: fc.constantFrom(...plausible).map((v) => JSON.stringify(v)) },
    { weight: 1, arbitrary: fc.constantFrom("1e999", "-1e999", "123456789012345678901234567890", "1e-400", "-0", '"\\u0000"', '"\\ud800"', '"\\\\\\""') },
    { weight: 1, arbitrary: fc.constantFrom(127, 128, 129, 5000).map((d) => deepText(d)) },
    { weight: 1, arbitrary: fc.constantFrom(...LONG_LENGTHS).map((n) => JSON.stringify("y".repeat(n))) },
  );
}

// ---------------------------------------------------------------------------------------------
// Field names from the zod schemas (zod 4 definitions).

function keysOf(schema: unknown, seen = new Set<unknown>()): string[] {
  const def = (schema as { _zod?: { def?: any } } | undefined)?._zod?.def;
  if (!def || seen.has(schema)) return [];
  seen.add(schema);
  switch (def.type) {
    case "object":
      return Object.keys(def.shape);
    case "union":
      return [...new Set((def.options as unknown[]).flatMap((o) => keysOf(o, seen)))];
    case "intersection":
      return [...new Set([...keysOf(def.left, seen), ...keysOf(def.right, seen)])];
    case "pipe":
      return keysOf(def.in, seen);
    case "optional":
    case "nullable":
    case "default":
    case "readonly":
    case "catch":
    case "nonoptional":
      return keysOf(def.innerType, seen);
    default:
      return [];
  }
}

// ---------------------------------------------------------------------------------------------
// The running Kiln and the real things it holds, so some requests reach past "not found".

let k: TestKiln;
let creds: { platform: string; admin: string; projectToken: string; anon: string; service: string; user: string | null };
let valid: Record<string, string[]>;
let plausible: string[];
let sql: ReturnType<typeof postgres> | null = null;

beforeAll(async () => {
  // Rationing would turn most answers into 429s after a few hundred requests.
  k = await startKiln({ env: { KILN_AUTH_FAILURE_LIMIT: "100000000" } });
  const p = await createProject(k, "fuzz");
  const many = Object.fromEntries(["signup", "signin", "refresh", "forgot_password", "reset_password", "change_email"].map((e) => [e, 1_000_000]));
  await k.api("PATCH", `/auth/config?project_id=${p.id}`, { body: { rate_limits: many } });
  const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
  const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "fuzz" } })).body;
  const pt = await createToken(k, p.id);
  const signup = await k.api("POST", "/auth/signup", { token: anon, body: { email: "fuzz@example.com", password: "correct horse battery staple" } });
  const user = (signup.body?.access_token as string | undefined) ?? null;
  await k.api("POST", `/projects/${p.id}/databases`, { body: { name: "fuzzdb" } });
  const db = await eventually(
    () => k.api("GET", `/projects/${p.id}/databases/fuzzdb`),
    (r) => r.body?.status !== "provisioning",
    30_000,
  );
  if (db.body.connection_string) {
    sql = postgres(db.body.connection_string, { max: 1, onnotice: () => {} });
    await sql.unsafe(`create table items (id serial primary key, name text, n integer, big bigint, amount numeric(10,2), data jsonb, at timestamptz, day date, flag boolean, tags text[])`);
    for (const role of ["anonymous", "authenticated", "anon"])
      await sql.unsafe(`grant all on items to ${role}; grant usage on sequence items_id_seq to ${role}`).catch(() => {});
  }
  creds = { platform: k.token, admin: k.adminToken, projectToken: pt.token, anon, service: sk.key, user };
  valid = {
    projectId: [p.id],
    databaseName: ["fuzzdb"],
    keyId: [sk.id],
    tokenId: [pt.id],
    userId: signup.body?.user?.id ? [signup.body.user.id] : [],
    functionId: [],
  };
  plausible = ["items", "fuzzdb", "id", "name", "n", "data", "at", "eq", "in", "is", "like", "nodejs22.x", "fuzz@example.com", "hourly", "2024-01-01T00:00:00Z", p.id, "http://localhost:3000/cb", "functions.invoke"];
}, 90_000);

afterAll(async () => {
  await sql?.end({ timeout: 1 }).catch(() => {});
  if (k) {
    await k.stop();
    removeDir(k.dataDir);
  }
});

// ---------------------------------------------------------------------------------------------
// One route's requests.

function credentialFor(def: RouteDef): fc.Arbitrary<string> {
  const c = creds;
  const all = [c.platform, c.anon, c.anon, c.service, c.service, c.projectToken, ...(c.user ? [c.user, c.user] : []), ""];
  switch (def.auth.kind) {
    case "admin":
      return fc.constant(c.admin);
    case "account":
      return fc.constant(c.platform);
    case "project":
      return fc.constantFrom(c.platform, c.platform, c.projectToken);
    case "anon":
      return fc.constantFrom(c.anon, c.anon, c.service);
    case "user":
      // Logging out would end the session the other requests use.
      return def.path === "/auth/logout" ? fc.constant(c.anon) : fc.constant(c.user ?? c.anon);
    default:
      return fc.constantFrom(...all);
  }
}

function paramsFor(def: RouteDef): fc.Arbitrary<Record<string, string>> {
  const names = [...def.path.matchAll(/\{(\w+)\+?\}/g)].map((m) => m[1]!);
  const shape: Record<string, fc.Arbitrary<string>> = {};
  names.forEach((name, i) => {
    // A DELETE never gets the real thing it would delete (the fuzzing needs it).
    const real = def.method === "DELETE" && i === names.length - 1 ? [] : (valid[name] ?? []);
    shape[name] = real.length ? fc.oneof({ weight: 3, arbitrary: fc.constantFrom(...real) }, { weight: 2, arbitrary: hostileString(300) }) : hostileString(300);
  });
  return fc.record(shape);
}

function queryFor(def: RouteDef): fc.Arbitrary<[string, string][]> {
  const keys = [...keysOf(def.query), "project_id", "page", "limit", "x"];
  const value = fc.oneof({ weight: 3, arbitrary: hostileString(200) }, { weight: 1, arbitrary: fc.constantFrom(...plausible) }, { weight: 1, arbitrary: fc.constantFrom(...LONG_LENGTHS.slice(0, 1)).map((n) => "q".repeat(Math.min(n, 6000))) });
  return fc.array(fc.tuple(fc.constantFrom(...keys), value), { maxLength: 5 });
}

/** A JSON object text with the schema's field names (and others), each value hostile. */
function objectText(keys: string[]): fc.Arbitrary<string> {
  const key = keys.length ? fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...keys) }, { weight: 1, arbitrary: hostileString(16) }) : hostileString(16);
  return fc.array(fc.tuple(key, valueText(plausible)), { maxLength: Math.max(3, keys.length + 1) }).map((entries) => `{${entries.map(([k2, v]) => `${JSON.stringify(k2)}:${v}`).join(",")}}`);
}

/** Query API bodies shaped like the real thing (that operation's fields), so they reach the SQL layer with hostile values. */
function queryBodyText(operation: string): fc.Arbitrary<string> {
  const column = fc.oneof({ weight: 6, arbitrary: fc.constantFrom("id", "name", "n", "big", "amount", "data", "at", "day", "flag", "tags") }, { weight: 1, arbitrary: hostileString(70) });
  const value = fc.oneof({ weight: 3, arbitrary: hostileJson }, { weight: 2, arbitrary: hostileString(40) }, { weight: 2, arbitrary: hostileNumber });
  const filter = fc.record({ column, operator: fc.constantFrom("eq", "neq", "gt", "gte", "lt", "lte", "like", "ilike", "is", "in"), value: fc.oneof(value, fc.array(value, { maxLength: 3 })) });
  const row = fc.dictionary(column, value, { minKeys: 1, maxKeys: 3 });
  const fields: Record<string, fc.Arbitrary<unknown>> = {
    table: fc.oneof({ weight: 6, arbitrary: fc.constant("items") }, { weight: 1, arbitrary: hostileString(70) }),
    values: fc.oneof(row, fc.array(row, { minLength: 1, maxLength: 3 })),
    filters: fc.array(filter, { minLength: operation === "select" ? 0 : 1, maxLength: 3 }),
    select: fc.array(column, { minLength: 1, maxLength: 3 }),
    order: fc.array(fc.record({ column, ascending: fc.boolean(), nulls_first: fc.boolean() }, { requiredKeys: ["column", "ascending"] }), { maxLength: 2 }),
    limit: fc.oneof(fc.nat(100), hostileNumber),
    offset: fc.oneof(fc.nat(1000), hostileNumber),
  };
  const own: Record<string, string[]> = { select: ["table", "select", "filters", "order", "limit", "offset"], insert: ["table", "values"], update: ["table", "values", "filters"], delete: ["table", "filters"] };
  const required: Record<string, string[]> = { select: ["table"], insert: ["table", "values"], update: ["table", "values", "filters"], delete: ["table", "filters"] };
  const pick = Object.fromEntries(own[operation]!.map((f) => [f, fields[f]!]));
  return fc.record(pick, { requiredKeys: required[operation]! }).map((b) => JSON.stringify(b));
}

/** Log search bodies: a valid resource, with hostile queries (grammar operators among them), cursors, bounds and limits. */
function logSearchBodyText(): fc.Arbitrary<string> {
  const q = fc.oneof(
    { weight: 3, arbitrary: fc.array(fc.constantFrom("(", ")", '"', "\\", "-", ":", " ", "OR", "AND", "NOT", "level:", "body:", "invocation.id:", "x", "%", "_", "'", ";", "\u0000", "😀"), { maxLength: 30 }).map((xs) => xs.join("")) },
    { weight: 2, arbitrary: hostileString(300) },
    { weight: 1, arbitrary: fc.constantFrom("(".repeat(5000), "a ".repeat(3000), "level:(error OR warn) -timeout", "\"unclosed") },
  );
  const bound = fc.oneof({ weight: 3, arbitrary: fc.constantFrom("2030-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z") }, { weight: 1, arbitrary: hostileString(40) });
  // Mostly absent or valid, so most requests get as far as the query itself.
  const rarely = <T>(a: fc.Arbitrary<T>) => fc.option(a, { nil: undefined, freq: 4 });
  return fc
    .record({
      resource: fc.record({ type: fc.constantFrom("function", "frontend"), ids: rarely(fc.array(hostileString(40), { maxLength: 3 })), deployments: rarely(fc.record({ ids: fc.array(hostileString(40), { maxLength: 3 }) })) }),
      q,
      limit: rarely(fc.oneof(fc.integer({ min: 1, max: 1000 }), hostileNumber)),
      cursor: rarely(fc.oneof(hostileString(100), fc.constant(Buffer.from(JSON.stringify({ v: 1, t: "2030-01-01T00:00:00.000Z", i: "a", f: "x" })).toString("base64url")))),
      start_time: rarely(bound),
      end_time: rarely(bound),
    })
    .map((b) => JSON.stringify(b));
}

/** Metrics bodies: a valid window, with hostile queries. */
function metricsBodyText(): fc.Arbitrary<string> {
  const query = fc.record({ id: hostileString(40), metric: fc.oneof(fc.constantFrom("request_count", "server_error_count", "availability", "p95_latency"), hostileString(20)), group_by: fc.oneof(fc.constantFrom("region", "resource_type"), hostileString(20)) }, { requiredKeys: ["id", "metric"] });
  return fc.record({ time_range: fc.record({ window: fc.oneof(fc.constantFrom("30m", "1h", "24h", "7d"), hostileString(10)) }), queries: fc.array(query, { minLength: 1, maxLength: 11 }) }).map((b) => JSON.stringify(b));
}

function bodyFor(def: RouteDef): fc.Arbitrary<Body> {
  const json = (text: fc.Arbitrary<string>): fc.Arbitrary<Body> =>
    fc.tuple(text, fc.constantFrom("application/json", "application/json", "text/plain", "application/x-www-form-urlencoded", "")).map(([t, contentType]) => ({ kind: "text", text: t, contentType }));
  if (def.bodyLimit === "deploy") {
    // Multipart deploys: the schema's text fields with hostile values, a file of junk bytes, or a broken body.
    const field = fc.tuple(
      fc.constantFrom("name", "runtime", "handler", "is_public", "invocation_mode", "http_auth_mode", "openapi_spec", "functions", "code", "x"),
      fc.oneof(hostileString(100), fc.constantFrom("nodejs22.x", "fuzz-fn", "true", "rpc", "http", "none", '{"openapi":"3.0.0"}', '[{"name":"a","runtime":"nodejs22.x","file_field":"f"}]', deepText(5000), '{"openapi":"3.0.0","x":' + deepText(200) + "}")),
    );
    return fc.oneof(
      fc.record({ kind: fc.constant("multipart" as const), fields: fc.array(field, { maxLength: 6 }), files: fc.array(fc.tuple(fc.constantFrom("code", "f", "x"), fc.nat(4096)), { maxLength: 2 }) }),
      json(fc.constantFrom("", "--x\r\n", "not multipart")).map((b) => ({ ...b, contentType: "multipart/form-data; boundary=x" }) as Body),
      json(fc.constantFrom("{}", "")),
    );
  }
  if (!def.body) return fc.oneof({ weight: 4, arbitrary: fc.constant({ kind: "none" } as Body) }, { weight: 1, arbitrary: json(fc.constantFrom("{}", "[", deepText(50_000))) });
  const keys = keysOf(def.body);
  const texts: fc.Arbitrary<string>[] = [
    objectText(keys),
    objectText(keys),
    hostileJson.map((v) => JSON.stringify(v)),
    fc.constantFrom("", "{", "[", '{"a":}', "nul", "\ufeff{}", "{}{}", "1e999", '"\\u0000"', "[]", "null", "1", "true", '"s"'),
    fc.constantFrom(128, 129, 50_000).map((d) => deepText(d)),
    fc.constantFrom(129, 50_000).map((d) => deepObjectText(d)),
    // Brackets inside strings are not nesting; escaped quotes do not end a string.
    fc.constantFrom(`{"name":"${"[".repeat(500)}\\"${"{".repeat(500)}"}`, `["\\\\", ${deepText(5)}]`),
  ];
  const operation = /^\/databases\/\{databaseName\}\/query\/(\w+)$/.exec(def.path)?.[1];
  if (operation) for (let i = 0; i < 6; i++) texts.push(queryBodyText(operation));
  if (def.path === "/functions/{functionId}/invoke") texts.push(valueText(plausible).map((v) => `{"payload":${v}}`));
  // Log search and metrics bodies shaped like the real thing, so hostile queries reach the grammar and the SQL.
  if (def.path === "/projects/{projectId}/logs/search") for (let i = 0; i < 16; i++) texts.push(logSearchBodyText());
  if (def.path === "/projects/{projectId}/metrics/query") for (let i = 0; i < 12; i++) texts.push(metricsBodyText());
  return json(fc.oneof(...texts));
}

function caseFor(def: RouteDef): fc.Arbitrary<Case> {
  return fc.record({ params: paramsFor(def), rawParams: fc.boolean(), query: queryFor(def), body: bodyFor(def), credential: credentialFor(def) });
}

// ---------------------------------------------------------------------------------------------
// Sending one.

function encodeSegment(v: string, raw: boolean): string {
  // "." and ".." would be resolved away by the URL: DELETE /projects/{id}/keys/.. is DELETE /projects/{id}.
  if (/^(\.|%2e){1,2}$/i.test(v)) return `${v}x`;
  if (raw && !/[/?#]/.test(v)) return v;
  try {
    return encodeURIComponent(v);
  } catch {
    return encodeURIComponent(v.replace(/[\ud800-\udfff]/g, "\ufffd"));
  }
}

function urlOf(def: RouteDef, c: Case): string {
  const path = def.path.replace(/\{(\w+)\+?\}/g, (_, name: string) => encodeSegment(c.params[name] ?? "", c.rawParams));
  const qs = c.query.map(([key, v]) => `${encodeSegment(key, false)}=${encodeSegment(v, false)}`).join("&");
  return `${k.url}${path}${qs ? `?${qs}` : ""}`;
}

function requestInit(def: RouteDef, c: Case): RequestInit {
  const headers: Record<string, string> = {};
  if (c.credential) headers.authorization = `Bearer ${c.credential}`;
  let body: BodyInit | undefined;
  const mayHaveBody = def.method !== "GET" && def.method !== "HEAD";
  if (mayHaveBody && c.body.kind === "text") {
    body = c.body.text;
    if (c.body.contentType) headers["content-type"] = c.body.contentType;
  } else if (mayHaveBody && c.body.kind === "multipart") {
    const form = new FormData();
    for (const [name, v] of c.body.fields) form.append(name, v);
    for (const [name, size] of c.body.files) form.append(name, new Blob([new Uint8Array(size).map((_, i) => (i * 31) & 0xff)]), "code.tgz");
    body = form;
  }
  return { method: def.method, headers, body, signal: AbortSignal.timeout(REQUEST_MS), redirect: "manual" };
}

function shown(c: Case): string {
  const cut = (s: string) => (s.length > 300 ? `${s.slice(0, 300)}… (${s.length} chars)` : s);
  const body = c.body.kind === "text" ? { ...c.body, text: cut(c.body.text) } : c.body;
  return JSON.stringify({ ...c, params: Object.fromEntries(Object.entries(c.params).map(([n, v]) => [n, cut(v)])), query: c.query.map(([n, v]) => [n, cut(v)]), body, credential: c.credential ? `${c.credential.slice(0, 3)}…` : "" });
}

/** Answers per route and status: KILN_FUZZ_STATS=1 prints them (2: and the first error messages), to see how far the requests get. */
const statuses: Record<string, Record<number, number>> = {};

async function send(def: RouteDef, c: Case): Promise<void> {
  const url = urlOf(def, c);
  const logFrom = k.stderr.length;
  const started = Date.now();
  let status: number;
  let text: string;
  try {
    const res = await fetch(url, requestInit(def, c));
    status = res.status;
    // A live stream (the log tail) answered: its status is the answer; the stream never ends.
    if (res.ok && res.headers.get("content-type")?.startsWith("text/event-stream")) {
      await res.body?.cancel();
      text = "";
    } else text = await res.text();
    const seen = (statuses[`${def.method} ${def.path}`] ??= {});
    seen[status] = (seen[status] ?? 0) + 1;
    if (process.env.KILN_FUZZ_STATS === "2" && status >= 400 && seen[status] <= 3) console.log(def.method, def.path, status, text.slice(0, 200));
  } catch (err) {
    throw new Error(`${def.method} ${def.path}: no answer within ${REQUEST_MS} ms (${(err as Error).message}) after ${Date.now() - started} ms\nrequest: ${shown(c)}\nKiln log:\n${k.stderr.slice(logFrom).slice(-4000)}`);
  }
  if (status >= 500) {
    await new Promise((r) => setTimeout(r, 50)); // let the log line arrive
    throw new Error(`${def.method} ${def.path} answered ${status}: ${text.slice(0, 500)}\nurl: ${url.slice(0, 500)}\nrequest: ${shown(c)}\nKiln log:\n${k.stderr.slice(logFrom).slice(-4000)}`);
  }
}

// ---------------------------------------------------------------------------------------------

const routes = buildRouter(resolveConfig({})).routes;

describe("fuzzing every route", () => {
  test(`${routes.length} routes: hostile params, queries and bodies never get a 5xx or hang`, async () => {
    const started = Date.now();
    const deadline = started + BUDGET_MS;
    let total = 0;
    const failures: string[] = [];
    for (const [i, def] of routes.entries()) {
      // Each route gets an even share of what is left of the budget, and at least MIN_RUNS requests.
      const until = Date.now() + Math.max(0, Math.floor((deadline - Date.now()) / (routes.length - i)));
      let runs = 0;
      const out = await fc.check(
        fc.asyncProperty(caseFor(def), async (c) => {
          if (runs >= MIN_RUNS && Date.now() > until) return;
          runs++;
          await send(def, c);
        }),
        { numRuns: MAX_RUNS, seed: SEED, endOnFailure: true },
      );
      total += runs;
      if (out.failed) failures.push(`${def.method} ${def.path} (seed ${out.seed}, path ${out.counterexamplePath}):\n${String((out.errorInstance as Error)?.message ?? out.errorInstance)}`);
    }
    console.log(`fuzzing: ${total} requests to ${routes.length} routes in ${Date.now() - started} ms`);
    if (process.env.KILN_FUZZ_STATS) for (const [route, byStatus] of Object.entries(statuses)) console.log(route, JSON.stringify(byStatus));
    expect(failures, failures.join("\n\n")).toEqual([]);
  }, BUDGET_MS + 120_000);
});

describe("the nesting scan", () => {
  /** Nesting of arrays and objects in a parsed value, by a walk with its own stack. */
  function depthOf(root: unknown): number {
    let max = 0;
    const stack: [unknown, number][] = [[root, 0]];
    while (stack.length) {
      const [v, d] = stack.pop()!;
      if (v && typeof v === "object") {
        max = Math.max(max, d + 1);
        for (const x of Object.values(v)) stack.push([x, d + 1]);
      }
    }
    return max;
  }

  test("agrees with the parsed value's depth for any JSON, brackets, quotes and backslashes in strings included", () => {
    const tricky = fc.string({ unit: fc.constantFrom("[", "]", "{", "}", '"', "\\", "a", "\u0000"), maxLength: 12 });
    const value = fc.letrec((tie) => ({
      v: fc.oneof({ depthSize: "large" }, tricky, fc.integer(), fc.constant(null), fc.array(tie("v"), { maxLength: 3 }), fc.dictionary(tricky, tie("v"), { maxKeys: 3 })),
    })).v;
    fc.assert(
      fc.property(value, fc.nat(12), fc.boolean(), (v, max, pretty) => {
        const text = pretty ? JSON.stringify(v, null, 2) : JSON.stringify(v);
        expect(jsonTooDeep(text, max)).toBe(depthOf(v) > max);
      }),
      { numRuns: 2000 },
    );
  });
});
