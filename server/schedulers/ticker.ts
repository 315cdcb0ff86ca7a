import type { Clock, TimerHandle } from "../clock";
import type { FunctionRecord } from "../functions/records";
import { deployedRegions } from "../functions/regions";
import { newId } from "../ids";
import type { Logger } from "../log";
import { isoTime, storableText, type ControlStore } from "../store/store";
import { parseCron, type CronSchedule } from "./cron";
import { chooseRegion, RUNS_KEPT, type FunctionKind, type SchedulerRow } from "./service";

/** What a tick did with the function: its answer, or why there was none. */
export interface RunOutcome {
  ok: boolean;
  httpStatus: number | null;
  invocationId: string | null;
  error: string | null;
}

/** Starts what a tick runs: an invocation (standard functions), an execution (durable ones, later). */
export type TickTarget = (fn: FunctionRecord, event: Record<string, unknown>) => Promise<RunOutcome>;

export interface TickerDeps {
  store: ControlStore;
  clock: Clock;
  log: Logger;
  regions: readonly string[];
  /** With the controllable clock, an advance returns only after the runs it caused have finished. */
  awaitRuns: boolean;
  /** Several instances share the store (production profile): look for their changes this often (wall time). */
  pollMs: number | null;
  findFunction(functionId: string): Promise<FunctionRecord | null>;
  /** Fault injection (KILN_FAULTS=scheduler-claim-delay:N): hold N claims 300 ms after reading them due, so instances race. */
  fault(name: string): boolean;
  targets: Partial<Record<FunctionKind, TickTarget>>;
}

const DUE_BATCH = 100;
/**
 * Production profile: how long a running run stays its instance's without a renewal (wall time, so a
 * moved platform clock never expires another instance's runs). Renewed every third of it while the
 * run executes; once lapsed, its instance is taken to be gone and any instance fails the run.
 */
const LEASE_MS = Number(process.env.KILN_SCHEDULER_LEASE_MS ?? 30_000);
const INTERRUPTED = "interrupted: Kiln stopped during the run";

/**
 * Fires scheduler ticks on the platform clock. One timer is armed for the earliest `next_run_at`;
 * when it fires, every due scheduler is claimed by a compare-and-set on its `next_run_at` in the
 * shared store, so with several Kiln instances each tick runs exactly once, on whichever instance
 * claims it first, and an instance that dies leaves nothing unclaimed for the others. A tick moves
 * `next_run_at` to the first occurrence after now: ticks missed while no Kiln ran become one
 * catch-up run, never a burst (docs/schedulers.md).
 */
export class SchedulerTicker {
  private timer: TimerHandle | null = null;
  private armedFor: number | null = null;
  private rearming: Promise<void> = Promise.resolve();
  private readonly inFlight = new Set<Promise<void>>();
  private readonly crons = new Map<string, CronSchedule>();
  private poll: ReturnType<typeof setInterval> | null = null;
  private renew: ReturnType<typeof setInterval> | null = null;
  private stopped = false;
  /** The owner of the runs this instance claims (a new one each start). */
  private readonly instanceId = newId();

  constructor(private readonly d: TickerDeps) {}

  /** Arms the timer for the earliest due scheduler (serialised: the last call wins). */
  rearm(): Promise<void> {
    const run = this.rearming.then(async () => {
      if (this.stopped) return;
      const [r] = await this.d.store.query<{ next: Date | string | null }>(`select min(next_run_at) as next from schedulers where enabled`);
      const next = r?.next ? new Date(r.next).getTime() : null;
      if (next === this.armedFor && this.timer) return;
      this.timer?.cancel();
      this.timer = null;
      this.armedFor = next;
      if (next !== null) this.timer = this.d.clock.at(next, () => this.tick(), "scheduler tick");
    });
    this.rearming = run.catch(() => {});
    return run;
  }

  /** Runs cut short by a stop or a crash are failed (at most once: never run again); then ticking starts. */
  async start(): Promise<void> {
    await this.failInterrupted();
    await this.rearm();
    if (this.d.pollMs) {
      this.poll = setInterval(() => void this.rearm().catch((e) => this.d.log.error("scheduler poll failed", e)), this.d.pollMs);
      this.poll.unref?.();
    }
    if (this.shared) {
      this.renew = setInterval(() => void this.renewLeases().catch((e) => this.d.log.error("scheduler run leases failed", e)), Math.max(200, LEASE_MS / 3));
      this.renew.unref?.();
    }
  }

  /** Several instances may share the store (production profile): runs have owners and leases. */
  private get shared(): boolean {
    return this.d.store.kind === "postgres";
  }

  /**
   * Fails the runs that can no longer be in progress. The embedded store has one instance, so every
   * `running` run is one its previous life left. Instances sharing the PostgreSQL store renew a lease
   * on the runs they execute: a run whose lease lapsed (its instance stopped or died, this one's
   * previous life included) or that has none (recorded before runs had owners) is failed; the runs
   * other live instances are executing are left alone.
   */
  private async failInterrupted(): Promise<void> {
    const at = this.d.clock.now().toISOString();
    if (!this.shared) {
      await this.d.store.query(`update scheduler_runs set status = 'failed', finished_at = $1, error = $2 where status = 'running'`, [at, INTERRUPTED]);
      return;
    }
    await this.d.store.query(
      `update scheduler_runs set status = 'failed', finished_at = $1, error = $2 where status = 'running' and (lease_until is null or lease_until < $3)`,
      [at, INTERRUPTED, new Date().toISOString()],
    );
  }

