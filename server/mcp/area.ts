import { defineArea } from "../area";
import { mcpRoutes } from "./routes";
import type { McpDeps } from "./tools";

/**
 * The MCP endpoint (`POST /mcp`): coding agents drive a project through tools that call the other
 * areas' services under the API's rules, authenticated by a project access token (docs/mcp.md).
 * It keeps nothing of its own: no migrations, no state between requests.
 */
export const mcpArea = defineArea({
  name: "mcp",
  start: (_deps: McpDeps) => ({}),
  routes: mcpRoutes,
});
