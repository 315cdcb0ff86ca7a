import { defineArea } from "../area";
import type { Platform } from "../platform";
import { CONFIG_MIGRATIONS } from "./migrations";
import { configRoutes } from "./routes";
import type { ConfigDeps } from "./section";
import { ConfigService } from "./service";

/**
 * Project configuration as code (`GET/PUT /projects/{id}/config`): reads and writes every other
 * area's settings through their services, so it is listed after them.
 */
export const configArea = defineArea({
  name: "config",
  migrations: CONFIG_MIGRATIONS,
  start: (deps: Pick<Platform, "store" | "clock" | "config" | "log"> & ConfigDeps) => ({ configuration: new ConfigService(deps) }),
  routes: configRoutes,
  project: { cleanup: (projectId, { configuration }) => configuration.removeAll(projectId) },
});
