import { defineArea } from "../area";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { KEYS_MIGRATIONS } from "./migrations";
import { keyRoutes } from "./routes";
import { KeysService } from "./service";

export const keysArea = defineArea({
  name: "keys",
  migrations: KEYS_MIGRATIONS,
  start: ({ store, clock, principals }: Pick<Platform, "store" | "clock" | "principals"> & { projects: ProjectsService }) => ({
    keys: new KeysService(store, () => clock.now(), (id) => principals.evict((p) => "keyId" in p && p.keyId === id)),
  }),
  // Nothing of its rows in memory (resolved keys are in the principal cache, which a restore empties).
  reset: { resume: () => {} },
  routes: keyRoutes,
  project: {
    // Every project starts with an anon key named "default".
    setup: async (tx, projectId, { keys }) => void (await keys.createAnonKey(projectId, { name: "default" }, tx)),
    cleanup: (projectId, { keys }) => keys.removeAll(projectId),
  },
});
