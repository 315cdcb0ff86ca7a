import type { Elysia } from "elysia";
import * as z from "zod";
import type { AuthRule, Principal } from "../auth/principal";
import type { Kiln } from "../context";
import type { ProjectRecord } from "../projects/service";
import { badRequest, jsonResponse } from "./errors";

export type Method = "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS";

export interface ResponseSpec {
  description: string;
  schema?: z.ZodType;
  contentType?: string;
}

/**
 * One API route: its transport contract (path, method, schemas, auth) and the handler that calls
 * into a service. The OpenAPI description is generated from these definitions, so a route exists in
 * the document exactly when it exists in the server.
 */
export interface RouteDef<P = any, Q = any, B = any> {
  method: Method;
  /** OpenAPI-style path: `/projects/{projectId}`. */
  path: string;
  summary: string;
  tag: string;
  auth: AuthRule;
  params?: z.ZodType<P>;
  query?: z.ZodType<Q>;
  body?: z.ZodType<B>;
  responses: Record<number, ResponseSpec>;
  /** `handler`: the body is parsed as JSON but validated by the handler itself (after its own auth). */
  bodyValidation?: "route" | "handler";
  /** Extra methods served by the same handler (HEAD beside GET). */
  alsoHead?: boolean;
  /**
   * Matched ahead of Elysia's router when the path has exactly this shape (see Router.direct):
   * for the warm invocation path, where the router's work is a visible share of a request.
   */
  direct?: boolean;
  handler: (ctx: RouteContext<P, Q, B>) => Promise<Reply> | Reply;
}

export interface RouteContext<P, Q, B> {
  kiln: Kiln;
  request: Request;
  ip: string;
  /** performance.now() when the request reached Kiln (for the X-Service-Proxy-Ms family). */
  arrivedAt: number;
  params: P;
  query: Q;
  body: B;
  principal: Principal | null;
  /** The project of a project-scoped route, loaded and authorized by the guard. */
  project: ProjectRecord | null;
}

export type Reply = Response | { status: number; body?: unknown; headers?: Record<string, string> };

export const reply = {
  ok: (body: unknown, headers?: Record<string, string>): Reply => ({ status: 200, body, headers }),
  created: (body: unknown): Reply => ({ status: 201, body }),
  accepted: (body: unknown): Reply => ({ status: 202, body }),
  noContent: (): Reply => ({ status: 204 }),
};

/** Names where a validation problem sits, e.g. `body field 'name': expected string`. */
export function describeZodError(where: string, error: z.ZodError): string {
  const parts = error.issues.slice(0, 5).map((i) => {
    const field = i.path.length ? i.path.join(".") : "";
    const msg = i.message.replace(/^Invalid input: /, "");
    return field ? `${where} field '${field}': ${msg}` : `${where}: ${msg}`;
  });
  return `invalid request: ${parts.join("; ")}`;
}

/** The path of the first string holding a NUL character, if any ("" for the value itself). */
function nulAt(v: unknown, path: string): string | null {
  if (typeof v === "string") return v.includes("\0") ? path : null;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const p = nulAt(v[i], path ? `${path}.${i}` : String(i));
      if (p !== null) return p;
    }
  } else if (v && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) {
      const p = nulAt(x, path ? `${path}.${k}` : k);
      if (p !== null) return p;
    }
  }
  return null;
}

function refuseNul(value: unknown, where: string): void {
  const nul = nulAt(value, "");
  if (nul !== null) throw badRequest(`invalid request: ${where}${nul ? ` field '${nul}'` : ""}: must not contain a NUL character (\\u0000)`);
}

/**
 * Input through its schema, or a 400 naming the field. PostgreSQL text cannot hold a NUL, so one is
 * refused here, before and after the schema's transforms (a JSON text field may decode to one),
 * rather than failing as a 500 in a store write.
 */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, where: string): T {
  refuseNul(value, where);
  const r = schema.safeParse(value);
  if (!r.success) throw badRequest(describeZodError(where, r.error));
  refuseNul(r.data, where);
  return r.data;
}

function parseWith<T>(schema: z.ZodType<T> | undefined, value: unknown, where: string): T {
  return schema ? parseInput(schema, value, where) : (undefined as T);
}

async function readJsonBody(request: Request): Promise<unknown> {
  const text = await request.text();
  if (text.trim() === "") return {};
  // Lenient about Content-Type (curl -d sends form encoding) but strict about the JSON itself.
  try {
    return JSON.parse(text);
  } catch {
    throw badRequest("request body is not valid JSON");
  }
}

