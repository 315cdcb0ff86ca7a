// End-user OAuth sign-in against the local provider emulators, over plain HTTP: authorize →
// provider → callback → code → exchange; the JSON callback; linking; the device flow; every error row.
import { createRemoteJWKSet, jwtVerify } from "jose";
import { describe, expect, test } from "vitest";
import { createProject, useKiln } from "../support/kiln";
import { follow, useOAuthEmulators } from "../support/oauth";

const k = useKiln({ args: ["--controllable-clock"] });
const E = useOAuthEmulators();

let n = 0;
const email = (tag = "u") => `${tag}-${Date.now()}-${++n}@example.com`;
const APP = "http://localhost:3000/auth/done";

type Kind = "google" | "github" | "microsoft" | "apple";

/** A project with its anon key, the given providers configured against the emulators, and APP allowed. */
async function app(providers: Kind[] = ["google"], auth: Record<string, unknown> = {}) {
  const p = await createProject(k);
  const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
  for (const provider of providers) {
    const r = await k.api("POST", `/projects/${p.id}/oauth/configs`, {
      body: { provider, client_id: `${provider}-${p.id}`, client_secret: `secret-${p.id}-${provider}`, redirect_url: `${k.url}/auth/oauth/${provider}/callback`, issuer: E.issuer(provider) },
    });
    if (r.status !== 201) throw new Error(`config ${r.status} ${r.text}`);
  }
  const cfg = await k.api("PATCH", `/auth/config?project_id=${p.id}`, { body: { allowed_redirect_urls: [APP, `${APP}?tab=2`], ...auth } });
  if (cfg.status !== 200) throw new Error(`auth config ${cfg.status} ${cfg.text}`);
  return { id: p.id, anon };
}

function authorizeUrl(a: { anon: string }, provider: string, q: Record<string, string> = {}) {
  return `${k.url}/auth/oauth/${provider}/authorize?${new URLSearchParams({ anon_key: a.anon, ...q })}`;
}

/** The person the next authorization on `kind` signs in as (the emulators' identities API). */
function as(kind: Kind, who: { email: string; name?: string; picture?: string | null; email_verified?: boolean }) {
  E.em.queueNext(kind, who);
}

/** A sign-in with a redirect URL: the code delivered to it (and the URL itself). */
async function signInCode(a: { anon: string }, kind: Kind, who: { email: string; name?: string; email_verified?: boolean }, q: Record<string, string> = {}) {
  as(kind, who);
  const f = await follow(authorizeUrl(a, kind, { redirect_url: APP, ...q }), APP);
  if (!f.location) throw new Error(`sign-in ended at ${f.response.status} ${JSON.stringify(f.body)}`);
  const u = new URL(f.location);
  return { url: u, code: u.searchParams.get("code")! };
}

const exchange = (a: { anon: string }, code: string, redirect_url = APP) => k.api("POST", "/auth/oauth/exchange", { token: a.anon, body: { code, redirect_url } });

describe("sign-in with a redirect URL and the code exchange", () => {
  test("authorize → 307 to the provider with PKCE and state; callback → 303 with a code; exchange → 201 with the auth token response; a second sign-in → 200, the same user", async () => {
    const a = await app();
    const first = await fetch(authorizeUrl(a, "google", { redirect_url: APP, client_state: "nonce-123" }), { redirect: "manual" });
    expect(first.status).toBe(307);
    const to = new URL(first.headers.get("location")!);
    expect(`${to.origin}${to.pathname}`).toBe(`${E.issuer("google")}/auth`);
    expect(to.searchParams.get("code_challenge_method")).toBe("S256");
    expect(to.searchParams.get("code_challenge")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(to.searchParams.get("state")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(to.searchParams.get("scope")).toBe("openid email profile");
    expect(to.searchParams.get("redirect_uri")).toBe(`${k.url}/auth/oauth/google/callback`);

    const who = { email: email("ada"), name: "Ada Lovelace", picture: "https://example.com/ada.png" };
    as("google", who);
    const f = await follow(to.toString(), APP);
    const back = new URL(f.location!);
    expect(`${back.origin}${back.pathname}`).toBe(APP);
    expect(back.searchParams.get("client_state")).toBe("nonce-123");
    const code = back.searchParams.get("code")!;
    expect(code).toMatch(/^[A-Za-z0-9_-]{20,}$/);
    // No session token ever travels in a URL.
    expect([...back.searchParams.keys()].sort()).toEqual(["client_state", "code"]);

    const r = await exchange(a, code);
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ token_type: "bearer", expires_in: 3600, refresh_token: expect.stringMatching(/^rt-/) });
    expect(r.body.user).toMatchObject({
      email: who.email,
      email_confirmed: true,
      status: "active",
      raw_user_meta_data: { name: "Ada Lovelace", picture: "https://example.com/ada.png", provider: "google", email_verified: true },
    });
    // The same tokens as password sign-in: the project's JWKS verifies them, /auth/user and refresh work.
    const jwks = createRemoteJWKSet(new URL(`${k.url}/auth/jwks.json?project_id=${a.id}`));
    const { payload } = await jwtVerify(r.body.access_token, jwks, { audience: "authenticated" });
    expect(payload).toMatchObject({ sub: r.body.user.id, email: who.email, role: "authenticated", project_id: a.id });
    expect((await k.api("GET", "/auth/user", { token: r.body.access_token })).body.id).toBe(r.body.user.id);
    const refreshed = await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: r.body.refresh_token } });
    expect(refreshed.status).toBe(200);
    expect((await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: r.body.refresh_token } })).status).toBe(401);

    const again = await signInCode(a, "google", who);
    const r2 = await exchange(a, again.code);
    expect(r2.status).toBe(200);
    expect(r2.body.user.id).toBe(r.body.user.id);
    expect(r2.body.refresh_token).not.toBe(r.body.refresh_token);
  });
});
