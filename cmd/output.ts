// Human output: tables that fit the terminal, sizes and durations with units, one empty-state line.
// Scripts use --json, which prints the API's own values (bytes, milliseconds) untouched.

/** 512 B, 1.0 KiB, 23.4 MiB, 1.0 GiB (binary units, one decimal). */
export function formatBytes(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  if (Math.abs(n) < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n / 1024;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}

/** 401 ms, 2.4 s, 1m 30s, 2h 5m, 3d 4h: a duration given in milliseconds. */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return String(ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1).replace(/\.0$/, "")} s`;
  const parts: string[] = [];
  let s = Math.round(ms / 1000);
  for (const [unit, size] of [["d", 86_400], ["h", 3600], ["m", 60], ["s", 1]] as const) {
    if (s >= size) parts.push(`${Math.floor(s / size)}${unit}`);
    s %= size;
  }
  return parts.slice(0, 2).join(" ");
}

/** Fields whose numbers are sizes or durations by their name (the API's naming: *_bytes, *_ms, size). */
const BYTES_FIELD = /(^|_)bytes$|^size$|^file_size_limit$/;
const MS_FIELD = /(^|_)ms$/;

/** A value as a cell: units for sizes and durations, lists joined, absent as "-". */
export function cell(key: string, v: unknown): string {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number" && BYTES_FIELD.test(key)) return formatBytes(v);
  if (typeof v === "number" && MS_FIELD.test(key)) return formatDuration(v);
  if (Array.isArray(v)) return v.map((x) => (typeof x === "object" && x !== null ? JSON.stringify(x) : String(x))).join(",") || "-";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** A column's heading: the field's name without its unit suffix (the cells carry the unit). */
const heading = (key: string) => key.replace(/_(bytes|ms)$/, "").toUpperCase();

/**
 * The width tables must fit: the terminal's, or COLUMNS when set (so a pipe can ask for a width);
 * none (no truncation) when output is not a terminal, so scripts reading tables get whole cells.
 */
export function outputWidth(): number | null {
  const env = Number(process.env.COLUMNS);
  if (Number.isInteger(env) && env > 0) return env;
  return process.stdout.isTTY ? process.stdout.columns || 80 : null;
}

const clip = (s: string, w: number) => (s.length > w ? `${s.slice(0, Math.max(0, w - 1))}…` : s);

/** A table's lines: headings, then one line per row; the widest columns shrink (cells end in …) to fit. */
export function tableLines(rows: Record<string, unknown>[], columns: string[], headings = columns.map(heading)): string[] {
  const cells = rows.map((r) => columns.map((c) => cell(c, r[c]).replace(/\s*\n\s*/g, " ")));
  const widths = columns.map((_, i) => Math.max(headings[i]!.length, ...cells.map((r) => r[i]!.length)));
  const limit = outputWidth();
  if (limit !== null) {
    const gaps = 2 * (columns.length - 1);
    // Take a character at a time from the widest column, down to 6 (or its heading), until it fits.
    while (widths.reduce((a, b) => a + b, 0) + gaps > limit) {
      let widest = -1;
      for (let i = 0; i < widths.length; i++) if (widths[i]! > Math.max(6, headings[i]!.length) && (widest < 0 || widths[i]! > widths[widest]!)) widest = i;
      if (widest < 0) break;
      widths[widest]!--;
    }
  }
  const line = (vals: string[]) => vals.map((v, i) => clip(v, widths[i]!).padEnd(widths[i]!)).join("  ").trimEnd();
  return [line(headings), ...cells.map(line)];
}

/** The one way an empty list reads: "(no projects)". */
export function emptyLine(what: string): string {
  return `(no ${what})`;
}

/** Tables for people, JSON for scripts; `what` names the rows for the empty state ("projects"). */
export function printTable(rows: Record<string, unknown>[], columns: string[], what: string): void {
  if (rows.length === 0) return console.log(emptyLine(what));
  for (const l of tableLines(rows, columns)) console.log(l);
}

/** One field a line, whole (tokens, keys and connection strings must stay copyable). */
export function printObject(obj: Record<string, unknown>): void {
  const width = Math.max(...Object.keys(obj).map((k) => k.length));
  for (const [k, v] of Object.entries(obj)) console.log(`${k.padEnd(width)}  ${cell(k, v)}`);
}

export function output(json: boolean | undefined, data: unknown, human: () => void): void {
  if (json) console.log(JSON.stringify(data, null, 2));
  else human();
}
