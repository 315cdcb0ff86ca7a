import { HttpError } from "../http/errors";
import { FixedWindowLimiter } from "../http/rate-limit";
import type { AuthConfig, RateLimited } from "./config";

/** These report their budget in X-RateLimit-* headers; signin and refresh are limited silently. */
const REPORTED: ReadonlySet<RateLimited> = new Set(["signup", "forgot_password", "reset_password", "change_email"]);

/**
 * Per project and client address, in fixed hourly windows, with the limits the project configured.
 */
export class AuthRateLimits {
  private readonly limiter: FixedWindowLimiter;

  constructor(now: () => number) {
    this.limiter = new FixedWindowLimiter(1, 3_600_000, now);
  }

  clear(): void {
    this.limiter.clear();
  }

  /** Counts one request; throws 429 when over. Returns the headers the response must carry. */
  take(endpoint: RateLimited, projectId: string, ip: string, cfg: AuthConfig): Record<string, string> {
    const r = this.limiter.hit(`${projectId}|${ip}|${endpoint}`, cfg.rate_limits[endpoint]);
    const headers: Record<string, string> = REPORTED.has(endpoint)
      ? { "X-RateLimit-Limit": String(r.limit), "X-RateLimit-Remaining": String(r.remaining) }
      : {};
    if (!r.allowed) {
      if (REPORTED.has(endpoint)) headers["X-RateLimit-Reset"] = String(Math.ceil(r.resetMs / 1000));
      headers["Retry-After"] = String(r.retryAfterSeconds);
      throw new HttpError(429, { error: `too many ${endpoint.replace("_", " ")} requests; retry later` }, headers);
    }
    return headers;
  }
}

/** Runs a handler and adds the rate-limit headers to whatever it answers, errors included. */
export async function withHeaders<T>(headers: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof HttpError) throw new HttpError(err.status, err.body, { ...headers, ...err.headers });
    throw err;
  }
}
