// The platform clock's timers under a controlled move: one-off timers fire once each in due order,
// with now() at their own due instant; a repeating sweep (`every`) that a move carries past several
// of its due instants runs once, at the last of them, and goes on from there.
import { describe, expect, test } from "vitest";
import { PlatformClock } from "../../server/clock";

const HOUR = 3_600_000;

describe("PlatformClock", () => {
  test("one-off timers in a move fire in due order, each with now() at its due instant", async () => {
    const start = Date.UTC(2030, 0, 1);
    const clock = new PlatformClock(undefined, start);
    const seen: [string, number][] = [];
    clock.at(start + 3 * HOUR, () => seen.push(["c", clock.nowMs()]));
    clock.at(start + 1 * HOUR, () => seen.push(["a", clock.nowMs()]));
    clock.at(start + 2 * HOUR, () => seen.push(["b", clock.nowMs()]));
    await clock.advance(5 * HOUR);
    expect(seen.map(([n]) => n)).toEqual(["a", "b", "c"]);
    // Each ran at its instant (the clock also runs at the real rate: a few ms at most).
    seen.forEach(([, at], i) => expect(at - (start + (i + 1) * HOUR)).toBeLessThan(1000));
    expect(clock.nowMs() - (start + 5 * HOUR)).toBeLessThan(1000);
    clock.stop();
  });

  test("a sweep carried past many due instants runs once, at the last, among the one-off timers in order; then every interval again", async () => {
    const start = Date.UTC(2030, 0, 1);
    const clock = new PlatformClock(undefined, start);
    const runs: number[] = [];
    const order: string[] = [];
    clock.every(HOUR, () => {
      runs.push(clock.nowMs());
      order.push("sweep");
    });
    // A one-off timer after the sweep's last due instant in the move, one before it.
    clock.at(start + 30.5 * HOUR, () => order.push("after"));
    clock.at(start + 2.5 * HOUR, () => order.push("before"));
    await clock.advance(31 * HOUR + 30 * 60_000);
    // 31 due instants skipped: one run, at the 31st hour.
    expect(runs).toHaveLength(1);
    expect(Math.abs(runs[0]! - (start + 31 * HOUR))).toBeLessThan(1000);
    expect(order).toEqual(["before", "after", "sweep"]);
    // From there every hour, once per hour when moved an hour at a time.
    for (let i = 0; i < 3; i++) await clock.advance(HOUR);
    expect(runs).toHaveLength(4);
    runs.slice(1).forEach((at, i) => expect(Math.abs(at - (start + (32 + i) * HOUR))).toBeLessThan(1000));
    clock.stop();
  });

  test("a cancelled sweep runs no more", async () => {
    const clock = new PlatformClock();
    let runs = 0;
    const h = clock.every(HOUR, () => void runs++);
    await clock.advance(HOUR);
    expect(runs).toBe(1);
    h.cancel();
    await clock.advance(10 * HOUR);
    expect(runs).toBe(1);
    clock.stop();
  });
});
