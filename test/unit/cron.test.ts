import { scheduledJobs } from "croner";
import * as fc from "fast-check";
import { afterEach, describe, expect, test, vi } from "vitest";
import { _internal, checkMaxGap, MAX_GAP_MS, parseCron, type CronSchedule } from "../../server/schedulers/cron";

const MINUTE = 60_000;
const DAY = 86_400_000;
const at = (iso: string) => Date.parse(iso);
const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

function schedule(expr: string): CronSchedule {
  const r = parseCron(expr);
  if (!r.ok) throw new Error(`${expr}: ${r.error}`);
  return r.cron;
}

/** Syntax only (rule 2 skipped), for schedules rule 2 refuses. */
function compiled(expr: string): CronSchedule {
  const r = _internal.compile(expr);
  if (!r.ok) throw new Error(`${expr}: ${r.error}`);
  return r.cron;
}

function errorOf(expr: string): string {
  const r = parseCron(expr);
  if (r.ok) throw new Error(`${JSON.stringify(expr)} was accepted`);
  return r.error;
}

function runs(cron: CronSchedule, fromIso: string, n: number): string[] {
  const out: string[] = [];
  let t = at(fromIso);
  for (let i = 0; i < n; i++) {
    t = cron.nextAfter(t)!;
    out.push(new Date(t).toISOString());
  }
  return out;
}

/** UTC days in [from, to) on which a `0 0 ...` schedule runs. */
function runDays(cron: CronSchedule, fromIso: string, toIso: string): string[] {
  const out: string[] = [];
  for (let t = cron.nextAfter(at(fromIso) - 1); t !== null && t < at(toIso); t = cron.nextAfter(t)) out.push(iso(t)!.slice(0, 10));
  return out;
}

