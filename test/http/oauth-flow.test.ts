// End-user OAuth sign-in against the local provider emulators, over plain HTTP: authorize →
// provider → callback → code → exchange; the JSON callback; linking; the device flow; every error row.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createRemoteJWKSet, jwtVerify } from "jose";
import { describe, expect, test } from "vitest";
import { createProject, ROOT, STORE, useKiln } from "../support/kiln";
import { follow, useOAuthEmulators } from "../support/oauth-signin";

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
  if (!f.location) throw new Error(`sign-in ended at ${f.response?.status} ${JSON.stringify(f.body)}`);
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

/** Moves Kiln's clock forward. */
async function advance(seconds: number) {
  const r = await k.api("POST", "/_kiln/clock/advance", { body: { seconds } });
  if (r.status !== 200) throw new Error(`clock ${r.status} ${r.text}`);
}

describe("sign-in without a redirect URL: the callback answers JSON", () => {
  test("google, github, microsoft and apple: 201 for a new user, 200 for the next sign-in; raw_user_meta_data says who and how", async () => {
    const kinds: Kind[] = ["google", "github", "microsoft", "apple"];
    const a = await app(kinds);
    for (const kind of kinds) {
      const who = { email: email(kind), name: `Someone at ${kind}`, picture: kind === "apple" ? null : `https://example.com/${kind}.png` };
      as(kind, who);
      const f = await follow(authorizeUrl(a, kind));
      expect(f.response?.status, JSON.stringify(f.body)).toBe(201);
      expect(f.body.user).toMatchObject({ email: who.email, email_confirmed: true, raw_user_meta_data: { provider: kind, email_verified: true } });
      if (kind !== "apple") expect(f.body.user.raw_user_meta_data).toMatchObject({ name: who.name, picture: who.picture });
      expect(f.body.access_token).toEqual(expect.any(String));
      as(kind, who);
      const again = await follow(authorizeUrl(a, kind));
      expect(again.response?.status).toBe(200);
      expect(again.body.user.id).toBe(f.body.user.id);
    }
  });

  test("a github config keeps GitHub's shape: authorize at /login/oauth/authorize with the default scopes", async () => {
    const a = await app(["github"]);
    const r = await fetch(authorizeUrl(a, "github"), { redirect: "manual" });
    expect(r.status).toBe(307);
    const to = new URL(r.headers.get("location")!);
    expect(`${to.origin}${to.pathname}`).toBe(`${E.issuer("github")}/login/oauth/authorize`);
    expect(to.searchParams.get("scope")).toBe("read:user user:email");
  });
});

describe("Apple's form_post", () => {
  test("apple is asked with response_mode=form_post and its callback is a form POST; the POST callback takes the same rules", async () => {
    const a = await app(["apple"]);
    const r = await fetch(authorizeUrl(a, "apple"), { redirect: "manual" });
    const to = new URL(r.headers.get("location")!);
    expect(to.searchParams.get("response_mode")).toBe("form_post");
    expect(to.searchParams.get("scope")).toBe("openid email name");
    const post = (form: Record<string, string>) =>
      fetch(`${k.url}/auth/oauth/apple/callback`, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(form) });
    const missing = await post({ code: "x" });
    expect(missing.status).toBe(400);
    expect(await missing.json()).toEqual({ error: "missing state" });
    expect((await post({ code: "x", state: "made-up" })).status).toBe(400);
    // The whole flow, the emulator's auto-posting page included (follow posts it as a browser would).
    as("apple", { email: email("apple") });
    const f = await follow(to.toString());
    expect(f.response?.status).toBe(201);
    expect(f.response?.url).toBe(`${k.url}/auth/oauth/apple/callback`);
  });
});

