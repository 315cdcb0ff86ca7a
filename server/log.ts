/** Kiln's own diagnostic log on standard error; standard output is kept for the lines scripts read. */
export interface Logger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string, err?: unknown): void;
}

export function createLogger(quiet = process.env.KILN_LOG === "quiet"): Logger {
  const at = () => new Date().toISOString();
  return {
    info: (m) => !quiet && console.error(`${at()} info  ${m}`),
    warn: (m) => console.error(`${at()} warn  ${m}`),
    error: (m, e) => console.error(`${at()} error ${m}${e === undefined ? "" : `: ${describeError(e)}`}`),
  };
}

/**
 * What an error line says about `e`: its stack when it has one, else its name, code and message, and
 * for an error without any (a bare `new Error()`, an empty DOMException, a thrown string) whatever it
 * is, never an empty line.
 */
export function describeError(e: unknown): string {
  if (e instanceof Error) {
    const code = (e as { code?: unknown }).code;
    const head = `${e.name || "Error"}${code !== undefined ? ` (${String(code)})` : ""}: ${e.message || "(no message)"}`;
    const frames = (e.stack ?? "").split("\n").filter((l) => /^\s+at /.test(l));
    return frames.length ? `${head}\n${frames.join("\n")}` : head;
  }
  if (typeof e === "string") return e || "(an empty string was thrown)";
  try {
    return `${Object.prototype.toString.call(e)} ${JSON.stringify(e)}`;
  } catch {
    return String(e);
  }
}
