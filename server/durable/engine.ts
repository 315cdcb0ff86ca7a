import type { Clock, TimerHandle } from "../clock";
import type { FunctionRecord } from "../functions/service";
import { activeVersion, type InvokeDeps } from "../functions/invoke";
import { conflict, HttpError } from "../http/errors";
import { newId } from "../ids";
import { countUsage } from "../metrics/service";
import type { ControlStore, Row, Sql } from "../store/store";
import type { JournalEntry, LogLine, StepAck, StepFrame } from "../../runtime-sandbox/worker-pool";
import { parseDuration, parseInstant } from "./durations";

/** What running segments uses: an invocation's needs (pool, records, variables, log ingest), the store and the clock. */
export type DurableDeps = Pick<InvokeDeps, "config" | "log" | "functions" | "variables" | "functionPool" | "logs"> & { store: ControlStore; clock: Clock };

export interface EngineOptions {
  /** How long a claimed execution stays this instance's without a sign of life (wall time). */
  leaseMs: number;
  /** Segments running at once on this instance; more wait `queued`. */
  maxConcurrent: number;
  /** Several instances share the store: look for their work this often (wall time); null for one instance. */
  pollMs: number | null;
}

/** step.run's retries when the handler gives none (so 4 attempts in all). */
export const DEFAULT_RETRIES = 3;
const MAX_RETRIES = 50;
/** Before retry n (1-based): 1 s, 2 s, 4 s ... at most 10 minutes, on the platform clock. */
export const backoffMs = (attempt: number) => Math.min(1000 * 2 ** (attempt - 1), 600_000);
/** Segments that end in a crash or timeout without writing a step, in a row, before the execution fails. */
const MAX_CRASHES = 3;

const iso = (ms: number) => new Date(ms).toISOString();
const json = (v: unknown) => (v === undefined ? null : JSON.stringify(v));

type Decision = { kind: "sleep" | "retry"; wakeAt: number } | { kind: "fail"; error: string };

/**
 * Runs durable executions. Each execution is a row (`durable_executions`) and a journal of steps
 * (`durable_steps`). A segment replays the handler in a worker against the journal: settled steps
 * are answered from it, each new step is written down (in one statement that also proves this
 * instance still holds the execution) before the handler may go on. A sleep or a retry later ends
 * the segment: the execution waits (`sleeping` / `queued` with `wake_at`) holding no worker, and a
 * timer on the platform clock claims it again. Claims are compare-and-set leases in the shared
 * store, so with several instances each segment runs on one of them, and an instance that dies
 * (kill -9) leaves leases that lapse; the embedded profile has one instance and takes back its
 * own executions at start. See docs/durable-functions.md.
 */
export class DurableEngine {
  readonly instanceId = newId();
  private timer: TimerHandle | null = null;
  private retention: TimerHandle | null = null;
  private armedFor: number | null = null;
  private pumping = false;
  private again = false;
  private readonly inFlight = new Map<string, Promise<void>>();
  private stopping = false;
  private renew: ReturnType<typeof setInterval> | null = null;
  private poll: ReturnType<typeof setInterval> | null = null;

  constructor(
    private readonly d: DurableDeps,
    private readonly o: EngineOptions,
  ) {}

  // ---------------------------------------------------------------------------------------------
  // Starting, stopping, re-running.

  /** A new execution, `queued`; with `rerun`, it starts with the journal of another up to a step. */
  async start(fn: FunctionRecord, input: unknown, identity: Record<string, unknown> | null, rerun?: { of: Row; fromSeq: number }): Promise<Row> {
    if (!fn.active_deployment_id) throw new HttpError(409, { error: `the durable function has no successful deployment yet (status ${fn.status})` });
    const now = this.d.clock.nowMs();
    const id = newId();
    const row = await this.d.store.transaction(async (tx) => {
      const [r] = await tx.query(
        `insert into durable_executions (id, project_id, function_id, status, input, identity, rerun_of, wake_at, created_at, updated_at)
         values ($1, $2, $3, 'queued', $4::text::jsonb, $5::text::jsonb, $6, $7, $7, $7) returning *`,
        [id, fn.project_id, fn.id, json(input), json(identity ?? undefined), rerun?.of.id ?? null, iso(now)],
      );
      // The settled steps before the chosen one are taken over as they are: replays return them.
      if (rerun)
        await tx.query(
          `insert into durable_steps (execution_id, seq, name, op, status, attempts, output, error, wake_at, started_at, finished_at)
           select $1, seq, name, op, status, attempts, output, error, wake_at, started_at, finished_at from durable_steps
            where execution_id = $2 and seq < $3 and status in ('completed', 'failed')`,
          [id, rerun.of.id, rerun.fromSeq],
        );
      return r!;
    });
    this.pump();
    return row;
  }

