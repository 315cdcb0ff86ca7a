// When a backup schedule entry runs next (UTC): daily at the hour, weekly on an ISO weekday, monthly on a day 1-28.
import { describe, expect, test } from "vitest";
import { nextRun } from "../../server/databases/backups";

const at = (iso: string) => new Date(iso).getTime();
const iso = (ms: number) => new Date(ms).toISOString();

describe("nextRun", () => {
  test("daily: later today, else tomorrow; exactly at the instant counts as passed", () => {
    expect(iso(nextRun({ frequency: "daily", hour: 3 }, at("2026-03-10T02:59:59Z")))).toBe("2026-03-10T03:00:00.000Z");
    expect(iso(nextRun({ frequency: "daily", hour: 3 }, at("2026-03-10T03:00:00Z")))).toBe("2026-03-11T03:00:00.000Z");
    expect(iso(nextRun({ frequency: "daily", hour: 0 }, at("2026-12-31T23:30:00Z")))).toBe("2027-01-01T00:00:00.000Z");
  });

  test("weekly: day 1 is Monday, 7 Sunday", () => {
    // 2026-03-10 is a Tuesday.
    expect(iso(nextRun({ frequency: "weekly", hour: 5, day: 2 }, at("2026-03-10T04:00:00Z")))).toBe("2026-03-10T05:00:00.000Z");
    expect(iso(nextRun({ frequency: "weekly", hour: 5, day: 2 }, at("2026-03-10T06:00:00Z")))).toBe("2026-03-17T05:00:00.000Z");
    expect(iso(nextRun({ frequency: "weekly", hour: 0, day: 1 }, at("2026-03-10T06:00:00Z")))).toBe("2026-03-16T00:00:00.000Z");
    expect(iso(nextRun({ frequency: "weekly", hour: 23, day: 7 }, at("2026-03-10T06:00:00Z")))).toBe("2026-03-15T23:00:00.000Z");
  });

  test("monthly: this month's day if still ahead, else next month's (across a year)", () => {
    expect(iso(nextRun({ frequency: "monthly", hour: 1, day: 28 }, at("2026-02-27T00:00:00Z")))).toBe("2026-02-28T01:00:00.000Z");
    expect(iso(nextRun({ frequency: "monthly", hour: 1, day: 28 }, at("2026-02-28T01:00:00Z")))).toBe("2026-03-28T01:00:00.000Z");
    expect(iso(nextRun({ frequency: "monthly", hour: 12, day: 1 }, at("2026-12-15T00:00:00Z")))).toBe("2027-01-01T12:00:00.000Z");
  });
});
