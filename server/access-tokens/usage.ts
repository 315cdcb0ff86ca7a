import { utcDay } from "../clock";
import { FlushLoop } from "../store/flush-loop";
import type { ControlStore } from "../store/store";

/**
 * Counts project-token requests in memory and writes them to the store in batches, so recording
 * usage never adds a store write to a request. Reads of usage flush first, so they are exact for
 * this instance; counts are added (not set), so several instances sharing a store sum correctly.
 */
export class TokenUsage {
  private pending = new Map<string, { days: Map<string, number>; lastUsed: Date }>();
  private readonly loop: FlushLoop;

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    log: { error: (m: string, e?: unknown) => void },
  ) {
    this.loop = new FlushLoop(() => this.write(), (e) => log.error("token usage flush failed", e));
  }

  start(intervalMs = 1000): void {
    this.loop.start(intervalMs);
  }

  record(tokenId: string): void {
    const at = this.now();
    let e = this.pending.get(tokenId);
    if (!e) this.pending.set(tokenId, (e = { days: new Map(), lastUsed: at }));
    const day = utcDay(at);
    e.days.set(day, (e.days.get(day) ?? 0) + 1);
    e.lastUsed = at;
  }

  /** Writes what is pending (reads of usage call this first). */
  flush(): Promise<void> {
    return this.loop.flush();
  }

  private async write(): Promise<void> {
    if (this.pending.size === 0) return;
    const batch = this.pending;
    this.pending = new Map();
    try {
      await this.store.transaction(async (tx) => {
        for (const [tokenId, e] of batch) {
          let total = 0;
          for (const [day, n] of e.days) {
            total += n;
            await tx.query(
              `insert into access_token_usage (token_id, day, requests) values ($1, $2::date, $3)
               on conflict (token_id, day) do update set requests = access_token_usage.requests + excluded.requests`,
              [tokenId, day, n],
            );
          }
          await tx.query(
            `update access_tokens set all_time_requests = all_time_requests + $2,
               last_used_at = greatest(coalesce(last_used_at, $3::timestamptz), $3::timestamptz) where id = $1`,
            [tokenId, total, e.lastUsed.toISOString()],
          );
        }
      });
    } catch (err) {
      // Put the counts back so a store hiccup loses nothing.
      for (const [tokenId, e] of batch) {
        const cur = this.pending.get(tokenId);
        if (!cur) this.pending.set(tokenId, e);
        else {
          for (const [d, n] of e.days) cur.days.set(d, (cur.days.get(d) ?? 0) + n);
          if (e.lastUsed > cur.lastUsed) cur.lastUsed = e.lastUsed;
        }
      }
      throw err;
    }
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }
}