function queryObject(url: URL): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of url.searchParams) out[k] = v;
  return out;
}

interface DirectRoute {
  def: RouteDef;
  pattern: RegExp;
  names: string[];
}

/** The path of an absolute request URL, still percent-encoded (as Elysia matches it). */
function rawPath(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start < 0) return "/";
  const q = url.indexOf("?", start);
  return q < 0 ? url.slice(start) : url.slice(start, q);
}

export class Router {
  readonly routes: RouteDef[] = [];
  private readonly directRoutes: DirectRoute[] = [];

  add<P, Q, B>(def: RouteDef<P, Q, B>): this {
    this.routes.push(def as RouteDef);
    return this;
  }

  /** Registers every route with Elysia, wrapping each handler in validation, auth and error mapping. */
  bind(app: Elysia<any, any, any, any, any, any, any>, kiln: Kiln, metaOf: (r: Request) => { ip: string; arrivedAt: number }): void {
    for (const def of this.routes) {
      const elysiaPath = def.path.replace(/\{(\w+)\}/g, ":$1");
      const run = async ({ request, params }: { request: Request; params: Record<string, string> }) => {
        try {
          return await this.execute(def, kiln, request, params, metaOf(request));
        } catch (err) {
          return kiln.http.renderError(err, request);
        }
      };
      const methods: Method[] = def.alsoHead ? [def.method, "HEAD"] : [def.method];
      for (const m of methods) app.route(m, elysiaPath, run as any);
      if (def.direct) {
        const names = [...def.path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!);
        // No '%' in a parameter: Elysia's decoding of those is left to Elysia.
        this.directRoutes.push({ def, names, pattern: new RegExp(`^${def.path.replace(/\{\w+\}/g, "([^/%]+)")}$`) });
      }
    }
  }

  /**
   * Serves a request for a `direct` route whose path has exactly the route's shape, exactly as the
   * bound route would (same parsing, auth and error mapping); null leaves the request to Elysia,
   * which also takes the variants (trailing slash, other methods) it would have served anyway.
   */
  direct(request: Request, kiln: Kiln, meta: { ip: string; arrivedAt: number }): Promise<Response> | null {
    for (const r of this.directRoutes) {
      if (request.method !== r.def.method) continue;
      const m = r.pattern.exec(rawPath(request.url));
      if (!m) continue;
      const params: Record<string, string> = {};
      for (let i = 0; i < r.names.length; i++) params[r.names[i]!] = m[i + 1]!;
      return this.execute(r.def, kiln, request, params, meta).catch((err) => kiln.http.renderError(err, request));
    }
    return null;
  }

  private async execute(def: RouteDef, kiln: Kiln, request: Request, rawParams: Record<string, string>, meta: { ip: string; arrivedAt: number }) {
    const ip = meta.ip;
    const params = parseWith(def.params, decodeParams(rawParams), "path");
    const query = def.query ? parseWith(def.query, queryObject(new URL(request.url)), "query") : undefined;
    const { principal, project } = await kiln.guard.authorize(def.auth, request, (params ?? {}) as { projectId?: string }, ip);
    const body = def.body
      ? def.bodyValidation === "handler"
        ? await readJsonBody(request)
        : parseWith(def.body, await readJsonBody(request), "body")
      : undefined;
    const out = await def.handler({ kiln, request, ip, arrivedAt: meta.arrivedAt, params, query, body, principal, project });
    if (out instanceof Response) return out;
    if (kiln.config.validateResponses) checkResponse(def, out);
    return jsonResponse(out.status, out.body, out.headers);
  }
}

function decodeParams(p: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(p ?? {})) {
    try {
      out[k] = decodeURIComponent(v);
    } catch {
      out[k] = v;
    }
  }
  return out;
}

/** Test-mode guard that the document tells the truth: a response that does not match its schema is a 500. */
function checkResponse(def: RouteDef, out: { status: number; body?: unknown }) {
  const spec = def.responses[out.status];
  if (!spec) throw new Error(`${def.method} ${def.path} answered ${out.status}, which its definition does not declare`);
  if (spec.schema && out.body !== undefined) {
    const r = spec.schema.safeParse(out.body);
    if (!r.success)
      throw new Error(`${def.method} ${def.path} ${out.status} response does not match its schema: ${describeZodError("response", r.error)}`);
  }
}
