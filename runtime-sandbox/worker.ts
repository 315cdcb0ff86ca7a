import { readFileSync } from "node:fs";
import { availableParallelism, constants } from "node:os";
import type { Duplex, Readable } from "node:stream";

/**
 * One worker and its protocol. The bootstrap inside talks on a channel (fd 3, a socketpair, for a
 * local process; a unix socket for a container), one JSON object per line; fds 1 and 2 carry only what escapes the bootstrap's capture (subprocesses,
 * native writes, the runtime's own fatal messages) and become log lines too.
 *
 *   pool → worker  {"t":"invoke","id","event","context":{functionName,invocationId,region,deadlineMs}}
 *   worker → pool  {"t":"ready"} | {"t":"init_error","error","type"}            once, at start
 *                  {"t":"log","l":"info"|"warn"|"error","m","ts"}               any time
 *                  {"t":"result","id","value"} | {"t":"error","id","error","type"}  one per invoke
 *                  {"t":"fatal","kind":"out_of_memory","error"}                 then it exits
 *
 * Durable executions (an invoke frame with `durable: {journal}`) add one exchange: each step the
 * handler reaches that the journal does not settle is reported, and the handler waits for Kiln's
 * answer, given once the step is written down:
 *   worker → pool  {"t":"step","id","seq","name","op":"run","status":"completed","output","ms"}
 *                  {"t":"step","id","seq","name","op":"run","status":"failed","error":{message,type},"ms"}
 *                  {"t":"step","id","seq","name","op":"sleep","duration"|"until"}
 *                  {"t":"step","id","seq","name","op":"mismatch","error"}   the replay diverged
 *   pool → worker  {"t":"step_ack","id","seq","action":"continue","output"?}
 *                  {"t":"step_ack","id","seq","action":"throw","error":{message,type}}
 *                  {"t":"step_ack","id","seq","action":"suspend"}   end the invocation now
 * After a suspend the bootstrap answers {"t":"result","id","value":null} at once and sends
 * nothing more for that invocation (its handler is abandoned).
 */

export type LogLevel = "info" | "warn" | "error";
export interface LogLine {
  level: LogLevel;
  message: string;
  /** When it was printed: epoch ms on the machine's clock. */
  at: number;
}

export type FailureKind = "timeout" | "crash" | "out_of_memory" | "runtime_missing" | "init_error" | "sandbox_unavailable";

export class FunctionError extends Error {
  constructor(
    readonly kind: FailureKind,
    message: string,
    readonly logs: LogLine[] = [],
  ) {
    super(message);
    this.name = "FunctionError";
  }
}

export type Outcome =
  | { ok: true; value: unknown; logs: LogLine[]; computeMs: number }
  | { ok: false; error: string; type: string; logs: LogLine[]; computeMs: number };

export interface InvokeFrame {
  id: string;
  event: unknown;
  context: { functionName: string; invocationId: string; region: string; deadlineMs: number };
  /** A durable execution's segment: the journal the handler replays against. */
  durable?: { journal: JournalEntry[] };
}

/** A settled step as the bootstrap replays it (by position: `seq` is the order of the handler's step calls). */
export interface JournalEntry {
  seq: number;
  name: string;
  op: "run" | "sleep";
  status: "completed" | "failed";
  output?: unknown;
  error?: { message: string; type: string };
}

export type StepFrame =
  | { seq: number; name: string; op: "run"; status: "completed"; output: unknown; ms: number }
  | { seq: number; name: string; op: "run"; status: "failed"; error: { message: string; type: string }; ms: number; retries?: number }
  | { seq: number; name: string; op: "sleep"; duration?: unknown; until?: unknown }
  | { seq: number; name: string; op: "mismatch"; error: string };

export type StepAck = { action: "continue"; output?: unknown } | { action: "throw"; error: { message: string; type: string } } | { action: "suspend" };

export interface ExitStatus {
  code: number | null;
  signal: string | null;
  /** The process could not be started at all. */
  error?: string;
  /** Killed by the kernel's OOM killer (cgroup or container). */
  oomKilled: boolean;
}

