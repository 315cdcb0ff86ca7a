import { existsSync } from "node:fs";
import type { ContainerEngine } from "./container";
import { LocalProcess } from "./local-process";
import { isMissing, resolveRuntime, type ResolvedRuntime } from "./runtimes";
import { chooseIsolation, noSandboxMessage, sandboxUser, unreachableByOthers, unsandboxedIsolation, type Isolation, type SandboxChoice } from "./isolation";
import { BOOTSTRAP_DIR } from "./mounts";
import { CgroupHost, DEFAULT_CPUS, describeLimits, NO_CGROUPS, withCgroup, type WorkerCgroup } from "./cgroups";
import { DEFAULT_MAX_PROCESSES, planLaunch } from "./sandbox";
import { FunctionError, Worker, type JournalEntry, type LogLine, type Outcome, type StepAck, type StepFrame } from "./worker";

export { FunctionError, type FailureKind, type JournalEntry, type LogLine, type Outcome, type StepAck, type StepFrame } from "./worker";

/**
 * Runs functions: warm worker processes per function version, reused one invocation at a time,
 * more of them under concurrent load (up to a cap, then a queue), stopped when idle. Each worker is
 * sandboxed (sandbox.ts) and speaks the line protocol described in worker.ts.
 */

export interface FunctionVersion {
  /** Unique per function version and region, e.g. "<functionId>:<deploymentId>:<region>". */
  key: string;
  functionName: string;
  region: string;
  /** e.g. "nodejs22.x"; see runtimes.ts. */
  runtime: string;
  /** Absolute; the function root, already extracted and built. Read-only for the worker. */
  codeDir: string;
  /** Relative file: index.js | index.mjs | main.py | main.rb. */
  entry: string;
  /** Exported name, default "handler". */
  handler: string;
  /** The only environment the code sees, besides PATH, HOME, TMPDIR and LANG. Never changed in place. */
  env: Record<string, string>;
  /**
   * Optional: differs exactly when `env` differs (e.g. a revision of the project's variables). When
   * given, the pool compares it instead of the whole env, so telling a new env costs the same for
   * ten variables or ten thousand.
   */
  envVersion?: string;
  /**
   * `cpus`: CPUs' worth of time a worker may use (cgroup cpu.max / CFS quota), default 1; not the
   * same as `cpuSeconds`, the CPU budget of one invocation.
   */
  limits: { memoryMb: number; timeoutMs: number; cpuSeconds?: number; maxProcesses?: number; cpus?: number };
  /** false: the function has no network at all (its own empty network namespace). */
  network: boolean;
}

export interface InvokeResult {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  /** The handler's time, from sending the event to receiving its answer (start-up excluded). */
  computeMs: number;
  /** Includes anything printed while the worker started, for the invocation that started it. */
  logs: LogLine[];
  coldStart: boolean;
  /** Start-up time (spawn to handler loaded), when coldStart. */
  initMs?: number;
  /** What the handler answered, before it became an HTTP response. */
  outcome: Outcome;
}

export interface WorkerPoolOptions {
  /** Default 4. */
  maxWorkersPerVersion?: number;
  /** Idle workers stop after this long; default 60 s. */
  idleMs?: number;
  /**
   * auto: the best sandbox that works here (bubblewrap, else Linux namespaces through util-linux);
   * or one named, which must work. "none": plain host processes, asked for explicitly.
   */
  sandbox?: SandboxChoice | "none";
  /** With auto: when no sandbox works, run unsandboxed rather than refuse every invocation (503). */
  allowUnsandboxed?: boolean;
  /** Run every worker as a container on this engine instead of a local process (isolation is then the engine's). */
  containers?: ContainerEngine;
  /** Never visible to a function (e.g. Kiln's data dir). Enforced only with bubblewrap. */
  hiddenPaths?: string[];
  /**
   * auto: per-worker memory, process and CPU limits through cgroups (v2, else v1) where writable
   * (root, or a delegated subtree); off: rlimits only. See cgroups.ts.
   */
  cgroups?: "auto" | "off";
  /**
   * How long a new worker may take to start and load the handler; default 10 s. A cold start is not the
   * invocation's time (as on Lambda, whose init phase has its own 10 s): the time limit starts when the
   * handler gets the event, so a slow container start on a busy machine does not turn into a 504.
   */
  initTimeoutMs?: number;
  log?: (msg: string) => void;
}

