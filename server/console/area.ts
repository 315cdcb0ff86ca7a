import * as z from "zod";
import type { AccountsService } from "../accounts/service";
import { defineArea } from "../area";
import { errorSchema } from "../http/common-schemas";
import { badRequest } from "../http/errors";
import { reply } from "../http/route";
import type { Platform } from "../platform";
import { consolePage } from "./bundle";
import { ConsoleSignIn } from "./sign-in";

const tag = "Console";

/**
 * The web console at /_console/: one static page (built from server/console/app at package time)
 * that drives Kiln through its public API only, plus the exchange of the one-time sign-in code the
 * start line prints.
 */
export const consoleArea = defineArea({
  name: "console",
  start: ({ clock }: Pick<Platform, "clock"> & { accounts: AccountsService }) => ({ consoleSignIn: new ConsoleSignIn(() => clock.nowMs()) }),
  // Paths are exact (server/http/exact-path.ts) and a trailing `/` routes nowhere: the address people
  // type, /_console/, is sent on to /_console (the fragment, a sign-in code, survives a redirect).
  hostRouter: () => (request) => {
    if (request.method !== "GET" && request.method !== "HEAD") return null;
    const url = new URL(request.url);
    if (url.pathname !== "/_console/") return null;
    return Promise.resolve(new Response(null, { status: 308, headers: { Location: `/_console${url.search}` } }));
  },
  routes(r) {
    const html = async () =>
      new Response(await consolePage(), {
        headers: {
          "Content-Type": "text/html; charset=utf-8",
          "Cache-Control": "no-cache",
          // Inline script and style only: the page fetches nothing but this Kiln's API.
          "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'self'",
          "Referrer-Policy": "no-referrer",
        },
      });
    r.add({
      method: "GET",
      path: "/_console",
      tag,
      summary: "The web console: a page that drives this Kiln through its public API (sign in with a platform token; /_console/ redirects here)",
      auth: { kind: "none" },
      responses: { 200: { description: "HTML page", contentType: "text/html" } },
      handler: () => html(),
    });
    r.add({
      method: "POST",
      path: "/_console/sign-in",
      tag,
      summary: "Trade the one-time code of the console link printed at start for a new platform token of the instance's account",
      auth: { kind: "none" },
      body: z.object({ code: z.string().min(1).max(200) }),
      responses: { 200: { description: "a platform token", schema: z.object({ platform_token: z.string() }) }, 400: errorSchema },
      handler: async ({ deps, body }) => {
        if (!deps.consoleSignIn.redeem(body.code)) throw badRequest("invalid or used sign-in code: sign in with the platform token (.kiln/credentials.json), or restart Kiln for a new link");
        return reply.ok({ platform_token: await deps.accounts.issueDefaultToken() });
      },
    });
  },
});
