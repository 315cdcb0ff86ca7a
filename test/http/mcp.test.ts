// The MCP endpoint (POST /mcp), driven by the MCP SDK's own client over its streamable HTTP
// transport: initialize, tools per token scope, every tool against real state, the resources,
// credentials (project access tokens only) and JSON-RPC errors.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createProject, createToken, eventually, useKiln } from "../support/kiln";

const k = useKiln();

const READ_TOOLS = ["list_functions", "get_function", "search_logs", "list_databases", "select_rows", "run_readonly_sql", "list_buckets", "list_objects", "list_schedulers", "export_config"];
const WRITE_TOOLS = ["deploy_function", "invoke_function", "modify_rows", "create_scheduler", "update_scheduler", "delete_scheduler", "dry_run_config"];

const GREET = {
  "index.js": `exports.handler = async (event) => { console.log("greeting " + (event?.name ?? "nobody")); return { hello: event?.name ?? "world" }; };`,
};

let project: { id: string };
let full: string;
let fullId: string;
let readOnly: string;
let serviceKey: string;
let anonKey: string;
const clients: Client[] = [];

/** An SDK client connected to this Kiln's /mcp with the given bearer (initialize happens in connect). */
async function connect(token: string): Promise<Client> {
  const client = new Client({ name: "kiln-test", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(`${k.url}/mcp`), { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
  await client.connect(transport);
  clients.push(client);
  return client;
}

type ToolOut = CallToolResult & { structuredContent?: any };
const call = async (c: Client, name: string, args: Record<string, unknown> = {}) => (await c.callTool({ name, arguments: args })) as ToolOut;
/** A tool's data: the call must have succeeded. */
async function data(c: Client, name: string, args: Record<string, unknown> = {}) {
  const r = await call(c, name, args);
  if (r.isError) throw new Error(`${name} failed: ${JSON.stringify(r.content)}`);
  // The text content is the same JSON as the structured content.
  expect(JSON.parse((r.content[0] as { text: string }).text)).toEqual(r.structuredContent);
  return r.structuredContent;
}
/** A tool error's message. */
async function failure(c: Client, name: string, args: Record<string, unknown> = {}) {
  const r = await call(c, name, args);
  expect(r.isError, `${name} should have failed: ${JSON.stringify(r.structuredContent)}`).toBe(true);
  return (r.content[0] as { text: string }).text;
}

/** A raw POST /mcp as a client would send it (both Accept types, JSON body). */
const raw = (token: string | null, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${k.url}/mcp`, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...(token ? { authorization: `Bearer ${token}` } : {}), ...headers },
    body: JSON.stringify(body),
  });
const INIT = { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } };

beforeAll(async () => {
  project = await createProject(k);
  ({ token: full, id: fullId } = await createToken(k, project.id, { scope: "full" }));
  readOnly = (await createToken(k, project.id, { scope: "read_only" })).token;
  serviceKey = (await k.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "backend" } })).body.key;
  anonKey = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key;
});

afterAll(async () => {
  for (const c of clients) await c.close().catch(() => {});
});

describe("MCP: connecting", () => {
  test("initialize: server info, capabilities and instructions; tools/list differs by token scope", async () => {
    const c = await connect(full);
    expect(c.getServerVersion()).toMatchObject({ name: "kiln", version: expect.any(String) });
    expect(c.getServerCapabilities()).toMatchObject({ tools: {}, resources: {} });
    expect(c.getInstructions()).toContain("project");
    const tools = (await c.listTools()).tools;
    expect(tools.map((t) => t.name).sort()).toEqual([...READ_TOOLS, ...WRITE_TOOLS].sort());
    for (const t of tools) {
      expect(t.inputSchema.type).toBe("object");
      expect(t.description!.length).toBeGreaterThan(20);
      expect(t.annotations?.readOnlyHint).toBe(READ_TOOLS.includes(t.name));
    }
    // The zod input becomes the published JSON Schema.
    const deploy = tools.find((t) => t.name === "deploy_function")!;
    expect(deploy.inputSchema.required).toEqual(expect.arrayContaining(["name", "runtime", "files"]));
    expect((deploy.inputSchema.properties as any).runtime.enum).toContain("nodejs22.x");

    const ro = await connect(readOnly);
    expect((await ro.listTools()).tools.map((t) => t.name).sort()).toEqual([...READ_TOOLS].sort());
  });

  test("a read-only token calling a write tool gets the API's 403 message as a tool error, and nothing changes", async () => {
    const ro = await connect(readOnly);
    expect(await failure(ro, "deploy_function", { name: "nope", runtime: "nodejs22.x", files: GREET })).toBe("project access token is read-only");
    expect(await failure(ro, "modify_rows", { database: "x", operation: "insert", table: "t", values: {} })).toBe("project access token is read-only");
    expect(await failure(ro, "create_scheduler", { function: "x", name: "s", cron: "0 3 * * *" })).toBe("project access token is read-only");
    expect((await k.api("GET", `/projects/${project.id}/functions`)).body.data.map((f: any) => f.name)).not.toContain("nope");
  });

  test("credentials: none → 401; unknown or revoked project token → 401 invalid token; platform token, service key, anon key → 403; all in the API's error shape", async () => {
    const none = await raw(null, INIT);
    expect(none.status).toBe(401);
    expect((await none.json()).error).toMatch(/Authorization: Bearer/);
    const unknown = await raw("pt-notarealtoken", INIT);
    expect(unknown.status).toBe(401);
    expect(await unknown.json()).toEqual({ error: "invalid token" });
    for (const token of [k.token, serviceKey, anonKey]) {
      const r = await raw(token, INIT);
      expect(r.status).toBe(403);
      expect((await r.json()).error).toMatch(/requires a project access token/);
    }
    const doomed = await createToken(k, project.id, { scope: "full" });
    expect((await raw(doomed.token, INIT)).status).toBe(200);
    expect((await k.api("DELETE", `/projects/${project.id}/access-tokens/${doomed.id}`)).status).toBe(204);
    const revoked = await raw(doomed.token, INIT);
    expect(revoked.status).toBe(401);
    expect(await revoked.json()).toEqual({ error: "invalid token" });
    // A body that is not JSON is the API's 400, before MCP sees it.
    const garbled = await fetch(`${k.url}/mcp`, { method: "POST", headers: { authorization: `Bearer ${full}`, "content-type": "application/json", accept: "application/json, text/event-stream" }, body: "{nope" });
    expect(garbled.status).toBe(400);
    expect((await garbled.json()).error).toEqual(expect.any(String));
    // Requests count in the token's usage, like the API's.
    const before = (await k.api("GET", `/projects/${project.id}/access-tokens/${fullId}/usage?days=1`)).body.total_requests as number;
    for (let i = 0; i < 3; i++) expect((await raw(full, { jsonrpc: "2.0", id: i, method: "ping" })).status).toBe(200);
    await eventually(() => k.api("GET", `/projects/${project.id}/access-tokens/${fullId}/usage?days=1`), (r) => r.body.total_requests >= before + 3);
    // The SDK's client sees the refusal at connect.
    await expect(connect(k.token)).rejects.toMatchObject({ code: 403, message: expect.stringContaining("requires a project access token") });
  });

  test("JSON-RPC: an unknown method is -32601, an unknown tool -32602; a notification is 202; GET /mcp is 405 (stateless: no SSE stream)", async () => {
    const r = await raw(full, { jsonrpc: "2.0", id: 7, method: "no/such/method", params: {} });
    expect(r.status).toBe(200);
    const body = await r.json();
    expect(body).toMatchObject({ jsonrpc: "2.0", id: 7, error: { code: -32601 } });
    const c = await connect(full);
    await expect(c.callTool({ name: "no_such_tool", arguments: {} })).rejects.toMatchObject({ code: -32602 });
    expect((await raw(full, { jsonrpc: "2.0", method: "notifications/initialized" })).status).toBe(202);
    const get = await fetch(`${k.url}/mcp`, { headers: { authorization: `Bearer ${full}`, accept: "text/event-stream" } });
    expect(get.status).toBe(405);
    expect(get.headers.get("allow")).toBe("POST");
    // The transport's own checks: both Accept types, a JSON body.
    expect((await raw(full, INIT, { accept: "application/json" })).status).toBe(406);
  });

  test("bad arguments are tool errors naming the field, not protocol errors or 500s", async () => {
    const c = await connect(full);
    expect(await failure(c, "get_function", {})).toMatch(/field 'function'/);
    expect(await failure(c, "list_functions", { limit: 1000 })).toMatch(/field 'limit'/);
    expect(await failure(c, "get_function", { function: "missing" })).toBe("function not found");
    // Text PostgreSQL cannot store is refused as the API refuses it, not failed on in the store.
    expect(await failure(c, "get_function", { function: "a\u0000b" })).toMatch(/arguments field 'function': must not contain a NUL/);
    expect(await failure(c, "select_rows", { database: "x\ud800", table: "t" })).toMatch(/arguments field 'database'.*surrogate/);
  });

  test("resources: the OpenAPI description (as /openapi.json serves it) and the project's configuration", async () => {
    const c = await connect(readOnly);
    const list = (await c.listResources()).resources;
    expect(list.map((r) => r.uri)).toEqual(["kiln://openapi.json", "kiln://project/config.json", "kiln://project/config.yaml"]);
    const doc = await c.readResource({ uri: "kiln://openapi.json" });
    const parsed = JSON.parse((doc.contents[0] as { text: string }).text);
    expect(parsed).toEqual((await k.api("GET", "/openapi.json", { token: null })).body);
    expect(parsed.paths["/mcp"].post.security).toEqual([{ bearerAuth: [] }]);
    await expect(c.readResource({ uri: "kiln://nothing" })).rejects.toMatchObject({ code: -32002 });
    // The configuration: what GET /projects/{id}/config exports for this token, JSON and YAML.
    const json = await c.readResource({ uri: "kiln://project/config.json" });
    expect((json.contents[0] as { text: string }).text).toBe((await k.api("GET", `/projects/${project.id}/config`, { token: readOnly })).text);
    const yaml = await c.readResource({ uri: "kiln://project/config.yaml" });
    expect(yaml.contents[0]).toMatchObject({ mimeType: "application/yaml" });
    expect((yaml.contents[0] as { text: string }).text).toBe((await k.api("GET", `/projects/${project.id}/config?format=yaml`, { token: readOnly })).text);
  });
});

describe("MCP: functions and logs", () => {
  test("deploy from inline files, then invoke: the round trip; get, list and log search see it", async () => {
    const c = await connect(full);
    const deployed = await data(c, "deploy_function", { name: "greet", runtime: "nodejs22.x", files: GREET });
    expect(deployed).toMatchObject({ created: true, function: { name: "greet", status: "active", runtime: "nodejs22.x" }, deployment: { status: "succeeded", error: null } });
    const out = await data(c, "invoke_function", { function: "greet", payload: { name: "ada" } });
    expect(out).toMatchObject({ status: 200, body: { hello: "ada" }, invocation_id: expect.any(String) });
    // By id as well as by name.
    expect(await data(c, "invoke_function", { function: deployed.function.id, payload: {} })).toMatchObject({ status: 200, body: { hello: "world" } });

    const ro = await connect(readOnly);
    const got = await data(ro, "get_function", { function: "greet" });
    expect(got.function.id).toBe(deployed.function.id);
    expect(got.deployments[0]).toMatchObject({ id: deployed.deployment.id, status: "succeeded" });
    expect((await data(ro, "list_functions")).data.map((f: any) => f.name)).toEqual(["greet"]);
    // The API sees the same function.
    expect((await k.api("GET", `/projects/${project.id}/functions/${deployed.function.id}`)).body.status).toBe("active");

    const logs = await data(ro, "search_logs", { function: "greet", q: '"greeting ada"' });
    expect(logs.data).toHaveLength(1);
    expect(logs.data[0]).toMatchObject({ body: "greeting ada", invocation_id: out.invocation_id, resource: { name: "greet" } });
    const build = await data(ro, "search_logs", { deployment_id: deployed.deployment.id });
    expect(build.data.length).toBeGreaterThan(0);

    // A redeploy updates the function (created false); the new code answers.
    const again = await data(c, "deploy_function", { name: "greet", runtime: "nodejs22.x", files: { "index.js": "exports.handler = async () => 'v2';" } });
    expect(again).toMatchObject({ created: false, deployment: { status: "succeeded" } });
    expect(await data(c, "invoke_function", { function: "greet" })).toMatchObject({ status: 200, body: "v2" });
  });

  test("deploy failures come back with the API's message: bad paths, bad names, a failed build", async () => {
    const c = await connect(full);
    expect(await failure(c, "deploy_function", { name: "bad", runtime: "nodejs22.x", files: { "../escape.js": "x" } })).toMatch(/'\.\.'/);
    expect(await failure(c, "deploy_function", { name: "bad", runtime: "nodejs22.x", files: {} })).toMatch(/at least one file/);
    expect(await failure(c, "deploy_function", { name: "Bad_Name", runtime: "nodejs22.x", files: GREET })).toMatch(/DNS-safe/);
    expect(await failure(c, "deploy_function", { name: "bad", runtime: "cobol", files: GREET })).toMatch(/field 'runtime'/);
    // A build that fails is a tool error with the deployment's error and the build's last lines.
    const failed = await call(c, "deploy_function", { name: "bad", runtime: "nodejs22.x", files: { "index.js": "x", ".service-dependencies/x": "no" } });
    expect(failed.isError).toBe(true);
    expect((failed.content[0] as { text: string }).text).toMatch(/^the build failed: reserved path/);
    expect(failed.structuredContent).toMatchObject({ function: { name: "bad", status: "failed" }, deployment: { status: "failed" }, build_log: expect.arrayContaining([expect.stringMatching(/reserved/)]) });
    expect(await failure(c, "invoke_function", { function: "never-deployed" })).toBe("function not found");
  });
});

describe("MCP: databases", () => {
  let ada: { id: string };
  beforeAll(async () => {
    ada = (await k.api("POST", `/projects/${project.id}/users`, { body: { email: "ada@example.com", password: "long enough" } })).body;
    const r = await k.api("POST", `/projects/${project.id}/databases`, { body: { name: "shop" } });
    expect(r.status).toBe(201);
    const d = await eventually(() => k.api("GET", `/projects/${project.id}/databases/shop`), (x) => x.body.status !== "provisioning", 60_000);
    const sql = postgres(d.body.connection_string, { max: 1, onnotice: () => {} });
    try {
      await sql.unsafe("create table items (name text primary key, qty int not null)");
      await sql.unsafe("insert into items values ('apple', 7), ('pear', 2)");
      await sql.unsafe(`
        create table notes (id int primary key, user_id uuid not null, body text);
        alter table notes enable row level security;
        create policy own on notes to authenticated using (user_id = auth.uid());
        grant select on notes to authenticated`);
      await sql`insert into notes values (1, ${ada.id}, 'mine'), (2, ${crypto.randomUUID()}, 'theirs')`;
    } finally {
      await sql.end();
    }
  });

  test("list_databases: the connection string only for a full-scope token", async () => {
    const fullList = await data(await connect(full), "list_databases");
    expect(fullList.data).toEqual([expect.objectContaining({ database_name: "shop", status: "active", connection_string: expect.stringMatching(/^postgres:\/\//) })]);
    const roList = await data(await connect(readOnly), "list_databases");
    expect(roList.data).toHaveLength(1);
    expect(roList.data[0]).not.toHaveProperty("connection_string");
  });

  test("select_rows and modify_rows go through the query API's rules", async () => {
    const c = await connect(full);
    const some = await data(c, "select_rows", { database: "shop", table: "items", filters: [{ column: "qty", operator: "gte", value: 5 }] });
    expect(some).toEqual({ data: [{ name: "apple", qty: 7 }], count: 1 });
    expect(await data(c, "modify_rows", { database: "shop", operation: "insert", table: "items", values: { name: "fig", qty: 9 } })).toEqual({ data: [{ name: "fig", qty: 9 }], count: 1 });
    expect(await data(c, "modify_rows", { database: "shop", operation: "update", table: "items", values: { qty: 8 }, filters: [{ column: "name", operator: "eq", value: "fig" }] })).toMatchObject({ count: 1 });
    const ordered = await data(await connect(readOnly), "select_rows", { database: "shop", table: "items", select: ["name"], order: [{ column: "name", ascending: true }] });
    expect(ordered.data.map((r: any) => r.name)).toEqual(["apple", "fig", "pear"]);
    expect(await data(c, "modify_rows", { database: "shop", operation: "delete", table: "items", filters: [{ column: "name", operator: "eq", value: "fig" }] })).toMatchObject({ count: 1 });
    // The query API's refusals, word for word.
    expect(await failure(c, "modify_rows", { database: "shop", operation: "delete", table: "items" })).toMatch(/filters/);
    expect(await failure(c, "select_rows", { database: "shop", table: "items", limit: 10 ** 6 })).toMatch(/limit/);
    expect(await failure(c, "select_rows", { database: "shop", table: "nothing_here" })).toMatch(/does not exist/);
    expect(await failure(c, "select_rows", { database: "nope", table: "items" })).toMatch(/not found/);
    // As `anonymous`, the owner's grants apply: none were given.
    expect(await failure(c, "select_rows", { database: "shop", table: "items", role: "anonymous" })).toMatch(/permission|anonymous/i);
  });

  test("as an end user (role authenticated): grants and RLS as that user, in the query API and read-only SQL", async () => {
    const ro = await connect(readOnly);
    expect(await data(ro, "select_rows", { database: "shop", table: "notes", select: ["body"], role: "authenticated", user_id: ada.id })).toEqual({ data: [{ body: "mine" }], count: 1 });
    expect((await data(ro, "select_rows", { database: "shop", table: "notes" })).count).toBe(2);
    expect(await data(ro, "run_readonly_sql", { database: "shop", sql: "select body, auth.uid()::text as uid from notes", role: "authenticated", user_id: ada.id })).toEqual({ data: [{ body: "mine", uid: ada.id }], count: 1 });
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "select * from items", role: "anonymous" })).toMatch(/permission denied/);
    expect(await failure(ro, "select_rows", { database: "shop", table: "notes", role: "authenticated" })).toMatch(/needs user_id/);
    expect(await failure(ro, "select_rows", { database: "shop", table: "notes", role: "authenticated", user_id: crypto.randomUUID() })).toBe("user not found");
  });

  test("run_readonly_sql: one read-only statement in a READ ONLY transaction; writes are refused and change nothing", async () => {
    const ro = await connect(readOnly);
    expect(await data(ro, "run_readonly_sql", { database: "shop", sql: "select count(*)::int as n, sum(qty)::int as total from items where qty > $1", params: [0] })).toEqual({ data: [{ n: 2, total: 9 }], count: 1 });
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "delete from items" })).toMatch(/only read-only statements/);
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "select 1; delete from items" })).toMatch(/exactly one statement/);
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "select * into t2 from items" })).toMatch(/creates a table/);
    // Parsed as a SELECT, refused by PostgreSQL: the transaction is read-only.
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "with gone as (delete from items returning *) select count(*) from gone" })).toMatch(/read-only transaction/);
    expect(await failure(ro, "run_readonly_sql", { database: "shop", sql: "selec 1" })).toMatch(/syntax error/);
    expect((await data(ro, "select_rows", { database: "shop", table: "items" })).count).toBe(2);
  });
});

describe("MCP: storage and schedulers", () => {
  test("list_buckets and list_objects", async () => {
    expect((await k.api("POST", `/projects/${project.id}/storage/buckets`, { body: { name: "avatars" } })).status).toBe(201);
    for (const path of ["u1/a.txt", "u1/b.txt", "u2/c.txt"]) {
      const form = new FormData();
      form.append("file", new Blob([`content of ${path}`], { type: "text/plain" }), "f.txt");
      const up = await fetch(`${k.url}/storage/avatars/${path}`, { method: "POST", headers: { authorization: `Bearer ${serviceKey}` }, body: form });
      expect(up.status).toBe(201);
    }
    const ro = await connect(readOnly);
    expect((await data(ro, "list_buckets")).buckets).toEqual([expect.objectContaining({ name: "avatars", project_id: project.id })]);
    const u1 = await data(ro, "list_objects", { bucket: "avatars", prefix: "u1/" });
    expect(u1.objects.map((o: any) => o.name)).toEqual(["u1/a.txt", "u1/b.txt"]);
    const page = await data(ro, "list_objects", { bucket: "avatars", limit: 2 });
    expect(page.objects).toHaveLength(2);
    expect((await data(ro, "list_objects", { bucket: "avatars", cursor: page.next_cursor })).objects.map((o: any) => o.name)).toEqual(["u2/c.txt"]);
    expect(await failure(ro, "list_objects", { bucket: "missing" })).toMatch(/not found/);
  });

  test("create, list, update and delete a scheduler; the API sees the same ones", async () => {
    const c = await connect(full);
    await data(c, "deploy_function", { name: "nightly", runtime: "nodejs22.x", files: GREET });
    const created = await data(c, "create_scheduler", { function: "nightly", name: "report", cron: "0 3 * * *", payload: { job: "report" } });
    expect(created.scheduler).toMatchObject({ name: "report", enabled: true, schedule: { kind: "cron", cron_expression: "0 3 * * *" }, payload: { job: "report" } });
    const listed = await data(await connect(readOnly), "list_schedulers", {});
    expect(listed.data.map((s: any) => s.id)).toEqual([created.scheduler.id]);
    expect((await data(c, "list_schedulers", { function: "nightly" })).total).toBe(1);
    const updated = await data(c, "update_scheduler", { function: "nightly", scheduler_id: created.scheduler.id, enabled: false, cron: "30 4 * * 1" });
    expect(updated.scheduler).toMatchObject({ enabled: false, schedule: { cron_expression: "30 4 * * 1" } });
    const api = await k.api("GET", `/projects/${project.id}/schedulers`);
    expect(api.body.data[0]).toMatchObject({ id: created.scheduler.id, enabled: false });
    expect(await failure(c, "create_scheduler", { function: "nightly", name: "bad", cron: "every day" })).toMatch(/cron/i);
    expect(await data(c, "delete_scheduler", { function: "nightly", scheduler_id: created.scheduler.id })).toEqual({ deleted: true, scheduler_id: created.scheduler.id });
    expect((await k.api("GET", `/projects/${project.id}/schedulers`)).body.data).toEqual([]);
    expect(await failure(c, "delete_scheduler", { function: "nightly", scheduler_id: created.scheduler.id })).toMatch(/not found/);
  });
});

describe("MCP: configuration", () => {
  test("export_config is the API's export (variable values only for a full-scope token); dry_run_config reports and changes nothing", async () => {
    expect((await k.api("POST", `/projects/${project.id}/variables`, { body: { name: "GREETING", value: "hi" } })).status).toBe(201);
    const c = await connect(full);
    const exported = await data(c, "export_config");
    expect(exported.manifest).toEqual((await k.api("GET", `/projects/${project.id}/config`, { token: full })).body);
    expect(exported.manifest.version).toBe(1);
    expect(exported.manifest.variables).toEqual([{ name: "GREETING", value: "hi" }]);
    const ro = await connect(readOnly);
    expect((await data(ro, "export_config")).manifest.variables).toEqual([{ name: "GREETING" }]);
    const yaml = await data(ro, "export_config", { format: "yaml" });
    expect(yaml.yaml).toBe((await k.api("GET", `/projects/${project.id}/config?format=yaml`, { token: readOnly })).text);

    // Unchanged: all unchanged. A changed value: updated in the report, not in the project.
    const same = await data(c, "dry_run_config", { manifest: exported.manifest });
    expect(same.summary).toMatchObject({ created: 0, updated: 0, deleted: 0, errors: 0 });
    const changed = await data(c, "dry_run_config", { manifest: { ...exported.manifest, variables: [{ name: "GREETING", value: "hello" }, { name: "NEW", value: "x" }] } });
    expect(changed.results).toEqual(expect.arrayContaining([{ section: "variables", name: "GREETING", action: "updated" }, { section: "variables", name: "NEW", action: "created" }]));
    expect(changed.summary).toMatchObject({ created: 1, updated: 1 });
    // YAML text works as well.
    expect((await data(c, "dry_run_config", { manifest: yaml.yaml })).summary).toMatchObject({ updated: 0, created: 0, errors: 0 });
    expect((await k.api("GET", `/projects/${project.id}/variables`)).body.data.map((v: any) => v.name)).toEqual(["GREETING"]);

    // An invalid manifest: every problem, by path.
    const invalid = await call(c, "dry_run_config", { manifest: { version: 2, nonsense: true } });
    expect(invalid.isError).toBe(true);
    expect((invalid.content[0] as { text: string }).text).toMatch(/^invalid configuration manifest/);
    expect(invalid.structuredContent.status).toBe(422);
    expect(invalid.structuredContent.errors).toEqual(expect.arrayContaining([expect.objectContaining({ path: "version" }), expect.objectContaining({ path: "nonsense" })]));
    // A read-only token: the dry run is an apply request (the API refuses it too).
    expect(await failure(ro, "dry_run_config", { manifest: exported.manifest })).toBe("project access token is read-only");
  });
});