  /** POST .../stop: a queued, running or sleeping execution is `stopped` (409 once finished). */
  async stop(projectId: string, executionId: string): Promise<Row | null> {
    const now = iso(this.d.clock.nowMs());
    const stopped = await this.d.store.transaction(async (tx) => {
      const [r] = await tx.query(
        `update durable_executions set status = 'stopped', finished_at = $3, updated_at = $3, lease_owner = null, lease_until = null, wake_at = null
          where id = $1 and project_id = $2 and status in ('queued', 'running', 'sleeping') returning *`,
        [executionId, projectId, now],
      );
      if (r) await this.count(tx, r, 0);
      return r ?? null;
    });
    if (!stopped) {
      const [r] = await this.d.store.query(`select status from durable_executions where id = $1 and project_id = $2`, [executionId, projectId]);
      if (r) throw conflict(`the execution has already finished (status ${r.status})`);
    }
    return stopped;
  }

  /**
   * A deleted durable function's unfinished executions stop with it, in the deleting transaction, and
   * are counted into usage as any stop is.
   */
  async stopFunction(tx: Sql, functionId: string): Promise<void> {
    const now = iso(this.d.clock.nowMs());
    const rows = await tx.query(
      `update durable_executions set status = 'stopped', error = 'the durable function was deleted', finished_at = $2, updated_at = $2, lease_owner = null, lease_until = null, wake_at = null
        where function_id = $1 and status in ('queued', 'running', 'sleeping') returning *`,
      [functionId, now],
    );
    for (const r of rows) await this.count(tx, r, 0);
  }