describe("rule 1: standard 5-field cron", () => {
  test("accepts ranges, steps, lists and names", () => {
    for (const expr of [
      "*/5 * * * *",
      "0 9-17 * * 1-5",
      "30 2 * JAN-JUN,jul-dec MON",
      "0 0 1 * *",
      "15 14 1 * *",
      "0 0 * * 0",
      "0 0 * * 7",
      "0-30/10 * * * *",
      "0 0 * * MON-SUN",
      "0 0 * * sat,SUN",
      "5,35 */2 1-31/2 * *",
      "  0\t0 * *  *  ",
    ]) {
      const r = parseCron(expr);
      expect(r.ok ? r.cron.expression : r.error, expr).toBe(expr.trim().split(/\s+/).join(" "));
    }
  });

  test("names, 7 for Sunday and steps mean what standard cron says", () => {
    expect(runs(schedule("0 0 * * 7"), "2026-01-01T00:00:00Z", 3)).toEqual(runs(schedule("0 0 * * 0"), "2026-01-01T00:00:00Z", 3));
    expect(runs(schedule("0 0 * * 7"), "2026-01-01T00:00:00Z", 1)).toEqual(["2026-01-04T00:00:00.000Z"]); // a Sunday
    expect(runs(schedule("0 0 * * MON-SUN"), "2026-01-01T00:00:00Z", 7).length).toBe(7);
    expect(runs(schedule("0 0 * * MON-SUN"), "2026-01-01T00:00:00Z", 2)).toEqual(["2026-01-02T00:00:00.000Z", "2026-01-03T00:00:00.000Z"]);
    expect(runs(schedule("0-30/10 * * * *"), "2026-01-01T00:00:00Z", 4)).toEqual([
      "2026-01-01T00:10:00.000Z",
      "2026-01-01T00:20:00.000Z",
      "2026-01-01T00:30:00.000Z",
      "2026-01-01T01:00:00.000Z",
    ]);
    // JAN-JUN,jul-dec: every month; MON: Mondays.
    expect(runs(schedule("30 2 * JAN-JUN,jul-dec MON"), "2026-06-30T00:00:00Z", 2)).toEqual(["2026-07-06T02:30:00.000Z", "2026-07-13T02:30:00.000Z"]);
  });

  test("refuses seconds, descriptors and Quartz syntax, naming the problem", () => {
    const fields = "Kiln takes standard 5-field cron (minute hour day-of-month month day-of-week)";
    expect(errorOf("* * * * * *")).toBe(`cron_expression has 6 fields; ${fields}, no seconds field`);
    expect(errorOf("0 0 12 * * * 2026")).toBe(`cron_expression has 7 fields; ${fields}, no seconds field`);
    expect(errorOf("@daily")).toBe("'@daily' descriptors are not supported; write the 5 fields (e.g. '0 0 * * *')");
    expect(errorOf("@hourly")).toBe("'@hourly' descriptors are not supported; write the 5 fields (e.g. '0 * * * *')");
    expect(errorOf("@reboot")).toMatch(/^'@reboot' descriptors are not supported/);
    expect(errorOf("@every 5m")).toMatch(/^'@every' descriptors are not supported/);
    expect(errorOf("0 0 ? * *")).toBe("'?' (Quartz syntax) is not supported in the day-of-month field; use '*'");
    expect(errorOf("0 0 * * ?")).toBe("'?' (Quartz syntax) is not supported in the day-of-week field; use '*'");
    expect(errorOf("0 0 L * *")).toBe("'L' (Quartz syntax) is not supported in the day-of-month field");
    expect(errorOf("0 0 LW * *")).toBe("'LW' (Quartz syntax) is not supported in the day-of-month field");
    expect(errorOf("0 0 15W * *")).toBe("'W' (Quartz syntax) is not supported in the day-of-month field");
    expect(errorOf("0 0 * * 5#3")).toBe("'#' (Quartz syntax) is not supported in the day-of-week field");
    expect(errorOf("0 0 * * 5L")).toBe("'L' (Quartz syntax) is not supported in the day-of-week field");
    expect(errorOf("0 0 * * FRIL")).toBe("'L' (Quartz syntax) is not supported in the day-of-week field");
  });

  test("refuses values out of range, bad names and malformed fields, naming the field", () => {
    const cases: [string, string][] = [
      ["60 * * * *", "cron_expression minute value 60 is out of range (0-59)"],
      ["* 24 * * *", "cron_expression hour value 24 is out of range (0-23)"],
      ["* * 0 * *", "cron_expression day-of-month value 0 is out of range (1-31)"],
      ["* * 32 * *", "cron_expression day-of-month value 32 is out of range (1-31)"],
      ["* * * 13 *", "cron_expression month value 13 is out of range (1-12)"],
      ["* * * 0 *", "cron_expression month value 0 is out of range (1-12)"],
      ["* * * * 8", "cron_expression day-of-week value 8 is out of range (0-7)"],
      ["0 0 * FOO *", "cron_expression month value 'FOO' is not a number or a month name (JAN-DEC)"],
      ["0 0 * * MONDAY", "cron_expression day-of-week value 'MONDAY' is not a number or a day name (SUN-SAT)"],
      ["0 0 * * JAN", "cron_expression day-of-week value 'JAN' is not a number or a day name (SUN-SAT)"],
      ["MON 0 * * *", "cron_expression minute value 'MON' is not a number (0-59)"],
      ["0 0 WED * *", "cron_expression day-of-month value 'WED' is not a number (1-31)"],
      ["1.5 * * * *", "cron_expression minute value '1.5' is not a number (0-59)"],
      ["5-1 * * * *", "cron_expression minute range '5-1' runs backwards; write it low-high"],
      ["0 0 * * 7-1", "cron_expression day-of-week range '7-1' runs backwards; write it low-high"],
      ["1- * * * *", "cron_expression minute range '1-' is not valid; write low-high"],
      ["1-2-3 * * * *", "cron_expression minute range '1-2-3' is not valid; write low-high"],
      ["*/0 * * * *", "cron_expression minute step 0 in '*/0' is out of range (1-60)"],
      ["*/61 * * * *", "cron_expression minute step 61 in '*/61' is out of range (1-60)"],
      ["0 0 * * */8", "cron_expression day-of-week step 8 in '*/8' is out of range (1-7)"],
      ["*/x * * * *", "cron_expression minute step 'x' in '*/x' is not a number"],
      ["*/5/2 * * * *", "cron_expression minute item '*/5/2' has more than one '/'"],
      ["5/10 * * * *", "cron_expression minute item '5/10' has a step without a range; write '5-59/10' or '*/10'"],
      ["/10 * * * *", "cron_expression minute item '/10' has a step without a range; write '*/10'"],
      ["1,,2 * * * *", "cron_expression minute field '1,,2' has an empty list item"],
      ["garbage", "cron_expression has 1 field; Kiln takes standard 5-field cron (minute hour day-of-month month day-of-week)"],
      ["0 0 * *", "cron_expression has 4 fields; Kiln takes standard 5-field cron (minute hour day-of-month month day-of-week)"],
      ["", "cron_expression is empty; write the 5 fields (minute hour day-of-month month day-of-week), e.g. '0 0 * * *'"],
      [" \t ", "cron_expression is empty; write the 5 fields (minute hour day-of-month month day-of-week), e.g. '0 0 * * *'"],
      ["0\u00a00 * * *", "cron_expression may only contain printable ASCII characters, spaces and tabs"],
      ["0 0\n* * *", "cron_expression may only contain printable ASCII characters, spaces and tabs"],
      [`0 0 * * ${"0,".repeat(130)}0`, "cron_expression is longer than 256 characters"],
    ];
    for (const [expr, error] of cases) expect(errorOf(expr), expr).toBe(error);
    expect(parseCron(`0 0 * * ${"0,".repeat(123)}0`).ok).toBe(true); // 255 characters
    expect(parseCron(123 as unknown as string)).toEqual({ ok: false, error: "cron_expression must be a string" });
  });

  test("nothing Kiln's grammar accepts is refused by croner", () => {
    const num = (lo: number, hi: number) => fc.integer({ min: lo, max: hi }).map(String);
    const item = (lo: number, hi: number, maxStep: number) =>
      fc.oneof(
        num(lo, hi),
        fc.constant("*"),
        fc.integer({ min: 1, max: maxStep }).map((s) => `*/${s}`),
        fc
          .tuple(fc.integer({ min: lo, max: hi }), fc.integer({ min: lo, max: hi }), fc.option(fc.integer({ min: 1, max: maxStep })))
          .map(([a, b, s]) => `${Math.min(a, b)}-${Math.max(a, b)}${s === null ? "" : `/${s}`}`),
      );
    const field = (lo: number, hi: number, maxStep: number) => fc.array(item(lo, hi, maxStep), { minLength: 1, maxLength: 3 }).map((a) => a.join(","));
    fc.assert(
      fc.property(field(0, 59, 60), field(0, 23, 24), field(1, 31, 31), field(1, 12, 12), field(0, 7, 7), (...f) => {
        const r = _internal.compile(f.join(" "));
        expect(r.ok ? "ok" : r.error).toBe("ok");
      }),
      { numRuns: 300 },
    );
  });
});

