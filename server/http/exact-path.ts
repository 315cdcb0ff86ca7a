/**
 * Paths are exact: a request reaches the route its path names as sent, or is refused.
 *
 * Bun builds `request.url` with the URL parser, which resolves dot segments (`.`, `..`, and their
 * `%2e` spellings), reads `\` as `/` and cuts the path at `#`: `DELETE /projects/P/variables/%2e%2e`
 * arrives as `DELETE /projects/P/` and Kiln has no way to see what was sent. Bun.serve's `routes`,
 * however, are matched against the request target as sent, and a pattern's parameters are its
 * segments as sent (percent-decoded). So Kiln registers patterns of 1 to MAX_SEGMENTS parameters
 * (`/:p0`, `/:p0/:p1`, ...): their handler gets the segments as sent, and a request whose URL differs
 * from them is refused here, before any routing.
 *
 * This leans on Bun matching routes on the raw target (1.4.5). Should Bun ever normalize before
 * matching, the segments would come normalized and nothing would be refused: the black-box test
 * test/http/exact-paths.test.ts sends the raw spellings and fails then.
 */
import { HttpError } from "./errors";

/**
 * Segments checked as sent. Bun's router (uWebSockets) splits a path into at most about 100
 * segments (measured: a pattern of 100 parameters no longer matches a path of 100 segments).
 */
export const MAX_SEGMENTS = 99;

/** The request's path as sent: its segments, percent-decoded; `deep` when it has more than MAX_SEGMENTS. */
export interface SentPath {
  segments: string[];
  deep: boolean;
}

type SegmentHandler<S> = (request: Request & { params?: Record<string, string> }, server: S) => Response | Promise<Response>;

/** Bun.serve `routes` that hand `handle` every request's path as sent (none for an empty segment). */
export function sentPathRoutes<S>(handle: (request: Request, server: S, sent: SentPath) => Response | Promise<Response>): Record<string, SegmentHandler<S>> {
  const routes: Record<string, SegmentHandler<S>> = {};
  const at = (n: number, deep: boolean): SegmentHandler<S> => (request, server) => {
    const params = request.params ?? {};
    const segments: string[] = [];
    for (let i = 0; i < n; i++) segments.push(params[`p${i}`] ?? "");
    return handle(request, server, { segments, deep });
  };
  routes["/"] = at(0, false);
  let pattern = "";
  for (let n = 1; n <= MAX_SEGMENTS; n++) {
    pattern += `/:p${n - 1}`;
    routes[pattern] = at(n, false);
  }
  routes[`${pattern}/*`] = at(MAX_SEGMENTS, true);
  return routes;
}

export const isDotSegment = (s: string) => s === "." || s === "..";

export function decodeSegment(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/**
 * Why this request's path cannot be routed as sent, or null when its URL is the path that was sent.
 * `sent` is null when no segment pattern matched: the path has an empty segment (`//`, a trailing
 * `/`), which hides what the URL parser did to the rest. `paramMessage` is the route's own message
 * for a bad segment in a parameter, where it words one (storage: `invalid or missing object path`).
 */
export function sentPathProblem(request: Request, sent: SentPath | null, paramMessage: (segments: string[], index: number) => string | null): HttpError | null {
  const url = new URL(request.url);
  if (sent === null) {
    const segments = url.pathname.slice(1).split("/").map(decodeSegment);
    const empty = segments.indexOf("");
    const message = empty >= 0 ? paramMessage(segments, empty) : null;
    return message ? new HttpError(400, { error: message }) : new HttpError(404, { error: `no route for ${request.method} ${url.pathname}: a path has no empty segments` });
  }
  if (sent.deep) return new HttpError(414, { error: `the path has more than ${MAX_SEGMENTS} segments` });
  const dot = sent.segments.findIndex(isDotSegment);
  if (dot >= 0)
    return new HttpError(400, { error: paramMessage(sent.segments, dot) ?? `invalid request: a path segment may not be '${sent.segments[dot]}' (paths are used exactly as sent)` });
  // A fragment is never part of a request target; the URL parser would cut the path there.
  if (request.url.includes("#")) return new HttpError(400, { error: "invalid request: the path holds a '#': send it percent-encoded (%23)" });
  // The URL parser reads a raw backslash as `/` and leaves `%5C` as it is: a segment as sent with
  // more backslashes than the URL has `%5C`s had a raw one (`a\..\b` keeps the segment count).
  let backslashes = 0;
  for (const s of sent.segments) for (const c of s) if (c === "\\") backslashes++;
  if (backslashes !== (url.pathname.match(/%5c/gi)?.length ?? 0))
    return new HttpError(400, { error: "invalid request: the path holds a backslash: send it percent-encoded (%5C)" });
  // Nothing else the URL parser does changes segments; should it ever, the path is refused too.
  const seen = url.pathname === "/" ? 0 : url.pathname.split("/").length - 1;
  if (seen !== sent.segments.length) return new HttpError(400, { error: "invalid request: the path cannot be read as sent" });
  return null;
}
