// The compiled binary (docs/binary.md): `npm run build:binary` makes dist/kiln, and that file alone,
// copied to an empty folder and run with no Node, no Bun and no node_modules in reach (PATH without
// them, an empty HOME, a working directory with nothing in it), starts, keeps a project, an embedded
// database (over the wire protocol, with an extension from the embedded bundles) and a Node function
// (its runtime from the runtime cache, as `npm test`'s pretest prepared it), and stops cleanly.
// A representative part of the black-box suite, not all of it: the areas whose files the binary
// reads at run time (PGlite's WebAssembly and data, extension bundles, Bun Workers, the sandbox's
// bootstraps and scripts) in depth, and one call or two into every other area (the same bundled
// code either way, but a module the bundler left out or a file read from the source tree shows here).
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, statSync, symlinkSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { deploy, settled, tgz } from "../support/functions";
import { BUN, createProject, eventually, removeDir, ROOT, startKiln, type TestKiln } from "../support/kiln";

const work = mkdtempSync(join(tmpdir(), "kiln-binary-"));
const kilnCache = process.env.KILN_CACHE_DIR ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "kiln");
let k: TestKiln;
let binary: string;

/** A PATH with every tool of /usr/bin and /bin except node, bun and their package managers. */
function pathWithoutNodeOrBun(): string {
  const dir = join(work, "path");
  mkdirSync(dir);
  const hidden = /^(node|nodejs|bun|bunx|npm|npx|corepack|yarn|pnpm)$/;
  for (const from of ["/usr/bin", "/bin"]) {
    if (!existsSync(from)) continue;
    for (const f of readdirSync(from)) if (!hidden.test(f) && !existsSync(join(dir, f))) symlinkSync(join(from, f), join(dir, f));
  }
  return dir;
}

beforeAll(async () => {
  // A prebuilt binary (CI builds it once) or a build now (~10 s of CPU).
  const built = process.env.KILN_TEST_BINARY ?? join(work, "build", "kiln");
  if (!process.env.KILN_TEST_BINARY) execFileSync(BUN, [join(ROOT, "cmd/build-binary.ts"), built], { cwd: ROOT, stdio: "pipe" });
  const empty = join(work, "run");
  mkdirSync(empty);
  binary = join(empty, "kiln");
  copyFileSync(built, binary);
  const home = join(work, "home");
  mkdirSync(home);
  // The Kiln cache is the one the pretest prepared (its Node runtimes; its control-store template,
  // which the binary would otherwise make itself with initdb, ~10 CPU-s, see docs/binary.md). The
  // binary extracts its sandbox files there too, in folders named by their content.
  const cache = kilnCache;
  const PATH = pathWithoutNodeOrBun();
  expect(() => execFileSync("sh", ["-c", "command -v node || command -v bun"], { env: { PATH } })).toThrow();
  k = await startKiln({ binary, cwd: empty, env: { PATH, HOME: home, KILN_CACHE_DIR: cache, NODE_PATH: undefined, BUN_INSTALL: undefined, XDG_CACHE_HOME: undefined } });
}, 180_000);

afterAll(async () => {
  if (k && k.proc.exitCode === null && k.proc.signalCode === null) await k.stop();
  removeDir(work);
});

