import type { Server } from "bun";
import { Elysia } from "elysia";
import type { HostRouter } from "../area";
import type { Logger } from "../log";
import { SERVICE_VERSION, KILN_VERSION } from "../version";
import { judgeCliVersion } from "./cli-version";
import { invokeBodyLimit, jsonBodyLimit, unreadBodies } from "./body";
import { errorResponse, HttpError, jsonResponse } from "./errors";
import type { Router, Transport } from "./route";

/** Bun's hard limit on a request body (4 GiB less one byte, the most it takes). */
const SERVER_BODY_CEILING = 2 ** 32 - 1;

export function renderError(log: Logger, err: unknown, request: Request): Response {
  if (err instanceof HttpError) return errorResponse(err);
  const requestId = crypto.randomUUID();
  log.error(`${request.method} ${new URL(request.url).pathname} failed (request ${requestId})`, err);
  // Never leak internals: the message names the request id so operators can find the log line.
  return jsonResponse(500, { error: `internal error (request ${requestId})` }, { "X-Request-Id": requestId });
}

/**
 * The HTTP front: Bun.serve → version/CLI checks → Elysia routing → the route's handler; then the
 * service headers on every response, errors included.
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
    if (code === "NOT_FOUND") return errorResponse(new HttpError(404, { error: `no route for ${request.method} ${new URL(request.url).pathname}` }));
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
  const server = Bun.serve({
    hostname: t.config.host,
    port: t.config.port,
    idleTimeout: 60,
    maxRequestBodySize,
    async fetch(request, srv) {
      meta.set(request, { ip: srv.requestIP(request)?.address ?? "unknown", arrivedAt: performance.now() });
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
        const m = meta.get(request)!;
        res = (await byHost(request, m)) ?? (await app.handle(request));
      } catch (err) {
        res = t.renderError(err, request);
      }
      // Refused over its limit: the rest of the body is discarded as it comes, for as long as it keeps coming.
      if (unreadBodies.has(request)) srv.timeout(request, UNREAD_BODY_IDLE_SECONDS);
      return finish(res, verdict === "suggest_upgrade");
    },
    error(err) {
      t.log.error("unhandled server error", err);
      return jsonResponse(500, { error: "internal error" });
    },
  });
  return server;
}
