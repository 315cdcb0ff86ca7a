import { Elysia } from "elysia";
import { MailCatcher } from "../../emulators/mail/catcher";
import type { Guard } from "../auth/guard";
import type { Config } from "../config";
import { errorResponse, HttpError } from "../http/errors";
import { Router } from "../http/route";
import { renderError } from "../http/server";
import { createLogger } from "../log";
import { mailCatcherRoutes, type MailCatcherRouteDeps } from "./mail-routes";

/** `kiln emulators mail`: the catcher and its routes without the rest of Kiln. */
export async function serveMailCatcher(o: { host: string; smtpPort: number; httpPort: number }) {
  const catcher = new MailCatcher();
  const smtp = await catcher.start({ host: o.host, port: o.smtpPort });
  // No accounts here: the standalone catcher is a development tool, open like the embedded profile's.
  const deps: MailCatcherRouteDeps = { mailCatcher: catcher, smtpAddress: `${smtp.host}:${smtp.port}`, mailCatcherAccess: "open", isOperator: async () => false };
  const router = new Router();
  mailCatcherRoutes(router.area());
  const log = createLogger();
  // Open access: the catcher's routes never ask this guard for more than rule `none`.
  const guard = { authorize: async () => ({ principal: null, project: null }) } as unknown as Guard;
  // The catcher's root is its messages page: `kiln emulators mail` is all this port serves.
  const app = new Elysia().get("/", () => new Response(null, { status: 302, headers: { location: "/_emulators/mail" } }));
  router.bind(app, { config: { validateResponses: false } as Config, log, guard, deps, renderError: (err, req) => renderError(log, err, req) }, () => ({ ip: "local", arrivedAt: performance.now() }));
  app.onError(({ code, request, error }) =>
    code === "NOT_FOUND" ? errorResponse(new HttpError(404, { error: `no route for ${request.method} ${new URL(request.url).pathname}` })) : renderError(log, error, request),
  );
  const server = Bun.serve({ hostname: o.host, port: o.httpPort, fetch: (req) => app.handle(req) });
  return {
    smtp: deps.smtpAddress,
    url: `http://${o.host}:${server.port}`,
    async stop() {
      await server.stop();
      await catcher.stop();
    },
  };
}
