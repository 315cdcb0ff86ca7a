// Paths are exact: a request reaches the resource its path names as sent, or none. Every write route
// of the OpenAPI document (DELETE, PUT, PATCH) is sent, over a raw socket so nothing resolves the
// path first, with one path parameter replaced by a hostile spelling (`..` and `.` as `%2e`, `%2E`,
// `.%2e`, mixed with real names and `/`, `\`, `%2f`, `%5c` separators; overlong UTF-8, double
// encoding, `;`, NUL) against a Kiln seeded with two projects and a variable, an access token, keys,
// a database with a branch, a bucket with an object and a policy. After each request every seeded
// resource must read as before, no answer may be a 5xx, and a path with a dot segment or a
// backslash must be refused (4xx).
//
// Bounded: KILN_PATHS_RUNS (default 120) requests; KILN_PATHS_SEED=<seed> replays a run.
import fc from "fast-check";
import { beforeAll, describe, expect, test } from "vitest";
import { activeDatabase, dbPath } from "../support/databases";
import { createProject, createToken, eventually, useKiln } from "../support/kiln";
import { rawRequest } from "../support/raw-http";

const RUNS = Number(process.env.KILN_PATHS_RUNS ?? 120);
const SEED = process.env.KILN_PATHS_SEED ? Number(process.env.KILN_PATHS_SEED) : undefined;

const k = useKiln();

interface Seed {
  P: string;
  Q: string;
  tokenId: string;
  serviceKey: { id: string; key: string };
  anonKeyId: string;
  bucketId: string;
  policyId: string;
}
let seed: Seed;

const VAR = "VICTIM_VAR";
const DB = "victim";
const BRANCH = "vb_branch";
const BUCKET = "vb";
const OBJECT = "dir/obj.txt";

async function ok<T = any>(p: Promise<{ status: number; body: T; text: string }>, status: number): Promise<T> {
  const r = await p;
  if (r.status !== status) throw new Error(`seeding: ${r.status} ${r.text}`);
  return r.body;
}

beforeAll(async () => {
  const P = (await createProject(k, "victim")).id;
  const Q = (await createProject(k, "bystander")).id;
  await ok(k.api("POST", `/projects/${P}/variables`, { body: { name: VAR, value: "v1" } }), 201);
  const tokenId = (await createToken(k, P)).id;
  const serviceKey = await ok(k.api("POST", `/projects/${P}/service-keys`, { body: { name: "backend" } }), 201);
  const anonKeyId = (await ok(k.api("GET", `/projects/${P}/anon-keys`), 200)).data[0].id;
  await activeDatabase(k, P, DB);
  await ok(k.api("POST", `${dbPath(P, DB)}/branches`, { body: { name: BRANCH } }), 202);
  const bucketId = (await ok(k.api("POST", `/projects/${P}/storage/buckets`, { body: { name: BUCKET } }), 201)).id;
  const form = new FormData();
  form.set("file", new Blob(["seeded"], { type: "text/plain" }), "obj.txt");
  const up = await fetch(`${k.url}/storage/${BUCKET}/${OBJECT}`, { method: "POST", headers: { authorization: `Bearer ${serviceKey.key}` }, body: form });
  if (up.status !== 201) throw new Error(`seeding the object: ${up.status} ${await up.text()}`);
  const policyId = (await ok(k.api("POST", `/storage/buckets/${bucketId}/policies`, { token: serviceKey.key, body: { name: "p1", operation: "SELECT", definition: "true" } }), 201)).id;
  // Settled: the variable propagated, the branch built (their status would change under the test).
  await eventually(() => k.api("GET", `/projects/${P}/variables/${VAR}`), (r) => r.body.status === "active");
  await eventually(() => k.api("GET", `${dbPath(P, DB)}/branches/${BRANCH}`), (r) => r.body.status !== "provisioning", 30_000);
  seed = { P, Q, tokenId, serviceKey, anonKeyId, bucketId, policyId };
}, 120_000);

