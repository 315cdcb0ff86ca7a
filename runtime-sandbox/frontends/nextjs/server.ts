import { spawn, type ChildProcess } from "node:child_process";
import { chownSync, mkdirSync, readFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { dirname, join, posix } from "node:path";
import { chooseIsolation, noSandboxMessage, sandboxUser, type Isolation } from "../../isolation";
import { sandboxMounts, TASK_ROOT } from "../../mounts";
import { isMissing, resolveRuntime } from "../../runtimes";
import { sandboxEnv } from "../../sandbox";
import type { FrontendServeInput, FrontendServer } from "../types";
import { SERVER_MANIFEST, type ServerManifest } from "./build";

/**
 * A Next.js deployment's server: the standalone `server.js` on Node.js (never in Kiln's process,
 * never under Bun), as a warm sandboxed process like a function worker. Started by the first
 * request, stopped after `idleMs` without one, started again by the next request after it died.
 * Kiln proxies each request to it over loopback HTTP, streaming both ways.
 *
 * The sandbox is the function workers' (bubblewrap or namespaces; read-only system, runtime and
 * code at /var/task; private /tmp; never root; seccomp; Kiln's data dir invisible) with one
 * difference: the host's network, because a web server is reached over TCP and its server
 * components call APIs (a Kiln function's URL, a database, a third party). It listens on a
 * loopback port Kiln picks; its environment is the sandbox minimum, the deployment's runtime
 * variables (no `NEXT_PUBLIC_*`), PORT and HOSTNAME.
 */

export interface NextjsServerContext {
  hiddenPaths: string[];
  sandbox: { want: "auto" | "bubblewrap" | "namespaces"; allowUnsandboxed: boolean };
  /** The idle stop's timer (the platform clock in Kiln); setTimeout when absent. */
  after?: (ms: number, run: () => void, label: string) => { cancel(): void };
}

const IDLE_MS = Number(process.env.KILN_FRONTEND_IDLE_MS) || 10 * 60_000;
const START_TIMEOUT_MS = Number(process.env.KILN_FRONTEND_START_TIMEOUT_MS) || 30_000;
const MEMORY_MB = Number(process.env.KILN_FRONTEND_MEMORY_MB) || 1024;

// Headers that describe one connection, not the request (RFC 9110 §7.6.1).
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "proxy-authorization"];

interface Running {
  proc: ChildProcess;
  port: number;
  exited: Promise<void>;
}

export class NextjsServer implements FrontendServer {
  private running: Running | null = null;
  private starting: Promise<Running> | null = null;
  private stopped = false;
  private idleTimer: { cancel(): void } | null = null;
  private inFlight = 0;
  /** How many times the process was started (a restart after a death counts). */
  starts = 0;

  constructor(
    private readonly ctx: NextjsServerContext,
    private readonly input: FrontendServeInput,
    private readonly o: { idleMs?: number; onStop?: (s: NextjsServer) => void } = {},
  ) {}

  /** The server process's pid on the host (the sandbox's outermost process), for tests and diagnostics. */
  get pid(): number | null {
    return this.running?.proc.pid ?? null;
  }

  async fetch(request: Request): Promise<Response> {
    if (this.stopped) return text(503, "this deployment is no longer served");
    this.inFlight++;
    this.clearIdle();
    try {
      let r: Running;
      try {
        r = await this.ensureRunning();
      } catch (e) {
        return text(503, `the Next.js server could not start: ${(e as Error).message}`);
      }
      try {
        return await this.forward(r, request);
      } catch (e) {
        // The process died under the request: a bodiless request is tried once more on a new one.
        if (!this.stopped && r.proc.exitCode === null && r.proc.signalCode === null) return text(502, `the Next.js server did not answer: ${(e as Error).message}`);
        if (request.method !== "GET" && request.method !== "HEAD") return text(502, "the Next.js server exited while answering");
        try {
          return await this.forward(await this.ensureRunning(), request);
        } catch (e2) {
          return text(502, `the Next.js server did not answer: ${(e2 as Error).message}`);
        }
      }
    } finally {
      this.inFlight--;
      this.armIdle();
    }
  }

  async tunnel(): Promise<{ port: number; release: () => void }> {
    if (this.stopped) throw new Error("this deployment is no longer served");
    this.inFlight++;
    this.clearIdle();
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.inFlight--;
      this.armIdle();
    };
    try {
      const r = await this.ensureRunning();
      return { port: r.port, release };
    } catch (e) {
      release();
      throw e;
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.clearIdle();
    await this.stopProcess();
    this.o.onStop?.(this);
  }

