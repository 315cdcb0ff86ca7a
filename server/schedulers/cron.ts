/**
 * Cron expressions for function schedulers (spec "Function schedulers", rules 1 and 2).
 *
 * Kiln takes standard 5-field cron (minute hour day-of-month month day-of-week) evaluated in UTC,
 * with the semantics of Vixie cron / cronie. Kiln validates the grammar itself so every refusal
 * names the field and the problem, and so nothing croner accepts beyond standard cron (seconds,
 * years, `@` descriptors, Quartz `?` `L` `W` `#`, `5/10` steps) gets through. croner then only
 * computes occurrences: it is built without a callback, so it never starts a timer; Kiln fires
 * ticks on its own platform clock.
 */
import { Cron } from "croner";

export const MAX_CRON_LENGTH = 256;
const MINUTE_MS = 60_000;
const DAY_MS = 86_400_000;
/** Rule 2: a schedule must run at least once every 31 days. */
export const MAX_GAP_MS = 31 * DAY_MS;
/**
 * Cron has no year field, so its runs depend only on dates and weekdays. Those repeat every 28
 * years between 1901 and 2099, and any stretch of up to a year anywhere (around 2100 too) has the
 * dates and weekdays of a stretch inside one such period. So a 31-day stretch without runs exists
 * at all if and only if one exists in a single 28-year period, which is what checkMaxGap walks.
 */
const PERIOD_DAYS = 28 * 365 + 7;
const WALK_FROM_MS = Date.UTC(2000, 0, 1);

const FIELD_LIST = "minute hour day-of-month month day-of-week";

export interface CronSchedule {
  /** The expression with its fields separated by single spaces. */
  readonly expression: string;
  /** The next occurrence strictly after `ms` (epoch ms), always at a whole UTC minute; null past year 9999. */
  nextAfter(ms: number): number | null;
  /** The latest occurrence strictly before `ms` (epoch ms); null if there is none. */
  previousBefore(ms: number): number | null;
}

export type ParseCronResult = { ok: true; cron: CronSchedule } | { ok: false; error: string };

export type GapCheck =
  | { ok: true }
  | { ok: false; neverRuns: true }
  /** The longest gap over the limit found in one calendar period, with the runs it lies between. */
  | { ok: false; neverRuns: false; gapMs: number; fromMs: number; toMs: number };

type Field = { name: string; min: number; max: number; maxStep: number; names?: readonly string[]; nameKind?: string };

const MONTH_NAMES = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const DAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

// maxStep matches croner's own limit (the number of distinct values), so nothing Kiln accepts is refused there.
const FIELDS: readonly Field[] = [
  { name: "minute", min: 0, max: 59, maxStep: 60 },
  { name: "hour", min: 0, max: 23, maxStep: 24 },
  { name: "day-of-month", min: 1, max: 31, maxStep: 31 },
  { name: "month", min: 1, max: 12, maxStep: 12, names: MONTH_NAMES, nameKind: "month name (JAN-DEC)" },
  { name: "day-of-week", min: 0, max: 7, maxStep: 7, names: DAY_NAMES, nameKind: "day name (SUN-SAT)" },
];
const DOM = FIELDS[2]!;
const DOW = FIELDS[4]!;

// Equivalents for the descriptors that have one within rule 2; the rest get a generic example.
const DESCRIPTOR_EXAMPLES: Record<string, string> = {
  "@hourly": "0 * * * *",
  "@daily": "0 0 * * *",
  "@midnight": "0 0 * * *",
  "@weekly": "0 0 * * 0",
  "@monthly": "0 0 1 * *",
};

export function parseCron(expr: string): ParseCronResult {
  const compiled = compile(expr);
  if (!compiled.ok) return compiled;
  const { cron, fields } = compiled;
  const gap = checkMaxGap(cron);
  if (!gap.ok) {
    if (gap.neverRuns) return fail(`cron_expression never runs: day-of-month '${fields[2]}' never occurs in month '${fields[3]}'`);
    return fail(
      `cron_expression can go ${formatDuration(gap.gapMs)} without running (${minuteIso(gap.fromMs)} to ${minuteIso(gap.toMs)}); ` +
        "a schedule must run at least once every 31 days",
    );
  }
  return { ok: true, cron };
}

