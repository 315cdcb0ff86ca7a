import { join } from "node:path";
import { defineArea } from "../area";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import { LeaseJournal } from "./lease-journal";
import type { LockTable } from "./lock-table";
import { MemoryLockTable } from "./memory-lock-table";
import { LOCKS_MIGRATIONS } from "./migrations";
import { PostgresLockTable } from "./postgres-lock-table";
import { PreparedPostgres } from "./prepared-postgres";
import { lockRoutes } from "./routes";
import { LocksService } from "./service";
import { legacyTokenCeiling } from "./token-floor";

type Needs = Pick<Platform, "store" | "clock" | "log" | "config">;

/**
 * Project locks (spec "Project locks"): leases on `/locks/{key}` for service keys. The embedded
 * profile (one Kiln on a PGlite control store) keeps leases in memory, every change journaled in
 * `<data-dir>/locks/` so leases and fencing tokens survive restarts; the production profile
 * (PostgreSQL, possibly several instances) keeps them in the store's tables. See docs/locks.md.
 */
export const locksArea = defineArea({
  name: "locks",
  migrations: LOCKS_MIGRATIONS,
  start: async ({ store, clock, log, config }: Needs) => {
    const embedded = store.kind === "pglite";
    // Production: the store's tables, through the lock table's own prepared connections.
    const prepared = !embedded && config.databaseUrl ? new PreparedPostgres(config.databaseUrl) : null;
    let lockTable: LockTable;
    if (embedded) {
      const tokenFloor = await legacyTokenCeiling(store);
      const journal = LeaseJournal.open(join(config.dataDir, "locks"), { nowMs: () => clock.nowMs(), warn: (m) => log.warn(m) });
      lockTable = new MemoryLockTable({ tokenFloor, state: journal.state, log: journal });
    } else {
      lockTable = new PostgresLockTable(prepared ?? store);
    }
    const locks = new LocksService(lockTable, {
      clock,
      log,
      fault: () => takeFault(config, "lock-backend"),
      // PostgresLockTable's close is nothing: its connections are what to close.
      close: prepared ? () => prepared.close() : undefined,
    });
    return { lockTable, locks };
  },
  routes: lockRoutes,
  project: { cleanup: (projectId, { locks }) => locks.removeAll(projectId) },
  // In place (embedded): the journal is closed before it is put back, and the leases replayed from it.
  reset: {
    files: ["locks"],
    release: async ({ lockTable }, changed) => {
      if (changed.files.length && lockTable instanceof MemoryLockTable) await lockTable.close();
    },
    resume: ({ lockTable, config, clock, log }, changed) => {
      if (!changed.files.length || !(lockTable instanceof MemoryLockTable)) return;
      const journal = LeaseJournal.open(join(config.dataDir, "locks"), { nowMs: () => clock.nowMs(), warn: (m) => log.warn(m) });
      lockTable.reopen(journal.state, journal);
    },
  },
  stop: ({ locks }) => locks.close(),
});