interface Lease {
  worker: Worker;
  cold: boolean;
  initMs?: number;
}

interface Waiter {
  deadline: number;
  timeoutMessage: string;
  /** The caller's own deadline, which also bounds a worker started for it. */
  callerDeadline: number;
  resolve: (l: Lease) => void;
  reject: (e: FunctionError) => void;
  timer: ReturnType<typeof setTimeout>;
}

interface Group {
  key: string;
  version: FunctionVersion;
  runtime: ResolvedRuntime;
  /** The environment workers get: the caller's, or the last updateEnv for this version. */
  env: Record<string, string>;
  /** The caller's envVersion (or its env as JSON) last time; a change means the caller updated it. */
  callerEnv: string;
  /** Everything else that shapes a worker; a change retires the current workers. */
  settings: string;
  generation: number;
  workers: Set<Worker>;
  leased: Set<Worker>;
  waiters: Waiter[];
  retired: boolean;
  drained: Array<() => void>;
}

const DEADLINE_PASSED = "the invocation's deadline passed";

export class WorkerPool {
  /** What isolates local workers: a sandbox kind, "container", or "unavailable" (every invocation a 503). */
  readonly isolation: Isolation["kind"] | "container" | "unavailable";
  private readonly containers: ContainerEngine | null;
  private readonly sandbox: Isolation | null;
  /** Why no sandbox is available, when none is. */
  readonly unavailable: string | null = null;
  private readonly cgroups: CgroupHost | null;
  private readonly cgroupsOff: boolean;
  private readonly max: number;
  private readonly idleMs: number;
  private readonly initTimeoutMs: number;
  private readonly hiddenPaths: string[];
  private readonly log: (msg: string) => void;
  private readonly groups = new Map<string, Group>();
  /** Retired groups still finishing their invocations. */
  private readonly draining = new Set<Group>();
  private readonly reported = new Set<string>();
  private readonly sweeper: ReturnType<typeof setInterval>;
  private closed = false;

  constructor(opts: WorkerPoolOptions = {}) {
    this.max = Math.max(1, opts.maxWorkersPerVersion ?? 4);
    this.idleMs = opts.idleMs ?? 60_000;
    this.initTimeoutMs = opts.initTimeoutMs ?? 10_000;
    this.hiddenPaths = opts.hiddenPaths ?? [];
    this.log = opts.log ?? ((m) => console.error(m));
    this.containers = opts.containers ?? null;
    const want = opts.sandbox ?? "auto";
    if (this.containers) {
      this.sandbox = null;
    } else {
      const chosen = want === "none" ? { isolation: unsandboxedIsolation(), problems: [] } : chooseIsolation({ want, allowUnsandboxed: !!opts.allowUnsandboxed });
      this.sandbox = chosen.isolation;
      if (want !== "auto" && !this.sandbox) throw new Error(`the ${want} sandbox was asked for, but ${chosen.problems.join("; ")}`);
      if (!this.sandbox) this.unavailable = noSandboxMessage(chosen.problems);
      else if (this.sandbox.kind === "none") this.log(`functions are NOT sandboxed: ${this.sandbox.description}`);
    }
    this.isolation = this.containers ? "container" : (this.sandbox?.kind ?? "unavailable");
    // A container's limits are the engine's own cgroups.
    this.cgroupsOff = opts.cgroups === "off";
    this.cgroups = this.containers || this.cgroupsOff || process.platform !== "linux" ? null : CgroupHost.detect(Math.random().toString(36).slice(2, 8));
    this.sweeper = setInterval(() => this.sweep(), Math.max(50, Math.min(10_000, this.idleMs / 2)));
    this.sweeper.unref?.();
  }