/** Rule 1: syntax only. */
function compile(expr: string): { ok: true; cron: CronSchedule; fields: string[] } | { ok: false; error: string } {
  if (typeof expr !== "string") return fail("cron_expression must be a string");
  if (expr.length > MAX_CRON_LENGTH) return fail(`cron_expression is longer than ${MAX_CRON_LENGTH} characters`);
  const trimmed = expr.trim();
  if (trimmed === "") return fail(`cron_expression is empty; write the 5 fields (${FIELD_LIST}), e.g. '0 0 * * *'`);
  if (/[^\x20-\x7e\t]/.test(trimmed)) return fail("cron_expression may only contain printable ASCII characters, spaces and tabs");
  if (trimmed.startsWith("@")) {
    const descriptor = trimmed.split(/\s+/)[0]!;
    const example = DESCRIPTOR_EXAMPLES[descriptor.toLowerCase()] ?? "0 0 * * *";
    return fail(`'${descriptor}' descriptors are not supported; write the 5 fields (e.g. '${example}')`);
  }
  const parts = trimmed.split(/[ \t]+/);
  if (parts.length !== 5) {
    const count = `cron_expression has ${parts.length} field${parts.length === 1 ? "" : "s"}`;
    const seconds = parts.length === 6 || parts.length === 7 ? ", no seconds field" : "";
    return fail(`${count}; Kiln takes standard 5-field cron (${FIELD_LIST})${seconds}`);
  }
  const normalized: string[] = [];
  for (let i = 0; i < 5; i++) {
    const field = checkField(FIELDS[i]!, parts[i]!);
    if ("error" in field) return fail(field.error);
    normalized.push(field.text);
  }

  let cron: CronSchedule;
  try {
    cron = new CronerSchedule(parts.join(" "), normalized);
  } catch (e) {
    // Kiln's own checks should have refused anything croner refuses; this is a safety net.
    return fail(`cron_expression is not valid: ${String((e as Error)?.message ?? e).replace(/^CronPattern:\s*/, "")}`);
  }
  return { ok: true, cron, fields: parts };
}

/**
 * Rule 2. Walks the runs of one whole calendar period, jumping each time to the latest run within
 * the limit: the gaps jumped over are all within the limit, and two jumps always cover more than
 * the limit, so a dense schedule such as `* * * * *` takes a few hundred steps rather than one per
 * minute, while every gap over the limit is still measured exactly (the longest is reported). The
 * "at most once a minute" half of rule 2 holds by construction: 5 fields, and croner's 5-part
 * mode pins seconds to 0.
 */
export function checkMaxGap(schedule: CronSchedule, limitMs: number = MAX_GAP_MS, periodDays: number = PERIOD_DAYS): GapCheck {
  const periodMs = periodDays * DAY_MS;
  const first = schedule.nextAfter(WALK_FROM_MS - 1);
  if (first === null || first >= WALK_FROM_MS + periodMs) return { ok: false, neverRuns: true };
  // The runs repeat with the period, so the gaps from `first` to `first + period` are all of them.
  const end = first + periodMs;
  let worst: GapCheck = { ok: true };
  let t = first;
  while (t < end) {
    const latest = schedule.previousBefore(t + limitMs + 1);
    if (latest !== null && latest > t) {
      t = latest;
      continue;
    }
    const next = schedule.nextAfter(t) ?? Infinity;
    if (worst.ok || (!worst.neverRuns && next - t > worst.gapMs)) worst = { ok: false, neverRuns: false, gapMs: next - t, fromMs: t, toMs: next };
    t = next;
  }
  return worst;
}

class CronerSchedule implements CronSchedule {
  readonly #cron: Cron;

  /** `fields`: the five fields with names already turned into numbers. */
  constructor(
    readonly expression: string,
    fields: string[],
  ) {
    const [, , dom, , dow] = fields as [string, string, string, string, string];
    // No callback: croner only schedules (and only then starts a timer) when given a function.
    // No `name`: it would register the job in croner's global scheduledJobs list.
    this.#cron = new Cron(fields.join(" "), {
      // utcOffset 0 rather than timezone "UTC": same result, ~10x faster (no Intl lookups).
      utcOffset: 0,
      mode: "5-part",
      // Vixie cron / cronie: a day field starting with '*' (even '*/2' or '*,5') counts as
      // unrestricted and then both day fields must match; otherwise either matching is enough
      // (`0 0 13 * FRI` runs on every 13th and every Friday). croner's `domAndDow` replaces the
      // deprecated `legacyMode`; its default (false, OR) alone would OR even for '*/2'.
      domAndDow: dom.startsWith("*") || dow.startsWith("*"),
      alternativeWeekdays: false,
      sloppyRanges: false,
    });
  }

  nextAfter(ms: number): number | null {
    if (!Number.isFinite(ms)) return null;
    return this.#cron.nextRun(new Date(ms))?.getTime() ?? null;
  }

  previousBefore(ms: number): number | null {
    if (!Number.isFinite(ms)) return null;
    // croner also returns a run earlier in the same second as the reference; runs are at whole
    // minutes, so that is still strictly before `ms`.
    return this.#cron.previousRuns(1, new Date(ms))[0]?.getTime() ?? null;
  }
}

/**
 * One field's grammar: item[,item...], item = '*' | value | value-value, each optionally /step.
 * Returns the field with names replaced by numbers (so croner's own name handling never matters),
 * or the error.
 */