describe("error rows", () => {
  test("an email that already exists from password sign-up → 409 (sign in, then link), at the callback and at the exchange", async () => {
    const a = await app();
    const addr = email("taken");
    expect((await k.api("POST", "/auth/signup", { token: a.anon, body: { email: addr, password: "correct horse" } })).status).toBe(201);
    as("google", { email: addr.toUpperCase() });
    const f = await follow(authorizeUrl(a, "google"));
    expect(f.response?.status).toBe(409);
    expect(f.body.error).toBe(`a user with the email ${addr} already exists: sign in as that user, then link google`);
    const { code } = await signInCode(a, "google", { email: addr });
    expect((await exchange(a, code)).status).toBe(409);
  });

  test("an email outside allowed_email_domains → 403, at the callback and at the exchange", async () => {
    const a = await app(["google"], { allowed_email_domains: ["example.org"] });
    as("google", { email: email("outsider") });
    const f = await follow(authorizeUrl(a, "google"));
    expect(f.response?.status).toBe(403);
    expect(f.body.error).toBe("email domain 'example.com' is not allowed for this project");
    const { code } = await signInCode(a, "google", { email: email("outsider") });
    const r = await exchange(a, code);
    expect(r.status).toBe(403);
    as("google", { email: `inside-${++n}@example.org` });
    expect((await follow(authorizeUrl(a, "google"))).response?.status).toBe(201);
  });

  test("an email the provider has not verified → 403", async () => {
    const a = await app(["google", "github"]);
    for (const kind of ["google", "github"] as Kind[]) {
      as(kind, { email: email("unverified"), email_verified: false });
      const f = await follow(authorizeUrl(a, kind));
      expect(f.response?.status, kind).toBe(403);
      expect(f.body.error).toMatch(new RegExp(`^the ${kind} provider has not verified the email address`));
    }
    const { code } = await signInCode(a, "google", { email: email("unverified"), email_verified: false });
    expect((await exchange(a, code)).status).toBe(403);
  });

  test("a disabled provider → 400; an unconfigured one → 404; a redirect_url not allowed (exactly, query included) → 400; anon_key missing 400, wrong 401", async () => {
    const a = await app(["google"]);
    expect((await k.api("PUT", `/projects/${a.id}/oauth/configs/google`, { body: { enabled: false } })).status).toBe(200);
    const disabled = await k.api("GET", `/auth/oauth/google/authorize?anon_key=${a.anon}`, { token: null });
    expect(disabled.status).toBe(400);
    expect(disabled.body.error).toBe("provider google is disabled for this project");
    const unconfigured = await k.api("GET", `/auth/oauth/github/authorize?anon_key=${a.anon}`, { token: null });
    expect(unconfigured.status).toBe(404);
    expect(unconfigured.body.error).toBe("provider github is not configured for this project");
    expect((await k.api("GET", `/auth/oauth/myspace/authorize?anon_key=${a.anon}`, { token: null })).status).toBe(404);

    await k.api("PUT", `/projects/${a.id}/oauth/configs/google`, { body: { enabled: true } });
    for (const bad of ["http://localhost:3000/auth/done?tab=3", "http://localhost:3000/auth/done/", "http://evil.example/auth/done"]) {
      const r = await k.api("GET", `/auth/oauth/google/authorize?anon_key=${a.anon}&redirect_url=${encodeURIComponent(bad)}`, { token: null });
      expect(r.status, bad).toBe(400);
      expect(r.body.error).toBe("redirect_url is not in the project's allowed_redirect_urls");
    }
    const withQuery = await fetch(authorizeUrl(a, "google", { redirect_url: `${APP}?tab=2` }), { redirect: "manual" });
    expect(withQuery.status).toBe(307);
    expect((await k.api("GET", `/auth/oauth/google/authorize`, { token: null })).status).toBe(400);
    expect((await k.api("GET", `/auth/oauth/google/authorize?anon_key=ak-nothing`, { token: null })).status).toBe(401);
  });

  test("state: missing → 400; used twice → 400; older than 10 minutes on the platform clock → 400", async () => {
    const a = await app();
    expect((await k.api("GET", "/auth/oauth/google/callback?code=x", { token: null })).body).toEqual({ error: "missing state" });
    expect((await k.api("GET", "/auth/oauth/google/callback?code=x&state=made-up", { token: null })).status).toBe(400);

    // The provider's redirect back to Kiln, captured: replayed, it is refused.
    as("google", { email: email("replay") });
    const atCallback = await follow(authorizeUrl(a, "google"), `${k.url}/auth/oauth/google/callback`);
    const first = await fetch(atCallback.location!);
    expect(first.status).toBe(201);
    const second = await fetch(atCallback.location!);
    expect(second.status).toBe(400);
    expect((await second.json()).error).toBe("invalid state: it has been used already");

    // A state is good for 10 minutes: at 9 it works, past 10 it does not.
    as("google", { email: email("slow") });
    const slowOk = await follow(authorizeUrl(a, "google"), `${k.url}/auth/oauth/google/callback`);
    await advance(9 * 60);
    expect((await fetch(slowOk.location!)).status).toBe(201);
    as("google", { email: email("slower") });
    const late = await follow(authorizeUrl(a, "google"), `${k.url}/auth/oauth/google/callback`);
    await advance(10 * 60 + 1);
    const r = await fetch(late.location!);
    expect(r.status).toBe(400);
    expect((await r.json()).error).toBe("expired state: a sign-in must complete within 10 minutes");
    // A callback without the provider's code is refused too (its state is spent by then).
    const s = new URL((await fetch(authorizeUrl(a, "google"), { redirect: "manual" })).headers.get("location")!).searchParams.get("state")!;
    expect((await k.api("GET", `/auth/oauth/google/callback?state=${s}`, { token: null })).body).toEqual({ error: "missing code" });
  });

  test("exchange: each code once; a wrong redirect_url → 400; a code older than 5 minutes → 400; another project's anon key → 400", async () => {
    const a = await app();
    const who = { email: email("codes") };
    const { code } = await signInCode(a, "google", who);
    const wrong = await exchange(a, code, `${APP}?tab=2`);
    expect(wrong.status).toBe(400);
    expect(wrong.body.error).toBe("redirect_url does not match the one the sign-in started with");
    const other = await app();
    expect((await exchange(other, code)).status).toBe(400);
    expect((await exchange(a, code)).status).toBe(201);
    const twice = await exchange(a, code);
    expect(twice.status).toBe(400);
    expect(twice.body.error).toBe("invalid code: it has been exchanged already");

    const late = await signInCode(a, "google", who);
    await advance(5 * 60 + 1);
    const r = await exchange(a, late.code);
    expect(r.status).toBe(400);
    expect(r.body.error).toBe("expired code: exchange it within 5 minutes");
    expect((await k.api("POST", "/auth/oauth/exchange", { token: null, body: { code: "x", redirect_url: APP } })).status).toBe(401);
  });

  test("a redirect URL removed from allowed_redirect_urls before the callback → 400", async () => {
    const a = await app();
    as("google", { email: email("moved") });
    const atCallback = await follow(authorizeUrl(a, "google", { redirect_url: APP }), `${k.url}/auth/oauth/google/callback`);
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { allowed_redirect_urls: [`${APP}?tab=2`] } });
    const r = await k.api("GET", atCallback.location!.slice(k.url.length), { token: null });
    expect(r.status).toBe(400);
    expect(r.body.error).toBe("redirect_url is no longer in the project's allowed_redirect_urls");
  });

  test("denied consent: the redirect URL gets error=access_denied (and client_state); without one, 400", async () => {
    const a = await app();
    E.em.queueNext("google", { deny: true });
    const f = await follow(authorizeUrl(a, "google", { redirect_url: APP, client_state: "cs" }), APP);
    const u = new URL(f.location!);
    expect(u.searchParams.get("error")).toBe("access_denied");
    expect(u.searchParams.get("client_state")).toBe("cs");
    expect(u.searchParams.get("code")).toBeNull();
    E.em.queueNext("google", { deny: true });
    const j = await follow(authorizeUrl(a, "google"));
    expect(j.response?.status).toBe(400);
    expect(j.body.error).toMatch(/^the google provider refused the sign-in: access_denied/);
  });
});

