import type { ServerWebSocket, WebSocketHandler } from "bun";

/**
 * A WebSocket Kiln accepted on behalf of something behind it (a frontend's server): Bun's listener
 * hands each event of the client's socket to the bridge the upgrade was given. One handler set per
 * listener (Bun takes it at `Bun.serve`), so every bridge carries its own callbacks.
 */
export interface SocketBridge {
  open(ws: ServerWebSocket<SocketBridge>): void;
  message(ws: ServerWebSocket<SocketBridge>, data: string | Buffer): void;
  close(ws: ServerWebSocket<SocketBridge>, code: number, reason: string): void;
}

export const bridgeHandlers: WebSocketHandler<SocketBridge> = {
  open: (ws) => ws.data.open(ws),
  message: (ws, data) => ws.data.message(ws, data),
  close: (ws, code, reason) => ws.data.close(ws, code, reason),
  // The bridge forwards as it receives; a frame is at most this big (the proxied server sets its own limits).
  maxPayloadLength: 16 * 1024 * 1024,
  idleTimeout: 0,
  sendPings: true,
};

/** Upgrades the request's connection to a WebSocket served by `bridge`; false when it cannot (not an upgrade request). */
export type Upgrade = (bridge: SocketBridge, headers?: Record<string, string>) => boolean;

/** What a host router answers once it upgraded the connection: the listener then answers nothing itself. */
export const UPGRADED: Response = new Response(null, { status: 204 });

export const isUpgradeRequest = (request: Request): boolean => request.headers.get("upgrade")?.toLowerCase() === "websocket";
