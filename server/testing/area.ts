import { defineArea } from "../area";
import type { Platform } from "../platform";
import { clockRoutes } from "./clock-routes";
import { snapshotRoutes } from "./snapshot-routes";

/** Test controls (`/_kiln/...`): the controllable clock, snapshots of the whole platform, reset. */
export const testingArea = defineArea({
  name: "testing",
  start: (_: Pick<Platform, "clock" | "config" | "snapshots">) => ({}),
  routes: (r) => {
    clockRoutes(r);
    snapshotRoutes(r);
  },
});
