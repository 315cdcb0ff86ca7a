// The Next.js framework of the frontends area (runtime-sandbox/frontends/nextjs*): the fixture app
// (test/fixtures/frontends/nextjs-app) built once in the build sandbox from the frontend npm cache
// that the test set-up fills (`npm-cache.ts prepare` in the pretest), with npm's registry set to an
// address nothing listens on, so a download would fail the build; then served by its standalone
// server on Node.js in the sandbox, behind the proxy.
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import { createNextjsFramework } from "../../runtime-sandbox/frontends/nextjs";
import { chooseNode } from "../../runtime-sandbox/frontends/nextjs/node-version";
import { NextjsServer as NextjsServerClass, type NextjsServer } from "../../runtime-sandbox/frontends/nextjs/server";
import { FrontendBuildError, type FrontendBuildResult, type FrontendFramework } from "../../runtime-sandbox/frontends/types";

const FIXTURE = join(import.meta.dirname, "../fixtures/frontends/nextjs-app");
const GREETING = `public-greeting-${Math.random().toString(36).slice(2, 10)}`;
const SECRET = `server-secret-${Math.random().toString(36).slice(2, 10)}`;

const work = mkdtempSync(join(tmpdir(), "kiln-nextjs-test-"));
const hidden = join(work, "data-dir");
mkdirSync(hidden);
// The backend stands in for Kiln's HTTP port: the one host port a sandboxed server reaches.
const framework: FrontendFramework = createNextjsFramework({
  hiddenPaths: [hidden],
  sandbox: { want: "auto", allowUnsandboxed: false },
  warn: () => {},
  kiln: () => ({ host: "127.0.0.1", port: backend.port!, publicUrl: `http://127.0.0.1:${backend.port}` }),
});

function copyApp(to: string): string {
  cpSync(FIXTURE, to, { recursive: true, filter: (src) => !/\/(node_modules|\.next)(\/|$)/.test(src.slice(FIXTURE.length)) });
  return to;
}

// The function a server component calls: stands in for a Kiln function's invoke URL.
const backend = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  async fetch(req) {
    const body = (await req.json()) as { from?: string };
    return Response.json({ answer: 42, from: body.from ?? null });
  },
});

const logs: Array<[string, string]> = [];
let result: FrontendBuildResult;
const outDir = join(work, "out");

beforeAll(async () => {
  // Any registry access fails: the build must come from the prepared cache.
  vi.stubEnv("npm_config_registry", "http://127.0.0.1:9/");
  mkdirSync(outDir);
  const sourceDir = copyApp(join(work, "src"));
  result = await framework.build({
    sourceDir,
    appRoot: "",
    outDir,
    env: { NEXT_PUBLIC_GREETING: GREETING, SERVER_SECRET: SECRET, BACKEND_URL: `http://127.0.0.1:${backend.port}/invoke`, NODE_OPTIONS: "--inspect", npm_config_registry: "http://evil.example/" },
    log: async (level, line) => void logs.push([level, line]),
    signal: new AbortController().signal,
  });
}, 900_000);

afterAll(async () => {
  vi.unstubAllEnvs();
  await framework.close();
  await backend.stop(true);
  rmSync(work, { recursive: true, force: true });
}, 120_000);

