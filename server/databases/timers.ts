import type { Clock, TimerHandle } from "../clock";

/** Work that falls due at instants kept in the control store (branch expiries, scheduled backups). */
export interface DueWork {
  label: string;
  /** The earliest instant (epoch ms) something is due, or null. */
  nextDue(): Promise<number | null>;
  /** Does everything due at `nowMs`; each item is claimed in the store, so instances never do one twice. */
  run(nowMs: number): Promise<void>;
}

/**
 * One platform-clock timer for each kind of due work, armed for its earliest instant (read from
 * the control store). With several instances on one store (`pollMs`), each looks again every so
 * often for the others' changes.
 */
export class DueTimers {
  private readonly timers = new Map<string, { handle: TimerHandle | null; due: number | null; rearming: Promise<void> }>();
  private poll: ReturnType<typeof setInterval> | null = null;
  private stopped = false;
  private readonly inFlight = new Set<Promise<void>>();

  constructor(
    private readonly clock: Clock,
    private readonly work: DueWork[],
    private readonly onError: (label: string, err: unknown) => void,
    private readonly pollMs: number | null,
    /**
     * With the controllable clock an advance returns only after the work it caused (tests read the
     * outcome at once); on real time the work runs beside the clock's other timers.
     */
    private readonly awaitRuns: boolean,
  ) {
    for (const w of work) this.timers.set(w.label, { handle: null, due: null, rearming: Promise.resolve() });
  }

  async start(): Promise<void> {
    await Promise.all(this.work.map((w) => this.rearm(w.label)));
    if (this.pollMs) {
      this.poll = setInterval(() => void this.rearmAll(), this.pollMs);
      this.poll.unref?.();
    }
  }

  rearmAll(): Promise<void> {
    return Promise.all(this.work.map((w) => this.rearm(w.label).catch((e) => this.onError(w.label, e)))).then(() => {});
  }

  /** Arms the timer of one kind of work for its earliest due instant (calls are serialised). */
  rearm(label: string): Promise<void> {
    const t = this.timers.get(label)!;
    const w = this.work.find((x) => x.label === label)!;
    const run = t.rearming.then(async () => {
      if (this.stopped) return;
      const next = await w.nextDue();
      if (next === t.due && t.handle) return;
      t.handle?.cancel();
      t.handle = null;
      t.due = next;
      if (next !== null) t.handle = this.clock.at(next, () => this.fire(w), label);
    });
    t.rearming = run.catch(() => {});
    return run;
  }

  private async fire(w: DueWork): Promise<void> {
    const t = this.timers.get(w.label)!;
    t.handle = null;
    t.due = null;
    if (this.stopped) return;
    const job = w
      .run(this.clock.nowMs())
      .catch((e) => this.onError(w.label, e))
      .then(() => this.rearm(w.label))
      .catch((e) => this.onError(w.label, e));
    this.inFlight.add(job);
    void job.finally(() => this.inFlight.delete(job));
    if (this.awaitRuns) await job;
  }

  /** Stopped (or not) and started again: every kind of work re-armed from the rows (a snapshot restore in place). */
  async restart(): Promise<void> {
    if (!this.stopped) await this.stop();
    for (const t of this.timers.values()) (t.handle = null), (t.due = null);
    this.stopped = false;
    await this.start();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.poll) clearInterval(this.poll);
    for (const t of this.timers.values()) t.handle?.cancel();
    await Promise.allSettled([...this.inFlight]);
  }
}