describe("linking", () => {
  async function passwordUser(a: { anon: string }) {
    const addr = email("linker");
    const r = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: addr, password: "correct horse" } });
    return { email: addr, token: r.body.access_token as string, id: r.body.user.id as string };
  }

  test("link a provider to a password user (JSON and redirect), list it, sign in with it, 409 when linked, unlink → 204", async () => {
    const a = await app(["google", "github"]);
    const u = await passwordUser(a);
    expect((await k.api("GET", "/auth/oauth/providers", { token: u.token })).body).toEqual({ providers: [] });
    const link = await k.api("POST", "/auth/oauth/google/link", { token: u.token });
    expect(link.status).toBe(200);
    expect(new URL(link.body.authorization_url).pathname).toBe(new URL(`${E.issuer("google")}/auth`).pathname);
    // Another email at the provider is fine: linking is by the provider's subject.
    const googleEmail = email("g");
    as("google", { email: googleEmail });
    const f = await follow(link.body.authorization_url);
    expect(f.response?.status).toBe(200);
    expect(f.body).toEqual({ provider: "google", linked_at: expect.any(String), updated_at: expect.any(String) });

    const list = await k.api("GET", "/auth/oauth/providers", { token: u.token });
    expect(list.body.providers.map((p: any) => p.provider)).toEqual(["google"]);
    // Signing in with Google is now this user.
    as("google", { email: googleEmail });
    const s = await follow(authorizeUrl(a, "google"));
    expect(s.response?.status).toBe(200);
    expect(s.body.user.id).toBe(u.id);

    const again = await k.api("POST", "/auth/oauth/google/link", { token: u.token });
    expect(again.status).toBe(409);
    expect(again.body.error).toBe("provider google is already linked to this user");

    const viaRedirect = await k.api("POST", `/auth/oauth/github/link?redirect_url=${encodeURIComponent(APP)}`, { token: u.token });
    as("github", { email: email("gh") });
    const back = await follow(viaRedirect.body.authorization_url, APP);
    expect(new URL(back.location!).searchParams.get("linked")).toBe("github");
    expect((await k.api("GET", "/auth/oauth/providers", { token: u.token })).body.providers.map((p: any) => p.provider).sort()).toEqual(["github", "google"]);

    expect((await k.api("DELETE", "/auth/oauth/google/unlink", { token: u.token })).status).toBe(204);
    const gone = await k.api("DELETE", "/auth/oauth/google/unlink", { token: u.token });
    expect(gone.status).toBe(404);
    expect((await k.api("GET", "/auth/oauth/providers", { token: u.token })).body.providers.map((p: any) => p.provider)).toEqual(["github"]);
  });

  test("the last way to sign in cannot be unlinked (400); a second provider or a password makes it possible", async () => {
    const a = await app(["google", "github"]);
    as("google", { email: email("only-google") });
    const s = await follow(authorizeUrl(a, "google"));
    const token = s.body.access_token;
    const last = await k.api("DELETE", "/auth/oauth/google/unlink", { token });
    expect(last.status).toBe(400);
    expect(last.body.error).toMatch(/^cannot unlink google: it is this user's last way to sign in/);
    const link = await k.api("POST", "/auth/oauth/github/link", { token });
    as("github", { email: email("gh2") });
    expect((await follow(link.body.authorization_url)).response?.status).toBe(200);
    expect((await k.api("DELETE", "/auth/oauth/google/unlink", { token })).status).toBe(204);
    expect((await k.api("DELETE", "/auth/oauth/github/unlink", { token })).status).toBe(400);
    expect((await k.api("PUT", "/auth/user", { token, body: { password: "now a password" } })).status).toBe(200);
    expect((await k.api("DELETE", "/auth/oauth/github/unlink", { token })).status).toBe(204);
  });

  test("without a user token → 401; an account linked elsewhere → 409; linking a disabled provider → 400", async () => {
    expect((await k.api("GET", "/auth/oauth/providers", { token: null })).status).toBe(401);
    expect((await k.api("POST", "/auth/oauth/google/link", { token: null })).status).toBe(401);
    expect((await k.api("DELETE", "/auth/oauth/google/unlink", { token: null })).status).toBe(401);
    const a = await app(["google"]);
    const taken = email("taken-google");
    as("google", { email: taken });
    expect((await follow(authorizeUrl(a, "google"))).response?.status).toBe(201);
    const u = await passwordUser(a);
    const link = await k.api("POST", "/auth/oauth/google/link", { token: u.token });
    as("google", { email: taken });
    const f = await follow(link.body.authorization_url);
    expect(f.response?.status).toBe(409);
    expect(f.body.error).toBe("this google account is linked to another user");
    // The user deleted while the link is at the provider: 404, not a half-made link.
    const gone = await passwordUser(a);
    const started = await k.api("POST", "/auth/oauth/google/link", { token: gone.token });
    expect((await k.api("DELETE", `/projects/${a.id}/users/${gone.id}`)).status).toBe(204);
    as("google", { email: email("orphan") });
    const orphan = await follow(started.body.authorization_url);
    expect(orphan.response?.status).toBe(404);
    expect(orphan.body.error).toBe("user not found");

    await k.api("PUT", `/projects/${a.id}/oauth/configs/google`, { body: { enabled: false } });
    const off = await k.api("POST", "/auth/oauth/google/link", { token: u.token });
    expect(off.status).toBe(400);
    expect(off.body.error).toBe("provider google is disabled for this project");
  });
});

