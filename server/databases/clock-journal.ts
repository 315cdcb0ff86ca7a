import { appendFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { dirname } from "node:path";
import type { Clock } from "../clock";

/**
 * Which real instant a platform-clock instant was, and back: the production engine's point-in-time
 * restore needs it, because the server's WAL carries the server's real time while the API speaks the
 * platform clock. The platform clock is real time plus an offset that only grows (`--clock-start`
 * sets it once; with `--controllable-clock` an advance adds to it); the journal notes every offset
 * it sees, with the real instant it saw it, sampling every `sampleMs` (default 10 ms) of real time.
 * A move of the clock is therefore placed within `sampleMs` of when it happened; a commit that close
 * to a move may fall on either side of it. Kept in a file so that restarts keep the history.
 */
export class ClockJournal {
  /** (real ms, offset ms) from then on, in real-time order. */
  private entries: { realMs: number; offsetMs: number }[] = [];
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(
    private readonly clock: Pick<Clock, "offsetMs">,
    private readonly file: string | null,
    sampleMs = 10,
  ) {
    if (file && existsSync(file))
      for (const line of readFileSync(file, "utf8").split("\n")) {
        try {
          if (line) this.entries.push(JSON.parse(line));
        } catch {
          // a torn last line
        }
      }
    this.sample();
    this.timer = setInterval(() => this.sample(), sampleMs);
    this.timer.unref?.();
  }

  private sample(): void {
    const offsetMs = this.clock.offsetMs();
    const last = this.entries[this.entries.length - 1];
    if (last && last.offsetMs === offsetMs) return;
    const e = { realMs: Date.now(), offsetMs };
    this.entries.push(e);
    if (this.file) {
      mkdirSync(dirname(this.file), { recursive: true });
      appendFileSync(this.file, `${JSON.stringify(e)}\n`);
    }
  }

  /** The platform instant real instant `realMs` was. */
  platformAt(realMs: number): number {
    this.sample();
    let offset = this.entries[0]!.offsetMs;
    for (const e of this.entries) {
      if (e.realMs > realMs) break;
      offset = e.offsetMs;
    }
    return realMs + offset;
  }

  /**
   * The real instant at which the platform clock read `platformMs`: the latest real instant whose
   * platform time is at or before it. An instant the clock jumped over maps to the jump.
   */
  realAt(platformMs: number): number {
    this.sample();
    for (let i = this.entries.length - 1; i >= 0; i--) {
      const e = this.entries[i]!;
      const end = i + 1 < this.entries.length ? this.entries[i + 1]!.realMs : Infinity;
      if (platformMs >= e.realMs + e.offsetMs) return Math.min(platformMs - e.offsetMs, end);
    }
    return platformMs - this.entries[0]!.offsetMs;
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
