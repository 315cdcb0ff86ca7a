// Standard functions: deploy from archives, builds and the deployment queue, RPC invocation with
// the credential rules, the sandbox as users meet it.
import { execFileSync, spawnSync } from "node:child_process";
import { isMissing, resolveRuntime } from "../../runtime-sandbox/runtimes";
import { mkdirSync, readFileSync, symlinkSync } from "node:fs";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, test } from "vitest";
import { deploy, localServer, npmTarball, processesTagged, settled, tgz } from "../support/functions";
import { createProject, eventually, FUNCTION_RUNTIME, startKiln, STORE, useKiln, withKiln, type TestKiln } from "../support/kiln";

const NODE_HELLO = {
  "index.js": `exports.handler = async (event, context) => ({ hello: event?.name ?? "world", fn: context.functionName, auth: event?.__service_auth ?? null, secret: process.env.GREETING ?? null });`,
};

// The registry builds install from: local, so nothing here reaches a public registry, and held at
// will, so a build stays busy exactly as long as a test needs (allowed to builds by name).
const registry = await localServer({ "/slow.tgz": npmTarball("slow", "module.exports = (v) => v + ':true';") });
afterAll(() => registry.close());
const k = useKiln({ env: { KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${registry.port}` } });
// The containers projects run this file to prove invocation on a container engine; what happens before
// a worker exists (validation, credentials, builds, the deployment queue, deletion) is the same code
// whatever runs the worker, so those blocks run on the process runtime only.
const BEFORE_THE_WORKER = FUNCTION_RUNTIME !== "process";
// What the sandbox does to a build or an invocation (installers' view of the host, the build proxy, a
// crash, the network, memory and CPU limits) is the same whichever control store keeps the records: the
// PostgreSQL project skips those blocks, the embedded and containers projects run them (suite time).
const SANDBOX_ONLY = STORE === "postgres";
async function setup() {
  const p = await createProject(k);
  const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
  return { p, sk };
}
const invoke = (fnId: string, token: string | null, payload?: unknown) => k.api("POST", `/functions/${fnId}/invoke`, { token, body: { payload } });

describe("deploy and invoke", () => {
  test("a new node function: 201 provisioning, then active; invoked by RPC with the platform's headers", async () => {
    const { p, sk } = await setup();
    const d = await deploy(k, p.id, { name: "hello", runtime: "nodejs22.x" }, tgz(NODE_HELLO));
    expect(d.status).toBe(201);
    expect(d.body).toMatchObject({ name: "hello", status: "provisioning", runtime: "nodejs22.x", handler: "handler", is_public: false, invocation_mode: "rpc", http_auth_mode: "service", openapi_spec: null });
    const fn = await settled(k, p.id, d.body.id);
    expect(fn.status).toBe("active");
    expect(fn.deployed_regions).toEqual(["local"]);
    const r = await invoke(fn.id, sk, { name: "ada" });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ hello: "ada", fn: "hello", auth: null, secret: null });
    for (const h of ["x-service-version", "x-service-region", "x-service-proxy-ms", "x-service-proxy-handler-ms", "x-service-compute-ms"]) expect(r.headers.get(h), h).toBeTruthy();
    const list = await k.api("GET", `/projects/${p.id}/functions`);
    expect(list.body).toMatchObject({ total: 1, data: [{ id: fn.id }] });
    const deps = await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`);
    expect(deps.body.data).toHaveLength(1);
    expect(deps.body.data[0]).toMatchObject({ kind: "deploy", status: "succeeded" });
    expect(deps.body.data[0].build_log.lines).toBeGreaterThan(0);
  });

  // (The response mapping, the HTTP event and its credentials are Kiln's code and the same bootstrap
  // whatever runs the worker: on the process runtime only, as the BEFORE_THE_WORKER blocks.)
  test.skipIf(BEFORE_THE_WORKER)("{statusCode, headers, body} sets the response; platform-owned headers from the function are dropped", async () => {
    const { p, sk } = await setup();
    const code = tgz({
      "index.mjs": `export const handler = async () => ({ statusCode: 418, headers: { "X-Teapot": "yes", "X-Service-Region": "forged", "content-type": "text/plain" }, body: "short and stout" });`,
    });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "teapot", runtime: "nodejs22.x" }, code)).body.id);
    const r = await invoke(fn.id, sk);
    expect(r.status).toBe(418);
    expect(r.text).toBe("short and stout");
    expect(r.headers.get("x-teapot")).toBe("yes");
    expect(r.headers.get("x-service-region")).toBe("local");
  });

  test("a python function", async () => {
    const { p, sk } = await setup();
    const code = tgz({ "main.py": "def handler(event, context):\n    return {'sum': sum(event['xs']), 'name': context.function_name}\n" });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "adder", runtime: "python3.11" }, code)).body.id);
    expect(fn.status).toBe("active");
    expect((await invoke(fn.id, sk, { xs: [1, 2, 3] })).body).toEqual({ sum: 6, name: "adder" });
  });

  test("redeploy: 200, new code served; a failed build keeps the last good version serving", async () => {
    const { p, sk } = await setup();
    const first = await deploy(k, p.id, { name: "versioned", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 'v1'" }));
    await settled(k, p.id, first.body.id);
    const second = await deploy(k, p.id, { name: "versioned", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 'v2'" }));
    expect(second.status).toBe(200);
    expect(second.body.id).toBe(first.body.id);
    await settled(k, p.id, first.body.id);
    expect((await invoke(first.body.id, sk)).body).toBe("v2");
    const broken = await deploy(k, p.id, { name: "versioned", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 'v3'", ".service-dependencies/x": "no" }));
    expect(broken.status).toBe(200);
    const after = await settled(k, p.id, first.body.id);
    expect(after.status).toBe("failed");
    expect((await invoke(first.body.id, sk)).body).toBe("v2");
    const deps = (await k.api("GET", `/projects/${p.id}/functions/${first.body.id}/deployments`)).body.data;
    expect(deps[0]).toMatchObject({ status: "failed", error: expect.stringMatching(/reserved path/) });
    expect(deps.map((x: any) => x.status)).toEqual(["failed", "succeeded", "succeeded"]);
  });

  test("project variables are the function's environment; a change applies without redeploy", async () => {
    const { p, sk } = await setup();
    await k.api("POST", `/projects/${p.id}/variables`, { body: { name: "GREETING", value: "hi" } });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "env", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    expect((await invoke(fn.id, sk)).body.secret).toBe("hi");
    await k.api("PATCH", `/projects/${p.id}/variables/GREETING`, { body: { value: "hello" } });
    await eventually(() => invoke(fn.id, sk), (r) => r.body.secret === "hello");
  });
});

describe.skipIf(BEFORE_THE_WORKER)("deploy validation", () => {
  test("names, runtimes, archives and mode combinations are checked (400 naming the field)", async () => {
    const { p } = await setup();
    const code = tgz(NODE_HELLO);
    for (const name of ["Upper", "-lead", "trail-", "a".repeat(64), "sp ace"]) {
      const r = await deploy(k, p.id, { name, runtime: "nodejs22.x" }, code);
      expect(r.status, name).toBe(400);
      expect(r.body.error).toContain("'name'");
    }
    expect((await deploy(k, p.id, { name: "a".repeat(63), runtime: "nodejs22.x" }, code)).status).toBe(201);
    expect((await deploy(k, p.id, { name: "x", runtime: "java21" }, code)).body.error).toContain("'runtime'");
    expect((await deploy(k, p.id, { name: "x", runtime: "nodejs22.x" }, null)).body.error).toContain("'code'");
    const link = await deploy(k, p.id, { name: "x", runtime: "nodejs22.x" }, tgz({ "index.js": "x" }, (d) => symlinkSync("/etc/passwd", join(d, "p"))));
    expect(link.status).toBe(400);
    expect(link.body.error).toMatch(/symlink/);
    const none = await deploy(k, p.id, { name: "x", runtime: "nodejs22.x", http_auth_mode: "none" }, code);
    expect(none.status).toBe(400);
    expect(none.body.error).toMatch(/http_auth_mode none/);
    expect((await deploy(k, p.id, { name: "x", runtime: "nodejs22.x", openapi_spec: '{"swagger":"2.0"}' }, code)).body.error).toContain("'openapi_spec'");
    // A NUL inside the JSON text would fail the store write: a 400 naming the field instead.
    const nul = await deploy(k, p.id, { name: "x", runtime: "nodejs22.x", openapi_spec: '{"openapi":"3.1.0","info":{"title":"a\\u0000b"}}' }, code);
    expect(nul.status).toBe(400);
    expect(nul.body.error).toMatch(/body field 'openapi_spec.info.title': must not contain a NUL/);
    const huge = JSON.stringify({ openapi: "3.1.0", info: { description: "x".repeat(256 * 1024) } });
    const tooBig = await deploy(k, p.id, { name: "x", runtime: "nodejs22.x", openapi_spec: huge }, code);
    expect(tooBig.status).toBe(400);
    expect(tooBig.body.error).toMatch(/256 KiB/);
    const json = await k.api("POST", `/projects/${p.id}/functions`, { body: { name: "x" } });
    expect(json.status).toBe(400);
  });

  test("PATCH settings; http_auth_mode none needs a public http function", async () => {
    const { p } = await setup();
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "cfg", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    expect((await k.api("PATCH", `/projects/${p.id}/functions/${fn.id}`, { body: { http_auth_mode: "none" } })).status).toBe(400);
    const ok = await k.api("PATCH", `/projects/${p.id}/functions/${fn.id}`, { body: { is_public: true, invocation_mode: "http", http_auth_mode: "none", openapi_spec: { openapi: "3.1.0", info: {} } } });
    expect(ok.body).toMatchObject({ is_public: true, invocation_mode: "http", http_auth_mode: "none", openapi_spec: { openapi: "3.1.0" } });
    expect((await k.api("PATCH", `/projects/${p.id}/functions/${fn.id}`, { body: { openapi_spec: null } })).body.openapi_spec).toBeNull();
  });
});

describe.skipIf(BEFORE_THE_WORKER)("credential rules", () => {
  test("service key, end-user token (with __service_auth), anon keys only with functions.invoke on public functions", async () => {
    const { p, sk } = await setup();
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "who", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    const defaultAnon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    const invokeAnon = (await k.api("POST", `/projects/${p.id}/anon-keys`, { body: { name: "web", permissions: ["functions.invoke"] } })).body.key;
    const user = (await k.api("POST", "/auth/signup", { token: defaultAnon, body: { email: `fn-${Date.now()}@example.com`, password: "long enough" } })).body;
    const asUser = await invoke(fn.id, user.access_token, { name: "me" });
    expect(asUser.status).toBe(200);
    expect(asUser.body.auth).toEqual({ user_id: user.user.id, email: user.user.email, project_id: p.id, role: "authenticated", access_token: user.access_token });
    expect((await invoke(fn.id, invokeAnon)).status).toBe(403); // private function
    await k.api("PATCH", `/projects/${p.id}/functions/${fn.id}`, { body: { is_public: true } });
    expect((await invoke(fn.id, defaultAnon)).status).toBe(403); // no functions.invoke
    expect((await invoke(fn.id, invokeAnon)).status).toBe(200);
    expect((await invoke(fn.id, k.token)).status).toBe(403);
    expect((await invoke(fn.id, null)).status).toBe(401);
    const scoped = async (permissions: string[]) => (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "s", permissions } })).body.key;
    expect((await invoke(fn.id, await scoped(["locks.manage"]))).status).toBe(403);
    expect((await invoke(fn.id, await scoped(["functions.invoke"]))).status).toBe(200);
    const other = await setup();
    expect((await invoke(fn.id, other.sk)).status).toBe(404);
    expect((await invoke(fn.id, sk)).status).toBe(200);
    const resolved = await k.api("GET", `/functions/resolve?name=who`, { token: sk });
    expect(resolved.body).toEqual({ name: "who", function_id: fn.id, cache_ttl_seconds: 60 });
    expect((await k.api("GET", `/functions/resolve?name=nope`, { token: sk })).status).toBe(404);
    const pre = await fetch(`${k.url}/functions/${fn.id}/invoke`, { method: "OPTIONS", headers: { origin: "http://localhost:3000", "access-control-request-method": "POST" } });
    expect(pre.status).toBe(204);
    expect(pre.headers.get("access-control-allow-methods")).toBe("POST, OPTIONS");
  });
});

describe.skipIf(BEFORE_THE_WORKER || SANDBOX_ONLY)("builds", () => {
  // A wheel made on the spot and shipped in the archive: pip installs it without any index.
  const withWheel = (dir: string) => {
    mkdirSync(join(dir, "wheels"));
    const py = `import zipfile
with zipfile.ZipFile("wheels/kilnprobe-1.0-py3-none-any.whl", "w") as z:
    z.writestr("kilnprobe/__init__.py", "VALUE = 42\\n")
    z.writestr("kilnprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: kilnprobe\\nVersion: 1.0\\n")
    z.writestr("kilnprobe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nGenerator: kiln-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
    z.writestr("kilnprobe-1.0.dist-info/RECORD", "")`;
    execFileSync("python3", ["-c", py], { cwd: dir });
  };

  test("python: requirements.txt is installed with pip into python_deps, importable by the function", async () => {
    const { p, sk } = await setup();
    const code = tgz({ "main.py": "import kilnprobe\ndef handler(event, context):\n    return kilnprobe.VALUE\n", "requirements.txt": "./wheels/kilnprobe-1.0-py3-none-any.whl\n" }, withWheel);
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "wheel", runtime: "python3.11" }, code)).body.id);
    expect(fn.status).toBe("active");
    expect((await invoke(fn.id, sk)).body).toBe(42);
  });

  test("installers run in the build sandbox: Kiln's data dir does not exist there; the failure says why", async () => {
    const { p } = await setup();
    const code = tgz({ "main.py": "def handler(event, context):\n    return 1\n", "requirements.txt": `-r ${join(k.dataDir, "kiln.pid")}\n` });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "peek", runtime: "python3.11" }, code)).body.id);
    expect(fn.status).toBe("failed");
    const deps = (await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data;
    expect(deps[0].error).toMatch(/^dependency installation failed: pip exited with 1: .*No such file or directory/);
  });

  test("a build cannot reach the host's local services: a dependency on 127.0.0.1 or localhost is refused by the build proxy, and the refusal is in the build log", async () => {
    // A local service the dependency points at: it must never see a connection from the build.
    const seen: Socket[] = [];
    const local = createServer((s) => {
      seen.push(s);
      s.destroy();
    });
    await new Promise<void>((r) => local.listen(0, "127.0.0.1", r));
    const port = (local.address() as AddressInfo).port;
    try {
      const { p } = await setup();
      for (const [name, host] of [["loop", "127.0.0.1"], ["named", "localhost"]] as const) {
        const code = tgz({ "index.js": "exports.handler = async () => 1", "package.json": `{"dependencies":{"evil":"http://${host}:${port}/evil.tgz"}}` });
        const fn = await settled(k, p.id, (await deploy(k, p.id, { name, runtime: "nodejs22.x" }, code)).body.id);
        expect(fn.status).toBe("failed");
        const deps = (await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data;
        expect(deps[0].error).toMatch(/^dependency installation failed: network: .*refused.*; npm exited with 1/); // the cause first: the egress refused it
        expect(deps[0].error).toMatch(/403|loopback|Kiln build sandbox/);
      }
      expect(seen.length).toBe(0);
    } finally {
      local.close();
    }
  });
});