/** What runs a worker: a local process (local-process.ts) or a container (container.ts). */
export interface WorkerProcess {
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** The protocol channel; a container's bootstrap connects once it has started. */
  readonly channel: Promise<Duplex>;
  /** Once, when the process is gone. */
  onExit(l: (s: ExitStatus) => void): void;
  /** Once, when stdout and stderr are drained. */
  onClose(l: () => void): void;
  /** Kills it and everything it started, now. */
  kill(): void;
  /**
   * After an invocation: kills whatever the function started and left running, leaving the worker
   * itself warm. Returns how many processes it killed, or "replace" when the worker must not serve
   * again (what it left cannot be cleared from here).
   */
  killStrays(): number | "replace";
  /**
   * Resolves once what the last killStrays() killed has exited (gone, or a zombie its parent has yet
   * to reap), or after `timeoutMs`: a SIGKILLed process still runs its exit for a moment, more on a
   * loaded machine, and the answer waits for that. Absent: nothing to wait for.
   */
  straysGone?(timeoutMs: number): Promise<void>;
  /** After the end: gives back what it held (cgroup folders, the container). */
  cleanup(): void;
  /** The interpreter's pid on this host, for CPU accounting; null when unknown. */
  runtimePid(): number | null;
}

export interface WorkerSpawn {
  process: WorkerProcess;
  /** Called once the process is gone, with anything it logged while not serving an invocation. */
  onExit: (w: Worker, leftover: LogLine[], reason: string) => void;
}

// Per invocation: a function that prints in a loop until its timeout must not fill Kiln's memory.
const MAX_LOG_LINES = 10_000;
const MAX_LOG_BYTES = 1 << 20;
const MAX_LINE_BYTES = 64 << 10;
// A response bigger than this is a runaway, not an answer.
const MAX_FRAME_BYTES = 64 << 20;
// What runtimes print when their own heap cap is hit (the kernel's OOM killer prints nothing).
const RUNTIME_OOM = /JavaScript heap out of memory|Reached heap limit|process out of memory|NoMemoryError|failed to allocate memory/;

interface Failure {
  kind: FailureKind;
  message: string;
}

let seq = 0;

export class Worker {
  readonly id = ++seq;
  state: "starting" | "idle" | "busy" | "exited" = "starting";
  lastUsed = Date.now();
  /** Bumped by the pool when the version's env or settings change; stale workers are not reused. */
  generation = 0;
  private readonly proc: WorkerProcess;
  private channel: Duplex | null = null;
  private inbox: string[] = [];
  private inboxBytes = 0;
  private logs: LogLine[] = [];
  /** Lines and bytes of the current invocation, handed over or not (the per-invocation caps count both). */
  private logCount = 0;
  private logBytes = 0;
  private dropped = 0;
  /** A hand-over of lines to the invocation's `onLogs` is scheduled. */
  private handOver = false;
  private readonly raw = { out: "", err: "" };
  private pending: {
    id: string;
    started: number;
    resolve: (o: Outcome) => void;
    reject: (e: FunctionError) => void;
    timers: Array<ReturnType<typeof setTimeout>>;
    deadline: number;
    timeoutMessage: string;
    onStep?: (f: StepFrame) => Promise<StepAck>;
    onLogs?: (lines: LogLine[]) => void;
    steps: Promise<void>;
  } | null = null;
  private starting: { resolve: () => void; reject: (e: FunctionError) => void; timer: ReturnType<typeof setTimeout> } | null = null;
  private killReason: Failure | null = null;
  private fatal: Failure | null = null;
  private initError: Failure | null = null;
  private runtimeOom = false;
  private exited = false;
  private finished = false;
  readonly ready: Promise<void>;

