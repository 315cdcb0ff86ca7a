// Driving the OAuth emulators' flows over plain HTTP: a cookie jar and redirects followed by hand
// (fetch's own following drops cookies between hops).
import * as jose from "jose";
import * as oauth from "oauth4webapi";

export class CookieJar {
  private cookies = new Map<string, string>();
  take(res: Response): void {
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const at = pair!.indexOf("=");
      const name = pair!.slice(0, at).trim();
      const value = pair!.slice(at + 1).trim();
      if (/expires=Thu, 01 Jan 1970/i.test(c) || value === "") this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
  }
  header(): string {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join("; ");
  }
}

/**
 * Follows redirects from `url` until one points at `redirectUri` (not fetched: the relying party's
 * callback) or a page answers; returns that URL, or the last response when the chain ended elsewhere.
 */
export async function followRedirects(url: string, redirectUri: string, init: { jar?: CookieJar; method?: string; body?: URLSearchParams } = {}) {
  const jar = init.jar ?? new CookieJar();
  let next = url;
  let method = init.method ?? "GET";
  let body: URLSearchParams | undefined = init.body;
  for (let hop = 0; hop < 15; hop++) {
    if (next.startsWith(redirectUri)) return { callback: new URL(next), response: null, jar };
    const res = await fetch(next, { method, body, redirect: "manual", headers: { cookie: jar.header(), ...(body ? { "content-type": "application/x-www-form-urlencoded" } : {}) } });
    jar.take(res);
    const location = res.headers.get("location");
    if (res.status < 300 || res.status >= 400 || !location) return { callback: null, response: res, jar };
    next = new URL(location, next).href;
    method = "GET";
    body = undefined;
  }
  throw new Error(`more than 15 redirects from ${url}`);
}

const insecure = { [oauth.allowInsecureRequests]: true } as const;

/** A tiny OpenID relying party (oauth4webapi) for one emulated issuer and client. */
export async function relyingParty(issuer: string, client: { client_id: string; client_secret: string; redirect_uri: string }) {
  const as = await oauth.processDiscoveryResponse(new URL(issuer), await oauth.discoveryRequest(new URL(issuer), insecure));
  const c: oauth.Client = { client_id: client.client_id };
  return {
    as,
    /** An authorization URL with PKCE (S256), state and nonce, and what the callback needs. */
    async start(scope = "openid email profile", extra: Record<string, string> = {}) {
      const code_verifier = oauth.generateRandomCodeVerifier();
      const state = oauth.generateRandomState();
      const nonce = oauth.generateRandomNonce();
      const url = new URL(as.authorization_endpoint!);
      const params = { client_id: client.client_id, redirect_uri: client.redirect_uri, response_type: "code", scope, state, nonce, code_challenge: await oauth.calculatePKCECodeChallenge(code_verifier), code_challenge_method: "S256", ...extra };
      for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
      return { url: url.href, code_verifier, state, nonce };
    },
    /** Callback → code exchange → the id_token verified against the issuer's JWKS (jose); its claims. */
    async finish(callback: URL, started: { code_verifier: string; state: string; nonce: string }, secret = client.client_secret) {
      const params = oauth.validateAuthResponse(as, c, callback, started.state);
      const response = await oauth.authorizationCodeGrantRequest(as, c, oauth.ClientSecretBasic(secret), params, client.redirect_uri, started.code_verifier, insecure);
      const result = await oauth.processAuthorizationCodeResponse(as, c, response, { expectedNonce: started.nonce, requireIdToken: true });
      const { payload, protectedHeader } = await jose.jwtVerify(result.id_token!, jose.createRemoteJWKSet(new URL(as.jwks_uri!)), { issuer: as.issuer, audience: client.client_id });
      return { tokens: result, claims: payload, header: protectedHeader };
    },
  };
}
