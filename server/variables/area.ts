import { defineArea } from "../area";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { VARIABLES_MIGRATIONS } from "./migrations";
import { variableRoutes } from "./routes";
import { VariablesService } from "./service";

export const variablesArea = defineArea({
  name: "variables",
  migrations: VARIABLES_MIGRATIONS,
  start: ({ store, clock }: Pick<Platform, "store" | "clock"> & { projects: ProjectsService }) => ({
    variables: new VariablesService(store, clock, Number(process.env.KILN_VARIABLE_PROPAGATION_MS ?? 200)),
  }),
  routes: variableRoutes,
  project: { cleanup: (projectId, { variables }) => variables.removeAll(projectId) },
  resume: ({ variables }) => variables.settlePending(),
  stop: async ({ variables }) => {
    await variables.settlePending().catch(() => {});
    variables.stop();
  },
});
