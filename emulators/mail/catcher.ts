import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import type { ParsedMail } from "mailparser";
import { SMTPServer, type SMTPServerSession } from "smtp-server";

/** One email as the catcher stores it and serves it as JSON. */
export interface CaughtMessage {
  id: string;
  received_at: string;
  /** The From header's address, or the envelope sender when the header has none. */
  from: string;
  /** Envelope recipients (so Bcc shows up too), lowercased, without repeats. */
  to: string[];
  subject: string;
  text: string;
  html: string | null;
  /** Raw header values keyed by lowercased name, unfolded; repeated headers joined with ", ". */
  headers: Record<string, string>;
  /** http(s) URLs found in the text and in the HTML's hrefs, first occurrence order. */
  links: string[];
}

export interface MessageFilter {
  to?: string;
  subjectIncludes?: string;
}

// Mail a dev app sends is small; the cap keeps one runaway attachment from eating the process.
const MAX_MESSAGE_BYTES = 25 * 1024 * 1024;


/**
 * smtp-server builds a TLS context (parsing its bundled certificate and the system CAs, tens of ms
 * of CPU) in its constructor even when TLS is off. The catcher speaks plain SMTP only (STARTTLS
 * disabled, no implicit TLS), so there is no context to build.
 */
class PlainSmtpServer extends SMTPServer {
  override updateSecureContext(): void {
    this.secureContext = new Map();
  }
}

/**
 * A local SMTP server that accepts every message, parses it and keeps it in memory, so that sign-up
 * and password-reset emails can be read (by a person in the dashboard, by a test through the API)
 * without a real mail provider.
 */
export class MailCatcher {
  private readonly maxMessages: number;
  /** Oldest first; `list` reverses. */
  private messages: CaughtMessage[] = [];
  private readonly listeners = new Set<(m: CaughtMessage) => void>();
  private server: SMTPServer | null = null;

  constructor(opts: { maxMessages?: number } = {}) {
    this.maxMessages = Math.max(1, opts.maxMessages ?? 1000);
  }

  async start(opts: { host?: string; port?: number } = {}): Promise<{ host: string; port: number }> {
    if (this.server) throw new Error("mail catcher already started");
    const host = opts.host ?? "127.0.0.1";
    const server = new PlainSmtpServer({
      authOptional: true,
      allowInsecureAuth: true,
      // Plain SMTP only: there is no certificate to offer, and clients must not try to upgrade.
      disabledCommands: ["STARTTLS"],
      size: MAX_MESSAGE_BYTES,
      logger: false,
      // The peer is on this machine; a reverse DNS lookup per connection only adds latency.
      disableReverseLookup: true,
      // A client that keeps its connection open must not hold `stop()` for the default 30 s.
      closeTimeout: 1000,
      // Apps configured with SMTP credentials still deliver here: any user and password is fine.
      onAuth: (auth, _session, callback) => callback(null, { user: auth.username ?? "anonymous" }),
      onData: (stream, session, callback) => {
        // mailparser is heavy (~30 MB): loaded with the first message, not with Kiln.
        import("mailparser")
          .then(({ simpleParser }) => simpleParser(stream))
          .then((parsed) => {
            if (stream.sizeExceeded) {
              const err = new Error("message exceeds fixed maximum message size") as Error & { responseCode: number };
              err.responseCode = 552;
              return callback(err);
            }
            this.store(toCaught(parsed, session));
            callback();
          })
          .catch((err: unknown) => callback(err instanceof Error ? err : new Error(String(err))));
      },
    });
    // smtp-server re-emits client socket errors (resets, timeouts) as 'error'; without a listener
    // the EventEmitter would throw and take Kiln down with it.
    server.on("error", () => {});

    await new Promise<void>((resolve, reject) => {
      const onListenError = (err: Error) => reject(err);
      server.server.once("error", onListenError);
      server.listen(opts.port ?? 0, host, () => {
        server.server.off("error", onListenError);
        resolve();
      });
    });
    this.server = server;
    const address = server.server.address() as AddressInfo;
    return { host, port: address.port };
  }

