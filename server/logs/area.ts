import { defineArea } from "../area";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import { logRoutes } from "./routes";
import { LogsService } from "./service";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log">;

/**
 * Logs: the log store (embedded: segment files on their own thread; production: the control
 * PostgreSQL), the ingest every area writes lines through, search, live tail and retention.
 * Listed before functions, which write their invocation and build lines through `logs.ingest`.
 */
export const logsArea = defineArea({
  name: "logs",
  start: ({ store, config, clock, log }: Needs) => {
    const logs = new LogsService({
      control: store,
      clock,
      log,
      dataDir: config.dataDir,
      retentionDays: () => config.logRetentionDays,
      databaseUrl: config.databaseUrl,
      fault: () => takeFault(config, "log-store"),
    });
    return { logs };
  },
  routes: logRoutes,
  project: { cleanup: (projectId, { logs }) => logs.removeProject(projectId) },
  resume: async ({ logs }) => {
    logs.startRetention();
  },
  closing: ({ logs }) => logs.tail.endAll(),
  // In place: the segment files are closed before they are put back, and opened again at the next use.
  reset: {
    files: ["log-segments", "logs"],
    flush: ({ logs }) => logs.ingest.flush(),
    release: ({ logs }, changed) => (changed.files.length ? logs.release() : undefined),
    resume: () => {},
  },
  stop: ({ logs }) => logs.stop(),
});