  /**
   * `durable`: a durable execution's segment, replaying `journal`, with each new step reported to
   * `onStep` and its lines handed to `onLogs` as they are printed (the result's `logs` hold the rest).
   */
  async invoke(
    v: FunctionVersion,
    event: unknown,
    ctx: { invocationId: string; deadlineMs?: number; durable?: { journal: JournalEntry[]; onStep: (f: StepFrame) => Promise<StepAck>; onLogs?: (lines: LogLine[]) => void } },
  ): Promise<InvokeResult> {
    if (this.closed) throw new FunctionError("crash", "the worker pool is closed");
    if (this.unavailable) throw new FunctionError("sandbox_unavailable", this.unavailable);
    const runtime = await resolveRuntime(v.runtime);
    if (isMissing(runtime)) throw new FunctionError("runtime_missing", `runtime ${v.runtime} is not available on this machine; install ${runtime.missing}`);
    // A runtime root's image is imported once (usually by the build already), before the clock starts.
    if (this.containers && runtime.root) {
      try {
        await this.containers.imageFor(runtime, (m) => this.report(m));
      } catch (e) {
        throw new FunctionError("runtime_missing", `runtime ${v.runtime}: importing its root filesystem into the container engine failed: ${(e as Error).message}`);
      }
    }
    // The clock starts after the runtime is at hand: a first-use install of Node is not the function's time.
    const callerDeadline = ctx.deadlineMs ?? Infinity;
    const limitMessage = `the function timed out after ${v.limits.timeoutMs} ms`;
    const g = this.groupFor(v, runtime);
    // Waiting for a busy worker is bounded by the time limit; a cold start by the init budget (startFor).
    const waitLimit = Date.now() + v.limits.timeoutMs;
    const lease = await this.acquire(g, Math.min(callerDeadline, waitLimit), callerDeadline < waitLimit ? DEADLINE_PASSED : limitMessage, callerDeadline);
    // The handler's time limit runs from here.
    const byLimit = Date.now() + v.limits.timeoutMs;
    const deadline = Math.min(callerDeadline, byLimit);
    const timeoutMessage = deadline < byLimit ? DEADLINE_PASSED : limitMessage;
    let out: Outcome;
    try {
      out = await lease.worker.run(
        {
          id: ctx.invocationId,
          event: event ?? null, // undefined would vanish from the JSON frame
          context: { functionName: v.functionName, invocationId: ctx.invocationId, region: v.region, deadlineMs: deadline },
          ...(ctx.durable ? { durable: { journal: ctx.durable.journal } } : {}),
        },
        { deadline, timeoutMessage, cpuSeconds: v.limits.cpuSeconds, onStep: ctx.durable?.onStep, onLogs: ctx.durable?.onLogs },
      );
    } finally {
      this.release(g, lease.worker);
    }
    return { ...toHttp(out), computeMs: out.computeMs, logs: out.logs, coldStart: lease.cold, ...(lease.cold ? { initMs: lease.initMs } : {}), outcome: out };
  }

  updateEnv(filter: (v: FunctionVersion) => boolean, env: Record<string, string>): void {
    for (const g of this.groups.values()) {
      if (!filter(g.version)) continue;
      g.env = { ...env };
      g.generation++;
      this.stopStale(g);
    }
  }

  /** Stops the workers of every version whose key starts with `keyPrefix`, except `keepPrefix`'s. */
  async retire(keyPrefix: string, keepPrefix?: string): Promise<void> {
    const done: Array<Promise<void>> = [];
    for (const [key, g] of this.groups) {
      if (!key.startsWith(keyPrefix) || (keepPrefix && key.startsWith(keepPrefix))) continue;
      this.groups.delete(key);
      g.retired = true;
      this.draining.add(g);
      done.push(new Promise<void>((r) => g.drained.push(r)));
      this.stopStale(g);
      this.checkDrained(g);
    }
    await Promise.all(done);
  }

