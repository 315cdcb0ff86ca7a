// OAuth sign-ins without a browser: the local provider emulators (emulators/oauth) served from the
// test process, and a redirect follower that keeps cookies the way a browser would.
import { createOAuthEmulators } from "../../emulators/oauth/emulators";
import type { OAuthEmulators } from "../../emulators/oauth/api";
import { afterAll } from "vitest";

export interface TestEmulators {
  /** The emulators' base URL: issuers are `${url}/_emulators/oauth/<kind>`. */
  url: string;
  em: OAuthEmulators;
  /** The `issuer` a config gives to use these emulators (an OIDC issuer, or GitHub's base). */
  issuer(kind: "google" | "microsoft" | "apple" | "github"): string;
}

/** The four emulated providers on a free loopback port for this test file. */
export function useOAuthEmulators(): TestEmulators {
  let url = "";
  const em = createOAuthEmulators({ baseUrl: () => url });
  const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: (req) => em.handle(req) });
  url = `http://127.0.0.1:${server.port}`;
  afterAll(async () => {
    await em.stop();
    server.stop(true);
  });
  return { url, em, issuer: (kind) => `${url}/_emulators/oauth/${kind}` };
}

export type Followed = { location: string; response?: undefined } | { location?: undefined; response: Response; body: any };

/**
 * Follows redirects from `start` as a browser would (cookies per host kept), until one leads to a
 * URL starting with `stopAt` (the app's redirect URL: returned, not fetched) or a page answers
 * without redirecting (its response and parsed JSON body).
 */
export async function follow(start: string, stopAt?: string, maxHops = 20): Promise<Followed> {
  const jar = new Map<string, Map<string, string>>();
  let url = start;
  for (let hop = 0; hop < maxHops; hop++) {
    if (stopAt && url.startsWith(stopAt)) return { location: url };
    const u = new URL(url);
    const cookies = jar.get(u.host);
    const headers: Record<string, string> = {};
    if (cookies?.size) headers.cookie = [...cookies].map(([k, v]) => `${k}=${v}`).join("; ");
    const res = await fetch(url, { redirect: "manual", headers });
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const i = pair!.indexOf("=");
      if (!jar.has(u.host)) jar.set(u.host, new Map());
      jar.get(u.host)!.set(pair!.slice(0, i).trim(), pair!.slice(i + 1).trim());
    }
    const location = res.headers.get("location");
    if (res.status >= 300 && res.status < 400 && location) {
      await res.arrayBuffer();
      url = new URL(location, url).toString();
      continue;
    }
    const text = await res.text();
    let body: any = text;
    try {
      body = JSON.parse(text);
    } catch {}
    return { response: res, body };
  }
  throw new Error(`more than ${maxHops} redirects from ${start}`);
}