describe("device flow (RFC 8628)", () => {
  async function deviceApp(auth: Record<string, unknown> = {}) {
    const a = await app(["google"], auth);
    expect((await k.api("POST", `/projects/${a.id}/oauth/configs`, { body: { provider: "device", client_id: "tv" } })).status).toBe(201);
    const addr = email("couch");
    const s = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: addr, password: "correct horse" } });
    return { ...a, user: { email: addr, token: s.body.access_token as string, id: s.body.user.id as string } };
  }
  const code = (a: { anon: string }, client_id = "tv") => k.api("POST", "/auth/device/code", { token: a.anon, body: { client_id } });
  const poll = (a: { anon: string }, device_code: string, client_id = "tv") =>
    k.api("POST", "/auth/device/token", { token: a.anon, body: { grant_type: "urn:ietf:params:oauth:grant-type:device_code", device_code, client_id } });

  test("device code and user code; polling: authorization_pending, slow_down (interval +5), then the auth token response once approved, once", async () => {
    const a = await deviceApp();
    const d = await code(a);
    expect(d.status).toBe(200);
    expect(d.body).toMatchObject({ user_code: expect.stringMatching(/^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/), verification_uri: `${k.url}/auth/device`, expires_in: 600, interval: 5 });
    expect(d.body.verification_uri_complete).toBe(`${k.url}/auth/device?user_code=${d.body.user_code}`);
    const pending = await poll(a, d.body.device_code);
    expect(pending.status).toBe(400);
    expect(pending.body.error).toBe("authorization_pending");
    const fast = await poll(a, d.body.device_code);
    expect(fast.body.error).toBe("slow_down");
    await advance(6);
    expect((await poll(a, d.body.device_code)).body.error).toBe("slow_down"); // 6 s < the 10 s interval: 15 s now
    await advance(16);
    expect((await poll(a, d.body.device_code)).body.error).toBe("authorization_pending");

    // The page a person opens shows the code; signing in there and approving is one API call.
    const page = await fetch(d.body.verification_uri_complete);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain(d.body.user_code);
    const ok = await k.api("POST", "/auth/device/verify", { token: a.user.token, body: { user_code: d.body.user_code.toLowerCase(), action: "approve" } });
    expect(ok.status).toBe(200);
    expect(ok.body).toEqual({ user_code: d.body.user_code, status: "approved" });
    await advance(16);
    const t = await poll(a, d.body.device_code);
    expect(t.status).toBe(200);
    expect(t.body).toMatchObject({ token_type: "bearer", user: { id: a.user.id, email: a.user.email } });
    expect((await k.api("GET", "/auth/user", { token: t.body.access_token })).body.id).toBe(a.user.id);
    await advance(16);
    expect((await poll(a, d.body.device_code)).body.error).toBe("invalid_grant");
    // An answered code cannot be answered again.
    expect((await k.api("POST", "/auth/device/verify", { token: a.user.token, body: { user_code: d.body.user_code, action: "deny" } })).status).toBe(404);
  });

  test("an RFC 8628 client's form-encoded requests (device code and polling) are read like JSON ones", async () => {
    const a = await deviceApp();
    const form = (path: string, fields: Record<string, string>) =>
      fetch(`${k.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${a.anon}`, "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(fields) });
    const d = await form("/auth/device/code", { client_id: "tv" });
    expect(d.status).toBe(200);
    const { device_code, user_code } = (await d.json()) as { device_code: string; user_code: string };
    const pending = await form("/auth/device/token", { grant_type: "urn:ietf:params:oauth:grant-type:device_code", device_code, client_id: "tv" });
    expect(pending.status).toBe(400);
    expect(((await pending.json()) as { error: string }).error).toBe("authorization_pending");
    expect((await k.api("POST", "/auth/device/verify", { token: a.user.token, body: { user_code, action: "approve" } })).status).toBe(200);
    await advance(16);
    const t = await form("/auth/device/token", { grant_type: "urn:ietf:params:oauth:grant-type:device_code", device_code, client_id: "tv" });
    expect(t.status).toBe(200);
    expect(((await t.json()) as { user: { id: string } }).user.id).toBe(a.user.id);
    // A form without the grant type is the same 400 as its JSON form.
    expect((await form("/auth/device/token", { device_code, client_id: "tv" })).status).toBe(400);
  });

  test("expired_token after 10 minutes; access_denied when the user denies; unknown client 404, disabled 400; device_verification_url from PATCH /auth/config", async () => {
    const a = await deviceApp({ device_verification_url: "https://app.example.com/device" });
    const d = await code(a);
    expect(d.body.verification_uri).toBe("https://app.example.com/device");
    expect(d.body.verification_uri_complete).toBe(`https://app.example.com/device?user_code=${d.body.user_code}`);
    await advance(601);
    expect((await poll(a, d.body.device_code)).body.error).toBe("expired_token");
    expect((await k.api("POST", "/auth/device/verify", { token: a.user.token, body: { user_code: d.body.user_code, action: "approve" } })).status).toBe(404);

    const d2 = await code(a);
    expect((await k.api("POST", "/auth/device/verify", { token: a.user.token, body: { user_code: d2.body.user_code, action: "deny" } })).body.status).toBe("denied");
    expect((await poll(a, d2.body.device_code)).body.error).toBe("access_denied");

    const unknown = await code(a, "fridge");
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toBe("no device client with client_id 'fridge' is configured for this project");
    await k.api("PUT", `/projects/${a.id}/oauth/configs/device?client_id=tv`, { body: { enabled: false } });
    const off = await code(a);
    expect(off.status).toBe(400);
    expect(off.body.error).toBe("device client 'tv' is disabled for this project");
    // Another project's user cannot approve this project's device.
    await k.api("PUT", `/projects/${a.id}/oauth/configs/device?client_id=tv`, { body: { enabled: true } });
    const d3 = await code(a);
    const b = await deviceApp();
    expect((await k.api("POST", "/auth/device/verify", { token: b.user.token, body: { user_code: d3.body.user_code, action: "approve" } })).status).toBe(404);
    expect((await poll(b, d3.body.device_code)).body.error).toBe("invalid_grant");
  });

  test("the managed device page: a code entry form, 404 for an unknown code, and sign-in buttons for the enabled providers", async () => {
    const a = await deviceApp();
    const entry = await fetch(`${k.url}/auth/device`);
    expect(entry.status).toBe(200);
    expect(await entry.text()).toContain('name="user_code"');
    expect((await fetch(`${k.url}/auth/device?user_code=BBBB-BBBB`)).status).toBe(404);
    const d = await code(a);
    const html = await (await fetch(d.body.verification_uri_complete)).text();
    expect(html).toContain('id="signin-google"');
    expect(html).toContain(`/auth/oauth/google/authorize?anon_key=${encodeURIComponent(a.anon)}&amp;redirect_url=${encodeURIComponent(`${k.url}/auth/device`)}`);
    // The sign-in buttons return to the page itself (a managed page, allowed without being listed).
    as("google", { email: email("device-google") });
    const f = await follow(`${k.url}/auth/oauth/google/authorize?anon_key=${a.anon}&redirect_url=${encodeURIComponent(`${k.url}/auth/device`)}&client_state=${d.body.user_code}`, `${k.url}/auth/device`);
    const back = new URL(f.location!);
    expect(back.searchParams.get("client_state")).toBe(d.body.user_code);
    const r = await exchange(a, back.searchParams.get("code")!, `${k.url}/auth/device`);
    expect(r.status).toBe(201);
  });
});

