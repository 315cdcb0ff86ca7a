import * as z from "zod";
import type { MailCatcher } from "../../emulators/mail/catcher";
import { errorSchema } from "../http/common-schemas";
import { notFound } from "../http/errors";
import { reply, type AreaRouter } from "../http/route";

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
 * newest first. No credential: it is a development tool, and it is off when Kiln sends real mail.
 */
export interface MailCatcherRouteDeps {
  /** The local catcher, or null when Kiln sends real mail (KILN_SMTP_URL). */
  mailCatcher: MailCatcher | null;
  /** host:port of the catcher's SMTP listener. */
  smtpAddress: string;
}

export function mailCatcherRoutes(r: AreaRouter<MailCatcherRouteDeps>): void {
  const get = (deps: MailCatcherRouteDeps) => {
    if (!deps.mailCatcher) throw notFound("the mail catcher is off: this Kiln sends mail through KILN_SMTP_URL");
    return deps.mailCatcher;
  };
  r.add({
    method: "GET",
    path: "/_emulators/mail",
    tag,
    summary: "The caught messages as a page people can read",
    auth: { kind: "none" },
    responses: { 200: { description: "HTML page", contentType: "text/html" }, 404: errorSchema },
    handler: ({ deps }) =>
      new Response(get(deps).renderHtml({ basePath: "/_emulators/mail" }).replace("</h1>", `</h1><p>SMTP: <code>${deps.smtpAddress}</code></p>`), {
        headers: { "Content-Type": "text/html; charset=utf-8" },
      }),
  });
  r.add({
    method: "GET",
    path: "/_emulators/mail/messages",
    tag,
    summary: "Caught messages, newest first; filter by recipient with `to`",
    auth: { kind: "none" },
    query: z.object({ to: z.string().optional(), limit: z.coerce.number().int().min(1).max(1000).optional() }),
    responses: { 200: { description: "messages", schema: z.object({ data: z.array(caughtMessageSchema) }) }, 404: errorSchema },
    handler: ({ deps, query }) => reply.ok({ data: get(deps).list({ to: query.to, limit: query.limit }) }),
  });
  r.add({
    method: "GET",
    path: "/_emulators/mail/messages/{messageId}",
    tag,
    summary: "One caught message",
    auth: { kind: "none" },
    params: z.object({ messageId: z.string() }),
    responses: { 200: { description: "message", schema: caughtMessageSchema }, 404: errorSchema },
    handler: ({ deps, params }) => {
      const m = get(deps).get(params.messageId);
      if (!m) throw notFound("message not found");
      return reply.ok(m);
    },
  });
  r.add({
    method: "DELETE",
    path: "/_emulators/mail/messages",
    tag,
    summary: "Forget every caught message",
    auth: { kind: "none" },
    responses: { 204: { description: "cleared" }, 404: errorSchema },
    handler: ({ deps }) => {
      get(deps).clear();
      return reply.noContent();
    },
  });
}