  /** Production profile: keeps this instance's running runs its own, and fails those whose owner is gone. */
  private async renewLeases(): Promise<void> {
    if (this.inFlight.size) {
      await this.d.store.query(`update scheduler_runs set lease_until = $2 where owner = $1 and status = 'running'`, [this.instanceId, new Date(Date.now() + LEASE_MS).toISOString()]);
    }
    await this.failInterrupted();
  }

  /** Stopped (or not) and started again from the rows (a snapshot restore in place). */
  async restart(): Promise<void> {
    if (!this.stopped) await this.stop();
    this.timer = null;
    this.armedFor = null;
    this.stopped = false;
    await this.start();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.poll) clearInterval(this.poll);
    this.timer?.cancel();
    await Promise.allSettled([...this.inFlight]);
    if (this.renew) clearInterval(this.renew);
  }

  private cron(expr: string): CronSchedule | null {
    let c = this.crons.get(expr);
    if (!c) {
      const parsed = parseCron(expr);
      if (!parsed.ok) return null;
      c = parsed.cron;
      if (this.crons.size > 10_000) this.crons.clear();
      this.crons.set(expr, c);
    }
    return c;
  }

  private async tick(): Promise<void> {
    this.timer = null;
    this.armedFor = null;
    const started: Promise<void>[] = [];
    try {
      for (;;) {
        const now = this.d.clock.nowMs();
        const due = await this.d.store.query<SchedulerRow>(`select * from schedulers where enabled and next_run_at <= $1 order by next_run_at, id limit ${DUE_BATCH}`, [
          new Date(now).toISOString(),
        ]);
        if (due.length && this.d.fault("scheduler-claim-delay")) await new Promise((r) => setTimeout(r, 300));
        for (const row of due) {
          const run = await this.claim(row, now);
          if (run) started.push(run);
        }
        if (due.length < DUE_BATCH) break;
      }
    } finally {
      await this.rearm();
    }
    if (this.d.awaitRuns) await Promise.allSettled(started);
  }

  /** Takes one tick of a scheduler, unless another instance (or a change) took it first; returns the run. */
  private async claim(row: SchedulerRow, now: number): Promise<Promise<void> | null> {
    const due = new Date(row.next_run_at!).getTime();
    const next = this.cron(row.cron_expression)?.nextAfter(now) ?? null;
    const fn = await this.d.findFunction(row.function_id);
    const region = fn ? chooseRegion(deployedRegions(this.d.regions, fn), row.regions, row.region) : row.region;
    const runId = newId();
    const at = new Date(now).toISOString();
    const claimed = await this.d.store.transaction(async (tx) => {
      const [won] = await tx.query(
        `update schedulers set next_run_at = $3, last_run_at = $4, region = $5 where id = $1 and enabled and next_run_at = $2 returning id`,
        [row.id, isoTime(row.next_run_at), next === null ? null : new Date(next).toISOString(), at, region],
      );
      if (!won) return false;
      await tx.query(
        `insert into scheduler_runs (id, scheduler_id, project_id, function_id, status, scheduled_for, started_at, region, owner, lease_until)
         values ($1, $2, $3, $4, 'running', $5, $6, $7, $8, $9)`,
        [runId, row.id, row.project_id, row.function_id, new Date(due).toISOString(), at, region, this.instanceId, new Date(Date.now() + LEASE_MS).toISOString()],
      );
      await tx.query(
        `delete from scheduler_runs where id in (select id from scheduler_runs where scheduler_id = $1 order by started_at desc, id desc offset ${RUNS_KEPT})`,
        [row.id],
      );
      return true;
    });
    if (!claimed) return null;
    const run = this.execute(row, fn, runId, region).finally(() => this.inFlight.delete(run));
    this.inFlight.add(run);
    return run;
  }

  private async execute(row: SchedulerRow, fn: FunctionRecord | null, runId: string, region: string | null): Promise<void> {
    const t0 = performance.now();
    let outcome: RunOutcome;
    try {
      const target = this.d.targets[row.function_kind];
      if (!fn || fn.status === "deleted" || fn.status === "deleting") outcome = failed("the function is being deleted");
      else if (!fn.active_deployment_id) outcome = failed(`the function has no successful deployment yet (status ${fn.status})`);
      else if (!region || !deployedRegions(this.d.regions, fn).includes(region)) outcome = failed(`region ${region ?? "(none)"} is not a deployed region of the function`);
      else if (!target) outcome = failed(`${row.function_kind} functions cannot be scheduled here`);
      else outcome = await target(fn, { ...row.payload, __service_schedule: { scheduler_id: row.id, run_id: runId, region } });
    } catch (err) {
      this.d.log.error(`scheduler ${row.id} run ${runId} failed`, err);
      outcome = failed(`internal error: ${(err as Error)?.message ?? err}`);
    }
    await this.d.store
      .query(`update scheduler_runs set status = $2, finished_at = $3, duration_ms = $4, invocation_id = $5, http_status = $6, error = $7 where id = $1`, [
        runId,
        outcome.ok ? "succeeded" : "failed",
        this.d.clock.now().toISOString(),
        performance.now() - t0,
        outcome.invocationId,
        outcome.httpStatus,
        outcome.error === null ? null : storableText(outcome.error.slice(0, 2000)),
      ])
      .catch((e) => this.d.log.error(`recording scheduler run ${runId} failed`, e));
  }
}

function failed(error: string): RunOutcome {
  return { ok: false, httpStatus: null, invocationId: null, error };
}
