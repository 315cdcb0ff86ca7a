import { defineArea } from "../area";
import { healthRoutes } from "./routes";

export const healthArea = defineArea({
  name: "health",
  start: (_: object) => ({}),
  routes: healthRoutes,
});
