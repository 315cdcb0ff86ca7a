// A Next.js frontend through Kiln's API (spec part 2: the Frontends endpoints, build and runtime
// rules 1-2): the fixture app (test/fixtures/frontends/nextjs-app) deployed as an archive, built in
// the sandbox from the frontend npm cache that `npm test`'s set-up fills (npm's registry is an
// address nothing listens on here, so any download fails the build), served at its site URL by its
// standalone server on Node.js; its server component calls a Kiln function. Then the same page in
// headless Chromium: it renders and hydrates. One build for the file and for the suite (`next build` is
// tens of CPU-s): the framework's own server tests (runtime-sandbox/frontends/nextjs/server.ts: lazy
// start, sandbox, restart, idle stop) run here too, on a copy of the deployment that Kiln built, rather
// than on a second build of the same fixture in a unit file (test/unit/frontends-nextjs.test.ts keeps
// what needs no fixture build).
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { connect, createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNextjsFramework } from "../../runtime-sandbox/frontends/nextjs";
import { NextjsServer as NextjsServerClass, type NextjsServer } from "../../runtime-sandbox/frontends/nextjs/server";
import type { FrontendBuildResult, FrontendFramework } from "../../runtime-sandbox/frontends/types";
import { useBrowser } from "../support/browser";
import { removeDir } from "../support/dirs";
import { freePort } from "../support/free-port";
import { deploy, settled as fnSettled, tgz } from "../support/functions";
import { createProject, eventually, useKiln, type TestKiln } from "../support/kiln";

const FIXTURE = join(import.meta.dirname, "../fixtures/frontends/nextjs-app");
// A stand-in `next` whose build writes a probe server as the standalone server.js: the server's
// sandbox tested through the real deploy path without a second `next build`.
const PROBE_FIXTURE = join(import.meta.dirname, "../fixtures/frontends/standalone-probe");
// Low enough for the probe's allocation to reach quickly, ample for the fixture app's server.
const MEMORY_MB = 384;
const PG_PORT = await freePort();
const GREETING = `greeting-${Math.random().toString(36).slice(2, 10)}`;
const SECRET = `secret-${Math.random().toString(36).slice(2, 10)}`;

function fixtureArchive(dir = FIXTURE): Buffer {
  return execFileSync("tar", ["-czf", "-", "--exclude=node_modules", "--exclude=.next", "-C", dir, "."], { maxBuffer: 64 << 20 });
}