  stats(): { workers: number; byVersion: Record<string, number> } {
    const byVersion: Record<string, number> = {};
    let workers = 0;
    for (const g of [...this.groups.values(), ...this.draining]) {
      const n = [...g.workers].filter((w) => w.state !== "exited").length;
      if (!n) continue;
      byVersion[g.key] = (byVersion[g.key] ?? 0) + n;
      workers += n;
    }
    return { workers, byVersion };
  }

  /** Stops everything now: running invocations fail with a "crash", queued ones too. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.sweeper);
    const all = [...this.groups.values(), ...this.draining];
    const gone: Array<Promise<void>> = [];
    for (const g of all) {
      for (const w of g.waiters.splice(0)) {
        clearTimeout(w.timer);
        w.reject(new FunctionError("crash", "the worker pool was closed"));
      }
      g.retired = true;
      if (g.workers.size) gone.push(new Promise<void>((r) => g.drained.push(r)));
      for (const w of g.workers) w.kill({ kind: "crash", message: "the worker pool was closed" });
    }
    await Promise.all(gone);
    this.groups.clear();
    this.draining.clear();
    // Workers remove their own cgroups on exit; give the last removals a moment before the pool's.
    await new Promise((r) => setTimeout(r, 50));
    this.cgroups?.dispose();
  }

  // -------------------------------------------------------------------------------------------

  private groupFor(v: FunctionVersion, runtime: ResolvedRuntime): Group {
    // The caller passes the same objects while nothing changed: nothing to compare then.
    const same = this.groups.get(v.key);
    if (same && same.version === v && same.runtime === runtime) return same;
    const settings = JSON.stringify([v.runtime, runtime.command, v.codeDir, v.entry, v.handler, v.limits, v.network, v.functionName, v.region]);
    const callerEnv = v.envVersion !== undefined ? `#${v.envVersion}` : JSON.stringify(v.env);
    let g = this.groups.get(v.key);
    if (!g) {
      g = { key: v.key, version: v, runtime, env: v.env, callerEnv, settings, generation: 0, workers: new Set(), leased: new Set(), waiters: [], retired: false, drained: [] };
      this.groups.set(v.key, g);
      return g;
    }
    g.version = v;
    g.runtime = runtime;
    let changed = false;
    if (settings !== g.settings) {
      g.settings = settings;
      changed = true;
    }
    // Whoever changed the environment last wins: an updateEnv, or a caller passing a new one.
    if (callerEnv !== g.callerEnv) {
      g.callerEnv = callerEnv;
      g.env = v.env;
      changed = true;
    }
    if (changed) {
      g.generation++;
      this.stopStale(g);
    }
    return g;
  }

  private current(g: Group): Worker[] {
    return [...g.workers].filter((w) => w.generation === g.generation && w.state !== "exited");
  }

  private acquire(g: Group, deadline: number, timeoutMessage: string, callerDeadline: number): Promise<Lease> {
    const idle = this.current(g).find((w) => w.state === "idle" && !g.leased.has(w));
    if (idle) {
      g.leased.add(idle);
      return Promise.resolve({ worker: idle, cold: false });
    }
    if (this.current(g).length < this.max) return this.startFor(g, callerDeadline);
    return new Promise<Lease>((resolve, reject) => {
      const waiter: Waiter = {
        deadline,
        timeoutMessage,
        callerDeadline,
        resolve,
        reject,
        timer: setTimeout(() => {
          g.waiters.splice(g.waiters.indexOf(waiter), 1);
          reject(new FunctionError("timeout", `${timeoutMessage} while waiting for a free worker (${this.max} busy)`));
        }, Math.max(0, deadline - Date.now())),
      };
      g.waiters.push(waiter);
    });
  }

  /** A new worker, leased to the caller once its handler is loaded. */
  private async startFor(g: Group, callerDeadline: number): Promise<Lease> {
    const started = performance.now();
    const byInit = Date.now() + this.initTimeoutMs;
    const deadline = Math.min(callerDeadline, byInit);
    const w = this.spawn(g, deadline, deadline < byInit ? DEADLINE_PASSED : `the function did not start within ${this.initTimeoutMs} ms (loading its code took too long)`);
    g.leased.add(w);
    try {
      await w.ready;
    } catch (e) {
      g.leased.delete(w);
      throw e;
    }
    return { worker: w, cold: true, initMs: performance.now() - started };
  }

