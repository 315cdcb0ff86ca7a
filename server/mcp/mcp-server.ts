import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import {
  CallToolRequestSchema,
  type CallToolResult,
  ErrorCode,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import * as z from "zod";
import { MSG } from "../auth/guard";
import { describeError } from "../log";
import { HttpError } from "../http/errors";
import { parseInput } from "../http/route";
import { KILN_VERSION } from "../version";
import { ToolFailure, type Tool, type ToolContext } from "./tools";

/** A resource the endpoint serves: a fixed URI, read on request. */
export interface McpResource {
  uri: string;
  name: string;
  title: string;
  description: string;
  mimeType: string;
  read(ctx: ToolContext): Promise<string>;
}

const INSTRUCTIONS =
  "Kiln: a backend platform (functions, PostgreSQL databases, object storage, schedulers, logs). " +
  "This endpoint acts on the one project its access token belongs to. Write tools need a full-scope token. " +
  "Resources: the platform API's OpenAPI description, and the project's configuration.";

/** JSON Schema of a tool's zod input, as tools/list publishes it (an object schema, as MCP requires). */
const inputSchemas = new WeakMap<z.ZodType, Record<string, unknown>>();
function jsonSchemaOf(schema: z.ZodObject): { type: "object"; [k: string]: unknown } {
  let s = inputSchemas.get(schema);
  if (!s) {
    s = z.toJSONSchema(schema, { io: "input", unrepresentable: "any" }) as Record<string, unknown>;
    delete s.$schema;
    inputSchemas.set(schema, s);
  }
  return { ...s, type: "object" };
}

/** What a failure tells the agent: the API's message (its `error`, or its `code`), as a tool error. */
export function toolError(message: string, status?: number): CallToolResult {
  return { isError: true, content: [{ type: "text", text: message }], structuredContent: { error: message, ...(status ? { status } : {}) } };
}

function toolResult(out: Record<string, unknown>): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify(out, null, 2) }], structuredContent: out };
}

/**
 * One MCP server for one request (stateless): the tools this token may call, the resources, and the
 * SDK's protocol handling (initialize, ping, unknown methods as -32601). Tool failures are tool
 * errors (`isError`) carrying the API's message; nothing a tool throws escapes as a protocol error
 * or a 500.
 */
function mcpServer(ctx: ToolContext, tools: readonly Tool[], resources: readonly McpResource[]): Server {
  const server = new Server({ name: "kiln", title: "Kiln", version: KILN_VERSION }, { capabilities: { tools: { listChanged: false }, resources: { listChanged: false } }, instructions: INSTRUCTIONS });
  const readOnly = ctx.principal.scope === "read_only";
  const visible = tools.filter((t) => !readOnly || t.access === "read");
  const byName = new Map(tools.map((t) => [t.name, t]));

  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: visible.map((t) => ({
      name: t.name,
      title: t.title,
      description: t.description,
      inputSchema: jsonSchemaOf(t.input),
      annotations: { title: t.title, readOnlyHint: t.access === "read", destructiveHint: t.name.startsWith("delete_") || t.name === "modify_rows", openWorldHint: false },
    })),
  }));

  server.setRequestHandler(CallToolRequestSchema, async (request): Promise<CallToolResult> => {
    const tool = byName.get(request.params.name);
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `unknown tool '${request.params.name}'; tools/list names the tools this token may call`);
    // The API's rules for a project access token, as the guard applies them to a route.
    if (tool.access === "write" && readOnly) return toolError(MSG.readOnly, 403);
    if (tool.access === "write" && ctx.project.status === "deleting") return toolError("project_deleting: the project is being deleted", 409);
    try {
      // The route's input rules: the schema, and no text PostgreSQL cannot store (a NUL, half a surrogate pair).
      return toolResult(await tool.run(ctx, parseInput(tool.input, request.params.arguments ?? {}, "arguments")));
    } catch (err) {
      if (err instanceof ToolFailure) return { ...toolError(err.message), structuredContent: { error: err.message, ...err.data } };
      if (err instanceof HttpError) {
        const body = err.body as { error?: string; code?: string };
        return toolError(body.error ?? body.code ?? `status ${err.status}`, err.status);
      }
      const id = crypto.randomUUID();
      ctx.deps.log.error(`MCP tool ${tool.name} failed (request ${id}): ${describeError(err)}`);
      return toolError(`internal error (request ${id}); see Kiln's log`, 500);
    }
  });

  server.setRequestHandler(ListResourcesRequestSchema, () => ({
    resources: resources.map((r) => ({ uri: r.uri, name: r.name, title: r.title, description: r.description, mimeType: r.mimeType })),
  }));

  server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
    const r = resources.find((x) => x.uri === request.params.uri);
    // -32002 is MCP's "resource not found".
    if (!r) throw new McpError(-32002, `resource not found: ${request.params.uri}`);
    try {
      return { contents: [{ uri: r.uri, mimeType: r.mimeType, text: await r.read(ctx) }] };
    } catch (err) {
      if (err instanceof HttpError) throw new McpError(ErrorCode.InvalidRequest, String((err.body as { error?: string; code?: string }).error ?? (err.body as { code?: string }).code));
      const id = crypto.randomUUID();
      ctx.deps.log.error(`MCP resource ${r.uri} failed (request ${id}): ${describeError(err)}`);
      throw new McpError(ErrorCode.InternalError, `internal error (request ${id}); see Kiln's log`);
    }
  });
  return server;
}

/**
 * Serves one POST of the streamable HTTP transport, stateless: no session id, a fresh server and
 * transport per request, answers as JSON (not an SSE stream). Every request carries the token, so
 * any Kiln instance can answer any request and nothing is kept between them.
 */
export async function serveMcp(request: Request, parsedBody: unknown, ctx: ToolContext, tools: readonly Tool[], resources: readonly McpResource[]): Promise<Response> {
  const server = mcpServer(ctx, tools, resources);
  const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  await server.connect(transport);
  try {
    return await transport.handleRequest(request, { parsedBody });
  } finally {
    await server.close();
  }
}