  async stop(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = null;
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Newest first. */
  list(filter: { to?: string; limit?: number } = {}): CaughtMessage[] {
    const out: CaughtMessage[] = [];
    const limit = filter.limit ?? Infinity;
    for (let i = this.messages.length - 1; i >= 0 && out.length < limit; i--) {
      const m = this.messages[i]!;
      if (matches(m, { to: filter.to })) out.push(m);
    }
    return out;
  }

  get(id: string): CaughtMessage | undefined {
    return this.messages.find((m) => m.id === id);
  }

  clear(): void {
    this.messages = [];
  }

  /** Calls `fn` for every message stored from now on; returns the unsubscribe function. */
  onMessage(fn: (m: CaughtMessage) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /**
   * The newest stored message matching `filter`, or else the first one to arrive. `to` compares
   * case-insensitively with each recipient; `subjectIncludes` is a case-sensitive substring.
   */
  waitFor(filter: MessageFilter, timeoutMs = 5000): Promise<CaughtMessage> {
    const existing = this.list().find((m) => matches(m, filter));
    if (existing) return Promise.resolve(existing);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        unsubscribe();
        reject(new Error(`no email matching ${JSON.stringify(filter)} arrived within ${timeoutMs} ms`));
      }, timeoutMs);
      const unsubscribe = this.onMessage((m) => {
        if (!matches(m, filter)) return;
        clearTimeout(timer);
        unsubscribe();
        resolve(m);
      });
    });
  }

  /** A self-contained page (inline CSS, no scripts) listing the messages newest first. */
  renderHtml(opts: { basePath: string }): string {
    const base = escapeHtml(opts.basePath);
    const items = this.list().map((m) => {
      const links = m.links.length
        ? `<ul class="links">${m.links
            .map((l) => `<li><a href="${escapeHtml(l)}" rel="noopener noreferrer" target="_blank">${escapeHtml(l)}</a></li>`)
            .join("")}</ul>`
        : `<p class="muted">No links.</p>`;
      return `<li id="msg-${escapeHtml(m.id)}"><details>
<summary><span class="when">${escapeHtml(m.received_at)}</span> <span class="from">${escapeHtml(m.from)}</span> → <span class="to">${escapeHtml(m.to.join(", "))}</span> <strong class="subject">${escapeHtml(m.subject || "(no subject)")}</strong></summary>
<pre>${escapeHtml(m.text)}</pre>
${links}
</details></li>`;
    });
    const body = items.length ? `<ol class="messages">${items.join("\n")}</ol>` : `<p class="muted">No emails caught yet.</p>`;
    return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Kiln mail (${this.messages.length})</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2rem; color: #222; }
h1 { font-size: 1.3rem; }
ol.messages { list-style: none; padding: 0; }
ol.messages > li { border: 1px solid #ddd; border-radius: 6px; margin: 0 0 .5rem; padding: .5rem .75rem; }
summary { cursor: pointer; }
.when, .muted { color: #777; }
.from, .to { font-family: ui-monospace, monospace; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f6f6; padding: .75rem; border-radius: 4px; }
</style>
</head>
<body>
<h1>Caught emails (${this.messages.length}) <a href="${base}">refresh</a></h1>
${body}
</body>
</html>
`;
  }

  private store(m: CaughtMessage): void {
    this.messages.push(m);
    if (this.messages.length > this.maxMessages) this.messages.splice(0, this.messages.length - this.maxMessages);
    for (const fn of [...this.listeners]) {
      // A failing listener must not turn into an SMTP error for a message that was stored.
      try {
        fn(m);
      } catch {}
    }
  }
}

function matches(m: CaughtMessage, filter: MessageFilter): boolean {
  if (filter.to !== undefined && !m.to.includes(filter.to.trim().toLowerCase())) return false;
  if (filter.subjectIncludes !== undefined && !m.subject.includes(filter.subjectIncludes)) return false;
  return true;
}

function toCaught(parsed: ParsedMail, session: SMTPServerSession): CaughtMessage {
  const envelopeFrom = session.envelope.mailFrom ? session.envelope.mailFrom.address : "";
  const to = [...new Set(session.envelope.rcptTo.map((r) => r.address.toLowerCase()))];
  const html = parsed.html === false ? null : parsed.html;
  const text = parsed.text ?? "";
  return {
    id: randomUUID(),
    received_at: new Date().toISOString(),
    from: parsed.from?.value[0]?.address ?? envelopeFrom,
    to,
    subject: parsed.subject ?? "",
    text,
    html,
    headers: headerRecord(parsed),
    links: extractLinks(text, html),
  };
}

function headerRecord(parsed: ParsedMail): Record<string, string> {
  const out: Record<string, string> = {};
  for (const { key, line } of parsed.headerLines) {
    const colon = line.indexOf(":");
    const value = line.slice(colon + 1).replace(/\r?\n[ \t]+/g, " ").trim();
    out[key] = key in out ? `${out[key]}, ${value}` : value;
  }
  return out;
}

/** http(s) URLs in plain text and in `href` attributes, de-duplicated, text first. */
export function extractLinks(text: string, html: string | null): string[] {
  const found = new Set<string>();
  for (const match of text.matchAll(/\bhttps?:\/\/[^\s<>"'`]+/gi)) found.add(trimUrl(match[0]));
  if (html) {
    for (const match of html.matchAll(/\shref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))/gi)) {
      const href = decodeEntities((match[1] ?? match[2] ?? match[3] ?? "").trim());
      if (/^https?:\/\//i.test(href)) found.add(href);
    }
  }
  return [...found];
}

// Prose around a URL ("see https://x.test/a.", "(https://x.test/a)") is not part of it; a closing
// bracket is kept only when the URL itself opened one (https://x.test/wiki/A_(b)).
function trimUrl(url: string): string {
  let u = url;
  for (;;) {
    const last = u.at(-1)!;
    if (/[.,;:!?'"*]/.test(last)) {
      u = u.slice(0, -1);
      continue;
    }
    const open = { ")": "(", "]": "[", "}": "{" }[last as ")" | "]" | "}"];
    if (open && count(u, open) < count(u, last)) {
      u = u.slice(0, -1);
      continue;
    }
    return u;
  }
}

function count(s: string, ch: string): number {
  return s.split(ch).length - 1;
}

function decodeEntities(s: string): string {
  return s.replace(/&(#x[0-9a-f]+|#\d+|amp|lt|gt|quot|apos);/gi, (whole, e: string) => {
    const lower = e.toLowerCase();
    if (lower.startsWith("#x")) return safeCodePoint(parseInt(lower.slice(2), 16), whole);
    if (lower.startsWith("#")) return safeCodePoint(parseInt(lower.slice(1), 10), whole);
    return { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" }[lower] ?? whole;
  });
}

function safeCodePoint(n: number, fallback: string): string {
  return Number.isInteger(n) && n >= 0 && n <= 0x10ffff ? String.fromCodePoint(n) : fallback;
}

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}