  /**
   * A segment that ran on after this instance lost the execution (stopped, or taken over after a
   * lapsed lease) still used compute. On an execution still going it joins the total counted at the
   * finish; on one already finished (a stop) it goes into usage now.
   */
  private async lateCompute(exec: Row, computeMs: number): Promise<void> {
    if (!(computeMs > 0)) return;
    await this.d.store.transaction(async (tx) => {
      const [r] = await tx.query(`update durable_executions set compute_ms = compute_ms + $2 where id = $1 returning status, project_id`, [exec.id, computeMs]);
      if (r && ["stopped", "completed", "failed"].includes(r.status)) {
        await countUsage(tx, r.project_id, { durable_compute_mb_seconds: (computeMs / 1000) * this.d.config.functionMemoryMb }, this.d.clock.nowMs());
      }
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Claiming work.

  /** At start: executions this store's only instance left running (a stop, a crash) run again from their journal. */
  async resume(): Promise<void> {
    if (this.d.store.kind === "pglite")
      await this.d.store.query(`update durable_executions set status = 'queued', lease_owner = null, lease_until = null, wake_at = $1 where status = 'running'`, [
        iso(this.d.clock.nowMs()),
      ]);
    // Leases are renewed while segments run; another instance takes over an execution whose lease lapsed.
    this.renew = setInterval(() => void this.renewLeases(), Math.max(200, this.o.leaseMs / 3));
    this.renew.unref?.();
    if (this.o.pollMs) {
      this.poll = setInterval(() => this.pump(), this.o.pollMs);
      this.poll.unref?.();
    }
    this.retention = this.d.clock.every(3_600_000, () => this.sweep().catch((e) => this.d.log.error("durable executions: retention sweep failed", e)), "durable retention");
    this.pump();
  }

  /**
   * Retention on the platform clock: every hour, executions that finished more than
   * KILN_DURABLE_RETENTION_DAYS ago go with their journals, a batch at a time.
   */
  async sweep(): Promise<number> {
    const cutoff = iso(this.d.clock.nowMs() - this.d.config.durableRetentionDays * 86_400_000);
    let removed = 0;
    for (;;) {
      const n = await this.d.store.transaction(async (tx) => {
        const ids = (await tx.query(`select id from durable_executions where finished_at < $1 order by finished_at limit 500`, [cutoff])).map((r) => r.id as string);
        if (!ids.length) return 0;
        await tx.query(`delete from durable_steps where execution_id = any($1::text[])`, [ids]);
        await tx.query(`delete from durable_executions where id = any($1::text[])`, [ids]);
        return ids.length;
      });
      removed += n;
      if (n < 500 || this.stopping) return removed;
    }
  }

  /** After `drain`, claiming again from the rows (a snapshot restore in place). */
  async restart(): Promise<void> {
    if (!this.stopping) await this.drain();
    this.stopping = false;
    this.timer = null;
    await this.resume();
  }

  /** At stop: nothing new is claimed; what runs here is given back (`queued`), its segment abandoned. */
  async drain(): Promise<void> {
    this.stopping = true;
    this.timer?.cancel();
    this.retention?.cancel();
    if (this.renew) clearInterval(this.renew);
    if (this.poll) clearInterval(this.poll);
    await this.d.store
      .query(`update durable_executions set status = 'queued', lease_owner = null, lease_until = null, wake_at = $2 where lease_owner = $1 and status = 'running'`, [
        this.instanceId,
        iso(this.d.clock.nowMs()),
      ])
      .catch((e) => this.d.log.error("durable executions: giving back leases failed", e));
    // Their step writes now fail the lease check: the segments end at their next step.
    await Promise.race([Promise.allSettled([...this.inFlight.values()]), new Promise((r) => setTimeout(r, 2000))]);
  }

  /** Claims due executions (and lapsed leases of other instances) up to the free room, then re-arms. */
  pump(): void {
    if (this.stopping) return;
    if (this.pumping) {
      this.again = true;
      return;
    }
    this.pumping = true;
    void (async () => {
      try {
        do {
          this.again = false;
          const room = this.o.maxConcurrent - this.inFlight.size;
          if (room <= 0 || this.stopping) break;
          const rows = await this.claim(room);
          for (const r of rows) this.launch(r);
          if (rows.length === room) this.again = true;
        } while (this.again && !this.stopping);
        if (this.inFlight.size < this.o.maxConcurrent) await this.rearm();
      } catch (e) {
        if (!this.stopping) this.d.log.error("durable executions: claiming work failed", e);
      } finally {
        this.pumping = false;
      }
    })();
  }

  private async claim(limit: number): Promise<Row[]> {
    const now = this.d.clock.nowMs();
    const wall = Date.now();
    return this.d.store.query(
      `update durable_executions set status = 'running', lease_owner = $1, lease_until = $2, segments = segments + 1, updated_at = $3
        where id in (
          select id from durable_executions
           where (status in ('queued', 'sleeping') and wake_at <= $3) or (status = 'running' and lease_until < $4)
           order by wake_at limit ${limit} for update skip locked)
        returning *`,
      [this.instanceId, iso(wall + this.o.leaseMs), iso(now), iso(wall)],
    );
  }

  /** One timer on the platform clock, for the earliest waiting execution. */
  private async rearm(): Promise<void> {
    const [r] = await this.d.store.query<{ next: Date | string | null }>(`select min(wake_at) as next from durable_executions where status in ('queued', 'sleeping')`);
    const next = r?.next ? new Date(r.next).getTime() : null;
    if (this.stopping || (next === this.armedFor && this.timer)) return;
    this.timer?.cancel();
    this.timer = null;
    this.armedFor = next;
    if (next !== null) this.timer = this.d.clock.at(Math.max(next, this.d.clock.nowMs() + 1), () => ((this.timer = null), (this.armedFor = null), this.pump()), "durable wake-up");
  }

  private async renewLeases(): Promise<void> {
    if (!this.inFlight.size || this.stopping) return;
    await this.d.store
      .query(`update durable_executions set lease_until = $2 where lease_owner = $1 and status = 'running'`, [this.instanceId, iso(Date.now() + this.o.leaseMs)])
      .catch(() => {});
  }

  private launch(row: Row): void {
    const run = this.segment(row)
      .catch((e) => this.d.log.error(`durable execution ${row.id}: segment failed`, e))
      .finally(() => {
        this.inFlight.delete(row.id);
        this.pump();
      });
    this.inFlight.set(row.id, run);
  }

  // ---------------------------------------------------------------------------------------------
  // One segment: replay the handler against the journal until it finishes, sleeps or fails.

  private async segment(exec: Row): Promise<void> {
    const fn = await this.d.functions.byId(exec.function_id);
    if (!fn || fn.kind !== "durable" || fn.status === "deleting") return void (await this.end(exec, "failed", { error: "the durable function was deleted" }));
    let version, deploymentId: string;
    try {
      ({ version, deploymentId } = await activeVersion(this.d, fn));
    } catch (err) {
      if (err instanceof HttpError) return void (await this.end(exec, "failed", { error: String((err.body as { error?: string }).error) }));
      throw err;
    }
    const now = this.d.clock.nowMs();
    // Sleeps that have ended are settled before the replay reaches them.
    await this.d.store.query(`update durable_steps set status = 'completed', finished_at = wake_at where execution_id = $1 and status = 'sleeping' and wake_at <= $2`, [exec.id, iso(now)]);
    const rows = await this.d.store.query(`select * from durable_steps where execution_id = $1 order by seq`, [exec.id]);
    const steps = new Map<number, Row>(rows.map((r) => [r.seq as number, r]));
    const journal: JournalEntry[] = rows
      .filter((r) => r.status === "completed" || r.status === "failed")
      .map((r) => ({ seq: r.seq, name: r.name, op: r.op, status: r.status, ...(r.status === "completed" ? { output: r.output ?? null } : { error: r.error }) }));
    // Lines go to the log ingest as they are printed (batched into the store every second, as every
    // function's are), not at the segment's end: a segment lasts as long as its handler runs, and its
    // lines must be searchable meanwhile and survive a kill -9 of Kiln.
    const record = (lines: readonly LogLine[]) => {
      if (!lines.length) return;
      try {
        this.d.logs.ingest.invocation(fn, deploymentId, this.d.config.regions[0]!, exec.id, lines);
      } catch (e) {
        this.d.log.error("recording durable execution logs failed", e);
      }
    };
    const say = (level: LogLine["level"], message: string) => record([{ level, message, at: Date.now() }]);
    let decision: Decision | null = null;
    let lost = false;
    let wrote = 0;
    /** Writes a step; false when this instance no longer holds the execution (stopped, or taken over). */
    const put = async (f: StepFrame, st: Parameters<DurableEngine["write"]>[2]) => {
      const ok = await this.write(exec, f, st);
      if (ok) wrote++;
      else lost = true;
      return ok;
    };

    const onStep = async (f: StepFrame): Promise<StepAck> => {
      if (lost || decision) return { action: "suspend" };
      const known = steps.get(f.seq);
      const op = f.op === "mismatch" ? null : f.op;
      if (f.op === "mismatch" || (known && op && (known.name !== f.name || known.op !== op))) {
        const error =
          f.op === "mismatch" ? f.error : `non-deterministic replay: step ${f.seq + 1} was ${known!.op} "${known!.name}" when the execution first ran, and is now ${op} "${f.name}"`;
        decision = { kind: "fail", error };
        return { action: "suspend" };
      }
      const at = this.d.clock.nowMs();
      if (f.op === "run") {
        const attempts = (known?.attempts ?? 0) + 1;
        const startedAt = known?.started_at ? new Date(known.started_at).getTime() : at - f.ms;
        if (f.status === "completed") {
          if (!(await put(f, { status: "completed", attempts, output: f.output, error: known?.error ?? null, startedAt, finishedAt: at }))) return { action: "suspend" };
          say("info", `step "${f.name}" completed (attempt ${attempts}, ${f.ms.toFixed(1)} ms)`);
          return { action: "continue" };
        }
        const retries = Number.isInteger(f.retries) && f.retries! >= 0 ? Math.min(f.retries!, MAX_RETRIES) : DEFAULT_RETRIES;
        const error = { message: f.error.message, type: f.error.type };
        if (attempts <= retries) {
          const wakeAt = at + backoffMs(attempts);
          if (!(await put(f, { status: "retrying", attempts, error, wakeAt, startedAt }))) return { action: "suspend" };
          say("warn", `step "${f.name}" failed (attempt ${attempts} of ${retries + 1}): ${error.type}: ${error.message}; retrying at ${iso(wakeAt)}`);
          decision = { kind: "retry", wakeAt };
          return { action: "suspend" };
        }
        if (!(await put(f, { status: "failed", attempts, error, startedAt, finishedAt: at }))) return { action: "suspend" };
        say("error", `step "${f.name}" failed after ${attempts} attempt${attempts === 1 ? "" : "s"}: ${error.type}: ${error.message}`);
        return { action: "throw", error };
      }
      // A sleep: its end is fixed when first reached, so replays wait for the same instant.
      let wakeAt = known?.wake_at ? new Date(known.wake_at).getTime() : null;
      if (wakeAt === null) {
        const parsed = f.until !== undefined ? parseInstant(f.until) : parseDuration(f.duration);
        if (typeof parsed === "string") return { action: "throw", error: { message: parsed, type: "TypeError" } };
        wakeAt = f.until !== undefined ? parsed : at + parsed;
      }
      if (wakeAt <= at) {
        if (!(await put(f, { status: "completed", attempts: 0, wakeAt, startedAt: known?.started_at ? new Date(known.started_at).getTime() : at, finishedAt: at }))) return { action: "suspend" };
        return { action: "continue" };
      }
      if (!(await put(f, { status: "sleeping", attempts: 0, wakeAt, startedAt: at }))) return { action: "suspend" };
      say("info", `step "${f.name}" sleeping until ${iso(wakeAt)}`);
      decision = { kind: "sleep", wakeAt };
      return { action: "suspend" };
    };

    let computeMs = 0;
    try {
      const pool = await this.d.functionPool();
      const out = await pool.invoke(version, eventOf(exec), { invocationId: `${exec.id}:${exec.segments}`, durable: { journal, onStep, onLogs: record } });
      record(out.logs);
      computeMs = out.computeMs;
      if (lost) return await this.lateCompute(exec, computeMs);
      const d = decision as Decision | null;
      if (d?.kind === "fail") {
        say("error", `execution failed: ${d.error}`);
        await this.end(exec, "failed", { error: d.error, computeMs });
      } else if (d) {
        await this.wait(exec, d.kind === "sleep" ? "sleeping" : "queued", d.wakeAt, computeMs);
      } else if (out.outcome.ok) {
        say("info", `execution completed`);
        await this.end(exec, "completed", { output: out.outcome.value, computeMs });
      } else {
        const error = `${out.outcome.type}: ${out.outcome.error}`;
        say("error", `execution failed: ${error}`);
        await this.end(exec, "failed", { error, computeMs });
      }
    } catch (err) {
      // A crash, an out-of-memory or a timeout of the worker: the journal keeps what was done.
      const e = err as { kind?: string; message?: string; logs?: LogLine[] };
      if (e.logs) record(e.logs);
      if (this.stopping || lost || !e.kind) {
        if (!e.kind && !this.stopping) throw err;
        return;
      }
      const crashes = wrote ? 1 : (exec.crashes as number) + 1;
      say("error", `segment ended: ${e.kind}: ${e.message}`);
      if (crashes >= MAX_CRASHES) await this.end(exec, "failed", { error: `${e.kind}: ${e.message}` });
      else await this.wait(exec, "queued", this.d.clock.nowMs() + backoffMs(crashes), 0, crashes);
    }
  }

  /** Writes a step, in one statement that also renews this instance's lease (false: the lease is gone). */
  private async write(
    exec: Row,
    f: { seq: number; name: string; op: string },
    s: { status: string; attempts: number; output?: unknown; error?: unknown; wakeAt?: number; startedAt?: number; finishedAt?: number },
  ): Promise<boolean> {
    const rows = await this.d.store.query(
      `with lease as (
         update durable_executions set lease_until = $3, updated_at = $4 where id = $1 and lease_owner = $2 and status = 'running' returning id)
       insert into durable_steps (execution_id, seq, name, op, status, attempts, output, error, wake_at, started_at, finished_at)
       select id, $5, $6, $7, $8, $9, $10::text::jsonb, $11::text::jsonb, $12, $13, $14 from lease
       on conflict (execution_id, seq) do update set status = excluded.status, attempts = excluded.attempts, output = excluded.output, error = excluded.error,
         wake_at = excluded.wake_at, started_at = coalesce(durable_steps.started_at, excluded.started_at), finished_at = excluded.finished_at
       returning seq`,
      [
        exec.id,
        this.instanceId,
        iso(Date.now() + this.o.leaseMs),
        iso(this.d.clock.nowMs()),
        f.seq,
        f.name,
        f.op,
        s.status,
        s.attempts,
        json(s.output),
        json(s.error ?? undefined),
        s.wakeAt === undefined ? null : iso(s.wakeAt),
        s.startedAt === undefined ? null : iso(s.startedAt),
        s.finishedAt === undefined ? null : iso(s.finishedAt),
      ],
    );
    return rows.length > 0;
  }

  /** The segment ended waiting: sleeping until a step's end, or queued for a retry. */
  private async wait(exec: Row, status: "sleeping" | "queued", wakeAt: number, computeMs: number, crashes?: number): Promise<void> {
    await this.d.store.query(
      `update durable_executions set status = $3, wake_at = $4, lease_owner = null, lease_until = null, compute_ms = compute_ms + $5, crashes = coalesce($6, crashes), updated_at = $7
        where id = $1 and lease_owner = $2 and status = 'running'`,
      [exec.id, this.instanceId, status, iso(wakeAt), computeMs, crashes ?? 0, iso(this.d.clock.nowMs())],
    );
  }

  /** Finished: completed or failed, counted into usage in the same transaction. */
  private async end(exec: Row, status: "completed" | "failed", r: { output?: unknown; error?: string; computeMs?: number }): Promise<void> {
    const now = iso(this.d.clock.nowMs());
    await this.d.store.transaction(async (tx) => {
      const [done] = await tx.query(
        `update durable_executions set status = $3, output = $4::text::jsonb, error = $5, finished_at = $6, updated_at = $6, lease_owner = null, lease_until = null, wake_at = null,
           compute_ms = compute_ms + $7
          where id = $1 and lease_owner = $2 and status = 'running' returning *`,
        [exec.id, this.instanceId, status, json(r.output), r.error ?? null, now, r.computeMs ?? 0],
      );
      if (done) await this.count(tx, done, 0);
    });
  }

  /** Usage, once per execution as it finishes: one execution, its steps, its compute in MB-seconds. */
  private async count(tx: Sql, exec: Row, extraMs: number): Promise<void> {
    const [{ n }] = (await tx.query(`select count(*)::int as n from durable_steps where execution_id = $1`, [exec.id])) as [{ n: number }];
    const mbSeconds = ((Number(exec.compute_ms) + extraMs) / 1000) * this.d.config.functionMemoryMb;
    await countUsage(tx, exec.project_id, { durable_executions: 1, durable_operations: n, durable_compute_mb_seconds: mbSeconds }, this.d.clock.nowMs());
  }
}

/** What the handler receives: the input, with the starting end user's identity as standard functions get it. */
function eventOf(exec: Row): unknown {
  const input = exec.input ?? null;
  if (!exec.identity || (input !== null && (typeof input !== "object" || Array.isArray(input)))) return input;
  return { ...(input ?? {}), __service_auth: exec.identity };
}
