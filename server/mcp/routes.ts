import * as z from "zod";
import { errorSchema } from "../http/common-schemas";
import { buildOpenApi } from "../http/openapi";
import type { AreaRouter } from "../http/route";
import type { McpResource } from "./mcp-server";
import type { McpDeps } from "./tools";

// The MCP SDK (with ajv) and the tools cost ~0.3 s to load: loaded at the first /mcp request, not at start.
let loaded: Promise<[typeof import("./mcp-server"), typeof import("./tools")]> | null = null;
const loadMcp = () => (loaded ??= Promise.all([import("./mcp-server"), import("./tools")]));

const jsonRpcMessage = z
  .looseObject({
    jsonrpc: z.literal("2.0"),
    id: z.union([z.string(), z.number()]).optional(),
    method: z.string().optional(),
    params: z.record(z.string(), z.unknown()).optional(),
    result: z.unknown().optional(),
    error: z.looseObject({ code: z.number(), message: z.string() }).optional(),
  })
  .describe("a JSON-RPC 2.0 message of the Model Context Protocol");
const jsonRpcBody = z.union([jsonRpcMessage, z.array(jsonRpcMessage)]);
const jsonRpcError = { description: "a JSON-RPC error from the MCP transport (bad Accept or Content-Type, not a JSON-RPC message)", schema: jsonRpcMessage };

export function mcpRoutes(r: AreaRouter<McpDeps>): void {
  // The document /openapi.json serves, made from the same route list once (it is complete when Kiln serves).
  let openApi: string | null = null;
  const resources: McpResource[] = [
    {
      uri: "kiln://openapi.json",
      name: "openapi",
      title: "Kiln platform API (OpenAPI 3.0)",
      description: "The OpenAPI description of every route of this Kiln, as GET /openapi.json serves it",
      mimeType: "application/json",
      read: async () => (openApi ??= JSON.stringify(buildOpenApi([...r.everyRoute()]))),
    },
    ...(["json", "yaml"] as const).map(
      (format): McpResource => ({
        uri: `kiln://project/config.${format}`,
        name: `config-${format}`,
        title: `The project's configuration (${format.toUpperCase()})`,
        description: "The configuration manifest of the token's project, as GET /projects/{id}/config exports it (variable values only for a full-scope token)",
        mimeType: format === "json" ? "application/json" : "application/yaml",
        read: async ({ deps, project, principal }) => (await deps.configuration.exportConfig(project.id, principal, format)).text,
      }),
    ),
  ];

  r.add({
    method: "POST",
    path: "/mcp",
    tag: "MCP",
    summary:
      "Model Context Protocol endpoint for coding agents (streamable HTTP, stateless, JSON answers): tools over the project of the project access token (functions, logs, databases, storage, schedulers, configuration) and resources (this OpenAPI description, the project's configuration). Project access tokens only; a read-only token sees the read tools only (docs/mcp.md)",
    auth: { kind: "projectToken" },
    body: jsonRpcBody,
    // The SDK's transport validates the messages and answers JSON-RPC errors itself.
    bodyValidation: "handler",
    // Inline deploys ride in the body: as much as a deploy upload may hold.
    bodyLimit: "deploy",
    responses: {
      200: { description: "the JSON-RPC response(s)", schema: z.union([jsonRpcMessage, z.array(jsonRpcMessage)]) },
      202: { description: "notifications or responses only: accepted, no body" },
      400: errorSchema,
      401: errorSchema,
      403: errorSchema,
      404: errorSchema,
      406: jsonRpcError,
      415: jsonRpcError,
    },
    handler: async ({ deps, principal, project, request, body }) => {
      const [{ serveMcp }, { TOOLS }] = await loadMcp();
      return serveMcp(request, body, { deps, project, principal }, TOOLS, resources);
    },
  });
}
