// Latency histograms: p95 read from merged bucket counts stays within a bucket's width of the exact
// percentile of the raw samples, for any samples; merging per-minute histograms equals one histogram.
import * as fc from "fast-check";
import { describe, expect, test } from "vitest";
import { BUCKET_BOUNDS_MS, BUCKETS, bucketOf, mergeInto, quantile } from "../../server/metrics/histogram";

function histogram(samples: number[]): { counts: number[]; max: number } {
  const counts = new Array(BUCKETS).fill(0);
  for (const s of samples) counts[bucketOf(s)]++;
  return { counts, max: Math.max(0, ...samples) };
}

/** The exact q-quantile by rank ceil(q * n) of the sorted samples (what a sort would give). */
function exact(samples: number[], q: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)]!;
}

describe("latency histogram", () => {
  test("bucketOf puts a latency in the first bucket whose upper bound it does not exceed", () => {
    expect(bucketOf(0)).toBe(0);
    expect(bucketOf(1)).toBe(0);
    expect(bucketOf(1.0001)).toBe(1);
    expect(bucketOf(500)).toBe(BUCKET_BOUNDS_MS.indexOf(500));
    expect(bucketOf(501)).toBe(BUCKET_BOUNDS_MS.indexOf(600));
    expect(bucketOf(1e9)).toBe(BUCKETS - 1);
    for (let i = 1; i < BUCKETS - 2; i++) expect(BUCKET_BOUNDS_MS[i + 1]! / BUCKET_BOUNDS_MS[i]!).toBeLessThanOrEqual(3);
  });

  test("no samples: no quantile", () => {
    expect(quantile(new Array(BUCKETS).fill(0), 0.95, 0)).toBeNull();
  });

  test("p95 of 18 quick samples and 2 slow ones is a slow one; with 40 quick ones it is quick", () => {
    const slow = [...new Array(18).fill(3), 480, 520];
    const h = histogram(slow);
    const p = quantile(h.counts, 0.95, h.max)!;
    expect(p).toBeGreaterThan(400);
    expect(p).toBeLessThanOrEqual(520);
    const h2 = histogram([...slow, ...new Array(22).fill(3)]);
    expect(quantile(h2.counts, 0.95, h2.max)!).toBeLessThanOrEqual(3);
  });

  test("for any samples, p95 from the histogram lies in the bucket of the exact p95 (never above the largest sample)", () => {
    fc.assert(
      fc.property(fc.array(fc.double({ min: 0, max: 200_000, noNaN: true }), { minLength: 1, maxLength: 400 }), (samples) => {
        const { counts, max } = histogram(samples);
        const p = quantile(counts, 0.95, max)!;
        const e = exact(samples, 0.95);
        const b = bucketOf(e);
        const lower = b === 0 ? 0 : BUCKET_BOUNDS_MS[b - 1]!;
        const upper = BUCKET_BOUNDS_MS[b]!;
        expect(p).toBeGreaterThanOrEqual(lower - 1e-9);
        expect(p).toBeLessThanOrEqual(Math.min(upper, max) + 1e-9);
      }),
      { numRuns: 2000 },
    );
  });

  test("merging per-minute histograms gives the histogram of all their samples", () => {
    fc.assert(
      fc.property(fc.array(fc.array(fc.double({ min: 0, max: 10_000, noNaN: true }), { maxLength: 50 }), { minLength: 1, maxLength: 10 }), (minutes) => {
        const merged = new Array(BUCKETS).fill(0);
        for (const m of minutes) mergeInto(merged, histogram(m).counts);
        expect(merged).toEqual(histogram(minutes.flat()).counts);
      }),
    );
  });
});
