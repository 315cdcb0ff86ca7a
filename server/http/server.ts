import { Elysia } from "elysia";
import type { Kiln } from "../context";
import { SERVICE_VERSION, KILN_VERSION } from "../version";
import { judgeCliVersion } from "./cli-version";
import { errorResponse, HttpError, jsonResponse } from "./errors";
import type { Router } from "./route";

export function renderError(kiln: Kiln, err: unknown, request: Request): Response {
  if (err instanceof HttpError) return errorResponse(err);
  const requestId = crypto.randomUUID();
  kiln.log.error(`${request.method} ${new URL(request.url).pathname} failed (request ${requestId})`, err);
  // Never leak internals: the message names the request id so operators can find the log line.
  return jsonResponse(500, { error: `internal error (request ${requestId})` }, { "X-Request-Id": requestId });
}

/**
 * The HTTP front: Bun.serve → version/CLI checks → Elysia routing → the route's handler; then the
 * service headers on every response, errors included.
 */
/** Answers requests addressed by host name (function addresses); null leaves them to the routes. */
export type HostRouter = (request: Request, meta: { ip: string; arrivedAt: number }) => Promise<Response> | null;

export function serveHttp(kiln: Kiln, router: Router, byHost: HostRouter = () => null) {
  const meta = new WeakMap<Request, { ip: string; arrivedAt: number }>();
  const app = new Elysia({ normalize: false });
  router.bind(app, kiln, (r) => meta.get(r) ?? { ip: "unknown", arrivedAt: performance.now() });
  app.onError(({ code, request, error }) => {
    if (code === "NOT_FOUND") return errorResponse(new HttpError(404, { error: `no route for ${request.method} ${new URL(request.url).pathname}` }));
    if (code === "PARSE") return errorResponse(new HttpError(400, { error: "request body could not be parsed" }));
    return renderError(kiln, error, request);
  });
  const region = kiln.config.regions[0]!;

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

  const server = Bun.serve({
    hostname: kiln.config.host,
    port: kiln.config.port,
    idleTimeout: 60,
    async fetch(request, srv) {
      meta.set(request, { ip: srv.requestIP(request)?.address ?? "unknown", arrivedAt: performance.now() });
      const verdict = judgeCliVersion(request.headers.get("x-service-cli-version"), KILN_VERSION, kiln.config.minCliVersion);
      if (verdict === "require_upgrade") {
        const res = jsonResponse(
          426,
          { error: `this CLI version is no longer supported; upgrade to ${kiln.config.minCliVersion} or later` },
          { "X-Service-CLI-Instruction": "require_version_upgrade" },
        );
        return finish(res, false);
      }
      let res: Response;
      try {
        const m = meta.get(request)!;
        res = (await byHost(request, m)) ?? (await (router.direct(request, kiln, m) ?? app.handle(request)));
      } catch (err) {
        res = renderError(kiln, err, request);
      }
      return finish(res, verdict === "suggest_upgrade");
    },
    error(err) {
      kiln.log.error("unhandled server error", err);
      return jsonResponse(500, { error: "internal error" });
    },
  });
  return server;
}