async function deployFrontend(k: TestKiln, projectId: string, fields: Record<string, string | string[]>, archive: Buffer) {
  const form = new FormData();
  for (const [key, v] of Object.entries(fields)) for (const one of Array.isArray(v) ? v : [v]) form.append(key, one);
  form.set("archive", new Blob([new Uint8Array(archive)]), "app.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
  return { status: res.status, body: (await res.json()) as any };
}

async function settled(k: TestKiln, projectId: string, id: string, timeoutMs: number) {
  return (await eventually(() => k.api("GET", `/projects/${projectId}/frontends/${id}`), (r) => r.status === 200 && r.body.status !== "provisioning" && !r.body.pending_deployment_id, timeoutMs)).body;
}

/** A request to a site: Kiln's port with the site's Host header (stock resolvers do not know *.localhost). */
function siteFetch(siteUrl: string, path: string, init: RequestInit = {}) {
  const u = new URL(siteUrl);
  return fetch(`http://127.0.0.1:${u.port}${path}`, { ...init, headers: { ...(init.headers as Record<string, string>), host: u.host } });
}

describe("Next.js frontends", () => {
  const k = useKiln({ args: ["--pg-port", String(PG_PORT)], env: { npm_config_registry: "http://127.0.0.1:9/", KILN_FRONTEND_MEMORY_MB: String(MEMORY_MB) } });
  const browser = useBrowser();
  let site: { id: string; site_url: string; current_deployment_id: string; projectId: string; backendUrl: string } | null = null;

  it("deploys the fixture: page with the server component's data, API route, NEXT_PUBLIC_ value in the client bundle only", async () => {
    const p = await createProject(k);
    // The backend the server component calls: a Kiln function's invoke URL.
    const fn = await deploy(
      k,
      p.id,
      { name: "backend", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" },
      tgz({ "index.js": `exports.handler = async (req) => ({ statusCode: 200, headers: { "content-type": "application/json" }, body: JSON.stringify({ answer: 42, from: JSON.parse(req.body).from }) });` }),
    );
    expect(fn.status).toBe(201);
    const backend = await fnSettled(k, p.id, fn.body.id);
    expect(backend.status).toBe("active");
    // Two names the build reserves (NODE_OPTIONS, npm_config_registry: a registry that answers, where Kiln's
    // environment has one nothing listens on) are selected: each is dropped with a warning.
    for (const [name, value] of [["BACKEND_URL", backend.invoke_url], ["NEXT_PUBLIC_GREETING", GREETING], ["SERVER_SECRET", SECRET], ["NODE_OPTIONS", "--inspect"], ["npm_config_registry", "http://evil.example/"], ["UNSELECTED", "x"]])
      expect((await k.api("POST", `/projects/${p.id}/variables`, { body: { name, value } })).status).toBe(201);

    const r = await deployFrontend(k, p.id, { name: "web", framework: "nextjs", variables: ["BACKEND_URL", "NEXT_PUBLIC_GREETING", "SERVER_SECRET", "NODE_OPTIONS", "npm_config_registry"] }, fixtureArchive());
    expect(r.status).toBe(201);
    const f = await settled(k, p.id, r.body.id, 900_000);
    const deployments = await k.api("GET", `/projects/${p.id}/frontends/${r.body.id}/deployments`);
    expect(f.status, JSON.stringify(deployments.body)).toBe("active");
    expect(f.framework).toBe("nextjs");
    site = { id: f.id, site_url: f.site_url, current_deployment_id: f.current_deployment_id, projectId: p.id, backendUrl: backend.invoke_url };
    // The deployment record keeps the build's warnings: one per reserved name, nothing else.
    const dep = (deployments.body.data as Array<{ id: string; warnings: string[] }>).find((d) => d.id === f.current_deployment_id)!;
    expect(dep.warnings).toHaveLength(2);
    expect(dep.warnings.some((w) => w.includes("NODE_OPTIONS") && w.includes("reserved"))).toBe(true);
    expect(dep.warnings.some((w) => w.includes("npm_config_registry") && w.includes("reserved"))).toBe(true);
    // The deployment's folder: the standalone server with its manifest, the static dir served by Kiln.
    const depDir = join(k.dataDir, "frontends", "deployments", f.current_deployment_id);
    expect(existsSync(join(depDir, "server", "kiln-nextjs.json"))).toBe(true);
    expect(readFileSync(join(depDir, "static", "hello.txt"), "utf8")).toBe("static file from public/\n");

    // The page: rendered per request by the server component, which called the function.
    const home = await siteFetch(f.site_url, "/");
    expect(home.status).toBe(200);
    const html = await home.text();
    expect(html).toContain("Hello from Next.js on Kiln");
    expect(html).toContain("backend said: <!-- -->200 {&quot;answer&quot;:42,&quot;from&quot;:&quot;nextjs&quot;}");
    expect(html).toContain("NEXT_PUBLIC_ names in the server environment: <!-- -->(none)");
    expect(html).not.toContain(SECRET);

    // The API route: JSON; the runtime sees SERVER_SECRET, no NEXT_PUBLIC_*, not the reserved NODE_OPTIONS.
    const api = await siteFetch(f.site_url, "/api/hello");
    expect(api.status).toBe(200);
    const body = (await api.json()) as Record<string, unknown>;
    expect(body).toMatchObject({ hello: "world", path: "/api/hello", runtime_variable: SECRET, public_in_server_env: [] });
    expect(String(body.node)).toMatch(/^v22\./);

    // The client bundle, served by Kiln from the static dir with immutable caching, has the value inlined.
    const chunks = [...new Set([...html.matchAll(/\/_next\/static\/chunks\/[^"]+\.js/g)].map((m) => m[0]))];
    expect(chunks.length).toBeGreaterThan(0);
    let inlined = false;
    for (const c of chunks) {
      const res = await siteFetch(f.site_url, c);
      expect(res.status).toBe(200);
      expect(res.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
      if ((await res.text()).includes(GREETING)) inlined = true;
    }
    expect(inlined).toBe(true);
    expect(await (await siteFetch(f.site_url, "/hello.txt")).text()).toBe("static file from public/\n");

    // The build log, line by line: the install from the cache, next build, the reserved name's warning.
    const logs = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "frontend", ids: [f.id], deployments: { ids: [f.current_deployment_id] } }, limit: 1000 } });
    expect(logs.status).toBe(200);
    const lines = (logs.body.data as Array<{ body: string }>).map((e) => String(e.body));
    expect(lines.some((l) => l.includes("npm ci --prefer-offline"))).toBe(true);
    // Node 22 by default (the fixture's package.json has no engines.node), and the Next.js it installed.
    expect(lines.some((l) => /Node\.js 22\.\d+\.\d+ \(package\.json has no engines\.node/.test(l))).toBe(true);
    expect(lines.some((l) => /Next\.js 16\.\d+\.\d+/.test(l))).toBe(true);
    expect(lines.some((l) => l.includes("running next build"))).toBe(true);
    expect(lines.some((l) => l.includes("variable NODE_OPTIONS was not passed") && l.includes("reserved"))).toBe(true);
    expect(lines.some((l) => l.includes("variable npm_config_registry was not passed") && l.includes("reserved"))).toBe(true);
  }, 1_000_000);

  it("renders and hydrates in a real browser", async () => {
    expect(site).not.toBeNull();
    const page = await (await browser.get()).page();
    try {
      const res = await page.goto(`${site!.site_url}/`, { waitUntil: "load", timeout: 60_000 });
      expect(res?.status()).toBe(200);
      await page.waitForFunction(() => document.getElementById("hydrated")?.textContent === "hydrated", null, { timeout: 60_000 });
      expect(await page.textContent("#greeting")).toBe(GREETING);
      expect(await page.textContent("#backend")).toContain('200 {"answer":42,"from":"nextjs"}');
      await page.click("#increment");
      await page.click("#increment");
      expect(await page.textContent("#increment")).toBe("clicked 2");
    } finally {
      await page.close();
    }
  }, 180_000);

  // The framework's server (what the area's serve() returns) driven directly, on a copy of the deployment
  // Kiln built above: the process lifecycle that HTTP alone cannot observe. Its own hidden path is this
  // Kiln's data dir, as the area gives it.
  describe("the Next.js server of that build (runtime-sandbox/frontends/nextjs/server.ts)", () => {
    let work = "";
    let deploymentDir = "";
    let result: FrontendBuildResult;
    let framework: FrontendFramework;
    let server: NextjsServer;
    // The one host port the sandboxed server reaches (through its relay): this file's Kiln, whose function the page calls.
    const kilnAddress = () => ({ host: "127.0.0.1", port: Number(new URL(k.url).port), publicUrl: k.url });

    beforeAll(() => {
      expect(site).not.toBeNull();
      work = mkdtempSync(join(tmpdir(), "kiln-nextjs-server-"));
      deploymentDir = join(work, "deployment");
      execFileSync("cp", ["-a", join(k.dataDir, "frontends", "deployments", site!.current_deployment_id), deploymentDir]);
      // What the build returned for it (the area keeps it in the store): the runtime's variables are the
      // selected ones minus reserved names and NEXT_PUBLIC_* (the tests above prove that split over HTTP).
      result = {
        kind: "nextjs",
        staticDir: "static",
        serverDir: "server",
        immutablePrefixes: ["/_next/static/"],
        nodeVersion: "22",
        runtimeEnv: { BACKEND_URL: site!.backendUrl, SERVER_SECRET: SECRET },
        warnings: [],
      };
      framework = createNextjsFramework({ hiddenPaths: [k.dataDir], sandbox: { want: "auto", allowUnsandboxed: false }, warn: () => {}, kiln: kilnAddress });
      server = framework.serve({ deploymentDir, result, log: () => {} }) as NextjsServer;
    });

    afterAll(async () => {
      await framework?.close();
      if (work) removeDir(work);
    }, 120_000);

    it("is started by the first request: the page is server-rendered with the server component's fetched data", async () => {
      expect(server.pid).toBeNull();
      const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/"));
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toContain("text/html");
      const html = await res.text();
      expect(html).toContain("Hello from Next.js on Kiln");
      expect(html).toContain(`backend said: <!-- -->200 {&quot;answer&quot;:42,&quot;from&quot;:&quot;nextjs&quot;}`);
      expect(html).toContain("NEXT_PUBLIC_ names in the server environment: <!-- -->(none)");
      expect(html).toContain(`<p id="greeting">${GREETING}</p>`);
      expect(html).not.toContain(SECRET);
      expect(server.pid).not.toBeNull();
      expect(server.starts).toBe(1);
    });

    it("the API route sees the runtime variables; Next.js's cache folder is writable, its code is not", async () => {
      const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/api/hello?x=1"));
      expect(res.status).toBe(200);
      const body = (await res.json()) as Record<string, unknown>;
      expect(body).toMatchObject({ hello: "world", path: "/api/hello", runtime_variable: SECRET, public_in_server_env: [] });
      expect(body).toMatchObject({ cache_writable: true, code_writable: false });
      expect(String(body.node)).toMatch(/^v22\./);
      expect(server.starts).toBe(1);
    });

    it("runs sandboxed on Node, not in the caller's process, without the hidden path", () => {
      const pid = server.pid!;
      expect(pid).not.toBe(process.pid);
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      expect(cmd[0]).toMatch(/bwrap|unshare|chrt|setpriv/);
      expect(cmd.some((a) => a.endsWith("/node"))).toBe(true);
      expect(cmd.some((a) => a.includes(k.dataDir))).toBe(false);
    });

    it("a server that died is started again by the next request", async () => {
      const pid = server.pid!;
      process.kill(-pid, "SIGKILL");
      await new Promise((r) => setTimeout(r, 100));
      const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/api/hello"));
      expect(res.status).toBe(200);
      expect(server.starts).toBe(2);
      expect(server.pid).not.toBe(pid);
    });

    it("an idle server is stopped; the next request starts it again", async () => {
      const idle = new NextjsServerClass({ hiddenPaths: [k.dataDir], sandbox: { want: "auto", allowUnsandboxed: false }, kiln: kilnAddress }, { deploymentDir, result, log: () => {} }, { idleMs: 300 });
      try {
        // Busy until the body is read through: a streaming response is never cut by the idle stop.
        const res = await idle.fetch(new Request("http://web--demo.app.localhost:7070/api/hello"));
        expect(res.status).toBe(200);
        await res.text();
        const pid = idle.pid!;
        for (let i = 0; i < 200 && idle.pid !== null; i++) await new Promise((r) => setTimeout(r, 50));
        expect(idle.pid).toBeNull();
        // Killed as it was let go: gone once its exit has been reaped.
        const alive = () => {
          try {
            process.kill(pid, 0);
            return true;
          } catch {
            return false;
          }
        };
        for (let i = 0; i < 200 && alive(); i++) await new Promise((r) => setTimeout(r, 50));
        expect(alive()).toBe(false);
        expect((await idle.fetch(new Request("http://web--demo.app.localhost:7070/api/hello"))).status).toBe(200);
        expect(idle.starts).toBe(2);
      } finally {
        await idle.stop();
      }
    }, 60_000);

    it("stop ends the process and refuses further requests", async () => {
      const pid = server.pid!;
      await server.stop();
      expect(() => process.kill(pid, 0)).toThrow();
      const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/"));
      expect(res.status).toBe(503);
    });
  });

  it("an engines.node that allows neither Node.js 22 nor 24 fails the deployment with a clear error", async () => {
    const p = await createProject(k);
    const archive = tgz({ "package.json": JSON.stringify({ name: "future", version: "1.0.0", engines: { node: ">=26" }, dependencies: { next: "16.0.10" } }), "app/page.jsx": "export default () => null" });
    const r = await deployFrontend(k, p.id, { name: "future" }, archive);
    expect(r.status).toBe(201);
    const f = await settled(k, p.id, r.body.id, 60_000);
    expect(f.status).toBe("failed");
    const d = await k.api("GET", `/projects/${p.id}/frontends/${f.id}/deployments`);
    expect(JSON.stringify(d.body.data)).toContain('package.json engines.node \\">=26\\" allows neither Node.js 22.x nor 24.x');
  }, 120_000);
  describe("the server's sandbox (a probe server in place of Next.js's)", () => {
    let probe: { projectId: string; id: string; site_url: string; invoke_url: string } | null = null;
    // Another service on the host's loopback, which the app must not reach.
    let other: Server;
    let otherPort = 0;

    it("deploys the probe through the Next.js build (stand-in next) and serves it", async () => {
      other = createServer((s) => s.end("other service\n")).listen(0, "127.0.0.1");
      await new Promise((r) => other.once("listening", r));
      otherPort = (other.address() as { port: number }).port;
      const p = await createProject(k);
      const fn = await deploy(
        k,
        p.id,
        { name: "backend", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" },
        tgz({ "index.js": `exports.handler = async (req) => ({ statusCode: 200, body: JSON.stringify({ answer: 42, from: JSON.parse(req.body).from }) });` }),
      );
      expect(fn.status).toBe(201);
      const backend = await fnSettled(k, p.id, fn.body.id);
      expect(backend.status).toBe("active");
      const r = await deployFrontend(k, p.id, { name: "probe", framework: "nextjs" }, fixtureArchive(PROBE_FIXTURE));
      expect(r.status).toBe(201);
      const f = await settled(k, p.id, r.body.id, 300_000);
      const deployments = await k.api("GET", `/projects/${p.id}/frontends/${r.body.id}/deployments`);
      expect(f.status, JSON.stringify(deployments.body)).toBe("active");
      probe = { projectId: p.id, id: f.id, site_url: f.site_url, invoke_url: backend.invoke_url };
      // The other service answers the test: a refusal below is the sandbox's doing.
      expect(await canConnect(otherPort)).toBe(true);
    }, 360_000);

    it("reaches Kiln's HTTP port (a function's invoke_url, also by localhost) and nothing else of the host: not the wire port, not another loopback service, not the host's addresses through the egress", async () => {
      expect(probe).not.toBeNull();
      const kilnPort = Number(new URL(k.url).port);
      const q = new URLSearchParams({ dataDir: k.dataDir, kilnPid: String(k.proc.pid), ports: [kilnPort, PG_PORT, otherPort].join(",") });
      const byLocalhost = probe!.invoke_url.replace("://127.0.0.1:", "://localhost:");
      for (const u of [probe!.invoke_url, byLocalhost, `http://127.0.0.2:${otherPort}/`, `http://[::1]:${PG_PORT}/`]) q.append("fetch", u);
      const res = await siteFetch(probe!.site_url, `/probe?${q}`);
      expect(res.status).toBe(200);
      const body = (await res.json()) as any;
      // Kiln's HTTP port is there; the wire port and the other service are not (a namespace of its own).
      expect(body.connects).toEqual({ [kilnPort]: "connected", [PG_PORT]: "ECONNREFUSED", [otherPort]: "ECONNREFUSED" });
      for (const u of [probe!.invoke_url, byLocalhost]) expect(body.fetches[u]).toEqual({ status: 200, body: '{"answer":42,"from":"probe"}' });
      // Any other loopback address goes to the egress proxy, which refuses it (403 to the CONNECT).
      expect(body.fetches[`http://127.0.0.2:${otherPort}/`].status).toBeUndefined();
      expect(body.fetches[`http://[::1]:${PG_PORT}/`].status).toBeUndefined();
      // Kiln's data dir and environment are invisible; the code and /etc are read-only; /tmp is its own; never root.
      expect(body.dataDir.err).toBe("ENOENT");
      expect(body.environ.ok).toBeUndefined();
      expect(body.writeCode.err).toBe("EROFS");
      expect(body.writeEtc.ok).toBeUndefined();
      expect(body.writeTmp).toEqual({ ok: "written" });
      expect(body.uid).not.toBe(0);
      expect(body.env.filter((n: string) => /^KILN|TOKEN|SECRET|DATABASE_URL|npm_/i.test(n))).toEqual([]);
    }, 60_000);

    it(`an app that allocates past its memory limit (${MEMORY_MB} MB) is stopped, says so in its logs, and the next request starts it again; Kiln keeps serving`, async () => {
      expect(probe).not.toBeNull();
      const before = (await (await siteFetch(probe!.site_url, "/")).json()) as { boot: string };
      // POST: a request with a body is not tried again on a new server.
      const alloc = await siteFetch(probe!.site_url, "/alloc", { method: "POST", body: "x" });
      expect(alloc.status).toBe(502);
      await alloc.arrayBuffer();
      const after = await siteFetch(probe!.site_url, "/");
      expect(after.status).toBe(200);
      expect(((await after.json()) as { boot: string }).boot).not.toBe(before.boot);
      const f = await k.api("GET", `/projects/${probe!.projectId}/frontends/${probe!.id}`);
      expect(f.body.status).toBe("active");
      await eventually(
        () => k.api("POST", `/projects/${probe!.projectId}/logs/search`, { body: { resource: { type: "frontend", ids: [probe!.id] }, q: '"out of memory"', limit: 50 } }),
        (r) => r.status === 200 && (r.body.data as Array<{ body: string }>).some((e) => String(e.body).includes(`out of memory (its limit is ${MEMORY_MB} MB)`)),
        30_000,
      );
      other.close();
    }, 120_000);
  });
});

/** Whether a TCP connection to 127.0.0.1:port succeeds from the test's own process. */
function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, "127.0.0.1");
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });
}
