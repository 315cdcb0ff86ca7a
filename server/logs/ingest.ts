import type { Clock } from "../clock";
import { newIdWithPrefix } from "../ids";
import { FlushLoop } from "../store/flush-loop";
import { levelOf, normalizeLevel } from "./levels";
import type { LogStore, StoredLine } from "../backends/logs/log-store";
import type { TailHub } from "./tail";

/** A line as a worker reports it (runtime-sandbox/worker.ts `LogLine`). */
export interface RawLine {
  level: string;
  message: string;
  /** Epoch ms, on the machine's clock. */
  at: number;
}

/** The function whose invocation printed the lines. */
export interface FunctionRef {
  id: string;
  name: string;
  project_id: string;
}

export interface BuildRef extends FunctionRef {
  deploymentId: string;
  /** A frontend's build (resource.type=frontend); a function's when absent. */
  resourceType?: "function" | "frontend";
}

/** Longest body kept, in characters (the worker already cuts lines at its own limit). */
export const MAX_BODY_CHARS = 16_000;
/** Lines waiting for the store at most; beyond, new lines are dropped (and counted) rather than memory grown. */
export const MAX_PENDING_LINES = 200_000;
/** Lines per COPY: the embedded store's thread takes one batch at a time. */
const BATCH = 2_000;
/**
 * Batches handed to the store before the first of them is written: the store's thread takes the next
 * one as soon as it is done with one, instead of idling while Kiln's busy main thread gets round to
 * preparing it (measured: that wait was a quarter of the thread's time under load).
 */
const IN_FLIGHT = 2;

let sequence = 0;

/**
 * A line's id: its time (9 base-36 characters of epoch ms), a sequence number of this process
 * (4), then random characters. Opaque to clients; it breaks ties between lines of the same
 * millisecond in the order they were printed, which the (timestamp, id) order of search keeps.
 */
export function lineId(atMs: number): string {
  sequence = (sequence + 1) % 1_679_616;
  return newIdWithPrefix(Math.max(0, Math.floor(atMs)).toString(36).padStart(9, "0").slice(-9) + sequence.toString(36).padStart(4, "0"));
}

function storableBody(s: string): string {
  const t = s.length > MAX_BODY_CHARS ? s.slice(0, MAX_BODY_CHARS) : s;
  const w = t.isWellFormed() ? t : t.toWellFormed();
  return w.includes("\0") ? w.replaceAll("\0", "\uFFFD") : w;
}

/**
 * A line that is a JSON object with a level or a message (`{"level":"error","message":"..."}`,
 * pino, structlog, bunyan) is structured: its body is the object and its level the object's.
 * Anything else is text at the level of the stream it came on (stdout info, stderr error).
 */
export function classify(message: string, streamLevel: string): { level: string; structured: boolean } {
  const m = message.trim();
  if (m.length >= 2 && m[0] === "{" && m[m.length - 1] === "}") {
    try {
      const o = JSON.parse(m) as unknown;
      if (o && typeof o === "object" && !Array.isArray(o)) {
        const r = o as Record<string, unknown>;
        const level = levelOf(r);
        if (level !== null || typeof r.message === "string" || typeof r.msg === "string") return { level: level ?? normalizeLevel(streamLevel), structured: true };
      }
    } catch {
      // not JSON: text
    }
  }
  return { level: normalizeLevel(streamLevel), structured: false };
}

/**
 * The one way lines get into the log store. Invocations and builds hand their lines over here and
 * go on: lines are stamped (opaque time-ordered id, platform-clock time), shown to live tails at
 * once, and written in COPY batches every second, so logging never adds a store write to an
 * invocation. Readers that must see everything so far (search, a build's end) call `flush`.
 */
export class LogIngest {
  private pending: StoredLine[] = [];
  /** A write is under way (it takes what arrives meanwhile too). */
  private writing = false;
  private dropped = new Map<string, { count: number; line: StoredLine }>();
  private readonly loop: FlushLoop;
  /** Lines written since start, and dropped because the store fell behind (for the bench and /metrics). */
  readonly counters = { written: 0, dropped: 0 };

  constructor(
    private readonly d: {
      store: () => Promise<LogStore>;
      clock: Clock;
      tail: TailHub;
      log: { error: (m: string, e?: unknown) => void; warn: (m: string) => void };
      maxPending?: number;
      /** After each batch is in the store, its segments by project (other instances' tails hear of them); a failure is only logged. */
      written?: (segments: Map<string, string[]>) => Promise<void>;
    },
  ) {
    this.loop = new FlushLoop(() => this.write(), (e) => d.log.error("log flush failed", e));
    this.loop.start(1000);
  }