/** Everything seeded, as read through the API; fields that move by themselves left out. */
async function snapshot(): Promise<Record<string, unknown>> {
  const { P, Q, serviceKey, bucketId } = seed;
  const sk = serviceKey.key;
  const reads: Record<string, [string, string?]> = {
    projects: ["/projects"],
    P: [`/projects/${P}`],
    Q: [`/projects/${Q}`],
    variables: [`/projects/${P}/variables`],
    variable: [`/projects/${P}/variables/${VAR}`],
    tokens: [`/projects/${P}/access-tokens`],
    serviceKeys: [`/projects/${P}/service-keys`],
    anonKeys: [`/projects/${P}/anon-keys`],
    databases: [`/projects/${P}/databases`],
    database: [dbPath(P, DB)],
    branches: [`${dbPath(P, DB)}/branches`],
    buckets: [`/projects/${P}/storage/buckets`],
    objects: [`/storage/${BUCKET}`, sk],
    policies: [`/storage/buckets/${bucketId}/policies`, sk],
  };
  const out: Record<string, unknown> = {};
  await Promise.all(
    Object.entries(reads).map(async ([name, [path, token]]) => {
      const r = await k.api("GET", path, { token });
      out[name] = { status: r.status, body: JSON.parse(JSON.stringify(r.body ?? null, (key, v) => (VOLATILE.has(key) ? undefined : v))) };
    }),
  );
  const obj = await fetch(`${k.url}/storage/${BUCKET}/${OBJECT}`, { headers: { authorization: `Bearer ${sk}` } });
  out.object = { status: obj.status, text: await obj.text() };
  return out;
}
const VOLATILE = new Set(["last_used_at", "storage_bytes", "size_bytes", "connection_string"]);

// ---------------------------------------------------------------------------------------------
// Hostile path parameters.

const DOTS = [".", "..", "%2e", "%2E", ".%2e", "%2e.", ".%2E", "%2E.", "%2e%2e", "%2E%2E", "%2e%2E", "%2E%2e"];
const ODD = [
  "%252e%252e", // double encoding
  "%252e",
  "%c0%ae%c0%ae", // overlong UTF-8 for ".."
  "%c0%ae",
  "%e0%80%ae%e0%80%ae",
  "%ef%bc%8e%ef%bc%8e", // fullwidth full stops
  "%u002e%u002e",
  "..%2f",
  "%2e%2e%2f",
  "%2e%2e%5c",
  "..;",
  ".%00.",
  "%00",
  "...",
  "....",
];
const SEPARATORS = ["/", "\\", "%2f", "%2F", "%5c", "%5C"];

function hostileValue(names: string[]): fc.Arbitrary<string> {
  const part = fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...DOTS) }, { weight: 2, arbitrary: fc.constantFrom(...ODD) }, { weight: 3, arbitrary: fc.constantFrom(...names) });
  const joined = fc
    .array(fc.tuple(part, fc.constantFrom(...SEPARATORS)), { minLength: 1, maxLength: 6 })
    // At least one part that is no real name: the value must never be a legitimate spelling of one.
    .filter((parts) => parts.some(([p]) => !names.includes(p)))
    .map((parts) => parts.map(([p, sep], i) => (i === 0 ? p : sep + p)).join(""));
  return fc.oneof(fc.constantFrom(...DOTS, ...ODD), joined);
}

/** Whether the raw path has a `.`/`..` segment (any spelling) or a backslash: refused, always. */
function mustBeRefused(path: string): boolean {
  if (path.includes("\\")) return true;
  return path
    .split("?")[0]!
    .split("/")
    .some((s) => /^(\.|%2e){1,2}$/i.test(s));
}

const BODIES = [{ name: "pwned" }, { value: "pwned" }, { ttl_seconds: 7200 }, { file_size_limit: 1 }, { is_public: true }, { name: "pwned", value: "pwned", ttl_seconds: 7200, file_size_limit: 1, is_public: true }];

interface Route {
  method: string;
  path: string;
  params: string[];
}

function realValue(route: Route, param: string): string {
  const s = seed;
  switch (param) {
    case "projectId":
      return s.P;
    case "tokenId":
      return s.tokenId;
    case "keyId":
      return route.path.includes("anon-keys") ? s.anonKeyId : s.serviceKey.id;
    case "variableId":
      return VAR;
    case "databaseName":
      return DB;
    case "branchName":
      return BRANCH;
    case "bucketName":
      return BUCKET;
    case "bucketId":
      return s.bucketId;
    case "policyId":
      return s.policyId;
    case "path":
      return OBJECT;
    default:
      return `no-such-${param.toLowerCase()}`;
  }
}

