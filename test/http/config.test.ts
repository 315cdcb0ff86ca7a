// Project configuration as code (spec: Configuration apply report, GET/PUT /projects/{id}/config;
// issue 29; docs/config.md): export in a fixed order (JSON, YAML), apply with a dry run, 422 with
// every problem, 409 for a concurrent apply, per-entry errors without rollback, the 4 MiB cap,
// skipped/missing coverage, round trips byte for byte, and `kiln config export|diff|apply`.
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import YAML from "yaml";
import { activeDatabase, advance } from "../support/databases";
import { deploy, tgz } from "../support/functions";
import { BUN, createProject, createToken, eventually, KILN, removeDir, ROOT, type TestKiln, useKiln } from "../support/kiln";

const k = useKiln();

const CODE = tgz({ "index.js": `exports.handler = async () => "ok";` });

async function deployDurable(projectId: string, name: string) {
  const form = new FormData();
  form.set("name", name);
  form.set("runtime", "nodejs22.x");
  form.set("code", new Blob([new Uint8Array(CODE)]), "code.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string };
}

/** GET the manifest as text, with its status and content type. */
async function exported(projectId: string, o: { token?: string; query?: string; accept?: string } = {}) {
  const res = await fetch(`${k.url}/projects/${projectId}/config${o.query ?? ""}`, { headers: { authorization: `Bearer ${o.token ?? k.token}`, ...(o.accept ? { accept: o.accept } : {}) } });
  return { status: res.status, type: res.headers.get("content-type") ?? "", text: await res.text() };
}
const exportText = async (projectId: string, query = "") => {
  const r = await exported(projectId, { query });
  expect(r.status, r.text).toBe(200);
  return r.text;
};

/** PUT a manifest (an object as JSON, a string as given). */
async function apply(projectId: string, manifest: unknown, o: { dryRun?: boolean; token?: string; type?: string } = {}) {
  return applyOn(k, projectId, manifest, o);
}

async function applyOn(kiln: TestKiln, projectId: string, manifest: unknown, o: { dryRun?: boolean; token?: string; type?: string } = {}) {
  const body = typeof manifest === "string" ? manifest : JSON.stringify(manifest);
  const res = await fetch(`${kiln.url}/projects/${projectId}/config${o.dryRun ? "?dry_run=true" : ""}`, {
    method: "PUT",
    headers: { authorization: `Bearer ${o.token ?? kiln.token}`, "content-type": o.type ?? (typeof manifest === "string" ? "application/yaml" : "application/json") },
    body,
  });
  const text = await res.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, body: json, text };
}

const actions = (report: any) => Object.fromEntries(report.results.map((r: any) => [`${r.section}${r.name !== undefined ? ` ${r.name}` : ""}`, r.action]));
const post = async (path: string, body: unknown) => {
  const r = await k.api("POST", path, { body });
  expect(r.status, r.text).toBeLessThan(300);
  return r.body;
};

/** A project with something in every section: what the round trips carry. */
async function richProject() {
  const p = await createProject(k);
  const base = `/projects/${p.id}`;
  expect((await k.api("PATCH", base, { body: { all_regions: false, selected_regions: ["local"] } })).status).toBe(200);
  await post(`${base}/variables`, { name: "ZETA", value: "last" });
  await post(`${base}/variables`, { name: "API_URL", value: "https://api.example.com" });
  expect((await k.api("PATCH", `/auth/config?project_id=${p.id}`, { body: { allowed_redirect_urls: ["https://app.example.com/cb"], access_token_ttl_seconds: 900, rate_limits: { signup: 7 } } })).status).toBe(200);
  const fn = (await deploy(k, p.id, { name: "hello", runtime: "nodejs22.x", is_public: "true", invocation_mode: "http" }, CODE)).body;
  await post(`${base}/functions/${fn.id}/schedulers`, { name: "nightly", schedule: { kind: "cron", cron_expression: "0 3 * * *" }, payload: { z: 1, a: { y: 2, b: 3 } } });
  await post(`${base}/functions/${fn.id}/schedulers`, { name: "hourly", enabled: false, schedule: { kind: "cron", cron_expression: "0 * * * *" } });
  const durable = await deployDurable(p.id, "checkout");
  await post(`${base}/durable-functions/${durable.id}/schedulers`, { name: "sweep", schedule: { kind: "cron", cron_expression: "*/5 * * * *" }, payload: { all: true } });
  await post(`${base}/storage/buckets`, { name: "avatars", file_size_limit: 1048576, allowed_mime_types: ["image/*"] });
  await post(`${base}/storage/buckets`, { name: "docs" });
  const sk = (await post(`${base}/service-keys`, { name: "admin" })).key;
  const bucket = (await k.api("GET", `${base}/storage/buckets/avatars`)).body;
  for (const pol of [
    { name: "read-own", operation: "SELECT", definition: "owner_id = auth.uid()" },
    { name: "insert-any", operation: "INSERT", definition: "auth.role() = 'authenticated'" },
  ]) {
    const r = await k.api("POST", `/storage/buckets/${bucket.id}/policies`, { token: sk, body: pol });
    expect(r.status, r.text).toBe(201);
  }
  await activeDatabase(k, p.id, "shop");
  expect((await k.api("PUT", `${base}/databases/shop/backup-schedule`, { body: { entries: [{ frequency: "weekly", hour: 4, day: 7 }, { frequency: "daily", hour: 2, retention_seconds: 86400 }] } })).status).toBe(200);
  return { p, fn, durable, sk };
}

/** A project that has the same functions, database and buckets (what a manifest never creates), nothing else. */
async function sameResources() {
  const p = await createProject(k);
  await deploy(k, p.id, { name: "hello", runtime: "nodejs22.x" }, CODE);
  await deployDurable(p.id, "checkout");
  await post(`/projects/${p.id}/storage/buckets`, { name: "avatars" });
  await post(`/projects/${p.id}/storage/buckets`, { name: "docs" });
  await activeDatabase(k, p.id, "shop");
  return p;
}

let rich: Awaited<ReturnType<typeof richProject>>;
beforeAll(async () => {
  rich = await richProject();
}, 120_000);

