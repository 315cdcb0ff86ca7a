// End-user OAuth sign-ins through Kiln without a browser: the provider emulators served from the
// test process (so both control stores' Kilns use the same ones), and a redirect follower that keeps
// cookies the way a browser would and returns the page a chain ends on.
import { createOAuthEmulators } from "../../emulators/oauth/emulators";
import type { OAuthEmulators } from "../../emulators/oauth/api";
import { afterAll } from "vitest";
import { CookieJar } from "./oauth-relying-party";

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

/** `location`: the URL the chain reached (stopAt); else `response` and its parsed `body`. */
export interface Followed {
  location?: string;
  response?: Response;
  body?: any;
}

/**
 * Follows redirects from `start` as a browser would (cookies per host kept), until one leads to a
 * URL starting with `stopAt` (the app's redirect URL: returned, not fetched) or a page answers
 * without redirecting (its response and parsed JSON body).
 */
export async function follow(start: string, stopAt?: string, maxHops = 20): Promise<Followed> {
  const jars = new Map<string, CookieJar>();
  let url = start;
  let form: URLSearchParams | undefined;
  for (let hop = 0; hop < maxHops; hop++) {
    if (stopAt && url.startsWith(stopAt)) return { location: url };
    const u = new URL(url);
    if (!jars.has(u.host)) jars.set(u.host, new CookieJar());
    const jar = jars.get(u.host)!;
    const res = await fetch(url, {
      method: form ? "POST" : "GET",
      body: form,
      redirect: "manual",
      headers: { cookie: jar.header(), ...(form ? { "content-type": "application/x-www-form-urlencoded" } : {}) },
    });
    jar.take(res);
    form = undefined;
    const location = res.headers.get("location");
    if (res.status >= 300 && res.status < 400 && location) {
      await res.arrayBuffer();
      url = new URL(location, url).toString();
      continue;
    }
    const text = await res.text();
    // response_mode=form_post (Apple): a page whose script posts a form of hidden fields; post it.
    const post = res.ok ? autoPostForm(text) : null;
    if (post) {
      url = new URL(post.action, url).toString();
      form = post.fields;
      continue;
    }
    let body: any = text;
    try {
      body = JSON.parse(text);
    } catch {}
    return { response: res, body };
  }
  throw new Error(`more than ${maxHops} redirects from ${start}`);
}

const unescape = (s: string) => s.replace(/&quot;/g, '"').replace(/&#39;|&#x27;/g, "'").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");

/** The form a form_post page submits by script: its action and hidden fields. */
function autoPostForm(html: string): { action: string; fields: URLSearchParams } | null {
  const f = /<form\b[^>]*>/i.exec(html)?.[0];
  if (!f || !/method=["']?post/i.test(f) || !/\.submit\(\)/.test(html)) return null;
  const action = /action=["']([^"']+)["']/i.exec(f)?.[1];
  if (!action) return null;
  const fields = new URLSearchParams();
  for (const m of html.matchAll(/<input\b[^>]*>/gi)) {
    const name = /name=["']([^"']+)["']/i.exec(m[0])?.[1];
    const value = /value=["']([^"']*)["']/i.exec(m[0])?.[1];
    if (name) fields.set(unescape(name), unescape(value ?? ""));
  }
  return { action: unescape(action), fields };
}
