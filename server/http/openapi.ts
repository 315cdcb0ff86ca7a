import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import * as z from "zod";
import { KILN_VERSION } from "../version";
import { errorBody } from "./common-schemas";
import { FixedWindowLimiter } from "./rate-limit";
import type { RouteDef, Router } from "./route";

type JsonSchema = Record<string, unknown>;

function toSchema(schema: z.ZodType, io: "input" | "output"): JsonSchema {
  const s = z.toJSONSchema(schema, { target: "openapi-3.0", io, unrepresentable: "any" }) as JsonSchema;
  delete s.$schema;
  return s;
}

function parametersOf(schema: z.ZodType | undefined, where: "path" | "query") {
  if (!schema || !(schema instanceof z.ZodObject)) return [];
  return Object.entries(schema.shape as Record<string, z.ZodType>).map(([name, field]) => {
    const s = toSchema(field, "input");
    const description = (s.description as string | undefined) ?? undefined;
    return {
      name,
      in: where,
      required: where === "path" ? true : !field.safeParse(undefined).success,
      schema: s,
      ...(description ? { description } : {}),
    };
  });
}

/** OpenAPI has no rest-of-path parameter: `{path+}` is written `{path}` (its description says slashes are allowed). */
function openApiPath(path: string): string {
  return path.replace(/\{(\w+)\+\}/g, "{$1}");
}

/** Builds the OpenAPI 3.0 document from the route definitions: nothing here is written by hand. */
export function buildOpenApi(routes: RouteDef[]): JsonSchema {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const def of routes) {
    const op: Record<string, unknown> = {
      operationId: `${def.method.toLowerCase()}${openApiPath(def.path).replace(/\{(\w+)\}/g, "By_$1").replace(/[^A-Za-z0-9]+(.)?/g, (_, c) => (c ? c.toUpperCase() : ""))}`,
      summary: def.summary,
      tags: [def.tag],
      parameters: [...parametersOf(def.params, "path"), ...parametersOf(def.query, "query")],
      responses: Object.fromEntries(
        Object.entries(def.responses).map(([status, r]) => [
          status,
          {
            description: r.description,
            ...(r.schema ? { content: { [r.contentType ?? "application/json"]: { schema: toSchema(r.schema, "output") } } } : {}),
          },
        ]),
      ),
    };
    if (def.body) {
      const schema = toSchema(def.body, "input");
      // A body the handler reads itself (the configuration apply) may also be YAML.
      const types = def.bodyValidation === "document" ? ["application/json", "application/yaml"] : def.formBody ? ["application/json", "application/x-www-form-urlencoded"] : ["application/json"];
      op.requestBody = { required: true, content: Object.fromEntries(types.map((t) => [t, { schema }])) };
    }
    // Every route that reads a body through body.ts refuses one over its limit; a `document` body's handler words its own refusal.
    if (((def.body && def.bodyValidation !== "document") || def.bodyLimit !== undefined) && !def.responses[413])
      (op.responses as Record<string, unknown>)["413"] = { description: "request body over the route's limit", content: { "application/json": { schema: toSchema(errorBody, "output") } } };
    if (def.auth.kind !== "none") op.security = [{ bearerAuth: [] }];
    const methods = def.alsoHead ? [def.method, "HEAD"] : [def.method];
    for (const m of methods) (paths[openApiPath(def.path)] ??= {})[m.toLowerCase()] = m === "HEAD" ? { ...op, operationId: `${op.operationId}Head` } : op;
  }
  return {
    openapi: "3.0.3",
    info: {
      title: "Kiln platform API",
      version: KILN_VERSION,
      description: "The platform API as served by Kiln, generated from the schemas of every route this server has.",
    },
    servers: [{ url: "/" }],
    components: { securitySchemes: { bearerAuth: { type: "http", scheme: "bearer" } } },
    paths,
  };
}

interface Variant {
  body: Uint8Array;
  etag: string;
}

function variant(body: Uint8Array): Variant {
  return { body, etag: `"${createHash("sha256").update(body).digest("base64url").slice(0, 32)}"` };
}

/** `/openapi.json` and `/openapi.yaml`, GET and HEAD, no credential, with ETags, gzip and a fetch ration. */
export function openApiRoutes(r: Router, opts: { fetchLimit: number; now: () => number }): void {
  const limiter = new FixedWindowLimiter(opts.fetchLimit, 60_000, opts.now);
  let docs: Record<"json" | "yaml", { plain: Variant; gzip: Variant }> | null = null;
  const build = async () => {
    const { default: YAML } = await import("yaml"); // only when the document is first asked for
    const doc = buildOpenApi(r.routes);
    const make = (text: string) => {
      const plain = variant(new TextEncoder().encode(text));
      return { plain, gzip: variant(gzipSync(plain.body)) };
    };
    return { json: make(JSON.stringify(doc)), yaml: make(YAML.stringify(doc)) };
  };

  const routes = r.area<unknown>();
  for (const format of ["json", "yaml"] as const) {
    routes.add({
      method: "GET",
      alsoHead: true,
      path: `/openapi.${format}`,
      tag: "OpenAPI",
      summary: `This OpenAPI 3.0 description (${format.toUpperCase()})`,
      auth: { kind: "none" },
      responses: {
        200: { description: "the document", schema: z.object({}).passthrough(), contentType: format === "json" ? "application/json" : "application/yaml" },
        304: { description: "unchanged (If-None-Match)" },
        429: { description: "more than the allowed fetches per minute from this address" },
      },
      handler: async ({ request, ip }) => {
        const rl = limiter.hit(ip);
        if (!rl.allowed)
          return new Response(JSON.stringify({ error: "too many OpenAPI description fetches; retry later" }), {
            status: 429,
            headers: { "Content-Type": "application/json", "Retry-After": String(rl.retryAfterSeconds) },
          });
        docs ??= await build();
        const gz = /\bgzip\b/.test(request.headers.get("accept-encoding") ?? "");
        const v = gz ? docs[format].gzip : docs[format].plain;
        const headers: Record<string, string> = {
          ETag: v.etag,
          Vary: "Accept-Encoding",
          "Cache-Control": "no-cache",
          "Content-Type": format === "json" ? "application/json; charset=utf-8" : "application/yaml; charset=utf-8",
        };
        if (gz) headers["Content-Encoding"] = "gzip";
        const inm = request.headers.get("if-none-match");
        if (inm && inm.split(",").some((t) => t.trim() === v.etag)) return new Response(null, { status: 304, headers });
        headers["Content-Length"] = String(v.body.byteLength);
        return new Response(request.method === "HEAD" ? null : (v.body as BodyInit), { status: 200, headers });
      },
    });
  }
}
