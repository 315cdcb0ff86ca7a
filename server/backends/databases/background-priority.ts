/**
 * The command prefix for a copy or a page hashing that runs beside a database that keeps serving:
 * SCHED_IDLE (`chrt --idle 0`), so it gets a core only when the database's threads and Kiln's do not
 * want it; `nice -n 19` where chrt is missing or refused (a seccomp profile may refuse
 * sched_setscheduler); nothing where neither exists. Checked once, at first use, without holding
 * the event loop (a synchronous spawn would stall the very database clients this protects).
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

export function backgroundPriority(): Promise<string[]> {
  prefix ??= (async () => {
    for (const cmd of [["chrt", "--idle", "0"], ["nice", "-n", "19"]]) if (await works(cmd)) return cmd;
    return [];
  })();
  return prefix;
}
