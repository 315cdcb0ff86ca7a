/**
 * Writes of counters kept in memory (token usage, database activity): every interval and on demand,
 * one at a time. A failed write does not stop later ones; its caller (or the log) hears about it.
 */
export class FlushLoop {
  private timer: ReturnType<typeof setInterval> | null = null;
  private last: Promise<void> = Promise.resolve();

  constructor(
    private readonly write: () => Promise<void>,
    private readonly onError: (err: unknown) => void,
  ) {}

  start(intervalMs = 1000): void {
    this.timer = setInterval(() => void this.flush().catch(this.onError), intervalMs);
    this.timer.unref?.();
  }

  /** Runs after any write under way; concurrent callers each wait for their own turn. */
  flush(): Promise<void> {
    const run = this.last.catch(() => {}).then(() => this.write());
    this.last = run;
    return run;
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.flush().catch(this.onError);
  }
}
