/**
 * Fixed-window counters kept in memory, keyed by whatever the caller rations (an address, a
 * project and address, ...). Windows are aligned to multiples of their length, like the spec's
 * "fixed-minute window".
 */
export class FixedWindowLimiter {
  private readonly windows = new Map<string, { start: number; count: number }>();

  /** Forgets every window (a snapshot restore: the counts of the requests since are gone with them). */
  clear(): void {
    this.windows.clear();
  }

  constructor(
    /** Default limit; `hit` may pass another per key (per-project settings). */
    private readonly limit: number,
    private readonly windowMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  private current(key: string) {
    const now = this.now();
    const start = now - (now % this.windowMs);
    let w = this.windows.get(key);
    if (!w || w.start !== start) {
      w = { start, count: 0 };
      this.windows.set(key, w);
      if (this.windows.size > 10_000) this.sweep(start);
    }
    return w;
  }

  /** Counts one hit; tells whether it is within the limit and when the window resets. */
  hit(key: string, limit = this.limit): { allowed: boolean; limit: number; remaining: number; resetMs: number; retryAfterSeconds: number } {
    const w = this.current(key);
    w.count++;
    return this.describe(w, 0, limit);
  }

  /** Whether the key is already over its limit, without counting. */
  peek(key: string, limit = this.limit) {
    return this.describe(this.current(key), 1, limit);
  }

  private describe(w: { start: number; count: number }, pending: number, limit: number) {
    const resetMs = w.start + this.windowMs;
    return {
      allowed: w.count + pending <= limit,
      limit,
      remaining: Math.max(0, limit - w.count),
      resetMs,
      retryAfterSeconds: Math.max(1, Math.ceil((resetMs - this.now()) / 1000)),
    };
  }

  private sweep(currentStart: number) {
    for (const [k, w] of this.windows) if (w.start !== currentStart) this.windows.delete(k);
  }
}