describe("build", () => {
  test("installs offline from the cache (npm ci with the lockfile) and builds on Node 22 by default", () => {
    const text = logs.map(([, l]) => l).join("\n");
    expect(text).toMatch(/Node\.js 22\.\d+\.\d+ \(package\.json has no engines\.node/);
    expect(text).toContain("npm ci --prefer-offline");
    expect(text).toMatch(/Next\.js 16\.\d+\.\d+/);
    expect(result.kind).toBe("nextjs");
    expect(result.nodeVersion).toBe("22");
    expect(result.immutablePrefixes).toEqual(["/_next/static/"]);
  });

  test("reserved names are dropped with a warning line each; NEXT_PUBLIC_* stays out of the runtime's variables", () => {
    const warns = logs.filter(([level]) => level === "warn").map(([, l]) => l);
    expect(warns.some((l) => l.includes("NODE_OPTIONS") && l.includes("reserved"))).toBe(true);
    expect(warns.some((l) => l.includes("npm_config_registry") && l.includes("reserved"))).toBe(true);
    expect(result.warnings).toHaveLength(2);
    expect(result.runtimeEnv).toEqual({ SERVER_SECRET: SECRET, BACKEND_URL: `http://127.0.0.1:${backend.port}/invoke` });
  });

  test("the NEXT_PUBLIC_ value is inlined into a client chunk; public/ and _next/static are in the static dir", () => {
    const chunks = join(outDir, result.staticDir, "_next/static/chunks");
    const files = readdirSync(chunks, { recursive: true }).map(String).filter((f) => f.endsWith(".js"));
    expect(files.some((f) => readFileSync(join(chunks, f), "utf8").includes(GREETING))).toBe(true);
    expect(readFileSync(join(outDir, result.staticDir, "hello.txt"), "utf8")).toBe("static file from public/\n");
    expect(existsSync(join(outDir, result.serverDir!, "kiln-nextjs.json"))).toBe(true);
  });
});

describe("server", () => {
  let server: NextjsServer;
  const serverLogs: string[] = [];
  beforeAll(() => {
    server = framework.serve({ deploymentDir: outDir, result, log: (_l, line) => void serverLogs.push(line) }) as NextjsServer;
  });

  test("started by the first request: the page is server-rendered with the server component's fetched data", async () => {
    expect(server.pid).toBeNull();
    const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/"));
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/html");
    const html = await res.text();
    expect(html).toContain("Hello from Next.js on Kiln");
    expect(html).toContain(`backend said: <!-- -->200 {&quot;answer&quot;:42,&quot;from&quot;:&quot;nextjs&quot;}`);
    // The server's environment has no NEXT_PUBLIC_* (listed at run time), though the client part has the value.
    expect(html).toContain("NEXT_PUBLIC_ names in the server environment: <!-- -->(none)");
    expect(html).toContain(`<p id="greeting">${GREETING}</p>`);
    expect(html).not.toContain(SECRET);
    expect(server.pid).not.toBeNull();
    expect(server.starts).toBe(1);
  });

  test("the API route answers JSON with the runtime variables, without NEXT_PUBLIC_*", async () => {
    const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/api/hello?x=1"));
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, unknown>;
    expect(body).toMatchObject({ hello: "world", path: "/api/hello", runtime_variable: SECRET, public_in_server_env: [] });
    // Next.js's cache folder is writable (optimized images, fetch cache); its code is not.
    expect(body).toMatchObject({ cache_writable: true, code_writable: false });
    expect(String(body.node)).toMatch(/^v22\./);
    expect(server.starts).toBe(1);
  });

  test("runs sandboxed on Node, not in Kiln's process", async () => {
    const pid = server.pid!;
    expect(pid).not.toBe(process.pid);
    const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    expect(cmd[0]).toMatch(/bwrap|unshare|chrt|setpriv/);
    expect(cmd.some((a) => a.endsWith("/node"))).toBe(true);
    expect(cmd.some((a) => a.includes(hidden))).toBe(false);
  });

  test("a server that died is started again by the next request", async () => {
    const pid = server.pid!;
    process.kill(-pid, "SIGKILL");
    await new Promise((r) => setTimeout(r, 100));
    const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/api/hello"));
    expect(res.status).toBe(200);
    expect(server.starts).toBe(2);
    expect(server.pid).not.toBe(pid);
  });

  test("an idle server is stopped; the next request starts it again", async () => {
    const idle = new NextjsServerClass({ hiddenPaths: [hidden], sandbox: { want: "auto", allowUnsandboxed: false } }, { deploymentDir: outDir, result, log: () => {} }, { idleMs: 300 });
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

  test("stop ends the process and refuses further requests", async () => {
    const pid = server.pid!;
    await server.stop();
    expect(() => process.kill(pid, 0)).toThrow();
    const res = await server.fetch(new Request("http://web--demo.app.localhost:7070/"));
    expect(res.status).toBe(503);
  });
});

describe("Node.js version", () => {
  test("engines.node chooses 24 when it excludes 22; a range excluding both is a clear error", async () => {
    const c24 = await chooseNode(">=24");
    expect("error" in c24 ? c24.error : c24.major).toBe("24");
    const c22 = await chooseNode("^22 || ^24");
    expect("error" in c22 ? c22.error : c22.major).toBe("22");
    const bad = await chooseNode(">=26");
    expect("error" in bad && bad.error).toContain('engines.node ">=26" allows neither Node.js 22.x nor 24.x');
  });

  test("a Next.js whose engines.node refuses the chosen Node fails the build with a clear error", async () => {
    const src = join(work, "engines-src");
    mkdirSync(join(src, "fake-next"), { recursive: true });
    writeFileSync(join(src, "package.json"), JSON.stringify({ name: "engines-app", version: "1.0.0", engines: { node: "22.x" }, dependencies: { next: "file:./fake-next" } }));
    writeFileSync(join(src, "fake-next", "package.json"), JSON.stringify({ name: "next", version: "16.0.0", engines: { node: ">=99.0.0" } }));
    const out = join(work, "engines-out");
    mkdirSync(out);
    const lines: string[] = [];
    const err = await framework
      .build({ sourceDir: src, appRoot: "", outDir: out, env: {}, log: async (_l, line) => void lines.push(line), signal: new AbortController().signal })
      .then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(FrontendBuildError);
    expect((err as Error).message).toMatch(/^Next\.js 16\.0\.0 requires Node\.js ">=99\.0\.0" \(its package\.json engines\.node\), but this app builds and runs on Node\.js 22\.\d+\.\d+/);
    expect(lines.join("\n")).toContain("npm install --prefer-offline");
  }, 120_000);
});