describe("rule 2: at most once a minute, at least once every 31 days", () => {
  test("expressions that never run are refused", () => {
    expect(errorOf("0 0 30 2 *")).toBe("cron_expression never runs: day-of-month '30' never occurs in month '2'");
    expect(errorOf("0 0 31 4 *")).toBe("cron_expression never runs: day-of-month '31' never occurs in month '4'");
    expect(errorOf("0 0 31 2,4,6,9,11 *")).toMatch(/never runs/);
  });

  test("gaps over 31 days are refused, with the longest gap found", () => {
    const tail = "a schedule must run at least once every 31 days";
    expect(errorOf("0 0 29 2 *")).toBe(`cron_expression can go 1461 days without running (2000-02-29T00:00Z to 2004-02-29T00:00Z); ${tail}`);
    expect(errorOf("0 0 1 1 *")).toBe(`cron_expression can go 366 days without running (2000-01-01T00:00Z to 2001-01-01T00:00Z); ${tail}`);
    expect(errorOf("0 0 1 */2 *")).toBe(`cron_expression can go 62 days without running (2000-07-01T00:00Z to 2000-09-01T00:00Z); ${tail}`);
    // Jan 31 -> Mar 31 is 59 or 60 days, but Mar 31 -> May 31 is 61.
    expect(errorOf("0 0 31 * *")).toBe(`cron_expression can go 61 days without running (2000-03-31T00:00Z to 2000-05-31T00:00Z); ${tail}`);
    expect(errorOf("0 0,23 1 */2 *")).toMatch(/^cron_expression can go 61 days 1 hour without running/);
    // Syntactically fine, but only January and July.
    expect(errorOf("30 2 * JAN,JUL MON")).toMatch(/^cron_expression can go 161 days without running/);
    expect(errorOf("0 0 28 2 *")).toMatch(/can go 366 days/);
    // 29th-31st: a common-year February has none of them (Jan 31 -> Mar 29).
    expect(errorOf("0 0 29-31 * *")).toMatch(/can go 57 days/);
  });

  test("monthly on the 1st passes with a longest gap of exactly 31 days", () => {
    expect(parseCron("0 0 1 * *").ok).toBe(true);
    expect(parseCron("59 23 1 * *").ok).toBe(true);
    expect(checkMaxGap(schedule("0 0 1 * *"))).toEqual({ ok: true });
    // One minute less than the limit and the 31-day gaps show up: the limit is met exactly.
    const tighter = checkMaxGap(schedule("0 0 1 * *"), MAX_GAP_MS - MINUTE);
    expect(tighter).toMatchObject({ ok: false, neverRuns: false, gapMs: 31 * DAY });
    for (const expr of ["0 0 28 * *", "0 12 * * MON", "0 0 28-31 * *", "0 0 * * *", "* * * * *"]) expect(parseCron(expr).ok, expr).toBe(true);
  });

  test("never more than once a minute, always at whole minutes", () => {
    const every = schedule("* * * * *");
    let t = every.nextAfter(at("2028-02-28T23:58:17.345Z"))!;
    expect(iso(t)).toBe("2028-02-28T23:59:00.000Z");
    for (let i = 0; i < 3000; i++) {
      const next = every.nextAfter(t)!;
      expect(next - t).toBe(MINUTE);
      t = next;
    }
    expect(iso(t)).toBe("2028-03-02T01:59:00.000Z"); // 50 hours on, through Feb 29
    // Even from inside a minute, the next run is the next whole minute.
    expect(iso(every.nextAfter(at("2026-01-01T00:00:59.999Z")))).toBe("2026-01-01T00:01:00.000Z");
    expect(iso(every.nextAfter(at("2026-01-01T00:00:00.001Z")))).toBe("2026-01-01T00:01:00.000Z");
  });

  test("one 28-year period decides rule 2 exactly as the full 400-year Gregorian cycle does", { timeout: 60_000 }, () => {
    const pick = (xs: string[]) => fc.constantFrom(...xs);
    fc.assert(
      fc.property(
        pick(["0", "59"]),
        pick(["0", "23", "0,12"]),
        pick(["*", "1", "15", "28", "29", "30", "31", "1,15", "*/2", "*/10", "29-31", "28-31", "1-7", "*/31"]),
        pick(["*", "*/2", "2", "1-6", "2-12", "1,3,5,7,8,10,12", "JAN-NOV", "*/3"]),
        pick(["*", "MON", "0", "5", "1-5", "*/3", "*/7", "SAT,SUN"]),
        (...fields) => {
          const cron = compiled(fields.join(" "));
          const short = checkMaxGap(cron);
          const long = checkMaxGap(cron, MAX_GAP_MS, 146_097);
          expect(short.ok, fields.join(" ")).toBe(long.ok);
          if (!short.ok && !long.ok) expect(short.neverRuns).toBe(long.neverRuns);
        },
      ),
      { numRuns: 25 },
    );
  });

  test("validating dense and sparse schedules is fast", () => {
    parseCron("0 0 1 * *"); // warm up the JIT: the cost being checked is the walk, not compilation
    for (const expr of ["* * * * *", "0 0 1 * *", "0 12 * * MON", "0 0 31 * *", "0 0 30 2 *"]) {
      const start = performance.now();
      parseCron(expr);
      const ms = performance.now() - start;
      expect(ms, `${expr} took ${ms.toFixed(1)} ms`).toBeLessThan(50);
    }
  });
});

