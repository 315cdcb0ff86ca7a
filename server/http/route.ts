import type { RequestGate } from "./gate";
import type { Elysia } from "elysia";
import * as z from "zod";
import type { AuthedBy, AuthRule } from "../auth/principal";
import type { Guard } from "../auth/guard";
import type { Config } from "../config";
import type { Logger } from "../log";
import { type BodyLimit, isFormEncoded, readFormBody, readJsonBody, resolveBodyLimit, type RouteBodyLimit } from "./body";
import type { ResponseSpec } from "./common-schemas";
import { badRequest, HttpError, jsonResponse } from "./errors";
import { decodeSegment } from "./exact-path";

export type { ResponseSpec } from "./common-schemas";

export type Method = "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS";

/**
 * One API route: its transport contract (path, method, schemas, auth) and the handler that calls
 * into a service. The OpenAPI description is generated from these definitions, so a route exists in
 * the document exactly when it exists in the server.
 */
export interface RouteDef<P = any, Q = any, B = any, R extends AuthRule = AuthRule, D = any> {
  method: Method;
  /** OpenAPI-style path: `/projects/{projectId}`. */
  path: string;
  summary: string;
  tag: string;
  /** Who may call it; it also types the handler's `principal` and `project` (see AuthedBy). */
  auth: R;
  params?: z.ZodType<P>;
  query?: z.ZodType<Q>;
  body?: z.ZodType<B>;
  responses: Record<number, ResponseSpec>;
  /**
   * `handler`: the body is parsed as JSON but validated by the handler itself (after its own auth).
   * `document`: the schema only describes the body (OpenAPI); the handler reads it (the configuration
   * apply: JSON or YAML, its own limit and status).
   */
  bodyValidation?: "route" | "handler" | "document";
  /**
   * The body may also come form-encoded (`application/x-www-form-urlencoded`, one value per field),
   * as OAuth clients send their token requests (RFC 6749 §4.1.3, RFC 8628 §3.1/§3.4).
   */
  formBody?: boolean;
  /**
   * The most a request body may hold, counted while it is read (413 beyond): the JSON limit
   * (`KILN_MAX_JSON_BODY_BYTES`) unless a number of bytes is given here; `invoke` for function
   * invocations, `deploy` for multipart uploads the handler reads with `readMultipartBody`.
   */
  bodyLimit?: RouteBodyLimit;
  /**
   * The message of the 400 for a path parameter that is not storable text (a NUL, a lone surrogate),
   * where the spec words it (storage: `invalid or missing object path`).
   */
  invalidParam?: Record<string, string>;
  /** Extra methods served by the same handler (HEAD beside GET). */
  alsoHead?: boolean;
  handler: (ctx: RouteContext<P, Q, B, D> & AuthedBy<R>) => Promise<Reply> | Reply;
}

export interface RouteContext<P, Q, B, D = unknown> {
  /** What the route's area declared it needs and provides (server/area.ts), nothing more. */
  deps: D;
  /** For handlers that apply an auth rule themselves (after reading something first). */
  guard: Guard;
  request: Request;
  ip: string;
  /** performance.now() when the request reached Kiln (for the X-Service-Proxy-Ms family). */
  arrivedAt: number;
  params: P;
  query: Q;
  body: B;
  /** This route's body limit, for a handler that reads the body itself (multipart). */
  bodyLimit: BodyLimit;
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

/** Why PostgreSQL could not store this text as given, if it could not. */
function textProblem(s: string): string | null {
  if (s.includes("\0")) return "must not contain a NUL character (\\u0000)";
  // A lone surrogate has no UTF-8 form: text would be silently altered, JSON refused by the store.
  if (!s.isWellFormed()) return "must be valid Unicode text (it holds half of a surrogate pair)";
  return null;
}

interface BadText {
  /** The string's path ("" for the value itself); for a field name, the object's. */
  path: string;
  problem: string;
}

/**
 * The first string, or object field name, that PostgreSQL could not store (a NUL, a lone surrogate),
 * depth-first. A walk with its own stack: no nesting can overflow the call stack.
 */
function badTextAt(root: unknown): BadText | null {
  const stack: Array<{ v: unknown; path: string }> = [{ v: root, path: "" }];
  const at = (path: string, key: string | number) => (path ? `${path}.${key}` : String(key));
  while (stack.length > 0) {
    const { v, path } = stack.pop()!;
    if (typeof v === "string") {
      const problem = textProblem(v);
      if (problem) return { path, problem };
    } else if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) {
        const x = v[i];
        if (typeof x === "string" || (x && typeof x === "object")) stack.push({ v: x, path: at(path, i) });
      }
    } else if (v && typeof v === "object") {
      const entries = Object.entries(v);
      for (const [k] of entries) {
        const problem = textProblem(k);
        if (problem) return { path, problem: problem.replace(/^must/, "field names must") };
      }
      for (let i = entries.length - 1; i >= 0; i--) {
        const [k, x] = entries[i]!;
        if (typeof x === "string" || (x && typeof x === "object")) stack.push({ v: x, path: at(path, k) });
      }
    }
  }
  return null;
}

