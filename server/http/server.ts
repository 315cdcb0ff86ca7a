import type { Server } from "bun";
import { Elysia } from "elysia";
import type { HostRouter } from "../area";
import type { Logger } from "../log";
import { SERVICE_VERSION, KILN_VERSION } from "../version";
import { judgeCliVersion } from "./cli-version";
import { invokeBodyLimit, jsonBodyLimit, unreadBodies } from "./body";
import { errorResponse, HttpError, jsonResponse } from "./errors";
import { type SentPath, sentPathProblem, sentPathRoutes } from "./exact-path";
import { METHODS, type Method, type Router, type Transport } from "./route";
import { bridgeHandlers, isUpgradeRequest, UPGRADED, type SocketBridge } from "./websocket-bridge";

/** GET or HEAD /healthz, the one request that does not wait for a start's deferred work. */
function isHealthCheck(request: Request): boolean {
  if (request.method !== "GET" && request.method !== "HEAD") return false;
  const url = request.url;
  const path = url.indexOf("/", url.indexOf("//") + 2);
  return path >= 0 && (url.startsWith("/healthz", path) && (url.length === path + 8 || url[path + 8] === "?"));
}

/** Bun's hard limit on a request body (4 GiB less one byte, the most it takes). */
const SERVER_BODY_CEILING = 2 ** 32 - 1;

export function renderError(log: Logger, err: unknown, request: Request): Response {
  if (err instanceof HttpError) return errorResponse(err);
  const requestId = crypto.randomUUID();
  // The client went away mid-request (an upload cut off, a closed tab): what failed is reading its
  // body, not Kiln. One info line; the answer goes nowhere, but the error shape stays the same.
  if (request.signal.aborted) {
    log.info(`${request.method} ${new URL(request.url).pathname}: the client closed the connection before the request was read (request ${requestId})`);
    return jsonResponse(400, { error: "the client closed the connection before the request was read" }, { "X-Request-Id": requestId });
  }
  log.error(`${request.method} ${new URL(request.url).pathname} failed (request ${requestId})`, err);
  // Never leak internals: the message names the request id so operators can find the log line.
  return jsonResponse(500, { error: `internal error (request ${requestId})` }, { "X-Request-Id": requestId });
}

/**
 * The HTTP front: Bun.serve → version/CLI checks → host routing (function addresses) → the path as
 * sent (exact-path.ts) and the method → Elysia routing → the route's handler; then the service
 * headers on every response, errors included.
 */

/**
 * Idle time allowed on a connection whose refused body is still being discarded. Closing it while the
 * client still sends resets the connection, and a reset throws away the 413 if the client has not read
 * it yet: a busy client can pause a few seconds, so this is not shorter than that.
 */
const UNREAD_BODY_IDLE_SECONDS = 10;

/**
 * A graceful stop: no new connections; requests in flight (streamed responses included) finish.
 * Connections still discarding a refused body hold no request, so once none is in flight they are
 * closed: otherwise the stop waits as long as the client keeps sending (or UNREAD_BODY_IDLE_SECONDS).
 */
export async function stopHttp(server: Server<unknown>): Promise<void> {
  const graceful = server.stop(false);
  let done = false;
  void graceful.then(() => (done = true));
  while (!done) {
    if (server.pendingRequests === 0) {
      await server.stop(true);
      break;
    }
    await Promise.race([graceful, new Promise((r) => setTimeout(r, 50))]);
  }
  await graceful;
}

