/** `kiln/testing` (docs/testing.md): a Kiln per test file, reset between tests. */
export interface StartOptions {
  /** "controllable": advance() moves Kiln's clock (and fires every timer due on the way). */
  clock?: "real" | "controllable";
  /** A kiln.seed.yaml applied at start; reset() restores it. */
  seed?: string;
  /** More `kiln start` flags. */
  args?: string[];
  env?: Record<string, string>;
  startTimeoutMs?: number;
}
export interface Restored {
  name: string;
  restored_at: string;
}
export interface Snapshot {
  name: string;
  created_at: string;
  size_bytes: number;
}
export interface RunningKiln {
  url: string;
  platformToken: string;
  /** The Kiln process's id. */
  pid: number;
  /** A service key of the project (by id or name), made once per project. */
  serviceKey(project: string): Promise<string>;
  anonKey(project: string): Promise<string>;
  connectionString(project: string, db: string): Promise<string>;
  reset(): Promise<Restored>;
  /** Milliseconds, or a duration such as "90s", "15m", "1h30m", "1d". */
  advance(by: number | string): Promise<{ now: string; offset_ms: number }>;
  snapshot(name: string): Promise<Snapshot>;
  restore(name: string): Promise<Restored>;
  stop(): Promise<void>;
}
export function startKiln(options?: StartOptions): Promise<RunningKiln>;
export function durationMs(v: number | string): number;
