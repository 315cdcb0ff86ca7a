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
    error: (m, e) => console.error(`${at()} error ${m}${e ? `: ${(e as Error)?.stack ?? e}` : ""}`),
  };
}
