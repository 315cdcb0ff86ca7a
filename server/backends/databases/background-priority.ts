/**
 * The command prefix for a copy or a page hashing that runs beside a database that keeps serving:
 * SCHED_IDLE (`chrt --idle 0`), so it gets a core only when the database's threads and Kiln's do not
 * want it; `nice -n 19` where chrt is missing or refused (a seccomp profile may refuse
 * sched_setscheduler); nothing where neither exists. Checked once, at first use.
 */
let prefix: string[] | null = null;

export function backgroundPriority(): string[] {
  if (prefix) return prefix;
  const works = (cmd: string[]) => {
    try {
      return Bun.which(cmd[0]!) !== null && Bun.spawnSync([...cmd, "true"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
    } catch {
      return false;
    }
  };
  prefix = [["chrt", "--idle", "0"], ["nice", "-n", "19"]].find(works) ?? [];
  return prefix;
}
