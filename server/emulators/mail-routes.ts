import * as z from "zod";
import type { MailCatcher } from "../../emulators/mail/catcher";
import { errorSchema } from "../http/common-schemas";
import { forbidden, notFound } from "../http/errors";
import { reply, type AreaRouter, type RouteContext } from "../http/route";

const tag = "Emulators: mail";

export const caughtMessageSchema = z.object({
  id: z.string(),
  received_at: z.string(),
  from: z.string(),
  to: z.array(z.string()),
  subject: z.string(),
  text: z.string(),
  html: z.string().nullable(),
  headers: z.record(z.string(), z.string()),
  links: z.array(z.string()).describe("every http(s) link in the message, in order"),
});

/**
 * The local mail catcher's pages: every email Kiln sends (and any other mail sent to its SMTP port),
 * newest first, whichever project sent it. Open on a developer's machine; with `--mail-catcher token`
 * (the production profile's default) only the platform token of the instance's own account reads
 * them: accounts made through /admin/accounts must not see each other's reset links. Off when Kiln
 * sends real mail.
 */
export interface MailCatcherRouteDeps {
  /** The local catcher, or null when Kiln sends real mail (KILN_SMTP_URL). */
  mailCatcher: MailCatcher | null;
  /** host:port of the catcher's SMTP listener. */
  smtpAddress: string;
  /** `open`: no credential; `token`: the platform token of an account for which `isOperator` holds. */
  mailCatcherAccess: "open" | "token";
  isOperator(accountId: string): Promise<boolean>;
}

const NOT_OPERATOR = "the mail catcher shows every project's mail: only a platform token of this Kiln's own account reads it";

export function mailCatcherRoutes(r: AreaRouter<MailCatcherRouteDeps>): void {
  // The rule depends on the start options, so the routes declare none and apply it here.
  const get = async ({ deps, guard, request, ip }: RouteContext<unknown, unknown, unknown, MailCatcherRouteDeps>) => {
    if (!deps.mailCatcher) throw notFound("the mail catcher is off: this Kiln sends mail through KILN_SMTP_URL");
    if (deps.mailCatcherAccess === "token") {
      const { principal } = await guard.authorize({ kind: "account" }, request, {}, ip);
      if (!(await deps.isOperator(principal.accountId))) throw forbidden(NOT_OPERATOR);
    }
    return deps.mailCatcher;
  };
  const guarded = { 401: errorSchema, 403: errorSchema, 404: errorSchema, 429: errorSchema };
  const auth = { kind: "none" } as const;
  const note = " (with --mail-catcher token: the instance account's platform token)";
  r.add({
    method: "GET",
    path: "/_emulators/mail",
    tag,
    summary: "The caught messages as a page people can read" + note,
    auth,
    responses: { 200: { description: "HTML page", contentType: "text/html" }, ...guarded },
    handler: async (ctx) =>
      new Response((await get(ctx)).renderHtml({ basePath: "/_emulators/mail" }).replace("</h1>", `</h1><p>SMTP: <code>${ctx.deps.smtpAddress}</code></p>`), {
        headers: { "Content-Type": "text/html; charset=utf-8" },
      }),
  });
  r.add({
    method: "GET",
    path: "/_emulators/mail/messages",
    tag,
    summary: "Caught messages, newest first; filter by recipient with `to`" + note,
    auth,
    query: z.object({ to: z.string().optional(), limit: z.coerce.number().int().min(1).max(1000).optional() }),
    responses: { 200: { description: "messages", schema: z.object({ data: z.array(caughtMessageSchema) }) }, ...guarded },
    handler: async (ctx) => reply.ok({ data: (await get(ctx)).list({ to: ctx.query.to, limit: ctx.query.limit }) }),
  });
  r.add({
    method: "GET",
    path: "/_emulators/mail/messages/{messageId}",
    tag,
    summary: "One caught message" + note,
    auth,
    params: z.object({ messageId: z.string() }),
    responses: { 200: { description: "message", schema: caughtMessageSchema }, ...guarded },
    handler: async (ctx) => {
      const m = (await get(ctx)).get(ctx.params.messageId);
      if (!m) throw notFound("message not found");
      return reply.ok(m);
    },
  });
  r.add({
    method: "DELETE",
    path: "/_emulators/mail/messages",
    tag,
    summary: "Forget every caught message" + note,
    auth,
    responses: { 204: { description: "cleared" }, ...guarded },
    handler: async (ctx) => {
      (await get(ctx)).clear();
      return reply.noContent();
    },
  });
}