describe("export", () => {
  test("JSON by default with every section in a fixed order; YAML by Accept or ?format=yaml; two exports byte-identical", async () => {
    const a = await exported(rich.p.id);
    expect(a.status).toBe(200);
    expect(a.type).toMatch(/^application\/json/);
    const m = JSON.parse(a.text);
    expect(Object.keys(m)).toEqual(["version", "project", "variables", "auth", "oauth", "functions", "durable_functions", "databases", "storage", "frontends"]);
    expect(m.oauth).toEqual([]);
    expect(m.frontends).toEqual([]);
    expect(m.version).toBe(1);
    expect(m.project).toEqual({ all_regions: false, selected_regions: ["local"] });
    // Entries by name; variable values for the platform token.
    expect(m.variables).toEqual([
      { name: "API_URL", value: "https://api.example.com" },
      { name: "ZETA", value: "last" },
    ]);
    expect(m.auth).toMatchObject({ allowed_redirect_urls: ["https://app.example.com/cb"], access_token_ttl_seconds: 900, rate_limits: { signup: 7, signin: 300 } });
    expect(Object.keys(m.auth)).toEqual(["allowed_redirect_urls", "allowed_email_domains", "device_verification_url", "require_email_confirmation", "access_token_ttl_seconds", "rate_limits"]);
    expect(m.functions).toEqual([
      {
        name: "hello",
        is_public: true,
        invocation_mode: "http",
        http_auth_mode: "service",
        openapi_spec: null,
        schedulers: [
          { name: "hourly", enabled: false, schedule: { kind: "cron", cron_expression: "0 * * * *" }, payload: {}, regions: [] },
          // The payload's keys sorted at every level: the same state gives the same bytes on both stores.
          { name: "nightly", enabled: true, schedule: { kind: "cron", cron_expression: "0 3 * * *" }, payload: { a: { b: 3, y: 2 }, z: 1 }, regions: [] },
        ],
      },
    ]);
    expect(JSON.stringify(m.functions[0].schedulers[1].payload)).toBe('{"a":{"b":3,"y":2},"z":1}');
    expect(m.durable_functions).toEqual([{ name: "checkout", schedulers: [{ name: "sweep", enabled: true, schedule: { kind: "cron", cron_expression: "*/5 * * * *" }, payload: { all: true }, regions: [] }] }]);
    expect(m.databases).toEqual([{ name: "shop", backup_schedule: [{ frequency: "weekly", hour: 4, day: 7, retention_seconds: expect.any(Number) }, { frequency: "daily", hour: 2, retention_seconds: 86400 }] }]);
    expect(m.storage).toEqual({
      buckets: [
        {
          name: "avatars",
          file_size_limit: 1048576,
          allowed_mime_types: ["image/*"],
          policies: [
            { name: "insert-any", operation: "INSERT", definition: "auth.role() = 'authenticated'" },
            { name: "read-own", operation: "SELECT", definition: "owner_id = auth.uid()" },
          ],
        },
        { name: "docs", file_size_limit: null, allowed_mime_types: [], policies: [] },
      ],
    });
    // No credential of any kind: no keys, tokens, secrets or ids.
    expect(a.text).not.toMatch(/"(sk|ak|pt|pk)-|"id"|connection_string|client_password/);
    expect(a.text).not.toContain(rich.sk);
    expect(a.text).not.toContain(rich.fn.id);
    expect(a.text.endsWith("}\n")).toBe(true);
    expect((await exported(rich.p.id)).text).toBe(a.text);

    const y1 = await exported(rich.p.id, { accept: "application/yaml" });
    expect(y1.type).toMatch(/^application\/yaml/);
    expect(YAML.parse(y1.text)).toEqual(m);
    expect(y1.text.startsWith("version: 1\nproject:\n")).toBe(true);
    const y2 = await exported(rich.p.id, { query: "?format=yaml" });
    expect(y2.text).toBe(y1.text);
    // ?format=json wins over an Accept asking for YAML; a bad format is a 400.
    expect((await exported(rich.p.id, { query: "?format=json", accept: "application/yaml" })).text).toBe(a.text);
    expect((await exported(rich.p.id, { query: "?format=xml" })).status).toBe(400);
  });

  test("variable values only for full-scope credentials: a read-only token exports names", async () => {
    const ro = (await createToken(k, rich.p.id, { scope: "read_only" })).token;
    const full = (await createToken(k, rich.p.id, { scope: "full" })).token;
    const r = await exported(rich.p.id, { token: ro });
    expect(r.status).toBe(200);
    const m = JSON.parse(r.text);
    expect(m.variables).toEqual([{ name: "API_URL" }, { name: "ZETA" }]);
    expect(r.text).not.toContain("https://api.example.com");
    // The auth settings are a credential read in their own area (GET /auth/config): left out. Everything else is the same as the full export.
    expect(m.auth).toBeUndefined();
    const fullText = (await exported(rich.p.id, { token: full })).text;
    const { auth: _auth, ...rest } = JSON.parse(fullText);
    expect({ ...rest, variables: m.variables }).toEqual(m);
    expect(JSON.parse(fullText).variables[0].value).toBe("https://api.example.com");
    // A token of another project: 403; no token: 401.
    const other = await createProject(k);
    expect((await exported(other.id, { token: ro })).status).toBe(403);
    expect((await fetch(`${k.url}/projects/${rich.p.id}/config`)).status).toBe(401);
    // Another account's platform token: the project is not found, for export and apply alike.
    const stranger = (await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "superagent" } })).body.platform_token;
    expect((await exported(rich.p.id, { token: stranger })).status).toBe(404);
    expect((await apply(rich.p.id, { version: 1, variables: [] }, { token: stranger })).status).toBe(404);
    expect((await exported(rich.p.id)).text).toContain("API_URL");
    // Applying that export (names only) with a full token changes nothing: a variable without a value keeps its own.
    const again = await apply(rich.p.id, r.text, { type: "application/json", token: full });
    expect(again.status, again.text).toBe(200);
    expect(again.body.summary).toMatchObject({ created: 0, updated: 0, deleted: 0, errors: 0 });
  });
});