describe("nextAfter", () => {
  test("is the next run strictly after the instant, in UTC", () => {
    const daily = schedule("0 0 * * *");
    // 2026-03-29 and 2026-10-25 are DST changes in Europe; UTC has none.
    expect(iso(daily.nextAfter(at("2026-03-29T00:30:00Z")))).toBe("2026-03-30T00:00:00.000Z");
    expect(iso(daily.nextAfter(at("2026-10-25T00:30:00Z")))).toBe("2026-10-26T00:00:00.000Z");
    expect(iso(daily.nextAfter(at("2026-03-30T00:00:00Z")))).toBe("2026-03-31T00:00:00.000Z");
    expect(iso(daily.nextAfter(at("2026-03-30T00:00:00Z") - 1))).toBe("2026-03-30T00:00:00.000Z");
    expect(iso(daily.previousBefore(at("2026-03-30T00:00:00Z")))).toBe("2026-03-29T00:00:00.000Z");
    expect(iso(daily.previousBefore(at("2026-03-30T00:00:00Z") + 1))).toBe("2026-03-30T00:00:00.000Z");

    expect(iso(schedule("15 14 1 * *").nextAfter(at("2026-01-31T12:00:00Z")))).toBe("2026-02-01T14:15:00.000Z");
    expect(iso(schedule("0 0 1 * *").nextAfter(at("2028-02-01T00:00:00Z")))).toBe("2028-03-01T00:00:00.000Z");
    expect(iso(schedule("0 0 28-31 * *").nextAfter(at("2028-02-28T00:00:00Z")))).toBe("2028-02-29T00:00:00.000Z");
    expect(iso(schedule("0 0 28-31 * *").nextAfter(at("2027-02-28T00:00:00Z")))).toBe("2027-03-28T00:00:00.000Z");
    // Friday 2026-01-09 after hours -> Monday 09:00.
    expect(iso(schedule("0 9-17 * * 1-5").nextAfter(at("2026-01-09T17:30:00Z")))).toBe("2026-01-12T09:00:00.000Z");
    expect(runs(schedule("*/5 * * * *"), "2026-12-31T23:52:00Z", 3)).toEqual([
      "2026-12-31T23:55:00.000Z",
      "2027-01-01T00:00:00.000Z",
      "2027-01-01T00:05:00.000Z",
    ]);
    expect(daily.nextAfter(Number.NaN)).toBeNull();
    expect(daily.nextAfter(at("9999-12-31T12:00:00Z"))).toBeNull();
  });

  describe("does not depend on the host time zone", () => {
    const saved = process.env.TZ;
    afterEach(() => {
      if (saved === undefined) delete process.env.TZ;
      else process.env.TZ = saved;
    });
    for (const tz of ["Europe/Berlin", "America/New_York", "Pacific/Chatham", "Asia/Kolkata"]) {
      test(tz, () => {
        process.env.TZ = tz;
        expect(new Date(at("2026-07-01T00:00:00Z")).getTimezoneOffset()).not.toBe(0); // the host zone really changed
        expect(runs(schedule("0 0 * * *"), "2026-03-28T12:00:00Z", 3)).toEqual([
          "2026-03-29T00:00:00.000Z",
          "2026-03-30T00:00:00.000Z",
          "2026-03-31T00:00:00.000Z",
        ]);
        expect(runs(schedule("30 1 * * SUN"), "2026-10-24T00:00:00Z", 2)).toEqual(["2026-10-25T01:30:00.000Z", "2026-11-01T01:30:00.000Z"]);
        expect(parseCron("0 0 1 * *").ok).toBe(true);
        expect(errorOf("0 0 31 * *")).toMatch(/can go 61 days/);
      });
    }
  });
});

