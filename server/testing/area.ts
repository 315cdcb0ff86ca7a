import { defineArea } from "../area";
import type { Platform } from "../platform";
import { clockRoutes } from "./clock-routes";

/** Test controls (`/_kiln/...`): the controllable clock. */
export const testingArea = defineArea({
  name: "testing",
  start: (_: Pick<Platform, "clock" | "config">) => ({}),
  routes: clockRoutes,
});