describe("apply", () => {
  test("export → apply: every entry unchanged; applying again is the same; nothing moves", async () => {
    const before = await exportText(rich.p.id);
    for (const body of [before, await exportText(rich.p.id, "?format=yaml")]) {
      const r = await apply(rich.p.id, body, { type: body.startsWith("{") ? "application/json" : "application/yaml" });
      expect(r.status, r.text).toBe(200);
      expect(Object.keys(r.body)).toEqual(["results", "skipped", "missing", "summary"]);
      expect(r.body.results.every((e: any) => e.action === "unchanged"), r.text).toBe(true);
      expect(r.body.summary).toEqual({ created: 0, updated: 0, deleted: 0, unchanged: r.body.results.length, errors: 0, skipped: 0, missing: 0 });
      expect(actions(r.body)).toMatchObject({
        "project regions": "unchanged",
        "variables API_URL": "unchanged",
        auth: "unchanged",
        "functions hello": "unchanged",
        "schedulers hello/nightly": "unchanged",
        "schedulers checkout/sweep": "unchanged",
        "databases shop": "unchanged",
        "storage_buckets avatars": "unchanged",
        "storage_policies avatars/read-own": "unchanged",
      });
    }
    expect(await exportText(rich.p.id)).toBe(before);
  });

  test("export → apply on a new project → export is byte-identical (JSON and YAML)", async () => {
    const source = await exportText(rich.p.id, "?format=yaml");
    const target = await sameResources();
    const r = await apply(target.id, source);
    expect(r.status, r.text).toBe(200);
    expect(r.body.summary).toMatchObject({ errors: 0, skipped: 0, missing: 0, deleted: 0 });
    expect(actions(r.body)).toMatchObject({
      "project regions": "updated",
      "variables API_URL": "created",
      "variables ZETA": "created",
      auth: "updated",
      "functions hello": "updated",
      "schedulers hello/nightly": "created",
      "schedulers hello/hourly": "created",
      "schedulers checkout/sweep": "created",
      "databases shop": "updated",
      "storage_buckets avatars": "updated",
      "storage_policies avatars/read-own": "created",
      "storage_policies avatars/insert-any": "created",
      "storage_buckets docs": "unchanged",
    });
    expect(await exportText(target.id, "?format=yaml")).toBe(source);
    expect(await exportText(target.id)).toBe(await exportText(rich.p.id));
    // Idempotent: the second apply changes nothing.
    const again = await apply(target.id, source);
    expect(again.body.summary).toMatchObject({ created: 0, updated: 0, deleted: 0, errors: 0 });

    // A new, empty project: what a manifest creates arrives byte for byte; functions, the database and
    // the buckets are reported as skipped (never created) and the export shows them absent.
    const empty = await createProject(k);
    const r2 = await apply(empty.id, source);
    expect(r2.status, r2.text).toBe(200);
    expect(r2.body.skipped.map((s: any) => `${s.type} ${s.name}`)).toEqual(["function hello", "durable_function checkout", "database shop", "bucket avatars", "bucket docs"]);
    expect(r2.body.skipped[0].reason).toMatch(/never deploys functions/);
    expect(r2.body.summary).toMatchObject({ skipped: 5, missing: 0, errors: 0 });
    expect((await k.api("GET", `/projects/${empty.id}/functions`)).body.total).toBe(0);
    expect((await k.api("GET", `/projects/${empty.id}/storage/buckets`)).body.buckets).toEqual([]);
    const m = YAML.parse(source);
    const expected = { ...m, functions: [], durable_functions: [], databases: [], storage: { buckets: [] } };
    expect(await exportText(empty.id, "?format=yaml")).toBe(YAML.stringify(expected, { lineWidth: 0 }));
  }, 120_000);

  test("changes in every section: dry run reports them and changes nothing; apply makes them; a section left out is left alone", async () => {
    const target = await sameResources();
    const source = JSON.parse(await exportText(rich.p.id));
    expect((await apply(target.id, source)).body.summary.errors).toBe(0);
    const before = await exportText(target.id);

    const m = JSON.parse(before);
    m.project = { all_regions: true };
    m.variables = [{ name: "API_URL", value: "https://v2.example.com" }, { name: "NEW_ONE", value: "1" }];
    m.auth = { access_token_ttl_seconds: 1200 };
    m.functions[0].is_public = false;
    m.functions[0].invocation_mode = "rpc";
    m.functions[0].schedulers = [{ ...m.functions[0].schedulers[1], schedule: { kind: "cron", cron_expression: "30 3 * * *" } }];
    m.durable_functions[0].schedulers = [];
    m.databases[0].backup_schedule = [{ frequency: "monthly", hour: 1, day: 15 }];
    m.storage.buckets[0].file_size_limit = null;
    m.storage.buckets[0].policies = [{ name: "read-own", operation: "SELECT", definition: "true" }, { name: "update-own", operation: "UPDATE", definition: "owner_id = auth.uid()" }];
    const want = {
      "project regions": "updated",
      "variables API_URL": "updated",
      "variables NEW_ONE": "created",
      "variables ZETA": "deleted",
      auth: "updated",
      "functions hello": "updated",
      "schedulers hello/nightly": "updated",
      "schedulers hello/hourly": "deleted",
      "schedulers checkout/sweep": "deleted",
      "databases shop": "updated",
      "storage_buckets avatars": "updated",
      "storage_policies avatars/read-own": "updated",
      "storage_policies avatars/update-own": "created",
      "storage_policies avatars/insert-any": "deleted",
      "storage_buckets docs": "unchanged",
    };
    const dry = await apply(target.id, m, { dryRun: true });
    expect(dry.status, dry.text).toBe(200);
    expect(actions(dry.body)).toEqual(want);
    expect(dry.body.summary).toEqual({ created: 2, updated: 8, deleted: 4, unchanged: 1, errors: 0, skipped: 0, missing: 0 });
    expect(await exportText(target.id)).toBe(before);
    // Updates say what they change; a variable's update says nothing more (its value is a credential).
    const notices = Object.fromEntries(dry.body.results.filter((r: any) => r.notice).map((r: any) => [`${r.section} ${r.name ?? ""}`.trim(), r.notice]));
    expect(notices).toMatchObject({
      "project regions": 'all_regions: false → true; selected_regions: ["local"] → []',
      auth: "access_token_ttl_seconds: 900 → 1200",
      "functions hello": 'is_public: true → false; invocation_mode: "http" → "rpc"',
      "schedulers hello/nightly": 'schedule: {"kind":"cron","cron_expression":"0 3 * * *"} → {"kind":"cron","cron_expression":"30 3 * * *"}',
      "storage_buckets avatars": "file_size_limit: 1048576 → null",
      "storage_policies avatars/read-own": 'definition: "owner_id = auth.uid()" → "true"',
    });
    expect(notices["databases shop"]).toMatch(/^backup_schedule: /);
    expect(notices["variables API_URL"]).toBeUndefined();
    expect(dry.text).not.toContain("v2.example.com");

    const real = await apply(target.id, m);
    expect(real.status, real.text).toBe(200);
    expect(real.body).toEqual(dry.body);
    const after = JSON.parse(await exportText(target.id));
    expect(after.project).toEqual({ all_regions: true, selected_regions: [] });
    expect(after.variables).toEqual([{ name: "API_URL", value: "https://v2.example.com" }, { name: "NEW_ONE", value: "1" }]);
    expect(after.auth).toMatchObject({ access_token_ttl_seconds: 1200, allowed_redirect_urls: ["https://app.example.com/cb"] });
    expect(after.functions[0]).toMatchObject({ is_public: false, invocation_mode: "rpc", schedulers: [{ name: "nightly", schedule: { cron_expression: "30 3 * * *" }, payload: { a: { b: 3, y: 2 }, z: 1 } }] });
    expect(after.functions[0].schedulers).toHaveLength(1);
    expect(after.durable_functions[0].schedulers).toEqual([]);
    expect(after.databases[0].backup_schedule).toEqual([{ frequency: "monthly", hour: 1, day: 15, retention_seconds: expect.any(Number) }]);
    expect(after.storage.buckets[0]).toMatchObject({ file_size_limit: null, policies: [{ name: "read-own", definition: "true" }, { name: "update-own", operation: "UPDATE" }] });
    // The areas' own state agrees (the change went through their services).
    expect((await k.api("GET", `/projects/${target.id}/variables/NEW_ONE`)).body.value).toBe("1");
    expect((await k.api("GET", `/auth/config?project_id=${target.id}`)).body.access_token_ttl_seconds).toBe(1200);
    // The scheduler's next run follows its new expression (the schedulers service re-armed it).
    const sched = (await k.api("GET", `/projects/${target.id}/schedulers`)).body.data.find((s: any) => s.name === "nightly");
    expect(new Date(sched.next_run_at).getUTCMinutes()).toBe(30);

    // Only the variables section: everything else stays as it is.
    const onlyVars = await apply(target.id, { version: 1, variables: [] });
    expect(actions(onlyVars.body)).toEqual({ "variables API_URL": "deleted", "variables NEW_ONE": "deleted" });
    expect(JSON.parse(await exportText(target.id))).toEqual({ ...after, variables: [] });
  }, 120_000);

  test("422 lists every problem with its path and applies nothing, JSON or YAML", async () => {
    const before = await exportText(rich.p.id);
    const bad = {
      version: 2,
      variables: [{ name: "1BAD", value: "x" }, { name: "OK", value: { nested: true } }, { name: "OK", value: "twice" }, { name: "NEW_GOOD", value: "y" }],
      auth: { access_token_ttl_seconds: 10, allowed_redirect_urls: ["ftp://x"] },
      functions: [{ name: "hello", schedulers: [{ name: "s", schedule: { kind: "cron", cron_expression: "* * *" } }], invocation_mode: "grpc" }],
      storage: { buckets: [{ name: "avatars", policies: [{ name: "p", operation: "SELECT", definition: "owner_id = = (" }] }] },
      webhooks: [],
    };
    const r = await apply(rich.p.id, bad);
    expect(r.status, r.text).toBe(422);
    expect(typeof r.body.error).toBe("string");
    const paths = r.body.errors.map((e: any) => e.path);
    for (const p of ["version", "variables.0.name", "variables.1.value", "auth.access_token_ttl_seconds", "auth.allowed_redirect_urls.0", "functions.0.invocation_mode", "webhooks"]) expect(paths, r.text).toContain(p);
    for (const e of r.body.errors) expect(typeof e.message).toBe("string");
    // Checks past the schema (duplicates, cron, policy definitions) are reported once the schema passes.
    const semantic = await apply(
      rich.p.id,
      "version: 1\nvariables:\n  - {name: OK, value: a}\n  - {name: OK, value: b}\n  - {name: NEW_GOOD, value: y}\nfunctions:\n  - name: hello\n    schedulers:\n      - {name: s, schedule: {kind: cron, cron_expression: '* * *'}}\n      - {name: t, schedule: {kind: cron, cron_expression: '* * * * * *'}}\nstorage:\n  buckets:\n    - name: avatars\n      policies:\n        - {name: p, operation: SELECT, definition: 'owner_id = = ('}\n",
    );
    expect(semantic.status, semantic.text).toBe(422);
    expect(semantic.body.errors.map((e: any) => e.path)).toEqual([
      "variables.1.name",
      "functions.0.schedulers.0.schedule.cron_expression",
      "functions.0.schedulers.1.schedule.cron_expression",
      "storage.buckets.0.policies.0.definition",
    ]);
    // A dry run validates the same way.
    expect((await apply(rich.p.id, bad, { dryRun: true })).status).toBe(422);
    // dry_run=1 is a dry run too; any other value is a 400.
    const put = (q: string) => fetch(`${k.url}/projects/${rich.p.id}/config${q}`, { method: "PUT", headers: { authorization: `Bearer ${k.token}`, "content-type": "application/json" }, body: JSON.stringify({ version: 1, variables: [] }) });
    expect((await put("?dry_run=maybe")).status).toBe(400);
    const one = await put("?dry_run=1");
    expect(one.status).toBe(200);
    expect(((await one.json()) as any).summary.deleted).toBe(2);
    expect(await exportText(rich.p.id)).toBe(before);
    // A body that is not JSON or YAML, and one that is not a manifest at all: 400 and 422.
    expect((await apply(rich.p.id, "version: [1", { type: "application/yaml" })).status).toBe(400);
    expect((await apply(rich.p.id, "{nope", { type: "application/json" })).status).toBe(400);
    expect((await apply(rich.p.id, "", { type: "application/json" })).status).toBe(400);
    // Bodies built to hurt: an alias bomb, nesting past the JSON depth limit (JSON and YAML), a key given twice.
    const levels = ["a: &a [x, x, x, x, x, x, x, x, x]"];
    for (let i = 1; i < 9; i++) levels.push(`l${i}: &l${i} [${Array(9).fill(i === 1 ? "*a" : `*l${i - 1}`).join(", ")}]`);
    const bomb = await apply(rich.p.id, `${levels.join("\n")}\nversion: 1\n`);
    expect(bomb.status, bomb.text).toBe(400);
    const deepJson = await apply(rich.p.id, `{"version": 1, "functions": [{"name": "hello", "schedulers": [{"name": "s", "schedule": {"kind": "cron", "cron_expression": "0 0 * * *"}, "payload": ${"[".repeat(500)}${"]".repeat(500)}}]}]}`, { type: "application/json" });
    expect(deepJson.status).toBe(400);
    expect(deepJson.body.error).toMatch(/nested too deeply/);
    const deepYaml = await apply(rich.p.id, `version: 1\nx: ${"[".repeat(500)}${"]".repeat(500)}\n`);
    expect(deepYaml.status).toBe(400);
    expect((await apply(rich.p.id, "version: 1\nversion: 1\n")).status).toBe(400);
    const notObject = await apply(rich.p.id, [1, 2]);
    expect(notObject.status).toBe(422);
    expect((await apply(rich.p.id, { version: 1, variables: [{ name: "NUL", value: "a\u0000b" }] })).status).toBe(422);
  });

  test("YAML numbers and booleans are variable values as their text", async () => {
    const p = await createProject(k);
    const r = await apply(p.id, "version: 1\nvariables:\n  - {name: PORT, value: 8080}\n  - {name: DEBUG, value: true}\n");
    expect(r.status, r.text).toBe(200);
    expect((await k.api("GET", `/projects/${p.id}/variables/PORT`)).body.value).toBe("8080");
    expect((await k.api("GET", `/projects/${p.id}/variables/DEBUG`)).body.value).toBe("true");
    expect(await exportText(p.id, "?format=yaml")).toContain('  - name: PORT\n    value: "8080"\n');
  });

  test("a body over 4 MiB is a 400; one just under is read", async () => {
    const pad = (n: number) => JSON.stringify({ version: 1, variables: [] }).replace("[]", `[]${" ".repeat(n)}`);
    const over = await apply(rich.p.id, pad(4 * 1024 * 1024), { type: "application/json" });
    expect(over.status).toBe(400);
    expect(over.body.error).toMatch(/4 MiB/);
    const under = await apply(rich.p.id, pad(4 * 1024 * 1024 - 100), { type: "application/json", dryRun: true });
    expect(under.status, under.text).toBe(200);
  });

  test("a read-only token is refused (dry runs too): 403 project access token is read-only", async () => {
    const ro = (await createToken(k, rich.p.id, { scope: "read_only" })).token;
    const manifest = await exportText(rich.p.id);
    for (const dryRun of [false, true]) {
      const r = await apply(rich.p.id, manifest, { token: ro, dryRun, type: "application/json" });
      expect(r.status).toBe(403);
      expect(r.body).toEqual({ error: "project access token is read-only" });
    }
    const full = (await createToken(k, rich.p.id, { scope: "full" })).token;
    expect((await apply(rich.p.id, manifest, { token: full, type: "application/json" })).status).toBe(200);
  });

  test("skipped and missing: a manifest never creates or deletes functions, databases or buckets", async () => {
    const p = await sameResources();
    const r = await apply(p.id, {
      version: 1,
      functions: [{ name: "ghost", is_public: true, schedulers: [{ name: "s", schedule: { kind: "cron", cron_expression: "0 0 * * *" } }] }],
      durable_functions: [{ name: "ghost-flow" }],
      databases: [{ name: "ghostdb", backup_schedule: [] }],
      storage: { buckets: [{ name: "avatars" }, { name: "ghost-bucket", policies: [] }] },
    });
    expect(r.status, r.text).toBe(200);
    expect(r.body.skipped).toEqual([
      { type: "function", name: "ghost", reason: expect.stringMatching(/not deployed/) },
      { type: "durable_function", name: "ghost-flow", reason: expect.any(String) },
      { type: "database", name: "ghostdb", reason: expect.stringMatching(/never creates databases/) },
      { type: "bucket", name: "ghost-bucket", reason: expect.stringMatching(/never creates buckets/) },
    ]);
    expect(r.body.missing).toEqual([
      { type: "function", name: "hello" },
      { type: "durable_function", name: "checkout" },
      { type: "database", name: "shop" },
      { type: "bucket", name: "docs" },
    ]);
    expect(r.body.summary).toMatchObject({ skipped: 4, missing: 4, created: 0, deleted: 0, errors: 0 });
    // Nothing was created, and what was not listed is still there.
    expect((await k.api("GET", `/projects/${p.id}/functions`)).body.data.map((f: any) => f.name)).toEqual(["hello"]);
    expect((await k.api("GET", `/projects/${p.id}/schedulers`)).body.total).toBe(0);
    expect((await k.api("GET", `/projects/${p.id}/storage/buckets`)).body.buckets.map((b: any) => b.name).sort()).toEqual(["avatars", "docs"]);
    expect((await k.api("GET", `/projects/${p.id}/databases/shop`)).status).toBe(200);
  }, 120_000);

  test("a step that fails is an error entry with the service's message; what succeeded stays (HOBBY plan)", async () => {
    const account = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } });
    expect(account.status).toBe(201);
    const token = account.body.platform_token;
    const p = await createProject(k, "hobby-config", token);
    const base = `/projects/${p.id}`;
    const r = await apply(p.id, { version: 1, project: { all_regions: false, selected_regions: ["local"] }, variables: [{ name: "KEPT", value: "yes" }], auth: { require_email_confirmation: true } }, { token });
    expect(r.status, r.text).toBe(200);
    expect(r.body.results).toEqual([
      { section: "project", name: "regions", action: "error", notice: expect.stringMatching(/SUPERAGENT/) },
      { section: "variables", name: "KEPT", action: "created" },
      { section: "auth", action: "updated", notice: "require_email_confirmation: false → true" },
    ]);
    expect(r.body.summary).toMatchObject({ errors: 1, created: 1, updated: 1 });
    expect((await k.api("GET", `${base}/variables/KEPT`, { token })).body.value).toBe("yes");
    expect((await k.api("GET", `/auth/config?project_id=${p.id}`, { token })).body.require_email_confirmation).toBe(true);
    expect((await k.api("GET", base, { token })).body.all_regions).toBe(true);
    // A dry run projects the same error where it can be known ahead (backups need SUPERAGENT).
    await activeDatabase(k, p.id, "tiny", token);
    const exp = await exported(p.id, { token });
    expect(JSON.parse(exp.text).databases).toEqual([{ name: "tiny" }]);
    const dry = await apply(p.id, { version: 1, databases: [{ name: "tiny", backup_schedule: [{ frequency: "daily", hour: 1 }] }] }, { token, dryRun: true });
    expect(dry.body.results).toEqual([{ section: "databases", name: "tiny", action: "error", notice: expect.stringMatching(/not available on the HOBBY plan/i) }]);
    expect(dry.body.summary.errors).toBe(1);
  }, 120_000);

  test("the manifest schema is in the OpenAPI description (GET response, PUT body as JSON and YAML, 422)", async () => {
    const doc = (await k.api("GET", "/openapi.json", { token: null })).body;
    const path = doc.paths["/projects/{projectId}/config"];
    const manifest = path.get.responses["200"].content["application/json"].schema;
    expect(Object.keys(manifest.properties)).toEqual(["version", "project", "variables", "auth", "oauth", "functions", "durable_functions", "databases", "storage", "frontends"]);
    expect(path.put.requestBody.content["application/yaml"].schema.properties.version).toBeTruthy();
    expect(path.put.responses["422"]).toBeTruthy();
    expect(path.put.responses["413"]).toBeUndefined();
    expect(Object.keys(path.put.responses["200"].content["application/json"].schema.properties)).toEqual(["results", "skipped", "missing", "summary"]);
  });
});

