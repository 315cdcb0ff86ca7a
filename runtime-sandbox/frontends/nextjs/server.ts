import { chownSync, mkdirSync, readFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { dirname, join, posix } from "node:path";
import { CgroupHost, withCgroup, type WorkerCgroup } from "../../cgroups";
import type { ContainerEngine } from "../../container";
import { chooseIsolation, hostTool, noSandboxMessage, sandboxUser, type Isolation } from "../../isolation";
import { SANDBOX_UID, sandboxMounts, TASK_ROOT, type Mount } from "../../mounts";
import { isMissing, resolveRuntime, type ResolvedRuntime } from "../../runtimes";
import { sandboxEnv } from "../../sandbox";
import type { FrontendServeInput, FrontendServer } from "../types";
import { SERVER_MANIFEST, type ServerManifest } from "./build";
import { openServerNetwork, type KilnAddress, type ServerNetwork } from "./server-network";
import { spawnLocal, startContainer, type ServerProcess } from "./server-process";

/**
 * A Next.js deployment's server: the standalone `server.js` on Node.js (never in Kiln's process,
 * never under Bun), as a warm sandboxed process like a function worker. Started by the first
 * request, stopped after `idleMs` without one, started again by the next request after it died.
 * Kiln proxies each request to it over loopback HTTP, streaming both ways.
 *
 * The sandbox is the function workers' (bubblewrap or namespaces; read-only system, runtime and
 * code at /var/task; private /tmp; never root; seccomp; Kiln's data dir invisible) plus a network
 * namespace of its own whose only doors are unix sockets (server-network.ts): Kiln's requests in,
 * Kiln's HTTP port out (a server component calls a Kiln function by its `invoke_url`), and the
 * egress proxy for the internet; never the host's loopback services. Memory, processes and CPU
 * are capped by a cgroup of its own like a function worker's (RLIMIT_DATA where no memory cgroup
 * is writable). Its environment is the sandbox minimum, the deployment's runtime variables (no
 * `NEXT_PUBLIC_*`), PORT and HOSTNAME, and the proxy variables.
 *
 * Only an explicitly unsandboxed Kiln (`allowUnsandboxed`, isolation "none") runs it on the host's
 * network, listening on a loopback port Kiln picks.
 */

export interface NextjsServerContext {
  hiddenPaths: string[];
  sandbox: { want: "auto" | "bubblewrap" | "namespaces"; allowUnsandboxed: boolean };
  /** Kiln's HTTP listener and public URL, once it listens: the one host address the server reaches. */
  kiln?: () => KilnAddress | null;
  /** `--function-runtime docker`: the engine the server runs on as a container (connected on first use). */
  containers?: (() => Promise<ContainerEngine>) | null;
  /** The idle stop's timer (the platform clock in Kiln); setTimeout when absent. */
  after?: (ms: number, run: () => void, label: string) => { cancel(): void };
}

const IDLE_MS = Number(process.env.KILN_FRONTEND_IDLE_MS) || 10 * 60_000;
const START_TIMEOUT_MS = Number(process.env.KILN_FRONTEND_START_TIMEOUT_MS) || 30_000;

/** The limits of one Next.js server (KILN_FRONTEND_MEMORY_MB, KILN_FRONTEND_CPUS, KILN_FRONTEND_MAX_PROCESSES). */
export function frontendLimits(env: Record<string, string | undefined> = process.env): { memoryMb: number; cpus: number; maxProcesses: number } {
  return {
    memoryMb: Number(env.KILN_FRONTEND_MEMORY_MB) || 1024,
    cpus: Number(env.KILN_FRONTEND_CPUS) || 1,
    maxProcesses: Number(env.KILN_FRONTEND_MAX_PROCESSES) || 256,
  };
}

// One cgroup folder for every Next.js server of this Kiln (a sub-folder per process), made on first use.
let cgroups: CgroupHost | null | undefined;
/** Kiln stops: the cgroup folder goes (every server has exited). */
export function disposeFrontendCgroups(): void {
  cgroups?.dispose();
  cgroups = undefined;
}

function frontendCgroups(): CgroupHost | null {
  if (cgroups === undefined) {
    try {
      cgroups = CgroupHost.detect("frontends");
    } catch {
      cgroups = null;
    }
  }
  return cgroups;
}

// Headers that describe one connection, not the request (RFC 9110 §7.6.1).
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "proxy-authorization"];

