import { isIP } from "node:net";
import type { Transporter } from "nodemailer";

/** How Kiln sends email: always SMTP, to the local catcher or to the server in `KILN_SMTP_URL`. */
export interface Mailer {
  send(msg: { to: string; subject: string; text: string; html?: string }): Promise<void>;
  close(): Promise<void>;
}

/**
 * A mailer for `smtp://user:pass@host:port` (STARTTLS when the server offers it) or `smtps://...`
 * (TLS from the first byte). Nodemailer options may ride along as query parameters
 * (`?requireTLS=true`) and win over the defaults set here.
 */
export function createSmtpMailer(opts: { url: string; from: string }): Mailer {
  const parsed = new URL(opts.url);
  if (parsed.protocol !== "smtp:" && parsed.protocol !== "smtps:") {
    throw new Error(`unsupported mail URL scheme '${parsed.protocol}': use smtp:// or smtps://`);
  }
  // nodemailer is loaded with the first email, not with Kiln (it weighs ~20 MB).
  let transport: Promise<Transporter> | null = null;
  const options = {
    url: opts.url,
    // One connection per message: Kiln sends rarely, and an idle pooled connection would outlive a
    // restarted catcher or a server's idle timeout.
    pool: false,
    // The local catcher speaks plain SMTP on loopback; there is nothing to upgrade to there.
    ignoreTLS: parsed.protocol === "smtp:" && isLoopback(parsed.hostname),
    // A mail server that does not answer must fail the request that sends, not hang it for minutes
    // (nodemailer's defaults are 2 min to connect and 10 min of socket silence).
    connectionTimeout: 10_000,
    greetingTimeout: 10_000,
    socketTimeout: 30_000,
  };
  const connect = () => (transport ??= import("nodemailer").then((m) => m.default.createTransport(options)));
  return {
    async send(msg) {
      await (await connect()).sendMail({
        from: opts.from,
        to: msg.to,
        subject: msg.subject,
        text: msg.text,
        ...(msg.html !== undefined ? { html: msg.html } : {}),
      });
    },
    async close() {
      if (transport) (await transport).close();
    },
  };
}

function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "localhost" || host.endsWith(".localhost")) return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  return host === "::1";
}