describe("oauth and frontends sections", () => {
  const SECRET = "GOCSPX-manifest-secret-0123456789";
  const callback = (provider: string) => `http://localhost:7070/auth/oauth/${provider}/callback`;

  test("oauth: exported without secrets; export → apply unchanged; updates keep the stored secret; a create without its secret is an error entry", async () => {
    const p = await createProject(k);
    const base = `/projects/${p.id}/oauth/configs`;
    await post(base, { provider: "google", client_id: "google-client", client_secret: SECRET, redirect_url: callback("google") });
    await post(base, { provider: "device", client_id: "tv-app" });
    const masked = (await k.api("GET", `${base}/google`)).body.client_secret;
    expect(masked).toMatch(/^GOCS…/);

    const text = await exportText(p.id);
    const m = JSON.parse(text);
    // Providers in the catalogue's order, device clients by client_id; never a secret, masked or not.
    expect(m.oauth).toEqual([
      { provider: "google", client_id: "google-client", enabled: true, redirect_url: callback("google"), scopes: ["openid", "email", "profile"], issuer: null },
      { provider: "device", client_id: "tv-app", enabled: true },
    ]);
    expect(text).not.toContain("client_secret");
    expect(text).not.toContain("GOCS");
    expect(text).not.toContain("0123456789");
    expect((await exported(p.id, { query: "?format=yaml" })).text).not.toContain("GOCS");

    const same = await apply(p.id, text, { type: "application/json" });
    expect(same.status, same.text).toBe(200);
    expect(actions(same.body)).toEqual({ "project regions": "unchanged", auth: "unchanged", "oauth google": "unchanged", "oauth device/tv-app": "unchanged" });

    // An update through the manifest: fields change, the secret stays; a device client listed anew is
    // created, one left out is deleted; a redirect provider without its secret cannot be created.
    const upd = {
      version: 1,
      oauth: [
        { provider: "google", client_id: "google-client-2", enabled: false, redirect_url: callback("google"), scopes: ["openid", "email"] },
        { provider: "github", client_id: "gh-client", redirect_url: callback("github") },
        { provider: "device", client_id: "kiosk", enabled: false },
      ],
    };
    const dry = await apply(p.id, upd, { dryRun: true });
    expect(dry.status, dry.text).toBe(200);
    expect(actions(dry.body)).toEqual({ "oauth google": "updated", "oauth github": "error", "oauth device/kiosk": "created", "oauth device/tv-app": "deleted" });
    expect(dry.body.results.find((r: any) => r.name === "google").notice).toBe('client_id: "google-client" → "google-client-2"; enabled: true → false; scopes: ["openid","email","profile"] → ["openid","email"]');
    expect(dry.body.results.find((r: any) => r.name === "github").notice).toMatch(/client_secret is write-only.*kiln auth oauth configs create github --client-secret/);
    expect(dry.body.summary).toMatchObject({ created: 1, updated: 1, deleted: 1, errors: 1 });
    expect(await exportText(p.id)).toBe(text);

    const r = await apply(p.id, upd);
    expect(r.status, r.text).toBe(200);
    expect(r.body).toEqual(dry.body);
    const google = (await k.api("GET", `${base}/google`)).body;
    expect(google).toMatchObject({ client_id: "google-client-2", enabled: false, scopes: ["openid", "email"], client_secret: masked });
    expect((await k.api("GET", `${base}/github`)).status).toBe(404);
    expect((await k.api("GET", base)).body.configs.map((c: any) => `${c.provider}/${c.client_id}`).sort()).toEqual(["device/kiosk", "google/google-client-2"]);
    // What the apply left is what the next export shows, and applying it again changes nothing.
    const after = JSON.parse(await exportText(p.id));
    expect(after.oauth).toEqual([
      { provider: "google", client_id: "google-client-2", enabled: false, redirect_url: callback("google"), scopes: ["openid", "email"], issuer: null },
      { provider: "device", client_id: "kiosk", enabled: false },
    ]);
    expect((await apply(p.id, after)).body.summary).toMatchObject({ created: 0, updated: 0, deleted: 0, errors: 0 });

    // The OAuth area's rules, at validation: a redirect URL it refuses, a device client with scopes, a
    // provider listed twice, a secret in the manifest: 422, nothing applied.
    const bad = await apply(p.id, {
      version: 1,
      oauth: [
        { provider: "google", client_id: "x", redirect_url: "not a url" },
        { provider: "google", client_id: "y", redirect_url: callback("google") },
        { provider: "device", client_id: "kiosk", scopes: ["openid"] },
        { provider: "apple", client_id: "z", client_secret: "s3cret" },
      ],
    });
    expect(bad.status, bad.text).toBe(422);
    const paths = bad.body.errors.map((e: any) => e.path);
    expect(paths).toEqual(expect.arrayContaining(["oauth.0.redirect_url", "oauth.3.client_secret"]));
    expect(bad.text).not.toContain("s3cret\"");
    const bad2 = await apply(p.id, { version: 1, oauth: [{ provider: "google", client_id: "x", redirect_url: callback("google") }, { provider: "google", client_id: "y", redirect_url: callback("google") }, { provider: "device", client_id: "kiosk", scopes: ["openid"] }] });
    expect(bad2.status, bad2.text).toBe(422);
    expect(bad2.body.errors).toEqual([
      { path: "oauth.1", message: "provider google is listed twice" },
      { path: "oauth.2.scopes", message: "a device client takes only client_id and enabled" },
    ]);
    expect((await k.api("GET", `${base}/google`)).body.client_id).toBe("google-client-2");
  }, 60_000);

  test("frontends: settings and custom domain exported without TLS material; never created or deleted (skipped/missing); settings applied for the next deployment; changes that need an archive or a certificate are error entries", async () => {
    const p = await createProject(k);
    const form = new FormData();
    form.append("name", "site");
    form.append("variables", "API_URL");
    form.set("archive", new Blob([new Uint8Array(tgz({ "dist/index.html": "<h1>hi</h1>", "other/index.html": "<h1>other</h1>" }))]), "site.tgz");
    const res = await fetch(`${k.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    expect(res.status, await res.clone().text()).toBe(201);
    const id = ((await res.json()) as any).id;
    const f = (await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.status === 200 && r.body.status !== "provisioning" && !r.body.pending_deployment_id, 60_000)).body;
    expect(f.status).toBe("active");

    const text = await exportText(p.id);
    const m = JSON.parse(text);
    expect(m.frontends).toEqual([{ name: "site", framework: "static", app_root: f.app_root ?? null, variable_scope: "scoped", variables: ["API_URL"], custom_domain: null }]);
    expect(Object.keys(m.frontends[0])).toEqual(["name", "framework", "app_root", "variable_scope", "variables", "custom_domain"]);
    expect(await exportText(p.id)).toBe(text);

    // export → apply: unchanged, nothing skipped or missing.
    const same = await apply(p.id, text, { type: "application/json" });
    expect(same.status, same.text).toBe(200);
    expect(actions(same.body)).toEqual({ "project regions": "unchanged", auth: "unchanged", "frontends site": "unchanged" });
    expect(same.body.summary).toMatchObject({ unchanged: 3, skipped: 0, missing: 0, errors: 0 });

    // An entry for a frontend the project lacks: skipped; the project's unlisted frontend: missing; neither changes.
    const cover = await apply(p.id, { version: 1, frontends: [{ name: "ghost", variable_scope: "all" }] });
    expect(cover.status, cover.text).toBe(200);
    expect(cover.body.skipped).toEqual([{ type: "frontend", name: "ghost", reason: expect.stringMatching(/never creates frontends/) }]);
    expect(cover.body.missing).toEqual([{ type: "frontend", name: "site" }]);
    expect(cover.body.results).toEqual([]);
    expect(cover.body.summary).toMatchObject({ skipped: 1, missing: 1, errors: 0 });
    expect((await k.api("GET", `/projects/${p.id}/frontends`)).body.data.map((x: any) => x.name)).toEqual(["site"]);

    // Settings are applied for the next deployment (none is made); a different framework takes a
    // deployment of an archive and a new custom domain its certificate: error entries naming the command.
    const change = await apply(p.id, { version: 1, frontends: [{ name: "site", framework: "nextjs", app_root: "./other/", variable_scope: "all", custom_domain: { domain: "www.example.com", tls: { mode: "byoc" } } }] });
    expect(change.status, change.text).toBe(200);
    expect(actions(change.body)).toEqual({ "frontends site": "updated", "frontend_framework site": "error", "frontend_domains site": "error" });
    const notices = Object.fromEntries(change.body.results.map((r: any) => [r.section, r.notice]));
    expect(notices.frontends).toMatch(/^app_root: null → "other"; variable_scope: "scoped" → "all": applies at the frontend's next deployment \(kiln frontends redeploy site\)/);
    expect(notices.frontend_framework).toMatch(/^framework: "static" → "nextjs": .*kiln frontends deploy site/);
    expect(notices.frontend_domains).toMatch(/www\.example\.com.*kiln frontends domain set site www\.example\.com/);
    expect(change.body.summary).toMatchObject({ errors: 2 });
    const after = JSON.parse(await exportText(p.id)).frontends[0];
    expect(after).toEqual({ ...m.frontends[0], app_root: "other", variable_scope: "all" });
    // No deployment was made: the site still serves the archive's root; a redeploy builds from the stored app_root.
    const u = new URL(f.site_url);
    const page = async () => (await fetch(`http://127.0.0.1:${u.port}/`, { headers: { host: u.host } })).text();
    expect(await page()).toContain("<h1>hi</h1>");
    expect((await k.api("GET", `/projects/${p.id}/frontends/${id}/deployments`)).body.total).toBe(1);
    expect((await k.api("POST", `/projects/${p.id}/frontends/${id}/redeploy`)).status).toBe(200);
    const rebuilt = (await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.status === 200 && r.body.status !== "provisioning" && !r.body.pending_deployment_id, 60_000)).body;
    expect(rebuilt.status).toBe("active");
    expect(await page()).toContain("<h1>other</h1>");
    // Back as exported: applied again (unchanged framework and domain left out).
    const back = await apply(p.id, { version: 1, frontends: [{ name: "site", app_root: null, variable_scope: "scoped", variables: ["API_URL"] }] });
    expect(actions(back.body)).toEqual({ "frontends site": "updated" });
    expect(JSON.parse(await exportText(p.id)).frontends).toEqual(m.frontends);
    const none = await apply(p.id, { version: 1, frontends: [{ name: "site", custom_domain: null }] });
    expect(actions(none.body)).toEqual({ "frontends site": "unchanged" });

    // Certificate or key material in a manifest: 422 (unknown fields), nothing applied.
    const bad = await apply(p.id, { version: 1, frontends: [{ name: "site", custom_domain: { domain: "www.example.com", tls: { mode: "byoc", private_key_pem: "-----BEGIN" } } }, { name: "site" }] });
    expect(bad.status, bad.text).toBe(422);
    expect(bad.body.errors.map((e: any) => e.path)).toEqual(["frontends.0.custom_domain.tls.private_key_pem"]);
    const dup = await apply(p.id, { version: 1, frontends: [{ name: "site" }, { name: "site" }] });
    expect(dup.status).toBe(422);
    expect(dup.body.errors).toEqual([{ path: "frontends.1.name", message: "frontend 'site' is listed twice" }]);
  }, 120_000);
});