describe("day-of-month and day-of-week together (Vixie cron)", () => {
  test("both restricted: either one matching is enough", () => {
    const days = runDays(schedule("0 0 13 * FRI"), "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z");
    const expected: string[] = [];
    for (let t = at("2026-01-01T00:00:00Z"); t < at("2027-01-01T00:00:00Z"); t += DAY) {
      const d = new Date(t);
      if (d.getUTCDate() === 13 || d.getUTCDay() === 5) expected.push(iso(t)!.slice(0, 10));
    }
    expect(days).toEqual(expected);
    expect(days).toContain("2026-01-13"); // a Tuesday
    expect(days).toContain("2026-01-02"); // a Friday
    expect(days).toContain("2026-02-13"); // Friday the 13th, once
    expect(days.length).toBe(52 + 12 - 3); // Fridays + 13ths - Fridays the 13th (Feb, Mar, Nov)
  });

  test("a day field starting with '*' counts as unrestricted, so both must match", () => {
    // '*/2' starts with '*': odd days that are Mondays, not odd days or Mondays.
    expect(runDays(schedule("0 0 */2 * MON"), "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")).toEqual(["2026-01-05", "2026-01-19"]);
    // '*/1' starts with '*': the 1st of the month only.
    expect(runDays(schedule("0 0 1 * */1"), "2026-01-01T00:00:00Z", "2026-04-01T00:00:00Z")).toEqual(["2026-01-01", "2026-02-01", "2026-03-01"]);
    // Days 1-7 or any Sunday; but '*/7' (Sundays, starting with '*') makes it the first Sunday of
    // the month, up to 35 days apart, which rule 2 refuses.
    expect(parseCron("0 0 1-7 * 0").ok).toBe(true);
    expect(runDays(compiled("0 0 1-7 * */7"), "2026-01-01T00:00:00Z", "2026-04-01T00:00:00Z")).toEqual(["2026-01-04", "2026-02-01", "2026-03-01"]);
    expect(errorOf("0 0 1-7 * */7")).toMatch(/can go 35 days/);
  });

  test("run days match a reference Vixie cron matcher", () => {
    const monthNames = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
    const dayNames = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    const expand = (text: string, lo: number, hi: number, names: string[] = [], base = 0) => {
      const value = (v: string) => (/^\d+$/.test(v) ? Number(v) : names.indexOf(v.toUpperCase()) + base);
      const set = new Set<number>();
      for (const item of text.split(",")) {
        const [range, step = "1"] = item.split("/") as [string, string?];
        const [a, b] = range === "*" ? [lo, hi] : range.includes("-") ? range.split("-").map(value) : [value(range), value(range)];
        for (let v = a!; v <= (b === 0 && a! > 0 ? 7 : b!); v += Number(step)) set.add(v);
      }
      return set;
    };
    const pick = (xs: string[]) => fc.constantFrom(...xs);
    fc.assert(
      fc.property(
        pick(["*", "1", "13", "31", "1,15", "*/2", "*/5", "1-7", "10-20/3", "*,5", "5,*"]),
        pick(["*", "2", "*/3", "JAN-MAR", "jun,DEC"]),
        pick(["*", "FRI", "0", "7", "1-5", "*/2", "*/7", "SAT-SUN", "MON-SUN", "*,3"]),
        (dom, month, dow) => {
          const D = expand(dom, 1, 31);
          const M = expand(month, 1, 12, monthNames, 1);
          const W = new Set([...expand(dow, 0, 7, dayNames)].map((d) => d % 7));
          const both = dom.startsWith("*") || dow.startsWith("*");
          const expected: string[] = [];
          for (let t = at("2026-01-01T00:00:00Z"); t < at("2028-01-01T00:00:00Z"); t += DAY) {
            const d = new Date(t);
            const [dm, dw] = [D.has(d.getUTCDate()), W.has(d.getUTCDay())];
            if (M.has(d.getUTCMonth() + 1) && (both ? dm && dw : dm || dw)) expected.push(iso(t)!.slice(0, 10));
          }
          const expr = `0 0 ${dom} ${month} ${dow}`;
          expect(runDays(compiled(expr), "2026-01-01T00:00:00Z", "2028-01-01T00:00:00Z"), expr).toEqual(expected);
        },
      ),
      { numRuns: 150 },
    );
  });
});

describe("no timers", () => {
  test("parsing and computing runs starts no timer and registers no croner job", () => {
    vi.useFakeTimers();
    try {
      const cron = schedule("*/5 * * * *");
      cron.nextAfter(Date.now());
      parseCron("0 0 1 * *");
      parseCron("0 0 31 * *");
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
    expect(scheduledJobs).toHaveLength(0);
  });
});
