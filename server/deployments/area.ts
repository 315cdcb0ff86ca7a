import { defineArea } from "../area";
import type { Platform } from "../platform";
import { deploymentRoutes } from "./routes";
import { DeploymentsService } from "./service";

/** GET /deployments: deployments across the caller's projects. Listed after the areas that deploy. */
export const deploymentsArea = defineArea({
  name: "deployments",
  start: ({ store }: Pick<Platform, "store">) => ({ deployments: new DeploymentsService(store) }),
  routes: deploymentRoutes,
});