function refuseBadText(value: unknown, where: string): void {
  const bad = badTextAt(value);
  if (bad !== null) throw badRequest(`invalid request: ${where}${bad.path ? ` field '${bad.path}'` : ""}: ${bad.problem}`);
}

/**
 * Input through its schema, or a 400 naming the field. PostgreSQL text cannot hold a NUL or a lone
 * surrogate, so one is refused here, before and after the schema's transforms (a JSON text field may
 * decode to one), rather than failing as a 500 in a store write.
 */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, where: string): T {
  refuseBadText(value, where);
  const r = schema.safeParse(value);
  if (!r.success) throw badRequest(describeZodError(where, r.error));
  refuseBadText(r.data, where);
  return r.data;
}

function parseWith<T>(schema: z.ZodType<T> | undefined, value: unknown, where: string): T {
  return schema ? parseInput(schema, value, where) : (undefined as T);
}

/**
 * Every query parameter, declared or not and however often repeated, is NUL-free: a guard or a
 * handler may read one straight from the URL (`project_id`), and PostgreSQL text cannot hold a NUL.
 */
function refuseNulInQuery(url: URL): void {
  for (const [k, v] of url.searchParams)
    if (k.includes("\0") || v.includes("\0"))
      throw badRequest(`invalid request: query field '${k.replaceAll("\0", "\\u0000")}': must not contain a NUL character (\\u0000)`);
}

function queryObject(url: URL): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of url.searchParams) out[k] = v;
  return out;
}

/** What serving a route needs besides its area's own dependencies. */
export interface Transport {
  config: Config;
  log: Logger;
  guard: Guard;
  /** The object every area's `deps` view is cut from (server/area.ts). */
  deps: unknown;
  renderError(err: unknown, request: Request): Response;
  /** Closed while a snapshot or restore swaps the state under the routes (server/http/gate.ts). */
  gate?: RequestGate;
}

/** The routes of one area: handlers are typed with that area's dependencies. */
export interface AreaRouter<D> {
  add<P, Q, B, const R extends AuthRule>(def: RouteDef<P, Q, B, R, D>): AreaRouter<D>;
  /** Every route of every area, complete once Kiln serves: what the API description is made of (the MCP endpoint serves it). */
  everyRoute(): readonly RouteDef[];
}

/** The methods Kiln serves on some path; any other is a 501 (serveHttp). */
export const METHODS: readonly Method[] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/**
 * Which of `segments` (percent-decoded) each of a route path's parameters covers, or null when the
 * path does not match: fixed text matches itself, `{name}` one segment, `{name+}` one or more (less
 * the fixed segments after it). The same rule as Elysia's, used to say what a path allows.
 */
function matchTemplate(template: string[], segments: string[]): string[] | null {
  const rest = template.findIndex((t) => t.endsWith("+}"));
  if (rest < 0 ? segments.length !== template.length : segments.length < template.length) return null;
  const covered: string[] = [];
  for (let i = 0, j = 0; i < template.length; i++) {
    const t = template[i]!;
    const param = /^\{(\w+)\+?\}$/.exec(t)?.[1];
    const take = i === rest ? segments.length - template.length + 1 : 1;
    for (let n = 0; n < take; n++, j++) {
      if (param === undefined && segments[j] !== t) return null;
      covered.push(param ?? "");
    }
  }
  return covered;
}

const segmentsOf = (path: string) => (path === "/" ? [] : path.slice(1).split("/"));

export class Router {
  readonly routes: RouteDef[] = [];
  private readonly bodyLimits = new Map<RouteDef, BodyLimit>();
  private templates: Array<{ def: RouteDef; segments: string[] }> | null = null;

  private matching(segments: string[]): Array<{ def: RouteDef; covered: string[] }> {
    this.templates ??= this.routes.map((def) => ({ def, segments: segmentsOf(def.path) }));
    const out: Array<{ def: RouteDef; covered: string[] }> = [];
    for (const t of this.templates) {
      const covered = matchTemplate(t.segments, segments);
      if (covered) out.push({ def: t.def, covered });
    }
    return out;
  }

  /** The methods some route serves on this path (as the URL has it), HEAD included where a route takes it. */
  allowedMethods(pathname: string): Method[] {
    const allowed = new Set<Method>();
    for (const { def } of this.matching(segmentsOf(pathname).map(decodeSegment))) {
      allowed.add(def.method);
      // Elysia answers HEAD on every GET route (with the GET handler, the body left out).
      if (def.alsoHead || def.method === "GET") allowed.add("HEAD");
    }
    return METHODS.filter((m) => allowed.has(m));
  }

