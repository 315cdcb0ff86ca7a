/**
 * Durations and instants handlers give `step.sleep` / `step.sleepUntil`: a number of milliseconds,
 * or a string like "30s", "5m", "2h", "1d", "1w", "1 day", "90 minutes", "1h30m"; an instant as an
 * RFC 3339 string, a Date (sent as one) or epoch milliseconds.
 */
const UNIT_MS: Record<string, number> = {
  ms: 1,
  millisecond: 1,
  s: 1000,
  sec: 1000,
  second: 1000,
  m: 60_000,
  min: 60_000,
  minute: 60_000,
  h: 3_600_000,
  hr: 3_600_000,
  hour: 3_600_000,
  d: 86_400_000,
  day: 86_400_000,
  w: 604_800_000,
  week: 604_800_000,
};
/** A year: no sleep may be longer (a typo of units should fail loudly, not park an execution forever). */
export const MAX_SLEEP_MS = 366 * 86_400_000;

export function parseDuration(v: unknown): number | string {
  if (typeof v === "number") return Number.isFinite(v) && v >= 0 && v <= MAX_SLEEP_MS ? v : `a sleep's duration must be 0 to ${MAX_SLEEP_MS} ms, not ${v}`;
  if (typeof v !== "string" || !v.trim()) return `a sleep's duration must be milliseconds or a string like "30s", "5m", "1d" (got ${JSON.stringify(v)})`;
  const parts = v.trim().toLowerCase().matchAll(/(\d+(?:\.\d+)?)\s*([a-z]+)\s*/g);
  let total = 0;
  let consumed = 0;
  for (const [whole, n, unit] of parts) {
    const ms = UNIT_MS[unit!] ?? UNIT_MS[unit!.replace(/s$/, "")];
    if (ms === undefined) return `unknown unit "${unit}" in the sleep duration ${JSON.stringify(v)}`;
    total += Number(n) * ms;
    consumed += whole.length;
  }
  if (consumed !== v.trim().length || consumed === 0) return `cannot read the sleep duration ${JSON.stringify(v)}; use milliseconds or a string like "30s", "5m", "1d"`;
  return total <= MAX_SLEEP_MS ? total : `a sleep may last at most 366 days (got ${JSON.stringify(v)})`;
}

export function parseInstant(v: unknown): number | string {
  if (typeof v === "number" && Number.isFinite(v)) return v;
  if (typeof v === "string" && /^\d{4}-\d{2}-\d{2}T/.test(v)) {
    const t = Date.parse(v);
    if (Number.isFinite(t)) return t;
  }
  return `step.sleepUntil needs a Date, an RFC 3339 string or epoch milliseconds (got ${JSON.stringify(v)})`;
}
