/**
 * The one source of "now" for the server. Everything that compares against the current time
 * (token expiry, usage days, lock leases) reads it here so tests can control time in one place.
 */
let offsetMs = 0;

export const clock = {
  now(): Date {
    return new Date(Date.now() + offsetMs);
  },
  nowMs(): number {
    return Date.now() + offsetMs;
  },
  offsetMs(): number {
    return offsetMs;
  },
  /** Moves the clock forward (test control); never backwards. */
  advance(ms: number): void {
    if (ms > 0) offsetMs += ms;
  },
};

/** UTC calendar day (YYYY-MM-DD) of a date. */
export function utcDay(d: Date): string {
  return d.toISOString().slice(0, 10);
}
