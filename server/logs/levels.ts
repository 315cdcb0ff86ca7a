/**
 * Log levels as Kiln stores and searches them: trace, debug, info, warn, error, fatal. Structured
 * lines bring their own spellings (`WARNING`, `err`, `critical`, pino's numbers); they are mapped
 * here, for stored lines and for `level:` in queries alike, so `level:warning` finds `warn` lines.
 */
export const LEVELS = ["trace", "debug", "info", "warn", "error", "fatal"] as const;

const SYNONYMS: Record<string, string> = {
  trace: "trace",
  verbose: "trace",
  debug: "debug",
  info: "info",
  information: "info",
  informational: "info",
  notice: "info",
  log: "info",
  warn: "warn",
  warning: "warn",
  error: "error",
  err: "error",
  fatal: "fatal",
  critical: "fatal",
  crit: "fatal",
  panic: "fatal",
  alert: "fatal",
  emerg: "fatal",
  emergency: "fatal",
};

/** pino and bunyan: 10 trace, 20 debug, 30 info, 40 warn, 50 error, 60 fatal. */
function numericLevel(n: number): string | null {
  if (!Number.isFinite(n)) return null;
  if (n >= 60) return "fatal";
  if (n >= 50) return "error";
  if (n >= 40) return "warn";
  if (n >= 30) return "info";
  if (n >= 20) return "debug";
  return "trace";
}

/**
 * A level as stored: a known spelling mapped, anything else lower-cased (at most 16 characters),
 * so an unknown level a program uses is still searchable by itself.
 */
export function normalizeLevel(level: string): string {
  const l = level.trim().toLowerCase();
  return SYNONYMS[l] ?? l.slice(0, 16);
}

/** The level a structured line carries, if any (`level`, `severity` or `lvl`; names or pino numbers). */
export function levelOf(o: Record<string, unknown>): string | null {
  for (const key of ["level", "severity", "lvl"]) {
    const v = o[key];
    if (typeof v === "string" && v.trim() !== "") return normalizeLevel(v);
    if (typeof v === "number") return numericLevel(v);
  }
  return null;
}