  private async forward(r: Running, request: Request): Promise<Response> {
    const url = new URL(request.url);
    const headers = new Headers(request.headers);
    for (const h of HOP_BY_HOP) headers.delete(h);
    if (!headers.has("x-forwarded-host") && headers.get("host")) headers.set("x-forwarded-host", headers.get("host")!);
    if (!headers.has("x-forwarded-proto")) headers.set("x-forwarded-proto", url.protocol.replace(":", ""));
    const hasBody = request.method !== "GET" && request.method !== "HEAD" && request.body !== null;
    const upstream = await fetch(`http://127.0.0.1:${r.port}${url.pathname}${url.search}`, {
      method: request.method,
      headers,
      body: hasBody ? request.body : undefined,
      redirect: "manual",
      // Bun: the body as Next.js encoded it (gzip), with its content-encoding header intact.
      decompress: false,
      ...(hasBody ? { duplex: "half" } : {}),
    } as RequestInit);
    const out = new Headers(upstream.headers);
    for (const h of HOP_BY_HOP) out.delete(h);
    // The process stays busy until the body is through, so streaming responses are not cut by the idle stop.
    this.inFlight++;
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.inFlight--;
      this.armIdle();
    };
    if (!upstream.body) {
      release();
      return new Response(null, { status: upstream.status, statusText: upstream.statusText, headers: out });
    }
    const reader = upstream.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (done) {
            release();
            controller.close();
          } else controller.enqueue(value);
        } catch (e) {
          release();
          controller.error(e);
        }
      },
      cancel(reason) {
        release();
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: upstream.status, statusText: upstream.statusText, headers: out });
  }

  private ensureRunning(): Promise<Running> {
    if (this.running && this.running.proc.exitCode === null && this.running.proc.signalCode === null) return Promise.resolve(this.running);
    this.starting ??= this.start().finally(() => {
      this.starting = null;
    });
    return this.starting;
  }

  private async start(): Promise<Running> {
    const { isolation, problems } = chooseIsolation(this.ctx.sandbox);
    if (!isolation) throw new Error(noSandboxMessage(problems));
    const result = this.input.result;
    const major = result.nodeVersion ?? "22";
    const runtime = await resolveRuntime(`nodejs${major}.x`);
    if (isMissing(runtime)) throw new Error(`Node.js ${major} is not available: ${runtime.missing}`);
    const serverDir = join(this.input.deploymentDir, result.serverDir ?? "server");
    const manifest = JSON.parse(readFileSync(join(serverDir, SERVER_MANIFEST), "utf8")) as ServerManifest;
    const port = await freePort();
    const env = sandboxEnv({
      runtime,
      env: { ...(result.runtimeEnv ?? {}), NODE_ENV: "production", PORT: String(port), HOSTNAME: "127.0.0.1", NEXT_TELEMETRY_DISABLED: "1" },
    });
    const cache = nextCacheDir(this.input.deploymentDir, serverDir, manifest.entry);
    const argv = launchArgv(isolation, runtime.command, serverDir, manifest.entry, this.ctx.hiddenPaths, cache);
    this.starts++;
    const proc = spawn(argv.argv[0]!, argv.argv.slice(1), { env, cwd: argv.cwd, stdio: ["ignore", "pipe", "pipe"], detached: true, ...(argv.uid === undefined ? {} : { uid: argv.uid, gid: argv.gid }) });
    const exited = new Promise<void>((resolve) => proc.once("close", () => resolve()));
    pipeLines(proc.stdout!, (l) => this.input.log("info", l));
    pipeLines(proc.stderr!, (l) => this.input.log("error", l));
    proc.once("exit", (code, signal) => {
      if (this.running?.proc === proc) this.running = null;
      if (!this.stopped && code !== 0 && signal !== "SIGKILL") this.input.log("error", `the Next.js server exited (${signal ?? `code ${code}`}); the next request starts it again`);
    });
    const r: Running = { proc, port, exited };
    try {
      await waitForPort(port, proc, START_TIMEOUT_MS);
    } catch (e) {
      killGroup(proc);
      await exited;
      throw e;
    }
    if (this.stopped) {
      killGroup(proc);
      throw new Error("the deployment stopped serving");
    }
    this.running = r;
    return r;
  }

  private async stopProcess(): Promise<void> {
    const starting = this.starting;
    if (starting) await starting.catch(() => {});
    const r = this.running;
    this.running = null;
    if (!r) return;
    killGroup(r.proc);
    await r.exited;
  }

  private clearIdle(): void {
    this.idleTimer?.cancel();
    this.idleTimer = null;
  }

  private armIdle(): void {
    this.clearIdle();
    if (this.stopped || this.inFlight > 0 || !this.running) return;
    const run = () => {
      this.idleTimer = null;
      if (this.inFlight === 0) void this.stopProcess();
    };
    const ms = this.o.idleMs ?? IDLE_MS;
    if (this.ctx.after) this.idleTimer = this.ctx.after(ms, run, "frontend server idle stop");
    else {
      const t = setTimeout(run, ms);
      t.unref?.();
      this.idleTimer = { cancel: () => clearTimeout(t) };
    }
  }
}

