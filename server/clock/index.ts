/**
 * The platform clock: the one source of "now" and the one place timers live. Everything that
 * compares against the current time or waits for an instant (token expiry, lease expiry, scheduler
 * ticks, retention jobs, sleeps) reads and schedules here, so a test that moves this clock moves all
 * of them together.
 *
 * Real time by default. With `--controllable-clock`, `advance` and `set` move it forward (never
 * back) and every timer due in the skipped interval fires in due order, once, before the call
 * returns, with `now()` reading the timer's own due instant while it runs. A repeating sweep
 * (`every`) whose due instants the move skips several of runs once, at the last of them: its work
 * (delete what is older than the instant it runs at) is the same as running at each of them.
 */
export interface TimerHandle {
  cancel(): void;
}

interface Timer {
  due: number;
  seq: number;
  label: string;
  run: () => unknown;
  cancelled: boolean;
  /** A repeating sweep's interval: a move past several of its due instants runs it at the last one only. */
  coalesce?: number;
}

/** Longest a single setTimeout may wait (Node and Bun clamp larger delays to 1 ms). */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;

export class PlatformClock {
  private offset = 0;
  private seq = 0;
  /** Pending timers, kept sorted by (due, seq): few are ever pending, so insertion is cheap. */
  private timers: Timer[] = [];
  private wallTimer: ReturnType<typeof setTimeout> | null = null;
  private firing: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(
    private readonly onError: (label: string, err: unknown) => void = () => {},
    /** Where the clock starts (epoch ms); it then runs at the real rate from there. */
    startMs?: number,
  ) {
    if (startMs !== undefined) this.offset = startMs - Date.now();
  }

  now(): Date {
    return new Date(this.nowMs());
  }

  nowMs(): number {
    return Date.now() + this.offset;
  }

  offsetMs(): number {
    return this.offset;
  }

  /** Runs `run` when the clock reaches `dueMs` (at once, on the next turn, if that has passed). */
  at(dueMs: number, run: () => unknown, label = "timer"): TimerHandle {
    return this.handle(this.add({ due: dueMs, seq: this.seq++, label, run, cancelled: false }));
  }

  /** Puts a timer in its place in the (due, seq) order. */
  private add(t: Timer): Timer {
    let i = this.timers.length;
    while (i > 0 && this.timers[i - 1]!.due > t.due) i--;
    this.timers.splice(i, 0, t);
    if (i === 0) this.arm();
    return t;
  }

  private handle(t: Timer): TimerHandle {
    return {
      cancel: () => {
        if (t.cancelled) return;
        t.cancelled = true;
        const k = this.timers.indexOf(t);
        if (k >= 0) this.timers.splice(k, 1);
        if (k === 0) this.arm();
      },
    };
  }

  after(ms: number, run: () => unknown, label?: string): TimerHandle {
    return this.at(this.nowMs() + ms, run, label);
  }

  /**
   * Runs the sweep `run` every `ms` of platform time, the next run counted from the due instant of
   * the last. A move of the clock past several due instants runs it once, at the last of them (an
   * advance of 31 days ran each hourly sweep 744 times, 7-18 s of an idle Kiln's time): only
   * for work whose outcome depends on the instant it runs at, not on how often it ran.
   */
  every(ms: number, run: () => unknown, label = "interval"): TimerHandle {
    let handle: TimerHandle;
    let cancelled = false;
    const schedule = (due: number) => {
      const t: Timer = {
        due,
        seq: this.seq++,
        label,
        coalesce: ms,
        run: async () => {
          try {
            await run();
          } finally {
            // From the instant it ran at: a move may have put it later than first scheduled.
            if (!cancelled) schedule(t.due + ms);
          }
        },
        cancelled: false,
      };
      handle = this.handle(this.add(t));
    };
    schedule(this.nowMs() + ms);
    return {
      cancel: () => {
        cancelled = true;
        handle.cancel();
      },
    };
  }

  /** A promise that settles when the platform clock reaches now + ms. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.after(ms, resolve, "sleep"));
  }

  /**
   * Moves the clock forward by `ms`, firing every timer due up to the new instant in order.
   * Concurrent calls are served one after the other.
   */
  advance(ms: number): Promise<void> {
    const run = this.firing.then(() => this.moveTo(this.offset + Math.max(0, ms)));
    this.firing = run.catch(() => {});
    return run;
  }

  /** Moves the clock forward to an absolute instant; an instant in the past is refused. */
  set(instantMs: number): Promise<void> {
    const run = this.firing.then(() => {
      const target = instantMs - Date.now();
      if (target < this.offset) throw new RangeError("the platform clock only moves forward");
      return this.moveTo(target);
    });
    this.firing = run.catch(() => {});
    return run;
  }

  /**
   * A snapshot restore (server/snapshots): every timer is dropped (the areas that owned them were
   * stopped and schedule again from the restored state) and the clock takes the offset it had when
   * the snapshot was taken. This is the one way the clock moves back; see docs/testing.md.
   * `keepTimers`: a restore in place (areas' reset hooks), where each area that was reset cancelled
   * and schedules again its own timers and the others' timers still stand for unchanged state.
   */
  restoreOffset(offset: number, keepTimers = false): Promise<void> {
    const run = this.firing.then(() => {
      if (!keepTimers) this.timers = [];
      this.offset = offset;
      this.arm();
    });
    this.firing = run.catch(() => {});
    return run;
  }

  /** Drops every timer (Kiln is stopping). */
  stop(): void {
    this.stopped = true;
    this.timers = [];
    if (this.wallTimer) clearTimeout(this.wallTimer);
    this.wallTimer = null;
  }

  private async moveTo(targetOffset: number): Promise<void> {
    for (;;) {
      const next = this.timers[0];
      const target = Date.now() + targetOffset;
      if (!next || next.due > target) break;
      if (next.coalesce && next.due + next.coalesce <= target) {
        // A sweep due again within the move: it takes its place at the last of its due instants.
        this.timers.shift();
        next.due += Math.floor((target - next.due) / next.coalesce) * next.coalesce;
        this.add(next);
        continue;
      }
      // The timer runs with the clock at its own due instant (never moved back).
      this.offset = Math.max(this.offset, next.due - Date.now());
      await this.fire(next);
    }
    this.offset = Math.max(this.offset, targetOffset);
    this.arm();
  }

  private async fire(t: Timer): Promise<void> {
    const k = this.timers.indexOf(t);
    if (k >= 0) this.timers.splice(k, 1);
    if (t.cancelled) return;
    t.cancelled = true;
    try {
      await t.run();
    } catch (err) {
      this.onError(t.label, err);
    }
  }

  /** Keeps one real-time timer for the earliest due instant, so real time fires timers too. */
  private arm(): void {
    if (this.wallTimer) clearTimeout(this.wallTimer);
    this.wallTimer = null;
    const next = this.timers[0];
    if (!next || this.stopped) return;
    const delay = Math.min(MAX_TIMEOUT_MS, Math.max(0, next.due - this.nowMs()));
    this.wallTimer = setTimeout(() => {
      this.wallTimer = null;
      const run = this.firing.then(() => this.moveTo(this.offset));
      this.firing = run.catch(() => {});
    }, delay);
    (this.wallTimer as { unref?: () => void }).unref?.();
  }
}

export type Clock = PlatformClock;

/** UTC calendar day (YYYY-MM-DD) of a date. */
export function utcDay(d: Date): string {
  return d.toISOString().slice(0, 10);
}