  /** No route for this method and path: 405 with `Allow` when the path has other methods, else 404. */
  noRoute(request: Request): HttpError {
    const path = new URL(request.url).pathname;
    const allowed = this.allowedMethods(path);
    if (allowed.length === 0) return new HttpError(404, { error: `no route for ${request.method} ${path}` });
    return new HttpError(405, { error: `method ${request.method} is not allowed on ${path}; allowed: ${allowed.join(", ")}` }, { Allow: allowed.join(", ") });
  }

  /**
   * The message a route words for a bad segment (`.`, `..`, empty) at `index` of these decoded
   * segments, in the parameter it falls in (storage: `invalid or missing object path`), if any.
   */
  paramMessage(segments: string[], index: number): string | null {
    for (const { def, covered } of this.matching(segments)) {
      const message = def.invalidParam?.[covered[index]!];
      if (message) return message;
    }
    return null;
  }

  /** A view of this router for one area's routes. */
  area<D>(): AreaRouter<D> {
    const view: AreaRouter<D> = {
      add: (def) => {
        this.routes.push(def as unknown as RouteDef);
        return view;
      },
      everyRoute: () => this.routes,
    };
    return view;
  }

  /** The largest body any route reads: nothing larger need ever be accepted by the server. */
  largestBodyLimit(config: Config): number {
    return Math.max(0, ...this.routes.map((def) => resolveBodyLimit(def.bodyLimit, config).bytes));
  }

  /** Registers every route with Elysia, wrapping each handler in validation, auth and error mapping. */
  bind(app: Elysia<any, any, any, any, any, any, any>, t: Transport, metaOf: (r: Request) => { ip: string; arrivedAt: number }): void {
    for (const def of this.routes) {
      this.bodyLimits.set(def, resolveBodyLimit(def.bodyLimit, t.config));
      // `{name+}` takes the rest of the path, slashes included (Elysia's `*`), less a fixed suffix
      // when one follows it in the definition (`/storage/{bucketName}/{path+}/visibility`).
      const rest = /\{(\w+)\+\}(.*)$/.exec(def.path);
      const elysiaPath = (rest ? def.path.slice(0, rest.index) + "*" : def.path).replace(/\{(\w+)\}/g, ":$1");
      const run = async ({ request, params }: { request: Request; params: Record<string, string> }) => {
        try {
          if (rest) {
            const { "*": tail = "", ...named } = params;
            const suffix = rest[2]!;
            if (suffix && (!tail.endsWith(suffix) || tail.length === suffix.length)) throw this.noRoute(request);
            params = { ...named, [rest[1]!]: suffix ? tail.slice(0, -suffix.length) : tail };
          }
          return await this.execute(def, t, request, params, metaOf(request));
        } catch (err) {
          return t.renderError(err, request);
        }
      };
      const methods: Method[] = def.alsoHead ? [def.method, "HEAD"] : [def.method];
      for (const m of methods) app.route(m, elysiaPath, run as any);
    }
  }

  private async execute(def: RouteDef, t: Transport, request: Request, rawParams: Record<string, string>, meta: { ip: string; arrivedAt: number }) {
    const ip = meta.ip;
    const decoded = decodeParams(rawParams);
    for (const [name, message] of Object.entries(def.invalidParam ?? {})) if (decoded[name] !== undefined && badTextAt(decoded[name]) !== null) throw badRequest(message);
    const params = parseWith(def.params, decoded, "path");
    const url = request.url.includes("?") ? new URL(request.url) : null;
    if (url) refuseNulInQuery(url);
    const query = def.query ? parseWith(def.query, url ? queryObject(url) : {}, "query") : undefined;
    const { principal, project } = await t.guard.authorize(def.auth, request, (params ?? {}) as { projectId?: string }, ip);
    const bodyLimit = this.bodyLimits.get(def) ?? resolveBodyLimit(def.bodyLimit, t.config);
    let body: unknown;
    if (def.body && def.bodyValidation !== "document") {
      body = def.formBody && isFormEncoded(request) ? await readFormBody(request, bodyLimit) : await readJsonBody(request, bodyLimit, t.config.maxJsonDepth);
      if (def.bodyValidation !== "handler") body = parseWith(def.body, body, "body");
    }
    // The guard's answer matches the rule (AuthedBy); the route list holds rules of every kind.
    const out = await def.handler({ deps: t.deps, guard: t.guard, request, ip, arrivedAt: meta.arrivedAt, params, query, body, principal, project, bodyLimit } as RouteContext<unknown, unknown, unknown> & AuthedBy<AuthRule>);
    if (out instanceof Response) return out;
    if (t.config.validateResponses) checkResponse(def, out);
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