describe("the emulators by default", () => {
  test("a config without an issuer signs in against Kiln's own emulators where Kiln serves them (embedded), else names the real provider; identities over HTTP", async () => {
    const p = await createProject(k);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
    const c = await k.api("POST", `/projects/${p.id}/oauth/configs`, {
      body: { provider: "google", client_id: "web", client_secret: "a-secret-of-some-length", redirect_url: `${k.url}/auth/oauth/google/callback` },
    });
    expect(c.status).toBe(201);
    const withIssuer = await k.api("POST", `/projects/${p.id}/oauth/configs`, {
      body: { provider: "github", client_id: "web", client_secret: "a-secret-of-some-length", redirect_url: `${k.url}/auth/oauth/github/callback`, issuer: "https://github.com" },
    });
    expect(withIssuer.body).toMatchObject({ issuer: "https://github.com", uses: "provider" });
    if (STORE === "postgres") {
      // The production profile serves no emulators (anyone could sign in as anyone): the real Google.
      expect(c.body).toMatchObject({ issuer: null, uses: "provider" });
      return;
    }
    expect(c.body).toMatchObject({ issuer: null, uses: "emulator" });
    const who = { email: email("kiln-emulator"), name: "Grace Hopper" };
    expect((await k.api("POST", "/_emulators/oauth/google/next", { token: null, body: who })).status).toBe(200);
    const start = await fetch(`${k.url}/auth/oauth/google/authorize?anon_key=${anon}`, { redirect: "manual" });
    expect(start.headers.get("location")).toMatch(new RegExp(`^${k.url}/_emulators/oauth/google/auth\\?`));
    const f = await follow(start.headers.get("location")!);
    expect(f.response?.status).toBe(201);
    expect(f.body.user).toMatchObject({ email: who.email, raw_user_meta_data: { name: "Grace Hopper", provider: "google", email_verified: true } });
    // Back to the emulator after having pointed elsewhere: issuer null.
    await k.api("PUT", `/projects/${p.id}/oauth/configs/google`, { body: { issuer: "https://accounts.google.com" } });
    expect((await k.api("GET", `/projects/${p.id}/oauth/configs/google`)).body.uses).toBe("provider");
    expect((await k.api("PUT", `/projects/${p.id}/oauth/configs/google`, { body: { issuer: null } })).body.uses).toBe("emulator");
  });
});

