import type { Guard } from "../auth/guard";
import { invokeBodyLimit, readBodyBytes, readJsonBody } from "../http/body";
import { preflight } from "../http/cors";
import { errorResponse, HttpError } from "../http/errors";
import { INVOKE_AUTH, invoke, mayInvoke, type InvokeDeps } from "./invoke";
import type { FunctionRecord } from "./records";

/** Methods an HTTP-mode function address serves; the preflight advertises them plus OPTIONS. */
export const HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

/**
 * Every function answers on two addresses with the same semantics (RPC functions: POST {payload};
 * HTTP-mode functions: any method and path as a request event):
 * - `invoke_url`, the path form `<Kiln's address>/fn/<project-id>/<name>[/<path>]`: reached by every
 *   HTTP client with no DNS set-up (Node's fetch, Python's urllib and getent do not resolve
 *   `*.localhost` on a stock Debian; browsers and curl do). The function sees `/<path>`.
 * - the host form `http://<name>.<project-id>.<functions domain>:<port>` (each part a DNS label, so
 *   the 63-character name fits), routed by the Host header, as the spec's DNS addresses are.
 */
export function invokeUrl(deps: Pick<InvokeDeps, "address">, fn: { name: string; project_id: string }): string {
  return `${deps.address.publicUrl().replace(/\/+$/, "")}${FUNCTION_PATH_PREFIX}/${fn.project_id}/${fn.name}`;
}

/** The host form of a function's address (docs/functions.md). */
export function invokeHostUrl(deps: Pick<InvokeDeps, "config" | "address">, fn: { name: string; project_id: string }): string {
  return `http://${fn.name}.${fn.project_id}.${deps.config.functionsDomain}:${deps.address.httpPort()}`;
}

export const FUNCTION_PATH_PREFIX = "/fn";

/** A function the request addresses, by its Host header or by the path form; `path` is what the function sees. */
export interface FunctionTarget {
  name: string;
  projectId: string;
  /** The request's path as the function sees it (the path form's part after the name). */
  path?: string;
}

export function matchFunctionHost(host: string | null, domain: string): FunctionTarget | null {
  if (!host) return null;
  const h = host.toLowerCase().replace(/:\d+$/, "");
  const suffix = `.${domain}`;
  if (!h.endsWith(suffix)) return null;
  const m = /^([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)\.([a-z0-9]{20})$/.exec(h.slice(0, -suffix.length));
  return m ? { name: m[1]!, projectId: m[2]! } : null;
}

/** `/fn/<project-id>/<name>[/<path>]`: the path form of a function's address. */
export function matchFunctionPath(pathname: string): FunctionTarget | null {
  const m = /^\/fn\/([a-z0-9]{20})\/([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(\/.*)?$/.exec(pathname);
  return m ? { projectId: m[1]!, name: m[2]!, path: m[3] ?? "/" } : null;
}

const TEXTUAL = /^(text\/|application\/(json|xml|x-www-form-urlencoded|javascript|graphql)|[^;]*\+(json|xml))/i;

/** The request event an HTTP-mode function receives (docs/functions.md); the body within the invocation limit. */
async function requestEvent(deps: InvokeDeps, request: Request, path?: string) {
  const url = new URL(request.url);
  const headers: Record<string, string> = {};
  request.headers.forEach((v, k) => {
    headers[k] = v;
  });
  const raw = request.method === "GET" || request.method === "HEAD" ? new Uint8Array() : await readBodyBytes(request, invokeBodyLimit(deps.config));
  const textual = raw.length === 0 || TEXTUAL.test(request.headers.get("content-type") ?? "text/plain");
  return {
    method: request.method,
    path: path ?? url.pathname,
    query: Object.fromEntries(url.searchParams),
    headers,
    body: textual ? new TextDecoder().decode(raw) : Buffer.from(raw).toString("base64"),
    isBase64Encoded: !textual,
  };
}

export async function serveFunctionHost(deps: InvokeDeps, guard: Guard, request: Request, ip: string, arrivedAt: number, target: FunctionTarget): Promise<Response> {
  const handlerStart = performance.now();
  try {
    const fn: FunctionRecord | null = await deps.functions.byName(target.projectId, target.name);
    if (!fn || fn.status === "deleting") throw new HttpError(404, { error: "function not found" });
    const rpc = fn.invocation_mode === "rpc";
    if (request.method === "OPTIONS") return preflight(request, rpc ? ["POST"] : HTTP_METHODS);
    if (rpc ? request.method !== "POST" : !HTTP_METHODS.includes(request.method))
      throw new HttpError(405, { error: rpc ? "an RPC function takes POST with a JSON body {payload}" : `method ${request.method} is not served` });
    // Tokenless access exists only for public HTTP functions with http_auth_mode none.
    let principal = null;
    if (rpc || !(fn.http_auth_mode === "none" && fn.is_public)) {
      principal = (await guard.authorize(INVOKE_AUTH, request, {}, ip)).principal;
      if (principal.projectId !== fn.project_id) throw new HttpError(404, { error: "function not found" });
      mayInvoke(principal, fn);
    }
    if (rpc) {
      const body = await readJsonBody(request, invokeBodyLimit(deps.config), deps.config.maxJsonDepth, { emptyIsObject: false });
      if (typeof body !== "object" || body === null || Array.isArray(body)) throw new HttpError(400, { error: "invalid request: the body must be a JSON object {payload: ...}" });
      return await invoke(deps, fn, principal, (body as { payload?: unknown }).payload, arrivedAt, handlerStart);
    }
    return await invoke(deps, fn, principal, await requestEvent(deps, request, target.path), arrivedAt, handlerStart, { head: request.method === "HEAD" });
  } catch (err) {
    if (err instanceof HttpError) return errorResponse(err);
    throw err; // the server's catch-all logs it and answers 500
  }
}