/**
 * The one folder the server writes: Next.js's cache (`.next/cache` beside server.js: optimized
 * images, fetch cache), a folder of the deployment's own shown there writable; the code stays
 * read-only. The mount point is made in the server folder first (a read-only bind cannot get one).
 * A root Kiln hands the folder to the sandbox uid.
 */
function nextCacheDir(deploymentDir: string, serverDir: string, entry: string): { host: string; inside: string } {
  const host = join(deploymentDir, "next-cache");
  mkdirSync(host, { recursive: true });
  mkdirSync(join(serverDir, posix.dirname(entry), ".next", "cache"), { recursive: true });
  const user = sandboxUser();
  if (user) chownSync(host, user.uid, user.gid);
  return { host, inside: posix.join(posix.dirname(entry), ".next", "cache") };
}

/** The sandboxed command line: the server folder read-only at /var/task, host network, node server.js. */
function launchArgv(isolation: Isolation, node: string, serverDir: string, entry: string, hiddenPaths: string[], cache: { host: string; inside: string }): { argv: string[]; cwd: string; uid?: number; gid?: number } {
  const nodeArgs = [node, `--max-old-space-size=${Math.floor(MEMORY_MB * 0.75)}`];
  if (isolation.kind === "none") {
    const run = isolation.enclose({ mounts: [], network: true, tmpfsBytes: 0, hostname: "", chdir: serverDir }, [...nodeArgs, join(serverDir, entry)]);
    return { argv: run.argv, cwd: dirname(join(serverDir, entry)), uid: run.uid, gid: run.gid };
  }
  const mounts = sandboxMounts({ runtime: { mounts: [dirname(node)] }, codeDir: serverDir, network: true }, hiddenPaths, {
    extra: [{ kind: "bind", src: cache.host, dest: posix.join(TASK_ROOT, cache.inside), writable: true }],
  });
  const inside = posix.join(TASK_ROOT, entry);
  const run = isolation.enclose({ mounts, network: true, tmpfsBytes: 256 * 1024 * 1024, hostname: "kiln-frontend", chdir: posix.dirname(inside) }, [...nodeArgs, inside]);
  return { argv: run.argv, cwd: "/", uid: run.uid, gid: run.gid };
}

function killGroup(proc: ChildProcess): void {
  try {
    if (proc.pid) process.kill(-proc.pid, "SIGKILL");
  } catch {
    // already gone
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Resolves once the port accepts a connection; rejects when the process exits first or time runs out. */
async function waitForPort(port: number, proc: ChildProcess, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  let exitedWith: string | null = null;
  proc.once("exit", (code, signal) => (exitedWith = signal ?? `code ${code}`));
  for (;;) {
    if (exitedWith) throw new Error(`the server exited before it listened (${exitedWith})`);
    if (await canConnect(port)) return;
    if (Date.now() > end) throw new Error(`the server did not listen within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ port, host: "127.0.0.1" });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

function pipeLines(stream: NodeJS.ReadableStream, out: (line: string) => void): void {
  let rest = "";
  stream.on("data", (chunk: Buffer) => {
    const parts = (rest + chunk.toString("utf8")).split(/\r?\n/);
    rest = parts.pop() ?? "";
    for (const l of parts) if (l.trim()) out(l.slice(0, 4000));
  });
  stream.on("end", () => {
    if (rest.trim()) out(rest.slice(0, 4000));
  });
}

function text(status: number, message: string): Response {
  return new Response(JSON.stringify({ error: message }), { status, headers: { "content-type": "application/json" } });
}
