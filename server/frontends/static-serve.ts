import { join } from "node:path";
import { COMPRESSED_DIR, looksHashed, type StaticEntry, type StaticManifest } from "./static-files";

/** A deployment's static files, loaded for serving. */
export interface ServedSite {
  dir: string;
  manifest: StaticManifest;
  /** A static site answers unknown extension-less paths with its index.html (client-side routing). */
  spaFallback: boolean;
}

const IMMUTABLE = "public, max-age=31536000, immutable";
const REVALIDATE = "public, max-age=0, must-revalidate";

/** The file a URL path names: itself, its index.html, or `<path>.html`; null when none. */
export function resolvePath(site: ServedSite, pathname: string): string | null {
  let p: string;
  try {
    p = decodeURIComponent(pathname);
  } catch {
    return null;
  }
  if (p.includes("\0")) return null;
  const f = site.manifest.files;
  if (p.endsWith("/")) return f[`${p}index.html`] ? `${p}index.html` : null;
  if (f[p]) return p;
  if (f[`${p}/index.html`]) return `${p}/index.html`;
  if (f[`${p}.html`]) return `${p}.html`;
  return null;
}

/**
 * Answers a GET or HEAD from the deployment's files, or null when no file matches (a Next.js
 * deployment's server answers then). ETag and If-None-Match (304), one byte range (206, 416), the
 * best precompressed variant the client accepts (never with a range), and a year of `immutable`
 * caching for hashed files and the framework's immutable prefixes.
 */
export function serveFile(site: ServedSite, request: Request, pathname: string, fallback: boolean): Response | null {
  const exact = resolvePath(site, pathname);
  let path = exact;
  let status = 200;
  if (!path && fallback) {
    const last = pathname.slice(pathname.lastIndexOf("/") + 1);
    if (site.spaFallback && !last.includes(".") && site.manifest.files["/index.html"]) path = "/index.html";
    else if (site.manifest.files["/404.html"]) {
      path = "/404.html";
      status = 404;
    } else return new Response("Not Found", { status: 404, headers: { "Content-Type": "text/plain; charset=utf-8" } });
  }
  if (!path) return null;
  const e = site.manifest.files[path]!;
  const immutable = status === 200 && path === exact && (looksHashed(path) || site.manifest.immutablePrefixes.some((p) => path!.startsWith(p)));
  const headers: Record<string, string> = {
    "Content-Type": e.type,
    ETag: e.etag,
    "Cache-Control": status === 200 ? (immutable ? IMMUTABLE : REVALIDATE) : "no-store",
    "Accept-Ranges": "bytes",
    Vary: "Accept-Encoding",
  };
  if (status === 200 && matchesEtag(request.headers.get("if-none-match"), e.etag)) return new Response(null, { status: 304, headers });
  const head = request.method === "HEAD";
  const file = join(site.dir, path);
  const range = status === 200 ? request.headers.get("range") : null;
  if (range !== null && ifRangeHolds(request.headers.get("if-range"), e.etag)) {
    const r = parseRange(range, e.size);
    if (r === "invalid") return rangeNotSatisfiable(e, headers);
    if (r) {
      headers["Content-Range"] = `bytes ${r.start}-${r.end}/${e.size}`;
      headers["Content-Length"] = String(r.end - r.start + 1);
      return new Response(head ? null : Bun.file(file).slice(r.start, r.end + 1), { status: 206, headers });
    }
  }
  const enc = chooseEncoding(request.headers.get("accept-encoding"), e);
  if (enc) {
    headers["Content-Encoding"] = enc;
    headers["Content-Length"] = String(enc === "br" ? e.br : e.gz);
    return new Response(head ? null : Bun.file(join(site.dir, COMPRESSED_DIR, `${path}.${enc === "br" ? "br" : "gz"}`)), { status, headers });
  }
  headers["Content-Length"] = String(e.size);
  return new Response(head ? null : Bun.file(file), { status, headers });
}

function rangeNotSatisfiable(e: StaticEntry, headers: Record<string, string>): Response {
  return new Response(null, { status: 416, headers: { ...headers, "Content-Range": `bytes */${e.size}` } });
}

function matchesEtag(header: string | null, etag: string): boolean {
  if (!header) return false;
  if (header.trim() === "*") return true;
  return header.split(",").some((t) => t.trim().replace(/^W\//, "") === etag);
}

/** If-Range with our ETag (or absent) keeps the range; anything else sends the whole file. */
function ifRangeHolds(header: string | null, etag: string): boolean {
  return header === null || header.trim() === etag;
}

/**
 * One `bytes=` range (start-end, start-, -suffix). Several ranges, or a syntax error, are ignored
 * (RFC 9110 lets a server send the whole file); a range starting past the end is 416.
 */
export function parseRange(header: string, size: number): { start: number; end: number } | "invalid" | null {
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === "" && m[2] === "")) return null;
  if (m[1] === "") {
    const n = Number(m[2]);
    if (n === 0) return "invalid";
    return { start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (start >= size || (m[2] !== "" && Number(m[2]) < start)) return "invalid";
  return { start, end };
}

function chooseEncoding(accept: string | null, e: StaticEntry): "br" | "gzip" | null {
  if (!accept || (!e.br && !e.gz)) return null;
  const q = new Map<string, number>();
  for (const part of accept.toLowerCase().split(",")) {
    const [name, ...params] = part.trim().split(";");
    const qp = params.map((p) => p.trim()).find((p) => p.startsWith("q="));
    q.set(name!.trim(), qp ? Number(qp.slice(2)) || 0 : 1);
  }
  const ok = (n: string) => (q.get(n) ?? q.get("*") ?? 0) > 0;
  if (e.br && ok("br")) return "br";
  if (e.gz && ok("gzip")) return "gzip";
  return null;
}