describe("the managed sign-in page", () => {
  test("GET /auth/oauth/hosted: a button per enabled provider, returning to an allowed redirect_url or to the page; a redirect_url not allowed 400; a wrong anon key 401", async () => {
    const a = await app(["google", "github"]);
    await k.api("PUT", `/projects/${a.id}/oauth/configs/github`, { body: { enabled: false } });
    const page = await fetch(`${k.url}/auth/oauth/hosted?anon_key=${a.anon}&redirect_url=${encodeURIComponent(APP)}`);
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).toContain(`href="/auth/oauth/google/authorize?anon_key=${encodeURIComponent(a.anon)}&amp;redirect_url=${encodeURIComponent(APP)}"`);
    expect(html).not.toContain("signin-github");
    const bad = await k.api("GET", `/auth/oauth/hosted?anon_key=${a.anon}&redirect_url=${encodeURIComponent("http://localhost:3000/elsewhere")}`, { token: null });
    expect(bad.status).toBe(400);
    expect((await k.api("GET", "/auth/oauth/hosted?anon_key=ak-wrong", { token: null })).status).toBe(401);
    // A key no header can carry (it becomes a Bearer header) is a 400, on this page and on authorize.
    for (const path of ["/auth/oauth/hosted", "/auth/oauth/google/authorize"]) {
      const odd = await k.api("GET", `${path}?anon_key=${encodeURIComponent("\u{10FAF0}ak")}`, { token: null });
      expect(odd.status, path).toBe(400);
      expect(odd.body.error).toMatch(/anon_key/);
    }
    // Without redirect_url the buttons return to the page itself, a managed page: the flow takes it, and its code exchanges.
    const self = `${k.url}/auth/oauth/hosted?anon_key=${encodeURIComponent(a.anon)}`;
    expect(await (await fetch(self)).text()).toContain(`redirect_url=${encodeURIComponent(self)}`);
    as("google", { email: email("hosted") });
    const f = await follow(`${k.url}/auth/oauth/google/authorize?anon_key=${a.anon}&redirect_url=${encodeURIComponent(self)}`, `${self}&`);
    const code = new URL(f.location!).searchParams.get("code")!;
    expect((await exchange(a, code, self)).status).toBe(201);
  });
});