describe("paths are exact", () => {
  test("no write route reaches another resource through a dot segment, an encoded separator or a backslash", async () => {
    const doc = await k.api("GET", "/openapi.json", { token: null });
    expect(doc.status).toBe(200);
    const routes: Route[] = [];
    for (const [path, ops] of Object.entries(doc.body.paths as Record<string, Record<string, unknown>>))
      for (const method of Object.keys(ops)) {
        const params = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!);
        if (["delete", "put", "patch"].includes(method) && params.length > 0) routes.push({ method: method.toUpperCase(), path, params });
      }
    expect(routes.length).toBeGreaterThan(20);
    const s = seed;
    const names = [s.P, s.Q, "projects", VAR, "variables", "access-tokens", s.tokenId, "databases", DB, "branches", BRANCH, "storage", "buckets", BUCKET, s.bucketId, "dir", "obj.txt", "service-keys", s.serviceKey.id];

    const before = await snapshot();
    const caseArb = fc
      .constantFrom(...routes)
      .chain((route) => fc.record({ route: fc.constant(route), param: fc.constantFrom(...route.params), value: hostileValue(names), body: fc.constantFrom(...BODIES) }));
    // The probe's findings, tried first.
    const find = (method: string, path: string) => routes.find((r) => r.method === method && r.path === path)!;
    const examples: [{ route: Route; param: string; value: string; body: object }][] = [
      [{ route: find("DELETE", "/projects/{projectId}/variables/{variableId}"), param: "variableId", value: "%2e%2e", body: BODIES[0]! }],
      [{ route: find("DELETE", "/projects/{projectId}/access-tokens/{tokenId}"), param: "tokenId", value: "%2e%2e", body: BODIES[0]! }],
      [{ route: find("DELETE", "/projects/{projectId}/databases/{databaseName}/branches/{branchName}"), param: "branchName", value: "%2e%2e", body: BODIES[0]! }],
      [{ route: find("DELETE", "/projects/{projectId}/storage/buckets/{bucketName}"), param: "bucketName", value: `${BUCKET}/%2e%2e/${BUCKET}`, body: BODIES[0]! }],
      [{ route: find("PATCH", "/projects/{projectId}/variables/{variableId}"), param: "variableId", value: "x\\..", body: BODIES[0]! }],
      // As many segments as sent once the backslashes are read as `/`: the same route, another name.
      [{ route: find("DELETE", "/projects/{projectId}/variables/{variableId}"), param: "variableId", value: `${VAR}\\..\\${VAR}`, body: BODIES[0]! }],
    ];

    await fc.assert(
      fc.asyncProperty(caseArb, async ({ route, param, value, body }) => {
        const path = route.path.replace(/\{(\w+)\}/g, (_, name: string) => (name === param ? value : realValue(route, name)));
        const token = path.startsWith("/projects/") ? k.token : s.serviceKey.key;
        const r = await rawRequest(k.url, route.method, path, { headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) });
        const what = `${route.method} ${path} -> ${r.status} ${r.text.slice(0, 300)}`;
        expect(r.status, what).toBeGreaterThanOrEqual(200);
        expect(r.status, `a 5xx: ${what}\n${k.stderr.slice(-3000)}`).toBeLessThan(500);
        if (mustBeRefused(path)) expect(r.status, `not refused: ${what}`).toBeGreaterThanOrEqual(400);
        if (r.status >= 400) expect(typeof r.body?.error === "string" || typeof r.body?.code === "string", `not the error shape: ${what}`).toBe(true);
        expect(await snapshot(), `a seeded resource changed after ${what}`).toEqual(before);
      }),
      { numRuns: RUNS, seed: SEED, examples, endOnFailure: true },
    );
  }, 300_000);
});

