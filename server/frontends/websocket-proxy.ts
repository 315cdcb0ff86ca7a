import type { ServerWebSocket } from "bun";
import { UPGRADED, type SocketBridge, type Upgrade } from "../http/websocket-bridge";

/** An open client ↔ app WebSocket pair; Kiln closes it when its deployment stops serving. */
export interface ProxiedSocket {
  close(code: number, reason: string): void;
}

// Request headers the app's server sees on the upstream handshake: who asks (cookies, origin,
// credentials) and where from. The handshake's own headers are the proxy's.
const FORWARDED = ["cookie", "origin", "authorization", "user-agent", "accept-language", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"];
/** How long the app's server has to accept the upstream socket (wall time: a network wait, not a platform timer). */
const OPEN_TIMEOUT_MS = 10_000;

/** Close codes a peer may send (RFC 6455 §7.4: 1005, 1006 and 1015 are never sent). */
const sendable = (code: number) => (code >= 1000 && code <= 1014 && code !== 1004 && code !== 1005 && code !== 1006) || (code >= 3000 && code <= 4999);

const text = (status: number, body: string) => new Response(body, { status, headers: { "Content-Type": "text/plain; charset=utf-8" } });

/**
 * A WebSocket opened at a site's URL, proxied to the app's server: Kiln first opens the upstream
 * socket (same path and query, the client's subprotocols and identifying headers), and only once the
 * app accepted it upgrades the client's connection, answering with the subprotocol the app chose. An
 * app that refuses or does not answer gets the client a 502 and no socket. Frames then flow both ways
 * as they come, text as text and binary as binary; a close on either side closes the other with the
 * same code and reason. `sockets` holds the pair while it is open, so that a redeploy or a stop closes
 * it (1012 / 1001) rather than leaving it on a server that goes away.
 */
export async function proxyWebSocket(
  request: Request,
  pathAndQuery: string,
  tunnel: { websocketUrl: (pathAndQuery: string) => string; release: () => void },
  upgrade: Upgrade,
  sockets: Set<ProxiedSocket>,
): Promise<Response> {
  const headers: Record<string, string> = {};
  for (const h of FORWARDED) {
    const v = request.headers.get(h);
    if (v !== null) headers[h] = v;
  }
  if (!headers["x-forwarded-host"] && request.headers.get("host")) headers["x-forwarded-host"] = request.headers.get("host")!;
  headers["x-forwarded-proto"] ??= new URL(request.url).protocol === "https:" ? "https" : "http";
  const protocols = (request.headers.get("sec-websocket-protocol") ?? "")
    .split(",")
    .map((p) => p.trim())
    .filter(Boolean);

  let upstream: WebSocket;
  try {
    upstream = new WebSocket(tunnel.websocketUrl(pathAndQuery), { headers, protocols } as unknown as string[]);
    upstream.binaryType = "arraybuffer";
  } catch (e) {
    tunnel.release();
    return text(502, `the frontend's server did not accept the WebSocket: ${(e as Error).message}\n`);
  }
  // Frames the app sends before the client's side is open wait here.
  const early: (string | ArrayBuffer)[] = [];
  let client: ServerWebSocket<SocketBridge> | null = null;
  let upstreamClosed: { code: number; reason: string } | null = null;
  upstream.onmessage = (e) => {
    const data = e.data as string | ArrayBuffer;
    if (client) client.send(data);
    else early.push(data);
  };
  const opened = await new Promise<string | null>((resolve) => {
    const timer = setTimeout(() => resolve(`no answer within ${OPEN_TIMEOUT_MS / 1000} s`), OPEN_TIMEOUT_MS);
    upstream.onopen = () => (clearTimeout(timer), resolve(null));
    upstream.onerror = () => (clearTimeout(timer), resolve("it refused the connection or the handshake"));
    upstream.onclose = (e) => (clearTimeout(timer), resolve(`it closed the connection (${e.code})`));
  });
  if (opened !== null) {
    try {
      upstream.close();
    } catch {}
    tunnel.release();
    return text(502, `the frontend's server did not accept the WebSocket: ${opened}\n`);
  }

  let done = false;
  const pair: ProxiedSocket = {
    close(code, reason) {
      // Kiln closes both sides (a redeploy, a stop): the client hears why.
      client?.close(code, reason);
      try {
        upstream.close(1001, reason);
      } catch {}
      finish();
    },
  };
  const finish = () => {
    if (done) return;
    done = true;
    sockets.delete(pair);
    tunnel.release();
  };
  upstream.onerror = null;
  upstream.onclose = (e) => {
    upstreamClosed = { code: e.code, reason: e.reason };
    // An abnormal end (the process died) is reported as the server going away.
    if (client) client.close(sendable(e.code) ? e.code : 1011, sendable(e.code) ? e.reason : "the frontend's server closed the connection");
    finish();
  };
  const bridge: SocketBridge = {
    open(ws) {
      client = ws;
      for (const m of early.splice(0)) ws.send(m);
      if (upstreamClosed) ws.close(sendable(upstreamClosed.code) ? upstreamClosed.code : 1011, upstreamClosed.reason);
    },
    message(_ws, data) {
      if (upstream.readyState === WebSocket.OPEN) upstream.send(data as string | Uint8Array<ArrayBuffer>);
    },
    close(_ws, code, reason) {
      client = null;
      try {
        if (upstream.readyState === WebSocket.OPEN || upstream.readyState === WebSocket.CONNECTING) upstream.close(sendable(code) ? code : 1000, reason);
      } catch {}
      finish();
    },
  };
  const chosen = upstream.protocol;
  sockets.add(pair);
  if (!upgrade(bridge, chosen ? { "Sec-WebSocket-Protocol": chosen } : undefined)) {
    pair.close(1011, "the client's connection could not be upgraded");
    return text(400, "this request cannot be upgraded to a WebSocket\n");
  }
  return UPGRADED;
}