  /** Lines one invocation printed (and the platform's own about it). Never awaits anything. */
  invocation(fn: FunctionRef, deploymentId: string | null, region: string, invocationId: string, lines: readonly RawLine[]): void {
    // Workers stamp lines with the machine's time; the store keeps the platform clock's.
    const offset = this.d.clock.offsetMs();
    const out: StoredLine[] = [];
    for (const l of lines) {
      const body = storableBody(l.message);
      const { level, structured } = classify(body, l.level);
      const at = Number.isFinite(l.at) ? l.at + offset : this.d.clock.nowMs();
      out.push({
        id: lineId(at),
        project_id: fn.project_id,
        resource_type: "function",
        resource_id: fn.id,
        resource_name: fn.name,
        stream: "runtime",
        deployment_id: deploymentId,
        invocation_id: invocationId,
        region,
        level,
        structured,
        body,
        at,
      });
    }
    this.add(out);
  }

  /** One line of a deployment's build. */
  build(ref: BuildRef, region: string, level: string, text: string): void {
    const body = storableBody(text);
    const at = this.d.clock.nowMs();
    this.add([
      {
        id: lineId(at),
        project_id: ref.project_id,
        resource_type: ref.resourceType ?? "function",
        resource_id: ref.id,
        resource_name: ref.name,
        stream: "build",
        deployment_id: ref.deploymentId,
        invocation_id: null,
        region,
        level: normalizeLevel(level),
        structured: false,
        body,
        at,
      },
    ]);
  }

  /** One request a frontend served (its access-log line, resource.type=frontend). Never awaits anything. */
  frontendRequest(ref: FunctionRef, deploymentId: string | null, region: string, level: string, text: string): void {
    const at = this.d.clock.nowMs();
    this.add([
      {
        id: lineId(at),
        project_id: ref.project_id,
        resource_type: "frontend",
        resource_id: ref.id,
        resource_name: ref.name,
        stream: "runtime",
        deployment_id: deploymentId,
        invocation_id: null,
        region,
        level: normalizeLevel(level),
        structured: false,
        body: storableBody(text),
        at,
      },
    ]);
  }

  private add(lines: StoredLine[]): void {
    if (!lines.length) return;
    this.d.tail.publish(lines);
    const room = (this.d.maxPending ?? MAX_PENDING_LINES) - this.pending.length;
    if (room >= lines.length) {
      for (const l of lines) this.pending.push(l);
      // A full batch is written now rather than at the next tick (a burst keeps the store busy at once).
      if (!this.writing && this.pending.length >= BATCH) void this.loop.flush().catch((e) => this.d.log.error("log flush failed", e));
      return;
    }
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i]!;
      if (i < room) {
        this.pending.push(l);
        continue;
      }
      const d = this.dropped.get(l.project_id);
      if (d) d.count++;
      else this.dropped.set(l.project_id, { count: 1, line: l });
      this.counters.dropped++;
    }
  }

  /** Everything recorded so far is in the store when this settles. */
  flush(): Promise<void> {
    return this.loop.flush();
  }

  private async write(): Promise<void> {
    if (this.dropped.size) {
      // Each project that lost lines finds out where it looks: a line in its own logs.
      for (const [, { count, line }] of this.dropped) {
        this.d.log.warn(`log store fell behind: ${count} lines of project ${line.project_id} dropped`);
        const at = this.d.clock.nowMs();
        this.pending.push({
          ...line,
          id: lineId(at),
          level: "warn",
          structured: false,
          invocation_id: null,
          body: `${count} log lines were dropped: the log store fell behind (at most ${this.d.maxPending ?? MAX_PENDING_LINES} lines wait to be written)`,
          at,
        });
      }
      this.dropped.clear();
    }
    if (!this.pending.length) return;
    const store = await this.d.store();
    this.writing = true;
    const inFlight: Promise<void>[] = [];
    let failure: { err: unknown } | null = null;
    try {
      while (this.pending.length > 0 && !failure) {
        const batch = this.pending.splice(0, BATCH);
        inFlight.push(
          store.append(batch).then(
            async (segments) => {
              this.counters.written += batch.length;
              if (this.d.written) await this.d.written(segments).catch((err) => this.d.log.error("log lines written, but other instances' tails could not be told", err));
            },
            (err) => {
              // Back in the queue for the next write (lines are ordered by their time and id, not by when they are written).
              this.pending.unshift(...batch);
              failure ??= { err };
            },
          ),
        );
        if (inFlight.length >= IN_FLIGHT) await inFlight.shift();
        // Between batches the main thread serves requests.
        else await new Promise((r) => setImmediate(r));
      }
      await Promise.all(inFlight);
    } finally {
      this.writing = false;
    }
    if (failure) throw (failure as { err: unknown }).err;
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }
}
