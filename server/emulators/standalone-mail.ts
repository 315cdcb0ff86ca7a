import { Elysia } from "elysia";
import { MailCatcher } from "../../emulators/mail/catcher";
import type { Kiln } from "../context";
import { errorResponse, HttpError } from "../http/errors";
import { Router } from "../http/route";
import { renderError } from "../http/server";
import { createLogger } from "../log";
import { mailCatcherRoutes } from "./mail-routes";

/** `kiln emulators mail`: the catcher and its routes without the rest of Kiln. */
export async function serveMailCatcher(o: { host: string; smtpPort: number; httpPort: number }) {
  const catcher = new MailCatcher();
  const smtp = await catcher.start({ host: o.host, port: o.smtpPort });
  const smtpAddress = `${smtp.host}:${smtp.port}`;
  const router = new Router();
  mailCatcherRoutes(router, () => catcher, () => smtpAddress);
  // The catcher's routes take no credential, so this is all of Kiln they need.
  const kiln = {
    config: { validateResponses: false },
    log: createLogger(),
    guard: { authorize: async () => ({ principal: null, project: null }) },
  } as unknown as Kiln;
  kiln.http = { renderError: (err, req) => renderError(kiln, err, req) };
  const app = new Elysia();
  router.bind(app, kiln, () => ({ ip: "local", arrivedAt: performance.now() }));
  app.onError(({ code, request, error }) =>
    code === "NOT_FOUND" ? errorResponse(new HttpError(404, { error: `no route for ${request.method} ${new URL(request.url).pathname}` })) : renderError(kiln, error, request),
  );
  const server = Bun.serve({ hostname: o.host, port: o.httpPort, fetch: (req) => app.handle(req) });
  return {
    smtp: smtpAddress,
    url: `http://${o.host}:${server.port}`,
    async stop() {
      await server.stop();
      await catcher.stop();
    },
  };
}
