import { defineArea } from "../area";
import type { InvokeDeps } from "../functions/invoke";
import type { Platform } from "../platform";
import { DurableEngine } from "./engine";
import { ExecutionsReader } from "./executions";
import { DURABLE_MIGRATIONS } from "./migrations";
import { durableRoutes } from "./routes";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log" | "address"> & InvokeDeps;

/**
 * Durable functions: deployed like standard functions (same table, pipeline and builds, their own
 * collection), run as executions whose steps are journaled in the control store and replayed in
 * sandboxed workers; sleeps are timers on the platform clock (docs/durable-functions.md).
 */
export const durableArea = defineArea({
  name: "durable-functions",
  migrations: DURABLE_MIGRATIONS,
  start: (deps: Needs) => {
    const { store, functions } = deps;
    const durable = new DurableEngine(deps, {
      leaseMs: Number(process.env.KILN_DURABLE_LEASE_MS ?? 30_000),
      maxConcurrent: Number(process.env.KILN_DURABLE_CONCURRENCY ?? 32),
      // One instance (embedded store) knows all its work; several look for each other's.
      pollMs: store.kind === "postgres" ? Number(process.env.KILN_DURABLE_POLL_MS ?? 1000) : null,
    });
    const executions = new ExecutionsReader(store);
    // A deleted durable function's unfinished executions stop with it (in the deleting transaction).
    functions.onDelete((tx, functionId) => durable.stopFunction(tx, functionId));
    return { durable, executions };
  },
  routes: durableRoutes,
  project: { cleanup: (projectId, { executions }) => executions.removeAll(projectId) },
  resume: ({ durable }) => durable.resume(),
  drain: ({ durable }) => durable.drain(),
  // Executions under way and wake timers come from its rows: given back and claimed again when they changed.
  reset: {
    release: ({ durable }, changed) => (changed.tables.size ? durable.drain() : undefined),
    resume: ({ durable }, changed) => (changed.tables.size ? durable.restart() : undefined),
  },
});