  private spawn(g: Group, deadline: number, timeoutMessage: string): Worker {
    const v = g.version;
    if (!existsSync(v.codeDir)) throw new FunctionError("init_error", `the function's code folder ${v.codeDir} does not exist`);
    const onExit = (w: Worker, leftover: LogLine[], reason: string) => this.onExit(g, w, leftover, reason);
    const spec = { runtime: g.runtime, codeDir: v.codeDir, entry: v.entry, handler: v.handler || "handler", env: g.env, limits: v.limits, network: v.network };
    if (this.containers) return this.track(g, new Worker({ process: this.containers.launch(spec, { "dev.kiln.function": v.functionName, "dev.kiln.version": v.key }), onExit }, deadline, timeoutMessage));
    let cg: WorkerCgroup | null = null;
    if (this.cgroups) {
      try {
        cg = this.cgroups.create({ memoryMb: v.limits.memoryMb, maxProcesses: v.limits.maxProcesses ?? DEFAULT_MAX_PROCESSES, cpus: v.limits.cpus ?? DEFAULT_CPUS });
      } catch (e) {
        this.report(`cgroup: could not create a worker cgroup (${(e as Error).message}); using rlimits`);
      }
    }
    if (this.sandbox!.kind === "none" && sandboxUser()) {
      const blocked = unreachableByOthers([g.runtime.command, BOOTSTRAP_DIR, v.codeDir]);
      if (blocked) {
        cg?.killAll();
        void cg?.remove();
        throw new FunctionError("init_error", `${blocked} is not reachable by the sandbox uid ${sandboxUser()!.uid} that runs unsandboxed functions of a root Kiln; move the data dir or KILN_CACHE_DIR to a folder others can enter, or use a sandbox`);
      }
    }
    const plan = planLaunch(spec, { isolation: this.sandbox!, hiddenPaths: this.hiddenPaths, cgroupMemory: !!cg?.memory, cgroupPids: !!cg?.pids });
    // What enforces each limit (the same phrases as kiln doctor), once per distinct answer.
    const why = this.cgroupsOff ? { memory: "cgroups off", pids: "cgroups off", cpu: "cgroups off" } : undefined;
    this.report(`function limits: ${describeLimits(cg?.by ?? NO_CGROUPS, { sandboxed: this.sandbox!.kind !== "none", why }).join(", ")}`);
    if (this.sandbox!.kind === "none" && this.hiddenPaths.length) this.report("hidden paths are not enforced without a sandbox");
    const proc = new LocalProcess(withCgroup(plan.argv, cg), plan.env, plan.cwd, cg, plan.uid === undefined ? undefined : { uid: plan.uid, gid: plan.gid! });
    return this.track(g, new Worker({ process: proc, onExit }, deadline, timeoutMessage));
  }

  private track(g: Group, w: Worker): Worker {
    w.generation = g.generation;
    g.workers.add(w);
    return w;
  }

