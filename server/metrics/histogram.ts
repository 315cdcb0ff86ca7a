/**
 * Latency histograms: counts per bucket of fixed, roughly logarithmic upper bounds (20-33% apart
 * up to 20 s, wider beyond), so per-minute histograms add up across minutes, regions and
 * instances, and a p95 is read from the merged counts rather than by sorting raw samples. Within
 * the bucket holding the rank the value is interpolated linearly, then capped by the largest
 * latency seen: it always lies in the bucket of the exact percentile.
 */
export const BUCKET_BOUNDS_MS = [
  1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 150, 200, 250, 300, 400, 500, 600, 800, 1000, 1200, 1500, 2000, 2500, 3000, 4000, 5000,
  6000, 8000, 10_000, 12_000, 15_000, 20_000, 30_000, 45_000, 60_000, 90_000, 120_000, 300_000, 900_000, Infinity,
] as const;

export const BUCKETS = BUCKET_BOUNDS_MS.length;

/** The bucket of a latency: the first whose upper bound it does not exceed. */
export function bucketOf(ms: number): number {
  let lo = 0;
  let hi = BUCKETS - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ms <= BUCKET_BOUNDS_MS[mid]!) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** Adds `from` into `into` (same bucket layout); shorter arrays count as zeros. */
export function mergeInto(into: number[], from: readonly number[]): void {
  for (let i = 0; i < from.length && i < BUCKETS; i++) into[i] = (into[i] ?? 0) + (from[i] ?? 0);
}

/** The q-quantile (0..1) of a histogram, or null when it holds no samples. */
export function quantile(counts: readonly number[], q: number, maxMs: number): number | null {
  let total = 0;
  for (const c of counts) total += c;
  if (total === 0) return null;
  const rank = q * total;
  let seen = 0;
  for (let i = 0; i < BUCKETS; i++) {
    const c = counts[i] ?? 0;
    if (c === 0) continue;
    if (seen + c >= rank) {
      const lower = i === 0 ? 0 : BUCKET_BOUNDS_MS[i - 1]!;
      const upper = Math.min(BUCKET_BOUNDS_MS[i]!, Math.max(maxMs, lower));
      const v = lower + ((rank - seen) / c) * (upper - lower);
      return Math.min(v, maxMs);
    }
    seen += c;
  }
  return maxMs;
}