describe("concurrent applies", () => {
  // A Kiln of its own: its first apply takes the injected hold (it sleeps 60 s on the platform clock
  // while it holds the project), which would stall the other tests' first apply.
  const held = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "config-apply-hold:1" } });

  test("a second apply while one runs for the same project: 409; other projects are not held", async () => {
    const p = await createProject(held);
    const other = await createProject(held);
    const m = { version: 1, variables: [{ name: "RACE", value: "1" }] };
    // Whichever comes first takes the injected hold and sleeps 60 s on the platform clock.
    const first = applyOn(held, p.id, m);
    const second = applyOn(held, p.id, m);
    let done: Array<{ status: number }> = [];
    const settled = Promise.all([first, second]).then((r) => (done = r));
    const deadline = Date.now() + 20_000;
    let conflictSeen = false;
    while (!conflictSeen && Date.now() < deadline) {
      const race = await Promise.race([first, second, new Promise<null>((res) => setTimeout(() => res(null), 100))]);
      if (race && race.status === 409) conflictSeen = true;
    }
    expect(conflictSeen).toBe(true);
    // Meanwhile another project applies at once, and a dry run of the held project is not refused.
    expect((await applyOn(held, other.id, m)).status).toBe(200);
    expect((await applyOn(held, p.id, m, { dryRun: true })).status).toBe(200);
    await advance(held, 61);
    await settled;
    expect(done.map((r) => r.status).sort()).toEqual([200, 409]);
    // Released: the next apply runs.
    const after = await applyOn(held, p.id, m);
    expect(after.status).toBe(200);
    expect(after.body.summary.unchanged).toBe(1);
  }, 60_000);

});