describe.skipIf(SANDBOX_ONLY)("failures and isolation", () => {
  test("a thrown error is a 500 from the function; a crash a 502; a timeout-free function keeps working after", async () => {
    const { p, sk } = await setup();
    const fn = await settled(
      k,
      p.id,
      (
        await deploy(k, p.id, { name: "flaky", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (e) => { if (e.mode === "throw") throw new Error("boom"); if (e.mode === "exit") process.exit(3); return "fine"; }` }))
      ).body.id,
    );
    const thrown = await invoke(fn.id, sk, { mode: "throw" });
    expect(thrown.status).toBe(500);
    expect(thrown.body.error).toBe("boom");
    const crash = await invoke(fn.id, sk, { mode: "exit" });
    expect(crash.status).toBe(502);
    expect(crash.body.error).toMatch(/crashed/);
    expect((await invoke(fn.id, sk, { mode: "ok" })).body).toBe("fine");
  });

  test("a function cannot read Kiln's data dir", async () => {
    const { p, sk } = await setup();
    const code = tgz({ "index.js": `const fs = require("fs"); exports.handler = async (e) => { try { return { read: fs.readFileSync(e.path, "utf8").length } } catch (err) { return { error: err.code } } };` });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "snoop", runtime: "nodejs22.x" }, code)).body.id);
    const r = await invoke(fn.id, sk, { path: join(k.dataDir, "kiln.pid") });
    expect(r.body.read).toBeUndefined();
    expect(r.body.error).toMatch(/ENOENT|EACCES/);
  });
});

describe.skipIf(BEFORE_THE_WORKER)("delete", () => {
  test("202 deleting, then 404; a deploy while deletion is requested is 409", async () => {
    // On the file's Kiln, in a project of its own: nothing here needs a fresh Kiln.
    const p = await createProject(k);
    const d = await deploy(k, p.id, { name: "gone", runtime: "nodejs22.x" }, tgz(NODE_HELLO));
    await settled(k, p.id, d.body.id);
    const del = await k.api("DELETE", `/projects/${p.id}/functions/${d.body.id}`);
    expect(del.status).toBe(202);
    const again = await deploy(k, p.id, { name: "gone", runtime: "nodejs22.x" }, tgz(NODE_HELLO));
    expect([201, 409]).toContain(again.status); // 409 while the deletion runs; a new function once it finished
    await eventually(() => k.api("GET", `/projects/${p.id}/functions/${d.body.id}`), (r) => r.status === 404);
  });

});

describe("the function's own address (invoke_url)", () => {
  /** The host form of a function's address (`<name>.<project>.fn.localhost`). */
  const hostForm = (name: string, projectId: string) => `http://${name}.${projectId}.fn.localhost:${new URL(k.url).port}`;
  /** Requests to a host-form address: `*.localhost` is this machine, so connect to Kiln and send the Host. */
  async function viaHost(invokeUrl: string, path: string, init: RequestInit & { headers?: Record<string, string> } = {}) {
    const u = new URL(invokeUrl);
    const res = await fetch(`${k.url}${path}`, { ...init, headers: { ...init.headers, host: u.host } });
    const text = await res.text();
    let body: any = text;
    try {
      body = JSON.parse(text);
    } catch {}
    return { status: res.status, headers: res.headers, body, text };
  }

  test.skipIf(BEFORE_THE_WORKER)("HTTP mode: any method and nested path arrive as a request event; none auth needs no token there but the RPC route stays authenticated", async () => {
    const { p, sk } = await setup();
    const code = tgz({ "index.js": `exports.handler = async (req) => ({ statusCode: 200, headers: { "content-type": "application/json" }, body: JSON.stringify({ method: req.method, path: req.path, query: req.query, body: req.body, b64: req.isBase64Encoded, ua: req.headers?.["x-test"] }) });` });
    const d = await deploy(k, p.id, { name: "web", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" }, code);
    expect(d.status).toBe(201);
    const settledFn = await settled(k, p.id, d.body.id);
    expect(settledFn.invoke_url).toBe(`${k.url}/fn/${p.id}/web`);
    const fn = { ...settledFn, invoke_url: hostForm("web", p.id) };
    const post = await viaHost(fn.invoke_url, "/orders/42?x=1", { method: "PUT", body: '{"a":1}', headers: { "content-type": "application/json", "x-test": "yes" } });
    expect(post.status, JSON.stringify(post.body)).toBe(200);
    expect(post.body).toEqual({ method: "PUT", path: "/orders/42", query: { x: "1" }, body: '{"a":1}', b64: false, ua: "yes" });
    const bin = await viaHost(fn.invoke_url, "/", { method: "POST", body: new Uint8Array([0, 1, 2]), headers: { "content-type": "application/octet-stream" } });
    expect(bin.body).toMatchObject({ body: "AAEC", b64: true });
    const head = await viaHost(fn.invoke_url, "/x", { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.text).toBe("");
    const pre = await viaHost(fn.invoke_url, "/any", { method: "OPTIONS", headers: { origin: "http://localhost:3000" } });
    expect(pre.status).toBe(204);
    expect(pre.headers.get("access-control-allow-methods")).toBe("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
    expect((await invoke(fn.id, null, {})).status).toBe(401);
    expect((await invoke(fn.id, sk, {})).status).toBe(200);
  });

  test.skipIf(BEFORE_THE_WORKER)("HTTP mode with service auth needs a credential on the address; RPC functions take POST {payload} there", async () => {
    const { p, sk } = await setup();
    const svc = await settled(k, p.id, (await deploy(k, p.id, { name: "svc", runtime: "nodejs22.x", invocation_mode: "http" }, tgz({ "index.js": "exports.handler = async (r) => r.method" }))).body.id);
    const fn = { ...svc, invoke_url: hostForm("svc", p.id) };
    expect((await viaHost(fn.invoke_url, "/")).status).toBe(401);
    expect((await viaHost(fn.invoke_url, "/", { headers: { authorization: `Bearer ${sk}` } })).body).toBe("GET");
    const rpcFn = await settled(k, p.id, (await deploy(k, p.id, { name: "rpc", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    const rpc = { ...rpcFn, invoke_url: hostForm("rpc", p.id) };
    const ok = await viaHost(rpc.invoke_url, "/", { method: "POST", body: JSON.stringify({ payload: { name: "dns" } }), headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" } });
    expect(ok.body.hello).toBe("dns");
    expect((await viaHost(rpc.invoke_url, "/", { method: "GET", headers: { authorization: `Bearer ${sk}` } })).status).toBe(405);
    expect((await viaHost(`http://nope.${p.id}.fn.localhost:1`, "/")).status).toBe(404);
  });

  test("invoke_url (/fn/<project>/<name>) answers as the host form does, from Node's fetch and Python's urllib with no DNS set-up", async () => {
    const { p, sk } = await setup();
    const code = tgz({ "index.js": `exports.handler = async (req) => ({ statusCode: 201, headers: { "content-type": "application/json" }, body: JSON.stringify({ method: req.method, path: req.path, query: req.query, body: req.body }) });` });
    const web = await settled(k, p.id, (await deploy(k, p.id, { name: "pathweb", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" }, code)).body.id);
    const rpc = await settled(k, p.id, (await deploy(k, p.id, { name: "pathrpc", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    expect(web.invoke_url).toBe(`${k.url}/fn/${p.id}/pathweb`);
    // This process's fetch: the HTTP function sees the path after its name, the RPC one takes POST {payload}.
    const r = await fetch(`${web.invoke_url}/orders/7?x=1`, { method: "PATCH", body: "hi" });
    expect(r.status).toBe(201);
    expect(await r.json()).toEqual({ method: "PATCH", path: "/orders/7", query: { x: "1" }, body: "hi" });
    expect(await (await fetch(web.invoke_url)).json()).toMatchObject({ method: "GET", path: "/" });
    const viaRpc = await fetch(rpc.invoke_url, { method: "POST", headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" }, body: JSON.stringify({ payload: { name: "path" } }) });
    expect((await viaRpc.json()).hello).toBe("path");
    expect((await fetch(rpc.invoke_url, { method: "POST", body: "{}" })).status).toBe(401);
    expect((await fetch(`${k.url}/fn/${p.id}/nope`)).status).toBe(404);
    // Node's fetch (the real Node the functions run on, not Bun's node shim) and Python's urllib, as a user's scripts would call it.
    const nodeRuntime = await resolveRuntime("nodejs22.x");
    if (isMissing(nodeRuntime)) throw new Error(nodeRuntime.missing);
    const node = spawnSync(
      nodeRuntime.command,
      ["-e", `fetch(process.env.URL, { method: "POST", headers: { authorization: "Bearer ${sk}", "content-type": "application/json" }, body: JSON.stringify({ payload: { name: "node" } }) }).then((r) => r.json()).then((b) => console.log(b.hello))`],
      { encoding: "utf8", env: { ...process.env, URL: rpc.invoke_url } },
    );
    expect(node.stdout.trim(), node.stderr).toBe("node");
    const py = spawnSync("python3", ["-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1] + '/from/python').read().decode())", web.invoke_url], { encoding: "utf8" });
    expect(JSON.parse(py.stdout), py.stderr).toMatchObject({ method: "GET", path: "/from/python" });
  });
});

describe.skipIf(BEFORE_THE_WORKER)("the deployment queue", () => {
  // A build installing from the held registry stays busy until the test releases it.
  const slow = (v: string) =>
    tgz({ "index.js": `const slow = require("slow"); exports.handler = async () => slow("${v}");`, "package.json": `{"dependencies":{"slow":"${registry.url}/slow.tgz"}}` });
  afterEach(() => registry.release());

  test("one deployment at a time: newer deploys queue (pending_deployment_id) and supersede older queued ones", async () => {
    const { p, sk } = await setup();
    registry.hold();
    const first = await deploy(k, p.id, { name: "queued", runtime: "nodejs22.x" }, slow("a"));
    const second = await deploy(k, p.id, { name: "queued", runtime: "nodejs22.x" }, slow("b"));
    const third = await deploy(k, p.id, { name: "queued", runtime: "nodejs22.x" }, slow("c"));
    registry.release();
    expect(second.body.pending_deployment_id).toBeDefined();
    expect(third.body.pending_deployment_id).toBeDefined();
    expect(third.body.pending_deployment_id).not.toBe(second.body.pending_deployment_id);
    const fn = await settled(k, p.id, first.body.id);
    expect(fn.status).toBe("active");
    const deps = (await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data;
    expect(deps.map((d: any) => d.status)).toEqual(["succeeded", "superseded", "succeeded"]);
    expect(deps[0].id).toBe(third.body.pending_deployment_id);
    expect((await invoke(fn.id, sk)).body).toBe("c:true");
  });

  test("a deletion requested during a build waits behind it and supersedes queued deploys", async () => {
    const { p } = await setup();
    registry.hold();
    const first = await deploy(k, p.id, { name: "doomed", runtime: "nodejs22.x" }, slow("a"));
    await deploy(k, p.id, { name: "doomed", runtime: "nodejs22.x" }, slow("b"));
    const del = await k.api("DELETE", `/projects/${p.id}/functions/${first.body.id}`);
    expect(del.status).toBe(202);
    expect(del.body.pending_deployment_id).toBeDefined();
    expect((await deploy(k, p.id, { name: "doomed", runtime: "nodejs22.x" }, slow("c"))).status).toBe(409);
    registry.release();
    await eventually(() => k.api("GET", `/projects/${p.id}/functions/${first.body.id}`), (r) => r.status === 404, 60_000);
  });

  // A Kiln's life per event (the two tests had two starts each): killed during one build, started
  // again (which fails that build), stopped during another, started again (which fails that one).
  test("a build cut short by a crash is failed at the next start, never left provisioning; a stop kills the running installer: it does not wait for it, and the deployment is failed as interrupted", async () => {
    // A registry that accepts connections and never answers: npm would wait minutes for it.
    const seen: Socket[] = [];
    const hang = createServer((s) => seen.push(s));
    await new Promise<void>((r) => hang.listen(0, "127.0.0.1", r));
    const hangPort = (hang.address() as AddressInfo).port;
    // A registry on the host's loopback is only reachable from a build when allowed by name.
    const env = { KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${registry.port},127.0.0.1:${hangPort}` };
    let second: TestKiln | undefined;
    try {
      const first = await startKiln({ env });
      const p = await createProject(first);
      registry.hold();
      const d = await deploy(first, p.id, { name: "cut", runtime: "nodejs22.x" }, slow("a"));
      await eventually(() => first.api("GET", `/projects/${p.id}/functions/${d.body.id}/deployments`), (r) => r.body.data[0]?.status === "building");
      first.proc.kill("SIGKILL");
      await new Promise((r) => first.proc.once("exit", r));
      // Processes whose command line names this function's build folder (the installer, its sandbox).
      // (A killed Kiln can leave an installer behind; the next start kills it.)
      const buildDir = join(first.dataDir, "functions", d.body.id);
      const installers = () => processesTagged(buildDir);
      second = await startKiln({ dataDir: first.dataDir, databaseUrl: first.databaseUrl, env: { ...env, KILN_PLATFORM_TOKEN: first.token } });
      const again = second;
      const fn = await again.api("GET", `/projects/${p.id}/functions/${d.body.id}`);
      expect(fn.body.status).toBe("failed");
      const deps = (await again.api("GET", `/projects/${p.id}/functions/${d.body.id}/deployments`)).body.data;
      expect(deps[0]).toMatchObject({ status: "failed", error: expect.stringMatching(/interrupted/) });
      // Whatever installer the killed Kiln left running is gone too. (A failure names what is left:
      // pid, parent, process group, command line; CI once saw one process outlive 10 s.)
      const describeProcess = (pid: string) => {
        try {
          const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
          const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
          return `${pid} state ${f[0]} ppid ${f[1]} pgid ${f[2]}: ${readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").slice(0, 300)}`;
        } catch {
          return `${pid} (gone)`;
        }
      };
      await eventually(async () => installers().map(describeProcess), (list) => list.length === 0);

      // A stop while npm waits on the registry that never answers.
      const code = tgz({ "index.js": "exports.handler = async () => 1", "package.json": `{"dependencies":{"stuck":"http://127.0.0.1:${hangPort}/stuck.tgz"}}` });
      const stuck = await deploy(again, p.id, { name: "stuck", runtime: "nodejs22.x" }, code);
      await eventually(async () => seen.length, (n) => n > 0, 30_000); // npm is waiting on the registry
      expect(await again.stop()).toBe(0);
      await withKiln({ dataDir: first.dataDir, databaseUrl: first.databaseUrl, env: { KILN_PLATFORM_TOKEN: first.token } }, async (third) => {
        const deps = (await third.api("GET", `/projects/${p.id}/functions/${stuck.body.id}/deployments`)).body.data;
        expect(deps[0]).toMatchObject({ status: "failed", error: expect.stringMatching(/interrupted/) });
        expect((await third.api("GET", `/projects/${p.id}/functions/${stuck.body.id}`)).body.status).toBe("failed");
      });
    } finally {
      second?.proc.kill("SIGKILL"); // only matters when the stop above hung
      for (const s of seen) s.destroy();
      hang.close();
    }
  });
});

describe.skipIf(BEFORE_THE_WORKER)("batch deploy", () => {
  test("several functions in one request; the ones that fail before starting are reported, the others deploy", async () => {
    const { p, sk } = await setup();
    const form = new FormData();
    form.set(
      "functions",
      JSON.stringify([
        { name: "one", runtime: "nodejs22.x", file_field: "a" },
        { name: "two", runtime: "python3.11", file_field: "b" },
        { name: "Bad", runtime: "nodejs22.x", file_field: "a" },
        { name: "three", runtime: "nodejs22.x", file_field: "missing" },
      ]),
    );
    form.set("a", new Blob([new Uint8Array(tgz({ "index.js": "exports.handler = async () => 'one'" }))]), "a.tgz");
    form.set("b", new Blob([new Uint8Array(tgz({ "main.py": "def handler(e, c):\n    return 'two'\n" }))]), "b.tgz");
    const res = await fetch(`${k.url}/projects/${p.id}/functions/batch`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    const body = (await res.json()) as any;
    expect(res.status).toBe(200);
    expect(body.batch_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(body.functions.map((f: any) => f.name)).toEqual(["one", "two"]);
    expect(body.failed.map((f: any) => f.name)).toEqual(["Bad", "three"]);
    expect(body.failed[1].error).toMatch(/missing/);
    for (const f of body.functions) {
      await settled(k, p.id, f.id);
      expect((await invoke(f.id, sk)).body).toBe(f.name);
      // Each deployment remembers the batch that made it; a single deploy has none.
      const history = await k.api("GET", `/projects/${p.id}/functions/${f.id}/deployments`);
      expect(history.body.data.map((d: any) => d.batch_id)).toEqual([body.batch_id]);
    }
    const single = await deploy(k, p.id, { name: "single", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 1" }));
    expect((await k.api("GET", `/projects/${p.id}/functions/${single.body.id}/deployments`)).body.data[0].batch_id).toBeNull();
    const tooMany = new FormData();
    tooMany.set("functions", JSON.stringify(Array.from({ length: 101 }, (_, i) => ({ name: `f${i}`, runtime: "nodejs22.x", file_field: "a" }))));
    const r = await fetch(`${k.url}/projects/${p.id}/functions/batch`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: tooMany });
    expect(r.status).toBe(400);
    expect(((await r.json()) as any).error).toMatch(/100/);
  });
});

describe.skipIf(SANDBOX_ONLY)("isolation as users meet it", () => {
  test("no network by default; memory beyond the limit is a clear 502", async () => {
    const { p, sk } = await setup();
    const code = tgz({
      "index.js": `const net = require("net");
exports.handler = async (e) => {
  if (e.mode === "net") return await new Promise((ok) => { const s = net.connect(${new URL(k.url).port}, "127.0.0.1"); s.on("connect", () => { s.destroy(); ok("connected"); }); s.on("error", (err) => ok("refused: " + err.code)); });
  if (e.mode === "hog") { const keep = []; for (;;) keep.push(Buffer.alloc(16 * 1024 * 1024, 1)); }
  return "ok";
};`,
    });
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "boxed", runtime: "nodejs22.x" }, code)).body.id);
    const net = await invoke(fn.id, sk, { mode: "net" });
    expect(net.body).toMatch(/^refused: /);
    const hog = await invoke(fn.id, sk, { mode: "hog" });
    expect(hog.status).toBe(502);
    expect(hog.body.error).toMatch(/out of memory|crashed/);
    expect((await invoke(fn.id, sk, { mode: "ok" })).body).toBe("ok");
  });
});

describe("time limit and invocation logs", () => {
  test.skipIf(SANDBOX_ONLY)("CPU time is limited per invocation, threads included: two spinning threads are stopped at the budget with a 504", async () => {
    await withKiln({ env: { KILN_FUNCTION_CPU_SECONDS: "1", KILN_FUNCTION_TIMEOUT_MS: "20000" } }, async (kk) => {
      const p = await createProject(kk);
      const key = (await kk.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "b" } })).body.key;
      // Two threads spin until the process has used 4 s of CPU (far over the 1 s budget), however
      // long a loaded machine takes to give it that, up to 15 s: under the 20 s time limit.
      const code = tgz({
        "index.js": `const { Worker } = require("worker_threads");
const spin = "const end = Date.now() + 15000; while (Date.now() < end && process.cpuUsage().user < 4e6) {} require('worker_threads').parentPort.postMessage(1);";
exports.handler = async (e) => {
  if (!e.spin) return "idle";
  await Promise.all([0, 1].map(() => new Promise((ok) => new Worker(spin, { eval: true }).on("message", ok))));
  return "spun";
};`,
      });
      const fn = await settled(kk, p.id, (await deploy(kk, p.id, { name: "spinner", runtime: "nodejs22.x" }, code)).body.id);
      expect((await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: {} } })).body).toBe("idle");
      const spun = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { spin: true } } });
      expect(spun.status).toBe(504);
      expect(spun.body.error).toMatch(/CPU time limit of 1 s/);
      expect((await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: {} } })).body).toBe("idle");
    });
  });
});

// One Kiln for the limits a Kiln is started with (each test used to start its own): two regions, a cap of
// one function per project, 1 MB source archives, and short time limits. The limit runs from when the
// handler gets the event; a cold start (a second or more for a container on a busy machine) has its own
// budget, which the time-limit test waits out once: both are as short as a loaded machine allows.
describe("limits set when Kiln starts", () => {
  const kk = useKiln({ args: ["--regions", "eu,us"], env: { KILN_FUNCTION_LIMIT: "1", KILN_SOURCE_ARCHIVE_LIMIT_MB: "1", KILN_FUNCTION_TIMEOUT_MS: "1500", KILN_FUNCTION_INIT_TIMEOUT_MS: "6000" } });

  // Which region serves, the cap and the archive limit are the same code whatever runs the worker: not
  // in the containers projects (as the blocks of BEFORE_THE_WORKER); the time limits are the engine's too.
  test.skipIf(BEFORE_THE_WORKER)("deployed_regions names the region that serves it, not every configured one", async () => {
    const p = await createProject(kk);
    const sk = (await kk.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "b" } })).body.key;
    const fn = await settled(kk, p.id, (await deploy(kk, p.id, { name: "where", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).body.id);
    expect(fn.deployed_regions).toEqual(["eu"]);
    const r = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: {} } });
    expect(r.headers.get("x-service-region")).toBe("eu");
  });

  test.skipIf(BEFORE_THE_WORKER)("the per-project cap answers 403; archives over the size setting are 400", async () => {
    const p = await createProject(kk);
    expect((await deploy(kk, p.id, { name: "one", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).status).toBe(201);
    const two = await deploy(kk, p.id, { name: "two", runtime: "nodejs22.x" }, tgz(NODE_HELLO));
    expect(two.status).toBe(403);
    expect((await deploy(kk, p.id, { name: "one", runtime: "nodejs22.x" }, tgz(NODE_HELLO))).status).toBe(200);
    const random = Buffer.from(crypto.getRandomValues(new Uint8Array(65_536))).toString("base64").repeat(24); // ~2 MB, incompressible
    const big = await deploy(kk, p.id, { name: "one", runtime: "nodejs22.x" }, tgz({ "index.js": `// ${random}` }));
    expect(big.status).toBe(400);
    expect(big.body.error).toMatch(/1 MB/);
  });

  test("an invocation over the time limit is a 504; every invocation leaves log lines with level, invocation id and region", async () => {
    const p = await createProject(kk);
    const key = (await kk.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "b" } })).body.key;
    // A NUL in a log line (PostgreSQL text refuses it) must not cost the other rows.
    const code = tgz({ "index.js": `exports.handler = async (e) => { console.log("working on", e.ms); if (e.nul) console.log("nul:\\u0000:end"); await new Promise((r) => setTimeout(r, e.ms)); return "done"; };` });
    const fn = await settled(kk, p.id, (await deploy(kk, p.id, { name: "sleepy", runtime: "nodejs22.x" }, code)).body.id);
    const quick = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { ms: 10, nul: true } } });
    expect(quick.status).toBe(200);
    const slow = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { ms: 5000 } } });
    expect(slow.status).toBe(504);
    expect(slow.body.error).toMatch(/timed out/);
    expect((await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { ms: 10 } } })).status).toBe(200);
    // On that warm worker, an answer just after the limit does not count either, though a
    // container's kill (an engine call) lands later than that.
    const justLate = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { ms: 1505 } } });
    expect(justLate.status).toBe(504);
    // A cold start has its own budget (KILN_FUNCTION_INIT_TIMEOUT_MS): code that never finishes loading
    // (blocked, using no CPU) is a 504 naming that budget, not the time limit. It blocks only with a
    // project variable set, which the deploy's load check runs without (else the deploy fails). In a
    // project of its own: this Kiln allows one function per project.
    const p2 = await createProject(kk);
    const key2 = (await kk.api("POST", `/projects/${p2.id}/service-keys`, { body: { name: "b" } })).body.key;
    const stuck = await settled(kk, p2.id, (await deploy(kk, p2.id, { name: "stuck", runtime: "nodejs22.x" }, tgz({ "index.js": "if (process.env.STALL) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); exports.handler = async () => 'never';" }))).body.id);
    expect(stuck.status).toBe("active");
    await kk.api("POST", `/projects/${p2.id}/variables`, { body: { name: "STALL", value: "1" } });
    const never = await kk.api("POST", `/functions/${stuck.id}/invoke`, { token: key2, body: { payload: {} } });
    expect(never.status).toBe(504);
    expect(never.body.error).toMatch(/did not start within 6000 ms/);
    // Every invocation's lines, found by log search (which sees every line recorded before it).
    const search = await kk.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, limit: 1000 } });
    expect(search.status).toBe(200);
    const rows = search.body.data as Array<{ invocation_id: string; region: string; level: string; body: string }>;
    const slowId = slow.headers.get("x-service-invocation-id");
    const mine = rows.filter((r) => r.invocation_id === slowId);
    expect(mine.map((r) => r.body)).toEqual(expect.arrayContaining([expect.stringContaining("working on 5000"), expect.stringMatching(/timed out/)]));
    expect(mine.every((r) => r.region === "eu")).toBe(true);
    expect(mine.some((r) => r.level === "error")).toBe(true);
    expect(new Set(rows.map((r) => r.invocation_id)).size).toBe(4);
    // A NUL (which PostgreSQL text refuses) is kept as U+FFFD and costs no other line.
    expect(rows.map((r) => r.body)).toContain("nul:\uFFFD:end");
  });
});