function checkField(field: Field, text: string): { text: string } | { error: string } {
  const quartz = quartzSyntax(field, text);
  if (quartz) return { error: quartz };
  const items = text.split(",");
  if (items.some((item) => item === "")) return { error: `cron_expression ${field.name} field '${text}' has an empty list item` };
  const out: string[] = [];
  for (const item of items) {
    const slash = item.split("/");
    if (slash.length > 2) return { error: `cron_expression ${field.name} item '${item}' has more than one '/'` };
    const [range, stepText] = slash as [string, string | undefined];
    let step = "";
    if (stepText !== undefined) {
      if (!/^\d+$/.test(stepText)) return { error: `cron_expression ${field.name} step '${stepText}' in '${item}' is not a number` };
      const n = Number(stepText);
      if (n < 1 || n > field.maxStep) return { error: `cron_expression ${field.name} step ${stepText} in '${item}' is out of range (1-${field.maxStep})` };
      step = `/${n}`;
    }
    if (range === "*") {
      out.push(`*${step}`);
      continue;
    }
    if (range === "") return { error: `cron_expression ${field.name} item '${item}' has a step without a range; write '*/${stepText}'` };
    const ends = range.split("-");
    if (ends.length > 2 || ends.includes("")) return { error: `cron_expression ${field.name} range '${range}' is not valid; write low-high` };
    const low = fieldValue(field, ends[0]!, null);
    if (typeof low === "string") return { error: low };
    if (ends.length === 1) {
      // Crons disagree on '5/10' (Vixie cron refuses it, others read '5-59/10'); ask for the explicit form.
      if (stepText !== undefined)
        return { error: `cron_expression ${field.name} item '${item}' has a step without a range; write '${ends[0]}-${field.max}/${stepText}' or '*/${stepText}'` };
      out.push(String(low));
      continue;
    }
    const high = fieldValue(field, ends[1]!, low);
    if (typeof high === "string") return { error: high };
    if (low > high) return { error: `cron_expression ${field.name} range '${range}' runs backwards; write it low-high` };
    out.push(`${low}-${high}${step}`);
  }
  return { text: out.join(",") };
}

/**
 * A number or a name, as its numeric value; or the error. SUN ending a range that starts later
 * in the week is 7, so MON-SUN means Monday to Sunday (Vixie cron reads it as the empty range 1-0).
 */
function fieldValue(field: Field, token: string, rangeStart: number | null): number | string {
  let value: number;
  if (/^\d+$/.test(token)) value = Number(token);
  else {
    const index = field.names?.indexOf(token.toUpperCase()) ?? -1;
    if (index < 0)
      return `cron_expression ${field.name} value '${token}' is not a number${field.nameKind ? ` or a ${field.nameKind}` : ` (${field.min}-${field.max})`}`;
    value = index + (field.names === MONTH_NAMES ? 1 : 0);
    if (field === DOW && value === 0 && rangeStart !== null && rangeStart > 0) value = 7;
  }
  if (value < field.min || value > field.max) return `cron_expression ${field.name} value ${token} is out of range (${field.min}-${field.max})`;
  return value;
}

/** Quartz-only syntax, named as such rather than as a generic bad value. */
function quartzSyntax(field: Field, text: string): string | null {
  const refuse = (what: string, hint = "") => `'${what}' (Quartz syntax) is not supported in the ${field.name} field${hint}`;
  if (text.includes("?")) return refuse("?", "; use '*'");
  if (text.includes("#")) return refuse("#");
  if (field !== DOM && field !== DOW) return null;
  for (const item of text.split(",")) {
    // Blank out the field's own names first so JUL or WED never read as L or W.
    const bare = field.names ? item.toUpperCase().replace(new RegExp(field.names.join("|"), "g"), "0") : item.toUpperCase();
    if (/^[0-9LW/-]*$/.test(bare) && /[LW]/.test(bare)) return refuse(bare.includes("LW") ? "LW" : bare.includes("L") ? "L" : "W");
  }
  return null;
}

function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "forever";
  const minutes = Math.round(ms / MINUTE_MS);
  const parts: [number, string][] = [
    [Math.floor(minutes / 1440), "day"],
    [Math.floor((minutes % 1440) / 60), "hour"],
    [minutes % 60, "minute"],
  ];
  return parts
    .filter(([n]) => n > 0)
    .map(([n, unit]) => `${n} ${unit}${n === 1 ? "" : "s"}`)
    .join(" ");
}

function minuteIso(ms: number): string {
  return Number.isFinite(ms) ? `${new Date(ms).toISOString().slice(0, 16)}Z` : "never";
}

function fail(error: string): { ok: false; error: string } {
  return { ok: false, error };
}

// Exported for tests only: `compile` skips rule 2 so tests can study refused schedules.
export const _internal = { PERIOD_DAYS, compile };