describe("the compiled binary", () => {
  test("is one file that runs with nothing beside it", () => {
    expect(readdirSync(join(work, "run"))).toEqual(["kiln"]);
    expect(statSync(binary).size).toBeGreaterThan(50e6);
    expect(k.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  });

  test("a project, an embedded database queried over the wire, an extension from the embedded bundles", async () => {
    const p = await createProject(k);
    const r = await k.api("POST", `/projects/${p.id}/databases`, { body: { name: "app" } });
    expect(r.status).toBe(201);
    const db = await eventually(() => k.api("GET", `/projects/${p.id}/databases/app`), (x) => x.body.status !== "provisioning", 60_000);
    expect(db.body.status).toBe("active");
    const sql = postgres(db.body.connection_string, { max: 1, onnotice: () => {} });
    try {
      await sql`create table t (id int primary key, v text)`;
      await sql`insert into t values (1, 'one'), (2, 'two')`;
      expect(await sql`select v from t order by id`).toEqual([{ v: "one" }, { v: "two" }]);
      await sql`create extension vector`;
      expect(await sql`select '[1,2]'::vector <-> '[1,3]'::vector as d`).toEqual([{ d: 1 }]);
    } finally {
      await sql.end();
    }
  }, 120_000);

  test("a Node function deployed and invoked in the sandbox", async () => {
    const p = await createProject(k);
    const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const d = await deploy(k, p.id, { name: "hello", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (e) => ({ hello: e.name, node: process.version.split(".")[0] });` }));
    expect(d.status).toBe(201);
    const fn = await settled(k, p.id, d.body.id);
    expect(fn.status, JSON.stringify((await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body) + k.stderr.slice(-3000)).toBe("active");
    const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { name: "ada" } } });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ hello: "ada", node: "v22" });
  }, 120_000);

  test("serves the web console built into it (no sources to build it from beside it)", async () => {
    const res = await fetch(`${k.url}/_console`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/html");
    const html = await res.text();
    // The app's script, inline: the page fetches nothing else.
    const js = /<script type="module">([\s\S]*)<\/script>/.exec(html)?.[1] ?? "";
    expect(js.length).toBeGreaterThan(10_000);
    expect(js).toContain("kiln.console.token");
    expect(js).toContain("/logs/tail");
  });

  test("the CLI commands are in the same file", () => {
    const cli = (...args: string[]) => execFileSync(binary, ["--url", k.url, "--token", k.token, "--json", ...args], { cwd: join(work, "run"), env: { PATH: join(work, "path"), HOME: join(work, "home") }, encoding: "utf8" });
    const projects = JSON.parse(cli("projects", "list"));
    expect(projects.data.length).toBeGreaterThanOrEqual(2);
  });

  test("every other area answers from the binary: storage, end users, locks, logs, metrics, usage, configuration, MCP, OpenAPI", async () => {
    const p = await createProject(k);
    const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
    // Storage: a bucket, an object up and back down.
    expect((await k.api("POST", `/projects/${p.id}/storage/buckets`, { body: { name: "files" } })).status).toBe(201);
    const form = new FormData();
    form.set("file", new Blob(["from the binary"], { type: "text/plain" }), "note.txt");
    expect((await fetch(`${k.url}/storage/files/a/note.txt`, { method: "POST", headers: { authorization: `Bearer ${sk}` }, body: form })).status).toBe(201);
    expect(await (await fetch(`${k.url}/storage/files/a/note.txt`, { headers: { authorization: `Bearer ${sk}` } })).text()).toBe("from the binary");
    // End users: sign up, then the user reads itself.
    const signup = await k.api("POST", "/auth/signup", { token: anon, body: { email: "ada@example.com", password: "long enough" } });
    expect(signup.status).toBe(201);
    expect((await k.api("GET", "/auth/user", { token: signup.body.access_token })).body.email).toBe("ada@example.com");
    // Locks: a lease with its fencing token.
    const lease = await k.api("POST", "/locks/job/lease", { token: sk, body: { ttl_seconds: 30 }, headers: { "X-Service-Request-Id": crypto.randomUUID(), "X-Service-Lock-Token": crypto.randomUUID() } });
    expect(lease.status, lease.text).toBe(200);
    // Logs, metrics and usage answer for the project.
    expect((await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" } } })).status).toBe(200);
    expect((await k.api("POST", `/projects/${p.id}/metrics/query`, { body: { metrics: ["request_count"], resource: { type: "function" } } })).status).toBeLessThan(500);
    expect((await k.api("GET", `/projects/${p.id}/usage`)).status).toBe(200);
    // Configuration export (YAML, from every section's module) and the MCP endpoint's initialize.
    const config = await k.api("GET", `/projects/${p.id}/config?format=yaml`);
    expect(config.status).toBe(200);
    expect(config.text).toContain("files");
    const token = (await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "mcp", scope: "full" } })).body.token as string;
    const mcp = await fetch(`${k.url}/mcp`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: `Bearer ${token}` },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "binary-test", version: "1" } } }),
    });
    expect(mcp.status).toBe(200);
    expect(await mcp.text()).toContain('"name":"kiln"');
    // The OpenAPI description, generated from the bundled schemas.
    expect(Object.keys((await k.api("GET", "/openapi.json", { token: null })).body.paths).length).toBeGreaterThan(100);
  }, 120_000);

  test("stops cleanly on SIGTERM", async () => {
    expect(await k.stop()).toBe(0);
  });

  test("a fresh data dir on a machine with no template cache is unpacked from the embedded template, not made by initdb", async () => {
    // The archive keeps the files' times from when the template was prepared (before the build);
    // an initdb now would write PG_VERSION now.
    const cache = join(work, "empty-cache");
    const startedAt = Date.now() - 1000;
    const fresh = await startKiln({ binary, cwd: join(work, "run"), env: { PATH: join(work, "path"), HOME: join(work, "home"), KILN_CACHE_DIR: cache, XDG_CACHE_HOME: undefined }, startTimeoutMs: 120_000 });
    try {
      const templates = readdirSync(join(cache, "templates"));
      expect(templates).toEqual([expect.stringMatching(/^control-v\d+-pglite[\d.]+-[0-9a-f]{16}$/)]);
      expect(statSync(join(cache, "templates", templates[0]!, "PG_VERSION")).mtimeMs).toBeLessThan(startedAt);
      expect((await fresh.api("GET", "/projects")).status).toBe(200);
    } finally {
      expect(await fresh.stop()).toBe(0);
    }
  }, 180_000);
});