  private release(g: Group, w: Worker): void {
    g.leased.delete(w);
    if (w.state !== "idle") return; // gone; onExit takes it from here
    if (w.generation !== g.generation) return w.stop();
    const next = g.waiters.shift();
    if (next) {
      clearTimeout(next.timer);
      g.leased.add(w);
      next.resolve({ worker: w, cold: false });
      return;
    }
    if (g.retired) w.stop();
  }

  private onExit(g: Group, w: Worker, leftover: LogLine[], reason: string): void {
    g.workers.delete(w);
    g.leased.delete(w);
    if (leftover.length) {
      this.log(`function ${g.version.functionName} (${g.key}): worker ${w.id} ended (${reason}); its last output:\n${leftover.map((l) => `  ${l.level} ${l.message}`).join("\n")}`);
    }
    // A slot freed up: the first queued invocation gets a new worker.
    if (!this.closed && g.waiters.length && this.current(g).length < this.max) {
      const waiter = g.waiters.shift()!;
      clearTimeout(waiter.timer);
      this.startFor(g, waiter.callerDeadline).then(waiter.resolve, waiter.reject);
    }
    this.checkDrained(g);
  }

  private checkDrained(g: Group): void {
    if (!g.retired || g.workers.size) return;
    this.draining.delete(g);
    for (const r of g.drained.splice(0)) r();
  }

  /** Stops the workers that must not serve again and are not serving now. */
  private stopStale(g: Group): void {
    for (const w of g.workers) {
      if (g.leased.has(w)) continue;
      if (w.generation !== g.generation || (g.retired && !g.waiters.length)) w.stop();
    }
  }

  private sweep(): void {
    const now = Date.now();
    for (const g of this.groups.values()) {
      for (const w of g.workers) if (w.state === "idle" && !g.leased.has(w) && now - w.lastUsed > this.idleMs) w.stop();
    }
  }

  private report(msg: string): void {
    if (this.reported.has(msg)) return;
    this.reported.add(msg);
    this.log(msg);
  }
}

// ---------------------------------------------------------------------------------------------

const JSON_TYPE = "application/json";
const enc = new TextEncoder();

/**
 * `{statusCode, headers?, body?, isBase64Encoded?}` is an HTTP response; any other value is the
 * JSON body of a 200. A thrown error is a 500 `{error, type}`.
 */
export function toHttp(out: Outcome): { status: number; headers: Record<string, string>; body: Uint8Array } {
  if (!out.ok) return { status: 500, headers: { "content-type": JSON_TYPE }, body: enc.encode(JSON.stringify({ error: out.error, type: out.type })) };
  const v = out.value;
  if (v && typeof v === "object" && !Array.isArray(v) && "statusCode" in v) {
    const r = v as { statusCode: unknown; headers?: unknown; body?: unknown; isBase64Encoded?: unknown };
    const status = Number(r.statusCode);
    if (!Number.isInteger(status) || status < 100 || status > 599) {
      return { status: 502, headers: { "content-type": JSON_TYPE }, body: enc.encode(JSON.stringify({ error: `the function returned an invalid statusCode: ${JSON.stringify(r.statusCode)}`, type: "InvalidResponse" })) };
    }
    const headers: Record<string, string> = {};
    if (r.headers && typeof r.headers === "object") {
      for (const [k, val] of Object.entries(r.headers as Record<string, unknown>)) if (val !== null && val !== undefined) headers[k.toLowerCase()] = String(val);
    }
    let body: Uint8Array;
    if (r.body === undefined || r.body === null) body = new Uint8Array();
    else if (typeof r.body === "string") body = r.isBase64Encoded ? new Uint8Array(Buffer.from(r.body, "base64")) : enc.encode(r.body);
    else body = enc.encode(JSON.stringify(r.body));
    // As Lambda function URLs do: a body without a declared type is JSON.
    if (body.length && !headers["content-type"]) headers["content-type"] = JSON_TYPE;
    return { status, headers, body };
  }
  return { status: 200, headers: { "content-type": JSON_TYPE }, body: enc.encode(JSON.stringify(v ?? null)) };
}
