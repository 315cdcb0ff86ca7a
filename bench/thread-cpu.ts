// CPU time of a process and of its threads, from /proc (Linux; USER_HZ 100): what the wire benches
// report per statement and per thread (bench/database-wire-cpu.ts, pglite-thread-call.ts,
// wire-thread-ceiling.ts).
import { readdirSync, readFileSync } from "node:fs";

const TICK_MS = 10;

/** utime + stime of a /proc stat line, in ms (fields after the parenthesised name). */
function statCpuMs(stat: string): number {
  const f = stat.slice(stat.lastIndexOf(") ") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) * TICK_MS;
}

/** CPU ms a process (all its threads) has used so far. */
export function cpuMs(pid: number | "self" = "self"): number {
  return statCpuMs(readFileSync(`/proc/${pid}/stat`, "utf8"));
}

/** CPU ms of a process's threads, summed by thread name (Bun's main thread "bun", database threads "Worker", JSC's helpers, ...). */
export function cpuByThreadName(pid: number | "self" = "self"): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
      const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
      out.set(name, (out.get(name) ?? 0) + statCpuMs(stat));
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/** The same by role: the main thread, the database threads, the rest (JSC's GC and compiler helpers). */
export function cpuByRole(pid: number | "self" = "self"): Record<"main" | "database" | "other", number> {
  const out = { main: 0, database: 0, other: 0 };
  for (const [name, ms] of cpuByThreadName(pid)) out[name === "bun" ? "main" : name === "Worker" ? "database" : "other"] += ms;
  return out;
}
