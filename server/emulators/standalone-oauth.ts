import { Elysia } from "elysia";
import { OAUTH_EMULATOR_KINDS, type OAuthEmulatorEndpoints } from "../../emulators/oauth/api";
import { createOAuthEmulators } from "../../emulators/oauth/emulators";
import type { Guard } from "../auth/guard";
import type { Config } from "../config";
import { errorResponse, HttpError } from "../http/errors";
import { Router } from "../http/route";
import { renderError } from "../http/server";
import { createLogger } from "../log";
import { oauthEmulatorRoutes, type OAuthEmulatorRouteDeps } from "./oauth-routes";

/** `kiln emulators oauth`: the four local providers and their identities API without the rest of Kiln. */
export async function serveOAuthEmulators(o: { host: string; port: number }) {
  let url = "";
  const oauthEmulators = createOAuthEmulators({ baseUrl: () => url });
  const deps: OAuthEmulatorRouteDeps = { oauthEmulators };
  const router = new Router();
  oauthEmulatorRoutes(router.area());
  const log = createLogger();
  // Open access: the emulators' routes never ask this guard for more than rule `none`.
  const guard = { authorize: async () => ({ principal: null, project: null }) } as unknown as Guard;
  const app = new Elysia().get("/", () => new Response(null, { status: 302, headers: { location: "/_emulators/oauth" } }));
  router.bind(app, { config: { validateResponses: false } as Config, log, guard, deps, renderError: (err, req) => renderError(log, err, req) }, () => ({ ip: "local", arrivedAt: performance.now() }));
  app.onError(({ code, request, error }) =>
    code === "NOT_FOUND" ? errorResponse(new HttpError(404, { error: `no route for ${request.method} ${new URL(request.url).pathname}` })) : renderError(log, error, request),
  );
  const server = Bun.serve({ hostname: o.host, port: o.port, fetch: (req) => app.handle(req) });
  // The issuers carry the address browsers and relying parties use: a wildcard host is reached on loopback.
  const host = o.host === "0.0.0.0" || o.host === "::" ? "127.0.0.1" : o.host.includes(":") ? `[${o.host}]` : o.host;
  url = `http://${host}:${server.port}`;
  const endpoints: OAuthEmulatorEndpoints[] = OAUTH_EMULATOR_KINDS.map((k) => oauthEmulators.endpoints(k));
  return {
    url,
    endpoints,
    async stop() {
      await server.stop(true);
      await oauthEmulators.stop();
    },
  };
}
