import { defineArea } from "../area";
import type { Platform } from "../platform";
import { PROJECTS_MIGRATIONS } from "./migrations";
import { projectRoutes } from "./routes";
import { ProjectsService } from "./service";
import type { AccountsService } from "../accounts/service";

/**
 * Projects own everything else: the areas after this one hook into a project's creation and
 * deletion through their `project` hooks (registered by `server/main.ts`).
 */
export const projectsArea = defineArea({
  name: "projects",
  migrations: PROJECTS_MIGRATIONS,
  start: ({ store, config, clock, principals, log }: Pick<Platform, "store" | "config" | "clock" | "principals" | "log"> & { accounts: AccountsService }) => ({
    projects: new ProjectsService(store, config, clock, (id) => principals.evictProject(id), log),
  }),
  routes: projectRoutes,
  resume: ({ projects }) => projects.resumeDeletions(),
  // Deletions under way finish first; those the restored rows have under way continue.
  reset: { release: ({ projects }) => projects.drain(), resume: ({ projects }) => projects.resumeDeletions() },
  drain: ({ projects }) => projects.drain(),
});
