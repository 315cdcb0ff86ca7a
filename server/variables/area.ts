import { defineArea } from "../area";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { VARIABLES_MIGRATIONS } from "./migrations";
import { variableRoutes } from "./routes";
import { VariablesService } from "./service";

export const variablesArea = defineArea({
  name: "variables",
  migrations: VARIABLES_MIGRATIONS,
  secrets: [{ table: "variables", key: "id", column: "value" }],
  start: ({ store, clock, secretKey }: Pick<Platform, "store" | "clock" | "secretKey"> & { projects: ProjectsService }) => ({
    variables: new VariablesService(store, clock, Number(process.env.KILN_VARIABLE_PROPAGATION_MS ?? 200), secretKey),
  }),
  routes: variableRoutes,
  project: { cleanup: (projectId, { variables }) => variables.removeAll(projectId) },
  resume: ({ variables }) => variables.settlePending(),
  stop: async ({ variables }) => {
    await variables.settlePending().catch(() => {});
    variables.stop();
  },
});