  constructor(private readonly s: WorkerSpawn, startDeadline: number, timeoutMessage: string) {
    this.ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => this.kill({ kind: "timeout", message: timeoutMessage }), Math.max(0, startDeadline - Date.now()));
      this.starting = { resolve, reject, timer };
    });
    // The pool always awaits `ready`; this only keeps an unobserved rejection from being reported.
    this.ready.catch(() => {});
    this.proc = s.process;
    this.proc.channel.then(
      (channel) => {
        if (this.finished) return void channel.destroy();
        this.channel = channel;
        channel.setEncoding("utf8");
        channel.on("data", (d: string) => this.onChannel(d));
        channel.on("error", () => {}); // EPIPE after a crash: the exit handler reports it
        channel.resume(); // a container's channel arrives paused (its hello was read off it)
      },
      () => {}, // no channel: the process ends, and the exit handler reports why
    );
    this.proc.stdout.setEncoding("utf8").on("data", (d: string) => this.onRaw("out", d));
    this.proc.stderr.setEncoding("utf8").on("data", (d: string) => this.onRaw("err", d));
    this.proc.onExit((status) => {
      this.exited = true;
      this.exitStatus = status;
      if (status.error) {
        this.push("error", `could not start the worker: ${status.error}`);
        return this.finish();
      }
      // Output still in the pipes arrives before 'close'; a grandchild holding them open must not stall us.
      setTimeout(() => this.finish(), 250).unref?.();
    });
    this.proc.onClose(() => this.finish());
  }

  private exitStatus: ExitStatus = { code: null, signal: null, oomKilled: false };

  /**
   * Runs one invocation; resolves with the handler's outcome, rejects with a FunctionError.
   * `onLogs`: lines are handed over as they arrive (a turn of the event loop's worth at a time)
   * instead of with the outcome, which then carries only the rest: a durable segment runs for as
   * long as its handler does, and its lines must not wait in memory for its end.
   */
  run(
    frame: InvokeFrame,
    o: { deadline: number; timeoutMessage: string; cpuSeconds?: number; onStep?: (f: StepFrame) => Promise<StepAck>; onLogs?: (lines: LogLine[]) => void },
  ): Promise<Outcome> {
    if (this.state !== "idle") return Promise.reject(new FunctionError("crash", "worker not available"));
    this.state = "busy";
    return new Promise<Outcome>((resolve, reject) => {
      const timers = [setTimeout(() => this.kill({ kind: "timeout", message: o.timeoutMessage }), Math.max(0, o.deadline - Date.now()))];
      this.pending = {
        id: frame.id,
        started: performance.now(),
        resolve,
        reject,
        timers,
        deadline: o.deadline,
        timeoutMessage: o.timeoutMessage,
        onStep: o.onStep,
        onLogs: o.onLogs,
        steps: Promise.resolve(),
      };
      // What the worker printed while it started goes first.
      if (o.onLogs && this.logs.length) this.scheduleHandOver();
      if (o.cpuSeconds) this.watchCpu(o.cpuSeconds);
      this.channel!.write(JSON.stringify({ t: "invoke", ...frame }) + "\n");
    });
  }

  kill(reason: Failure = { kind: "crash", message: "the worker was stopped" }): void {
    if (this.finished) return;
    this.killReason ??= reason;
    this.proc.kill();
  }

  /** Stops an idle worker without treating it as a failure. */
  stop(): void {
    this.kill({ kind: "crash", message: "stopped" });
  }

  // -------------------------------------------------------------------------------------------

  private onChannel(d: string): void {
    // Only each new chunk is searched for line ends: a response of megabytes arrives in many chunks.
    let start = 0;
    let nl: number;
    while ((nl = d.indexOf("\n", start)) >= 0) {
      const line = this.inbox.length ? this.inbox.join("") + d.slice(start, nl) : d.slice(start, nl);
      this.inbox = [];
      this.inboxBytes = 0;
      start = nl + 1;
      if (!line) continue;
      let f: Record<string, unknown>;
      try {
        f = JSON.parse(line) as Record<string, unknown>;
      } catch {
        // Only the function itself writing to fd 3 gets here; its worker is not trusted any more.
        this.kill({ kind: "crash", message: "the worker broke the runtime protocol" });
        return;
      }
      this.onFrame(f);
    }
    if (start < d.length) {
      this.inbox.push(start ? d.slice(start) : d);
      this.inboxBytes += d.length - start;
      if (this.inboxBytes > MAX_FRAME_BYTES) {
        this.inbox = [];
        this.inboxBytes = 0;
        this.kill({ kind: "crash", message: `the function's response exceeded ${MAX_FRAME_BYTES >> 20} MB` });
      }
    }
  }

  private onFrame(f: Record<string, unknown>): void {
    switch (f.t) {
      case "log":
        this.push(f.l === "warn" || f.l === "error" ? f.l : "info", String(f.m ?? ""), typeof f.ts === "number" ? f.ts : Date.now());
        return;
      case "ready":
        if (this.starting) {
          clearTimeout(this.starting.timer);
          this.state = "idle";
          this.starting.resolve();
          this.starting = null;
        }
        return;
      case "init_error":
        this.initError = { kind: "init_error", message: `${String(f.type ?? "Error")}: ${String(f.error ?? "")}` };
        this.kill(this.initError);
        return;
      case "fatal":
        this.fatal = { kind: f.kind === "out_of_memory" ? "out_of_memory" : "crash", message: String(f.error ?? "the function failed") };
        return;
      case "step": {
        const p = this.pending;
        if (!p || f.id !== p.id || this.killReason) return;
        // Only a durable segment's handler has a step API; a frame from any other is a broken worker.
        if (!p.onStep) return this.kill({ kind: "crash", message: "the worker broke the runtime protocol" });
        const onStep = p.onStep;
        // One at a time, in the order sent: parallel steps are written down in the order they finished.
        p.steps = p.steps.then(async () => {
          const ack = await onStep(f as unknown as StepFrame).catch((): StepAck => ({ action: "suspend" }));
          if (this.pending === p && !this.killReason) this.channel?.write(JSON.stringify({ t: "step_ack", id: p.id, seq: f.seq, ...ack }) + "\n");
        });
        return;
      }
      case "result":
      case "error": {
        const p = this.pending;
        // Once killed (timeout, CPU budget) or past the deadline the answer no longer counts: a
        // container's kill is an engine call, and a timer can fire late on a busy machine, so the
        // handler may still answer before the kill lands. The exit settles it.
        if (!p || f.id !== p.id || this.killReason) return;
        if (Date.now() > p.deadline) return this.kill({ kind: "timeout", message: p.timeoutMessage });
        const computeMs = performance.now() - p.started;
        // Nothing the function started runs past its answer: not outside its time limit and CPU
        // budget, and not holding the worker's process limit for the next invocation.
        const strays = this.proc.killStrays();
        // Output a subprocess wrote before the handler returned is already in the stdout/stderr
        // pipes, but this turn of the event loop may have read fd 3 first: read the rest, then settle
        // (once what was killed has exited: nothing of it runs when the answer goes out).
        const gone = typeof strays === "number" && strays > 0 && this.proc.straysGone ? this.proc.straysGone(1000) : Promise.resolve();
        void gone.then(() => setImmediate(() => {
          if (this.pending !== p || this.killReason) return; // the worker died meanwhile: finish() rejects it
          this.pending = null;
          for (const t of p.timers) clearTimeout(t);
          this.lastUsed = Date.now();
          if (strays) this.push("warn", strays === "replace" ? "the function left processes running; its worker is replaced" : `killed ${strays} process${strays === 1 ? "" : "es"} the function left running after it returned`);
          this.state = "idle";
          const logs = this.takeLogs();
          if (f.t === "result") p.resolve({ ok: true, value: f.value, logs, computeMs });
          else p.resolve({ ok: false, error: String(f.error ?? ""), type: String(f.type ?? "Error"), logs, computeMs });
          // Not reused: out of the pool's choice at once (it drops exited workers), ended after this answer.
          if (strays === "replace") {
            this.state = "exited";
            this.kill({ kind: "crash", message: "stopped: the function left processes running" });
          }
        }));
        return;
      }
    }
  }

  private onRaw(stream: "out" | "err", d: string): void {
    this.raw[stream] += d;
    let nl: number;
    while ((nl = this.raw[stream].indexOf("\n")) >= 0) {
      this.rawLine(stream, this.raw[stream].slice(0, nl));
      this.raw[stream] = this.raw[stream].slice(nl + 1);
    }
    if (this.raw[stream].length > MAX_LINE_BYTES) {
      this.rawLine(stream, this.raw[stream]);
      this.raw[stream] = "";
    }
  }

  private rawLine(stream: "out" | "err", line: string): void {
    if (stream === "err" && RUNTIME_OOM.test(line)) this.runtimeOom = true;
    this.push(stream === "err" ? "error" : "info", line);
  }

  private push(level: LogLevel, message: string, ts = Date.now()): void {
    if (this.logCount >= MAX_LOG_LINES || this.logBytes + message.length > MAX_LOG_BYTES) {
      this.dropped++;
      return;
    }
    if (message.length > MAX_LINE_BYTES) message = `${message.slice(0, MAX_LINE_BYTES)}… (truncated)`;
    this.logCount++;
    this.logBytes += message.length;
    this.logs.push({ level, message, at: ts });
    if (this.pending?.onLogs) this.scheduleHandOver();
  }

  /** Lines that arrive in one turn of the event loop (a chunk of output) are handed over together. */
  private scheduleHandOver(): void {
    if (this.handOver) return;
    this.handOver = true;
    setImmediate(() => {
      this.handOver = false;
      const sink = this.pending?.onLogs;
      // Settled meanwhile: the lines go with the outcome (or the exit's leftovers) instead.
      if (!sink || !this.logs.length) return;
      const lines = this.logs;
      this.logs = [];
      sink(lines);
    });
  }

  private takeLogs(): LogLine[] {
    const logs = this.logs;
    if (this.dropped) logs.push({ level: "warn", message: `${this.dropped} more log lines were dropped (limit ${MAX_LOG_LINES} lines / ${MAX_LOG_BYTES >> 20} MB per invocation)`, at: Date.now() });
    this.logs = [];
    this.logCount = 0;
    this.logBytes = 0;
    this.dropped = 0;
    return logs;
  }

  private finish(): void {
    if (this.finished || !this.exited) return;
    this.finished = true;
    this.state = "exited";
    for (const s of ["out", "err"] as const) if (this.raw[s]) this.rawLine(s, this.raw[s]);
    // Whatever the function left running in its process group, cgroup or container goes with it.
    this.proc.kill();
    const failure = this.classify();
    if (this.starting) {
      clearTimeout(this.starting.timer);
      const kind = failure.kind === "crash" ? "init_error" : failure.kind;
      const message = kind === "init_error" && failure.kind === "crash" ? `the function failed to start: ${failure.message}` : failure.message;
      this.starting.reject(new FunctionError(kind, message, this.takeLogs()));
      this.starting = null;
    }
    if (this.pending) {
      for (const t of this.pending.timers) clearTimeout(t);
      this.pending.reject(new FunctionError(failure.kind, failure.message, this.takeLogs()));
      this.pending = null;
    }
    this.s.onExit(this, this.takeLogs(), failure.message);
    this.channel?.destroy();
    this.proc.cleanup();
  }

  private classify(): Failure {
    if (this.initError) return this.initError;
    const oom = this.fatal?.kind === "out_of_memory" || this.runtimeOom || this.exitStatus.oomKilled;
    if (this.killReason && this.killReason.kind !== "crash") return this.killReason;
    if (oom) return { kind: "out_of_memory", message: "the function ran out of memory" };
    if (this.killReason) return this.killReason;
    if (this.fatal) return this.fatal;
    if (this.exitStatus.error) return { kind: "crash", message: `could not start the worker: ${this.exitStatus.error}` };
    const { code, signal } = this.exitStatus;
    // bubblewrap reports a signal death of the sandboxed process as 128 + the signal number.
    const sig = signal ?? (code !== null && code > 128 ? signalName(code - 128) : null);
    return { kind: "crash", message: sig ? `the function's process was killed by ${sig}` : `the function's process exited with code ${code ?? "?"}` };
  }

  // -------------------------------------------------------------------------------------------
  // CPU time: RLIMIT_CPU counts a process's whole life, and a warm worker lives through many
  // invocations, so the budget is checked per invocation from /proc instead.

  // Nothing is read for an invocation that ends within the first LAZY_MS (a warm call pays one timer,
  // no /proc read): the baseline is taken then, so up to LAZY_MS × cores of CPU (40 ms on 2 cores)
  // goes uncounted, which only makes a budget of seconds that much later, never earlier.
  private watchCpu(seconds: number): void {
    const p = this.pending;
    if (!p) return;
    const budget = seconds * 1000;
    const begin = () => {
      const pid = this.proc.runtimePid();
      if (this.pending !== p || !pid) return;
      const start = cpuMs(pid);
      if (start === null) return;
      const check = () => {
        if (this.pending !== p) return;
        const used = (cpuMs(pid) ?? start) - start;
        if (used > budget) return this.kill({ kind: "timeout", message: `CPU time limit of ${seconds} s exceeded` });
        // CPU time cannot grow faster than wall time times the cores; look again no earlier than that.
        p.timers.push(setTimeout(check, Math.max(20, Math.min(1000, (budget - used) / CPU_COUNT))));
      };
      p.timers.push(setTimeout(check, Math.max(20, Math.min(1000, budget / CPU_COUNT))));
    };
    p.timers.push(setTimeout(begin, LAZY_MS));
  }
}

const LAZY_MS = 20;

const CPU_COUNT = Math.max(1, availableParallelism());
const CLOCK_TICKS = 100; // USER_HZ, 100 on every Linux ABI

function cpuMs(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // fields 14-17 (utime stime cutime cstime), counted from the state field at index 0 = field 3
    const ticks = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
    return (ticks * 1000) / CLOCK_TICKS;
  } catch {
    return null;
  }
}

function signalName(n: number): string | null {
  for (const [name, num] of Object.entries(constants.signals)) if (num === n) return name;
  return null;
}