describe("refused paths", () => {
  const send = (method: string, path: string, o: { token?: string; body?: string; headers?: Record<string, string> } = {}) =>
    rawRequest(k.url, method, path, { headers: { authorization: `Bearer ${o.token ?? k.token}`, ...o.headers }, body: o.body });

  test("a `.` or `..` segment, in any spelling, is a 400 in the error shape before any routing", async () => {
    const { P, Q } = seed;
    for (const dots of ["..", "%2e%2e", "%2E%2e", ".%2e", "%2e.", ".", "%2e"]) {
      for (const [method, path] of [
        ["DELETE", `/projects/${P}/variables/${dots}`],
        ["GET", `/projects/${P}/variables/${dots}`],
        ["DELETE", `/projects/${P}/variables/x/${dots}/${dots}/${Q}`],
        ["PATCH", `/projects/${Q}/${dots}/${P}`],
        ["GET", `/${dots}/projects`],
        // The absolute form of a request target is read the same way.
        ["DELETE", `http://localhost/projects/${P}/variables/${dots}`],
      ]) {
        const r = await send(method!, path!, { body: "{}", headers: { "content-type": "application/json" } });
        expect(r.status, `${method} ${path}`).toBe(400);
        expect(r.body).toEqual({ error: `invalid request: a path segment may not be '${dots.replace(/%2e/gi, ".")}' (paths are used exactly as sent)` });
      }
    }
    expect((await k.api("GET", `/projects/${P}`)).body.status).toBe("active");
    expect((await k.api("GET", `/projects/${Q}`)).body.status).toBe("active");
  });

  test("what the URL parser would change is refused: a backslash, a '#', an empty segment; over 99 segments is a 414", async () => {
    const { P } = seed;
    const cases: [string, number, string][] = [
      [`/projects/${P}/variables/x\\..\\..`, 400, "invalid request: the path holds a backslash: send it percent-encoded (%5C)"],
      [`/projects/${P}\\variables`, 400, "invalid request: the path holds a backslash: send it percent-encoded (%5C)"],
      [`/projects/${P}/variables/${VAR}\\..\\${VAR}`, 400, "invalid request: the path holds a backslash: send it percent-encoded (%5C)"],
      [`/projects/${P}#/variables/${VAR}`, 400, "invalid request: the path holds a '#': send it percent-encoded (%23)"],
      [`/projects/${P}/`, 404, `no route for DELETE /projects/${P}/: a path has no empty segments`],
      [`/projects//${P}`, 404, `no route for DELETE /projects//${P}: a path has no empty segments`],
      [`/projects/${P}/variables/${VAR}//%2e%2e`, 404, `no route for DELETE /projects/${P}/variables/${VAR}/: a path has no empty segments`],
      [`/${"a/".repeat(120)}b`, 414, "the path has more than 99 segments"],
    ];
    for (const [path, status, error] of cases) {
      const r = await send("DELETE", path);
      expect(r.status, path).toBe(status);
      expect(r.body, path).toEqual({ error });
    }
    // Encoded, the same characters are part of a name: no such variable.
    for (const name of ["x%5c..%5c..", "x%23", "%252e%252e", "%c0%ae%c0%ae", "%e0%80%ae", "..%2f..", `${VAR}%2f`])
      expect((await send("DELETE", `/projects/${P}/variables/${name}`)).status, name).toBe(404);
    expect((await k.api("GET", `/projects/${P}/variables/${VAR}`)).status).toBe(200);
    expect((await k.api("GET", `/projects/${P}`)).body.status).toBe("active");
  });

  test("storage object paths with a `.` or `..` segment are 400 'invalid or missing object path' on every object route, and nothing is stored", async () => {
    const sk = seed.serviceKey.key;
    const form = new FormData();
    form.set("file", new Blob(["other"], { type: "text/plain" }), "x.txt");
    const multipart = new Response(form);
    const contentType = multipart.headers.get("content-type")!;
    const upload = await multipart.text();
    const paths = ["a/../x.txt", "a/%2e%2e/x.txt", "dir/.%2E/x.txt", "a/./x.txt", "dir/%2e/obj.txt", "..", "%2e", "x/..", "a%2f..%2fx.txt", "a%2f%2e%2e%2fx.txt", "dir%2f.%2fobj.txt"];
    for (const p of paths) {
      const at = `/storage/${BUCKET}/${p}`;
      const tries: [string, string, RawInit][] = [
        ["POST", at, { body: upload, headers: { "content-type": contentType } }],
        ["POST", at, { body: JSON.stringify({ content_type: "text/plain", total_size: 5 }), headers: { "content-type": "application/json" } }],
        ["GET", at, {}],
        ["HEAD", at, {}],
        ["DELETE", at, {}],
        ["PUT", at, { body: "x", headers: { "content-type": "application/octet-stream", "x-upload-session": "s", "x-part-number": "1" } }],
        ["PATCH", `${at}/visibility`, { body: JSON.stringify({ is_public: true }), headers: { "content-type": "application/json" } }],
      ];
      for (const [method, path, init] of tries) {
        const r = await send(method, path, { token: sk, ...init });
        expect(r.status, `${method} ${path}: ${r.text}`).toBe(400);
        if (method !== "HEAD") expect(r.body, `${method} ${path}`).toEqual({ error: "invalid or missing object path" });
      }
    }
    for (const op of ["move", "copy"])
      for (const [from, to] of [
        [OBJECT, "a/../x.txt"],
        ["dir/../dir/obj.txt", "x.txt"],
      ]) {
        const r = await k.api("POST", `/storage/${BUCKET}/${op}`, { token: sk, body: { from, to } });
        expect(r.status, `${op} ${from} ${to}`).toBe(400);
        expect(r.body).toEqual({ error: "invalid or missing object path" });
      }
    const listed = await k.api("GET", `/storage/${BUCKET}`, { token: sk });
    expect(listed.body.objects.map((o: { name: string }) => o.name)).toEqual([OBJECT]);
  });
});

type RawInit = { body?: string; headers?: Record<string, string> };
