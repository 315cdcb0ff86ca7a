/**
 * The command prefix for a copy or a page hashing that runs beside a database that keeps serving:
 * SCHED_IDLE (`chrt --idle 0`), so it gets a core only when the database's threads and Kiln's do not
 * want it. `nice -n 10` still took a tenth of a busy core and doubled a parent's transaction latency
 * during a branch build on two cores. `nice` where there is no chrt; nothing where neither exists.
 */
export const BACKGROUND_PRIORITY: string[] = Bun.which("chrt") ? ["chrt", "--idle", "0"] : Bun.which("nice") ? ["nice", "-n", "19"] : [];
