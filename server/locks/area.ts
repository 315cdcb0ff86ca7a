import { defineArea } from "../area";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import type { LockTable } from "./lock-table";
import { LOCKS_MIGRATIONS } from "./migrations";
import { PostgresLockTable } from "./postgres-lock-table";
import { PreparedPostgres } from "./prepared-postgres";
import { lockRoutes } from "./routes";
import { LocksService } from "./service";
import { FencedMemoryTable } from "./token-floor";

type Needs = Pick<Platform, "store" | "clock" | "log" | "config">;

/**
 * Project locks (spec "Project locks"): leases on `/locks/{key}` for service keys. The embedded
 * profile (one Kiln on a PGlite control store) keeps leases in memory, with a fencing-token floor in
 * the store so tokens never go down across restarts; the production profile (PostgreSQL, possibly
 * several instances) keeps them in the store's tables. See docs/locks.md.
 */
export const locksArea = defineArea({
  name: "locks",
  migrations: LOCKS_MIGRATIONS,
  start: async ({ store, clock, log, config }: Needs) => {
    const fenced = store.kind === "pglite" ? await FencedMemoryTable.open(store, (e) => log.error("recording the lock fencing-token floor failed", e)) : null;
    // Production: the store's tables, through the lock table's own prepared connections.
    const prepared = !fenced && config.databaseUrl ? new PreparedPostgres(config.databaseUrl) : null;
    const lockTable: LockTable = fenced ? fenced.table : new PostgresLockTable(prepared ?? store);
    const locks = new LocksService(lockTable, {
      clock,
      log,
      issued: fenced ? () => fenced.issued() : undefined,
      fault: () => takeFault(config, "lock-backend"),
      close: fenced ? () => fenced.close() : prepared ? () => prepared.close() : undefined,
    });
    return { lockTable, locks };
  },
  routes: lockRoutes,
  project: { cleanup: (projectId, { locks }) => locks.removeAll(projectId) },
  stop: ({ locks }) => locks.close(),
});