export function serveHttp(t: Transport, router: Router, byHost: HostRouter = () => null) {
  const meta = new WeakMap<Request, { ip: string; arrivedAt: number }>();
  const app = new Elysia({ normalize: false });
  router.bind(app, t, (r) => meta.get(r) ?? { ip: "unknown", arrivedAt: performance.now() });
  app.onError(({ code, request, error }) => {
    if (code === "NOT_FOUND") return errorResponse(router.noRoute(request));
    if (code === "PARSE") return errorResponse(new HttpError(400, { error: "request body could not be parsed" }));
    return t.renderError(error, request);
  });
  const region = t.config.regions[0]!;

  const finish = (res: Response, hint: boolean): Response => {
    try {
      res.headers.set("X-Service-Version", SERVICE_VERSION);
      res.headers.set("X-Service-Region", region);
      if (hint) res.headers.set("X-Service-CLI-Instruction", "suggestion_version_upgrade");
      return res;
    } catch {
      const copy = new Response(res.body, res);
      return finish(copy, hint);
    }
  };

  // Every route enforces its own limit while reading (body.ts), with a message in the spec's shape;
  // Bun's own ceiling only backs that up. It sits far above every route's limit because Bun answers
  // past it with an empty 413, and a body nobody reads costs nothing (measured: 300 MB sent to
  // /healthz, RSS +13 MB), so a high ceiling is safe.
  const maxRequestBodySize = Math.max(SERVER_BODY_CEILING, router.largestBodyLimit(t.config), jsonBodyLimit(t.config).bytes, invokeBodyLimit(t.config).bytes);
  /** An API request, once host routing passed it on: its path as sent, its method, then Elysia. */
  const route = (request: Request, sent: SentPath | null): Response | Promise<Response> => {
    const refused = sentPathProblem(request, sent, (segments, i) => router.paramMessage(segments, i));
    if (refused) return errorResponse(refused);
    // Methods Bun passes on that no route has (PROPFIND, QUERY, ...); Bun itself drops a connection
    // whose method it does not know (FOO) before Kiln sees the request.
    if (!METHODS.includes(request.method as Method)) return errorResponse(new HttpError(501, { error: `method ${request.method} is not supported` }));
    return app.handle(request);
  };

  const handle = async (request: Request, srv: Server<unknown>, sent: SentPath | null): Promise<Response | undefined> => {
    // Kiln listens before its areas have resumed their background work (server/main.ts): /healthz
    // answers at once, every other request waits for that work, so each route answers as it would later.
    if (t.gate?.starting && !isHealthCheck(request) && !(await t.gate.starting))
      return finish(jsonResponse(503, { error: "Kiln failed to start; see its log" }), false);
    // Closed while a snapshot or restore swaps the state (gate.ts): wait, or 503 after the hold.
    const wait = t.gate?.enter(request);
    if (wait && !(await wait))
      return finish(jsonResponse(503, { error: "Kiln is saving or restoring a snapshot; try again shortly" }, { "Retry-After": "1" }), false);
    try {
      const res = await handleInside(request, srv, sent);
      // The connection became a WebSocket (a frontend's): Bun answers the handshake itself.
      return res === UPGRADED ? undefined : res;
    } finally {
      t.gate?.leave();
    }
  };
  const handleInside = async (request: Request, srv: Server<unknown>, sent: SentPath | null): Promise<Response> => {
    const m: { ip: string; arrivedAt: number; upgrade?: (bridge: SocketBridge, headers?: Record<string, string>) => boolean } = { ip: srv.requestIP(request)?.address ?? "unknown", arrivedAt: performance.now() };
    if (isUpgradeRequest(request)) m.upgrade = (bridge, headers) => (srv as Server<SocketBridge>).upgrade(request, { data: bridge, headers });
    meta.set(request, m);
    const verdict = judgeCliVersion(request.headers.get("x-service-cli-version"), KILN_VERSION, t.config.minCliVersion);
    if (verdict === "require_upgrade") {
      const res = jsonResponse(
        426,
        { error: `this CLI version is no longer supported; upgrade to ${t.config.minCliVersion} or later` },
        { "X-Service-CLI-Instruction": "require_version_upgrade" },
      );
      return finish(res, false);
    }
    let res: Response;
    try {
      res = (await byHost(request, m)) ?? (await route(request, sent));
    } catch (err) {
      res = t.renderError(err, request);
    }
    // Refused over its limit: the rest of the body is discarded as it comes, for as long as it keeps coming.
    if (unreadBodies.has(request)) srv.timeout(request, UNREAD_BODY_IDLE_SECONDS);
    if (res === UPGRADED) return res;
    return finish(res, verdict === "suggest_upgrade");
  };

  const server = Bun.serve({
    hostname: t.config.host,
    port: t.config.port,
    idleTimeout: 60,
    maxRequestBodySize,
    // Every path with no empty segment matches one of these, which hand over its segments as sent;
    // the rest (`//`, a trailing `/`) reach `fetch` (function addresses take any path).
    // (A WebSocket upgrade resolves to undefined: Bun then answers the handshake itself.)
    routes: sentPathRoutes<Server<unknown>>((request, srv, sent) => handle(request, srv, sent) as Promise<Response>),
    fetch: (request, srv) => handle(request, srv, null) as Promise<Response>,
    websocket: bridgeHandlers,
    error(err) {
      t.log.error("unhandled server error", err);
      return jsonResponse(500, { error: "internal error" });
    },
  });
  return server;
}