interface Running {
  proc: ServerProcess;
  /** Where requests go: a loopback port (unsandboxed) or the inbound relay's unix socket. */
  target: { port: number } | { socket: string };
  exited: Promise<void>;
}

export class NextjsServer implements FrontendServer {
  private running: Running | null = null;
  private starting: Promise<Running> | null = null;
  private stopped = false;
  private idleTimer: { cancel(): void } | null = null;
  private inFlight = 0;
  /** Processes Kiln itself is stopping (idle, stop): their end is not logged as a failure. */
  private readonly killing = new WeakSet<ServerProcess>();
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
        // A refused or cut connection is what a dying server looks like before its sandbox has
        // exited (an OOM kill inside, bubblewrap still reaping): give the exit a moment to show.
        if (!this.stopped && r.proc.alive()) await Promise.race([r.proc.exit, new Promise((w) => setTimeout(w, 2000))]);
        if (!this.stopped && r.proc.alive()) return text(502, `the Next.js server did not answer: ${(e as Error).message}`);
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

  /**
   * A WebSocket's way in: the server started if it is not running, and the URL of the upstream
   * socket (`ws+unix://<relay socket>:<path>` when sandboxed, which Bun's WebSocket client opens;
   * `ws://127.0.0.1:<port>` unsandboxed). Busy (no idle stop) until `release`.
   */
  async tunnel(): Promise<{ websocketUrl: (pathAndQuery: string) => string; release: () => void }> {
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
      const { target } = await this.ensureRunning();
      const websocketUrl = (pathAndQuery: string) => ("socket" in target ? `ws+unix://${target.socket}:${pathAndQuery}` : `ws://127.0.0.1:${target.port}${pathAndQuery}`);
      return { websocketUrl, release };
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
    const to = "socket" in r.target ? { url: `http://127.0.0.1${url.pathname}${url.search}`, unix: r.target.socket } : { url: `http://127.0.0.1:${r.target.port}${url.pathname}${url.search}` };
    const upstream = await fetch(to.url, {
      ...("unix" in to ? { unix: to.unix } : {}),
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
    if (this.running && this.running.proc.alive()) return Promise.resolve(this.running);
    this.starting ??= this.start().finally(() => {
      this.starting = null;
    });
    return this.starting;
  }

  private async start(): Promise<Running> {
    const engine = this.ctx.containers ? await this.ctx.containers() : null;
    const { isolation, problems } = engine ? { isolation: null, problems: [] } : chooseIsolation(this.ctx.sandbox);
    if (!engine && !isolation) throw new Error(noSandboxMessage(problems));
    const result = this.input.result;
    const major = result.nodeVersion ?? "22";
    const runtime = await resolveRuntime(`nodejs${major}.x`);
    if (isMissing(runtime)) throw new Error(`Node.js ${major} is not available: ${runtime.missing}`);
    const serverDir = join(this.input.deploymentDir, result.serverDir ?? "server");
    const manifest = JSON.parse(readFileSync(join(serverDir, SERVER_MANIFEST), "utf8")) as ServerManifest;
    const limits = frontendLimits();
    const sandboxed = !!engine || isolation!.kind !== "none";
    // Sandboxed: a network namespace of its own behind the relay; unsandboxed (opt-in): a host loopback port.
    const net: ServerNetwork | null = sandboxed
      ? await openServerNetwork(this.ctx.kiln?.() ?? null, (m) => this.input.log("warn", m), engine ? { uid: Number(SANDBOX_UID) } : undefined)
      : null;
    const port = net ? 0 : await freePort();
    let proc: ServerProcess;
    try {
      const env = sandboxEnv({
        runtime,
        env: { ...(result.runtimeEnv ?? {}), NODE_ENV: "production", NEXT_TELEMETRY_DISABLED: "1", ...(net ? net.env : { PORT: String(port), HOSTNAME: "127.0.0.1" }) },
      });
      const cache = nextCacheDir(this.input.deploymentDir, serverDir, manifest.entry, engine ? { uid: Number(SANDBOX_UID), gid: Number(SANDBOX_UID) } : sandboxUser());
      this.starts++;
      if (engine) {
        // The same filesystem plan, relay and limits, enforced by the engine (memory without swap, CPUs, pids).
        const extra: Mount[] = [{ kind: "bind", src: cache.host, dest: posix.join(TASK_ROOT, cache.inside), writable: true }, ...net!.mounts];
        const mounts = sandboxMounts({ runtime: { mounts: [dirname(runtime.command)] }, codeDir: serverDir, network: false }, this.ctx.hiddenPaths, { extra });
        const inside = posix.join(TASK_ROOT, manifest.entry);
        proc = await startContainer(engine, {
          cmd: [...nodeArgv(runtime.command, limits.memoryMb, net), inside],
          env,
          mounts,
          workingDir: posix.dirname(inside),
          memoryMb: limits.memoryMb,
          cpus: limits.cpus,
          maxProcesses: limits.maxProcesses,
          labels: { "dev.kiln.frontend": this.input.deploymentDir.split("/").slice(-2).join("/") },
        });
      } else {
        const host = frontendCgroups();
        const cg = host ? host.create({ memoryMb: limits.memoryMb, maxProcesses: limits.maxProcesses, cpus: limits.cpus }) : null;
        try {
          proc = spawnLocal(launchArgv(isolation!, runtime, serverDir, manifest.entry, this.ctx.hiddenPaths, cache, net, limits.memoryMb, cg), env, cg);
        } catch (e) {
          cg?.killAll();
          await cg?.remove().catch(() => {});
          throw e;
        }
      }
    } catch (e) {
      await net?.close().catch(() => {});
      throw e;
    }
    const exited = proc.closed.then(() => net?.close().catch(() => {}));
    pipeLines(proc.stdout, (l) => this.input.log("info", l));
    pipeLines(proc.stderr, (l) => this.input.log("error", l));
    void proc.exit.then(({ code, signal, oomKilled }) => {
      if (this.running?.proc === proc) this.running = null;
      if (this.stopped || this.killing.has(proc)) return;
      if (oomKilled) this.input.log("error", `the Next.js server was stopped: out of memory (its limit is ${limits.memoryMb} MB); the next request starts it again`);
      // 137: a container's main process ended by SIGKILL.
      else if (signal === "SIGKILL" || code === 137) this.input.log("error", "the Next.js server was killed; the next request starts it again");
      else if (code !== 0) this.input.log("error", `the Next.js server exited (${signal ?? `code ${code}`}); the next request starts it again`);
    });
    const r: Running = { proc, target: net ? { socket: net.appSocket } : { port }, exited };
    try {
      await waitForServer(r.target, proc, START_TIMEOUT_MS);
    } catch (e) {
      this.killing.add(proc);
      proc.kill();
      await exited;
      throw e;
    }
    if (this.stopped) {
      this.killing.add(proc);
      proc.kill();
      await exited;
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
    this.killing.add(r.proc);
    r.proc.kill();
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
function nextCacheDir(deploymentDir: string, serverDir: string, entry: string, owner: { uid: number; gid: number } | null): { host: string; inside: string } {
  const host = join(deploymentDir, "next-cache");
  mkdirSync(host, { recursive: true });
  mkdirSync(join(serverDir, posix.dirname(entry), ".next", "cache"), { recursive: true });
  if (owner && process.getuid?.() === 0) chownSync(host, owner.uid, owner.gid);
  return { host, inside: posix.join(posix.dirname(entry), ".next", "cache") };
}

/**
 * The sandboxed command line: the server folder read-only at /var/task, the relay preloaded and the
 * network namespace of its own (server-network.ts), node server.js; inside the server's cgroup, or
 * with RLIMIT_DATA where there is no memory cgroup. Unsandboxed (opt-in): host network, no relay.
 */
function launchArgv(
  isolation: Isolation,
  runtime: ResolvedRuntime,
  serverDir: string,
  entry: string,
  hiddenPaths: string[],
  cache: { host: string; inside: string },
  net: ServerNetwork | null,
  memoryMb: number,
  cg: WorkerCgroup | null,
): { argv: string[]; cwd: string; uid?: number; gid?: number } {
  const node = runtime.command;
  const nodeArgs = nodeArgv(node, memoryMb, net);
  const rlimits = dataLimit(runtime, memoryMb, cg, isolation.kind !== "none");
  if (isolation.kind === "none" || !net) {
    const run = isolation.enclose({ mounts: [], network: true, tmpfsBytes: 0, hostname: "", chdir: serverDir }, [...rlimits, ...nodeArgs, join(serverDir, entry)]);
    return { argv: withCgroup(run.argv, cg), cwd: dirname(join(serverDir, entry)), uid: run.uid, gid: run.gid };
  }
  const extra: Mount[] = [{ kind: "bind", src: cache.host, dest: posix.join(TASK_ROOT, cache.inside), writable: true }, ...net.mounts];
  // The network /etc files (hosts: localhost; resolv.conf) though the namespace is private: names resolve as on the host.
  const mounts = sandboxMounts({ runtime: { mounts: [dirname(node)] }, codeDir: serverDir, network: true }, hiddenPaths, { extra });
  const inside = posix.join(TASK_ROOT, entry);
  const run = isolation.enclose({ mounts, network: false, tmpfsBytes: 256 * 1024 * 1024, hostname: "kiln-frontend", chdir: posix.dirname(inside) }, [...rlimits, ...nodeArgs, inside]);
  return { argv: withCgroup(run.argv, cg), cwd: "/", uid: run.uid, gid: run.gid };
}

/** node and its flags, before the entry: the heap cap, and with the relay its preload. */
function nodeArgv(node: string, memoryMb: number, net: ServerNetwork | null): string[] {
  // V8 fails cleanly ("heap out of memory") before the cgroup's OOM killer would strike.
  return [node, `--max-old-space-size=${Math.max(64, Math.floor(memoryMb * 0.75))}`, ...(net ? ["--disable-warning=UNDICI-EHPA", ...net.nodeArgs] : [])];
}

// Node 24's V8 reserves a 512 MB code range at start-up, which RLIMIT_DATA counts (sandbox.ts planLaunch).
const NODE24_CODE_RANGE_MB = 512;

/** prlimit's RLIMIT_DATA (and no core files) when no memory cgroup caps the server. */
function dataLimit(runtime: ResolvedRuntime, memoryMb: number, cg: WorkerCgroup | null, sandboxed: boolean): string[] {
  const pl = hostTool("prlimit");
  if (!pl) return [];
  const out = [pl, "--core=0"];
  if (!cg?.memory) {
    const codeRange = Number(runtime.version.split(".")[0]) >= 24 ? NODE24_CODE_RANGE_MB : 0;
    out.push(`--data=${(Math.max(96, memoryMb) + codeRange) * 1024 * 1024}`);
  }
  // Inside bwrap's user namespace RLIMIT_NPROC counts only the sandbox's own processes.
  if (!cg?.pids && sandboxed && process.getuid?.() !== 0) out.push(`--nproc=${frontendLimits().maxProcesses}`);
  return [...out, "--"];
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

/** Resolves once the server accepts a connection; rejects when the process exits first or time runs out. */
async function waitForServer(target: Running["target"], proc: ServerProcess, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  let exitedWith: string | null = null;
  void proc.exit.then(({ code, signal }) => (exitedWith = signal ?? `code ${code}`));
  for (;;) {
    if (exitedWith) throw new Error(`the server exited before it listened (${exitedWith})`);
    if (await canConnect(target)) return;
    if (Date.now() > end) throw new Error(`the server did not listen within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function canConnect(target: Running["target"]): Promise<boolean> {
  return new Promise((resolve) => {
    const s = "socket" in target ? connect(target.socket) : connect({ port: target.port, host: "127.0.0.1" });
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