describe("docs/auth.md", () => {
  // The snippet as the docs show it, run against this Kiln (its emulators: the embedded profile).
  test.skipIf(STORE === "postgres")("the vitest snippet that signs a test user in with Google runs as written", async () => {
    const doc = readFileSync(join(ROOT, "docs/auth.md"), "utf8");
    const block = /<!-- oauth-signin-snippet[^>]*-->\n```ts\n([\s\S]*?)```/.exec(doc)?.[1];
    expect(block).toBeTruthy();
    const p = await createProject(k);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
    expect(
      (await k.api("POST", `/projects/${p.id}/oauth/configs`, {
        body: { provider: "google", client_id: "my-app", client_secret: "dev-secret-1234", redirect_url: `${k.url}/auth/oauth/google/callback` },
      })).status,
    ).toBe(201);
    await k.api("PATCH", `/auth/config?project_id=${p.id}`, { body: { allowed_redirect_urls: ["http://localhost:3000/auth/callback"] } });
    const js = new Bun.Transpiler({ loader: "ts" }).transformSync(block!.replace(/^import .*$/m, ""));
    const tests: Array<() => Promise<void>> = [];
    const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor;
    await new AsyncFunction("test", "expect", "process", js)((_: string, fn: () => Promise<void>) => tests.push(fn), expect, { env: { KILN_URL: k.url, KILN_ANON_KEY: anon } });
    expect(tests).toHaveLength(1);
    await tests[0]!();
    const users = await k.api("GET", `/projects/${p.id}/users`);
    expect(users.body.data.map((u: any) => u.email)).toEqual(["ada@example.com"]);
  });
});
