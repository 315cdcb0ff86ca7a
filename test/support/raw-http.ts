// One HTTP/1.1 request over a plain socket, with the request target and the method exactly as given.
// fetch() and every HTTP client resolve dot segments (`/a/%2e%2e/b` -> `/b`) and refuse unknown
// methods before sending, which is what the tests of Kiln's own handling must not have done for them.
import { connect } from "node:net";

export interface RawResponse {
  /** 0 when the server closed the connection without answering. */
  status: number;
  headers: Record<string, string>;
  text: string;
  body: any;
}

/** Sends `METHOD target HTTP/1.1` to the server at `base` (http://host:port) and reads the answer. */
export function rawRequest(base: string, method: string, target: string, o: { headers?: Record<string, string>; body?: string; timeoutMs?: number } = {}): Promise<RawResponse> {
  const u = new URL(base);
  const body = o.body === undefined ? undefined : Buffer.from(o.body);
  const headers: Record<string, string> = { host: u.host, connection: "close", ...o.headers };
  if (body) headers["content-length"] = String(body.length);
  const head = `${method} ${target} HTTP/1.1\r\n${Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("")}\r\n`;
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = connect(Number(u.port), u.hostname, () => {
      socket.write(Buffer.from(head, "latin1"));
      if (body) socket.write(body);
    });
    socket.setTimeout(o.timeoutMs ?? 30_000, () => socket.destroy(new Error(`${method} ${target}: no answer in ${(o.timeoutMs ?? 30_000) / 1000} s`)));
    socket.on("data", (d) => chunks.push(typeof d === "string" ? Buffer.from(d, "latin1") : d));
    socket.on("error", (err) => ((err as NodeJS.ErrnoException).code === "ECONNRESET" ? resolve(parse(Buffer.concat(chunks))) : reject(err)));
    socket.on("close", () => resolve(parse(Buffer.concat(chunks))));
  });
}

function parse(raw: Buffer): RawResponse {
  const end = raw.indexOf("\r\n\r\n");
  if (end < 0) return { status: 0, headers: {}, text: raw.toString("latin1"), body: undefined };
  const lines = raw.subarray(0, end).toString("latin1").split("\r\n");
  const status = Number(lines[0]!.split(" ")[1]);
  const headers: Record<string, string> = {};
  for (const l of lines.slice(1)) {
    const i = l.indexOf(":");
    const k = l.slice(0, i).trim().toLowerCase();
    headers[k] = headers[k] === undefined ? l.slice(i + 1).trim() : `${headers[k]}, ${l.slice(i + 1).trim()}`;
  }
  let payload = raw.subarray(end + 4);
  if (/chunked/i.test(headers["transfer-encoding"] ?? "")) payload = dechunk(payload);
  const text = payload.toString("utf8");
  let body: any = text;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {}
  return { status, headers, text, body };
}

function dechunk(b: Buffer): Buffer {
  const out: Buffer[] = [];
  let at = 0;
  while (at < b.length) {
    const eol = b.indexOf("\r\n", at);
    if (eol < 0) break;
    const size = parseInt(b.subarray(at, eol).toString("latin1"), 16);
    if (!size) break;
    out.push(b.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
  return Buffer.concat(out);
}
