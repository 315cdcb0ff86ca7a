/**
 * The command prefix for a copy or a page hashing that runs beside a database that keeps serving:
 * `nice -n 10`, so the database's threads and Kiln's win the cores when both want them. Not SCHED_IDLE
 * nor nice 19: somebody waits for this work (a backup answers when its copy is done, a branch is
 * polled until active), and on a machine kept busy by other work (a CI runner, a build) those got
 * ~0.3-1.5% of a core and a 40 MB copy took minutes; nice 10 keeps a tenth of a core against each busy
 * competitor. SCHED_IDLE measured no better for the parent's latency on a quiet machine
 * (docs/databases.md). Nothing where nice is missing. Checked once, at first use, without holding the
 * event loop (a synchronous spawn would stall the very database clients this protects).
 */
let prefix: Promise<string[]> | null = null;

async function works(cmd: string[]): Promise<boolean> {
  try {
    if (!Bun.which(cmd[0]!)) return false;
    return (await Bun.spawn([...cmd, "true"], { stdout: "ignore", stderr: "ignore" }).exited) === 0;
  } catch {
    return false;
  }
}

export const BACKGROUND_NICE = 10;

export function backgroundPriority(): Promise<string[]> {
  prefix ??= (async () => {
    const cmd = ["nice", "-n", String(BACKGROUND_NICE)];
    return (await works(cmd)) ? cmd : [];
  })();
  return prefix;
}