describe("kiln config", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-config-cli-"));
  afterAll(() => removeDir(dir));
  const cli = (args: string[], project: string) => {
    const r = spawnSync(BUN, [KILN, ...args], {
      cwd: ROOT,
      encoding: "utf8",
      env: { ...process.env, KILN_URL: k.url, KILN_TOKEN: k.token, KILN_PROJECT: project, KILN_CONFIG_DIR: dir } as NodeJS.ProcessEnv,
    });
    return { code: r.status, out: r.stdout, err: r.stderr };
  };

  test("export --yaml > kiln.yaml; diff exits 0 in sync, 1 with changes (a readable diff), 2 when it cannot check; apply [--dry-run]", async () => {
    const p = await createProject(k);
    await post(`/projects/${p.id}/variables`, { name: "OLD", value: "1" });
    const file = join(dir, "kiln.yaml");
    const exp = cli(["config", "export", "--yaml"], p.id);
    expect(exp.code, exp.err).toBe(0);
    expect(exp.out).toBe(await exportText(p.id, "?format=yaml"));
    writeFileSync(file, exp.out);
    const json = cli(["config", "export"], p.id);
    expect(json.out).toBe(await exportText(p.id));

    const same = cli(["config", "diff", file], p.id);
    expect(same.code, same.err).toBe(0);
    expect(same.out).toMatch(/No changes: the project matches the manifest/);

    const m = YAML.parse(readFileSync(file, "utf8"));
    m.variables = [{ name: "NEW", value: "2" }];
    m.auth.access_token_ttl_seconds = 600;
    writeFileSync(file, YAML.stringify(m));
    const diff = cli(["config", "diff", file], p.id);
    expect(diff.code, diff.err).toBe(1);
    expect(diff.out.split("\n")).toEqual(expect.arrayContaining(["+ variables NEW", "- variables OLD", "~ auth (access_token_ttl_seconds: 3600 → 600)", "1 to create, 1 to update, 1 to delete; 1 unchanged."]));
    const diffJson = cli(["--json", "config", "diff", file], p.id);
    expect(diffJson.code).toBe(1);
    expect(JSON.parse(diffJson.out).summary).toMatchObject({ created: 1, updated: 1, deleted: 1 });

    const dry = cli(["config", "apply", file, "--dry-run"], p.id);
    expect(dry.code, dry.err).toBe(0);
    expect(dry.out).toContain("+ variables NEW");
    expect((await k.api("GET", `/projects/${p.id}/variables/OLD`)).status).toBe(200);

    const applied = cli(["config", "apply", file], p.id);
    expect(applied.code, applied.err).toBe(0);
    expect(applied.out).toContain("1 created, 1 updated, 1 deleted");
    expect(cli(["config", "diff", file], p.id).code).toBe(0);

    // Cannot check: a missing file, an invalid manifest (every problem listed), a wrong token: exit 2.
    expect(cli(["config", "diff", join(dir, "nope.yaml")], p.id).code).toBe(2);
    expect(cli(["config", "diff"], p.id).code).toBe(2);
    expect(cli(["config", "diff", file, "--no-such-option"], p.id).code).toBe(2);
    writeFileSync(join(dir, "bad.yaml"), "version: 9\nvariables:\n  - name: 1x\n");
    const bad = cli(["config", "diff", join(dir, "bad.yaml")], p.id);
    expect(bad.code).toBe(2);
    expect(bad.err).toMatch(/version: version must be 1/);
    expect(bad.err).toMatch(/variables\.0\.name:/);
    expect(cli(["--token", "pk-wrongwrongwrongwrong", "config", "diff", file], p.id).code).toBe(2);
    // apply exits 1 when an entry failed.
    writeFileSync(join(dir, "fails.json"), JSON.stringify({ version: 1, variables: [{ name: "NOVALUE" }] }));
    const failed = cli(["config", "apply", join(dir, "fails.json")], p.id);
    expect(failed.code).toBe(1);
    expect(failed.out).toMatch(/! variables NOVALUE: variable 'NOVALUE' does not exist and the manifest gives no value/);
  }, 60_000);
});
