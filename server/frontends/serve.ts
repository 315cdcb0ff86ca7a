import { isUpgradeRequest, UPGRADED, type Upgrade } from "../http/websocket-bridge";
import type { Served } from "./service";
import { serveFile } from "./static-serve";
import { proxyWebSocket } from "./websocket-proxy";

export interface ServeDeps {
  region: string;
  record: (s: Served, status: number, latencyMs: number) => void;
  accessLog: (s: Served, level: string, line: string) => void;
}

/** The path and query of an absolute request URL, without a URL object per request (the hot path of a static file). */
export function pathOf(url: string): { pathname: string; search: string } {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start < 0) return { pathname: "/", search: "" };
  const q = url.indexOf("?", start);
  const h = url.indexOf("#", start);
  const end = q >= 0 ? q : h >= 0 ? h : url.length;
  return { pathname: url.slice(start, end), search: q >= 0 ? url.slice(q, h > q ? h : url.length) : "" };
}

const text = (status: number, body: string, headers: Record<string, string> = {}) => new Response(body, { status, headers: { "Content-Type": "text/plain; charset=utf-8", ...headers } });

/**
 * One request to a site: static files first (Kiln answers them), then the framework's server (a
 * Next.js deployment), else the static site's fallback. Each request is counted (metrics, usage) and
 * logged (resource.type=frontend).
 */
export async function serveSite(d: ServeDeps, s: Served | null, request: Request, arrivedAt: number, upgrade?: Upgrade): Promise<Response> {
  if (!s) return text(404, "No frontend serves this address (yet): deploy one, or check its status with GET /projects/{id}/frontends.\n");
  let res: Response;
  const { pathname, search } = pathOf(request.url);
  try {
    if (upgrade && isUpgradeRequest(request)) {
      // A WebSocket goes to the app's server (a static site has none to take it).
      if (!s.server?.tunnel) res = text(400, "this site is static: it has no server to take a WebSocket\n");
      else {
        let tunnel: { websocketUrl: (pathAndQuery: string) => string; release: () => void } | null = null;
        try {
          tunnel = await s.server.tunnel();
        } catch (e) {
          res = text(503, `the frontend's server could not start: ${(e as Error).message}\n`);
        }
        if (tunnel) res = await proxyWebSocket(request, `${pathname}${search}`, tunnel, upgrade, s.sockets);
      }
      const status = res! === UPGRADED ? 101 : res!.status;
      const ms = performance.now() - arrivedAt;
      d.record(s, status, ms);
      d.accessLog(s, status >= 500 ? "error" : status >= 400 ? "warn" : "info", `${request.method} ${pathname}${search} ${status} (WebSocket) ${ms.toFixed(1)}ms`);
      return res!;
    }
    const readOnly = request.method === "GET" || request.method === "HEAD";
    const fromFiles = readOnly ? serveFile(s.site, request, pathname, !s.server) : null;
    if (fromFiles) res = fromFiles;
    else if (s.server) res = await s.server.fetch(request);
    else res = text(405, "a static site serves GET and HEAD\n", { Allow: "GET, HEAD" });
  } catch (err) {
    res = text(502, `the frontend's server failed: ${(err as Error).message}\n`);
  }
  const ms = performance.now() - arrivedAt;
  d.record(s, res.status, ms);
  d.accessLog(s, res.status >= 500 ? "error" : res.status >= 400 ? "warn" : "info", `${request.method} ${pathname}${search} ${res.status} ${ms.toFixed(1)}ms`);
  return res;
}
