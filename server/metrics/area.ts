import { defineArea } from "../area";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import { METRICS_MIGRATIONS } from "./migrations";
import { metricsRoutes } from "./routes";
import { MetricsService } from "./service";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log">;

/**
 * Runtime metrics and usage: finished requests counted per platform-clock minute in memory and
 * written in batches; the metrics query and usage routes. Listed before functions, whose
 * invocations it counts.
 */
export const metricsArea = defineArea({
  name: "metrics",
  migrations: METRICS_MIGRATIONS,
  start: ({ store, config, clock, log }: Needs) => ({
    metrics: new MetricsService({ store, clock, log, retentionDays: () => config.metricsRetentionDays, fault: () => takeFault(config, "metrics-backend") }),
  }),
  routes: metricsRoutes,
  project: { cleanup: (projectId, { metrics }) => metrics.removeProject(projectId) },
  resume: async ({ metrics }) => metrics.startRetention(),
  // What is counted in memory is written first (and so put back with the rest).
  reset: { flush: ({ metrics }) => metrics.writeAll(), resume: ({ metrics }) => metrics.restored() },
  stop: ({ metrics }) => metrics.stop(),
});
