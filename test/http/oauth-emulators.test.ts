// The local OAuth providers (emulators/oauth) served by Kiln at /_emulators/oauth, over plain HTTP:
// the identities API, a queued answer instead of the login page, the authorization-code flow with
// PKCE against each OpenID provider (id_token verified against its JWKS), GitHub's OAuth app shape,
// the client rules (registered on first use, first secret pinned, strict when registered), and
// `kiln emulators oauth` alone. The browser drives the login page in oauth-emulators-browser.test.ts.
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { describe, expect, test } from "vitest";
import { BUN, KILN, ROOT, startKiln, STORE, useKiln } from "../support/kiln";
import { followRedirects, relyingParty } from "../support/oauth-relying-party";

// The postgres project runs the production profile, where the emulators are off unless asked for.
const k = useKiln({ env: { KILN_OAUTH_EMULATORS: "on" } });
const REDIRECT = "http://localhost:3000/auth/callback";
const json = (body: unknown) => ({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
const emu = (path: string, init?: RequestInit) => fetch(`${k.url}/_emulators/oauth${path}`, init);
const uniq = () => randomBytes(4).toString("hex");
const client = () => ({ client_id: `client-${uniq()}.apps.example`, client_secret: `secret-${uniq()}`, redirect_uri: REDIRECT });

describe("identities API", () => {
  test("lists the providers with their endpoints under Kiln's URL", async () => {
    const r = await emu("");
    expect(r.status).toBe(200);
    const { providers } = await r.json();
    expect(providers.map((p: { provider: string }) => p.provider)).toEqual(["google", "microsoft", "apple", "github"]);
    expect(providers[0]).toMatchObject({ issuer: `${k.url}/_emulators/oauth/google`, discovery: `${k.url}/_emulators/oauth/google/.well-known/openid-configuration` });
    expect(providers[3]).toMatchObject({ authorization: `${k.url}/_emulators/oauth/github/login/oauth/authorize`, user: `${k.url}/_emulators/oauth/github/user` });
  });

  test("create (201), update by email (200), list, delete (204, then 404), bad input 400", async () => {
    const email = `Ada-${uniq()}@Example.com`;
    const created = await emu("/identities", json({ email, name: "Ada Lovelace", picture: "https://img.example/ada.png" }));
    expect(created.status).toBe(201);
    const ada = await created.json();
    expect(ada).toMatchObject({ id: expect.stringMatching(/^idn_/), email: email.toLowerCase(), name: "Ada Lovelace", picture: "https://img.example/ada.png", email_verified: true });
    const updated = await emu("/identities", json({ email, email_verified: false }));
    expect(updated.status).toBe(200);
    expect(await updated.json()).toMatchObject({ id: ada.id, name: "Ada Lovelace", email_verified: false });
    const list = await (await emu("/identities")).json();
    expect(list.identities.filter((i: { email: string }) => i.email === email.toLowerCase())).toHaveLength(1);
    expect((await emu("/identities", json({ email: "not-an-email" }))).status).toBe(400);
    expect((await emu("/identities", json({ email: `p-${uniq()}@example.com`, picture: "javascript:alert(1)" }))).status).toBe(400);
    expect((await emu("/identities", json({ name: "no email" }))).status).toBe(400);
    expect((await emu(`/identities/${ada.id}`, { method: "DELETE" })).status).toBe(204);
    expect((await emu(`/identities/${ada.id}`, { method: "DELETE" })).status).toBe(404);
  });

  test("queueing names an existing identity or creates one; an unknown identity or provider is 400", async () => {
    expect((await emu("/google/next", json({ identity: `nobody-${uniq()}@example.com` }))).status).toBe(400);
    expect((await emu("/gitlab/next", json({ deny: true }))).status).toBe(400);
    expect((await emu("/google/next", json({}))).status).toBe(400);
    const email = `q-${uniq()}@example.com`;
    const r = await emu("/google/next", json({ email, name: "Q" }));
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({ provider: "google", deny: false, identity: { email, name: "Q" } });
    expect((await emu("/google/next", { method: "DELETE" })).status).toBe(204);
  });
});

describe.each(["google", "microsoft", "apple"] as const)("%s: OpenID Connect", (kind) => {
  const issuer = () => `${k.url}/_emulators/oauth/${kind}`;
  const scope = kind === "apple" ? "openid email name" : "openid email profile";

  test("discovery and JWKS of its own issuer; PKCE S256; code flow only", async () => {
    const d = await (await emu(`/${kind}/.well-known/openid-configuration`)).json();
    expect(d).toMatchObject({
      issuer: issuer(),
      authorization_endpoint: `${issuer()}/auth`,
      token_endpoint: `${issuer()}/token`,
      userinfo_endpoint: `${issuer()}/me`,
      jwks_uri: `${issuer()}/jwks`,
      code_challenge_methods_supported: ["S256"],
      response_types_supported: ["code"],
    });
    const jwks = await (await fetch(d.jwks_uri)).json();
    expect(jwks.keys).toEqual([expect.objectContaining({ kty: "RSA", alg: "RS256", use: "sig", kid: expect.stringContaining(kind) })]);
    expect(JSON.stringify(jwks)).not.toMatch(/"d":/);
  });

  test("a queued identity signs in without the page: code → tokens → id_token verified with the claims", async () => {
    const c = client();
    const rp = await relyingParty(issuer(), c);
    const email = `${kind}-${uniq()}@example.com`;
    expect((await emu(`/${kind}/next`, json({ email, name: "Grace Hopper", picture: "https://img.example/g.png" }))).status).toBe(200);
    const started = await rp.start(scope);
    const { callback } = await followRedirects(started.url, REDIRECT);
    expect(callback?.searchParams.get("code")).toBeTruthy();
    const { claims, header, tokens } = await rp.finish(callback!, started);
    expect(header.alg).toBe("RS256");
    expect(claims).toMatchObject({ iss: issuer(), aud: c.client_id, email, email_verified: true, nonce: started.nonce });
    if (kind === "apple") {
      expect(claims.name).toBe("Grace Hopper"); // first authorization of this client: the name comes once
      expect(claims.picture).toBeUndefined();
      expect(claims.sub).toMatch(/^\d{6}\.[0-9a-f]{32}\.[0-9a-f]{4}$/);
    } else expect(claims).toMatchObject({ name: "Grace Hopper", picture: "https://img.example/g.png" });
    if (kind === "google") expect(claims.sub).toMatch(/^\d{21}$/);
    const info = await fetch(rp.as.userinfo_endpoint!, { headers: { authorization: `Bearer ${tokens.access_token}` } });
    expect(info.status).toBe(200);
    expect(await info.json()).toMatchObject({ sub: claims.sub, email });

    // Again: the same subject (derived from the email); Apple leaves the name out after the first time.
    await emu(`/${kind}/next`, json({ identity: email }));
    const again = await rp.start(scope);
    const second = await rp.finish((await followRedirects(again.url, REDIRECT)).callback!, again);
    expect(second.claims.sub).toBe(claims.sub);
    if (kind === "apple") expect(second.claims.name).toBeUndefined();
    else expect(second.claims.name).toBe("Grace Hopper");
  });

  test("an unverified email says so; deny answers access_denied with the state", async () => {
    const c = client();
    const rp = await relyingParty(issuer(), c);
    const email = `unverified-${uniq()}@example.com`;
    await emu(`/${kind}/next`, json({ email, email_verified: false, client_id: c.client_id }));
    const s1 = await rp.start(scope);
    const { claims } = await rp.finish((await followRedirects(s1.url, REDIRECT)).callback!, s1);
    expect(claims).toMatchObject({ email, email_verified: false });

    await emu(`/${kind}/next`, json({ deny: true, client_id: c.client_id }));
    const s2 = await rp.start(scope);
    const { callback } = await followRedirects(s2.url, REDIRECT);
    expect(callback?.searchParams.get("error")).toBe("access_denied");
    expect(callback?.searchParams.get("state")).toBe(s2.state);
    expect(callback?.searchParams.get("code")).toBeNull();
  });

  test("PKCE is required and checked; a code works once; the first secret is pinned", async () => {
    const c = client();
    const rp = await relyingParty(issuer(), c);
    const email = `pkce-${uniq()}@example.com`;
    // Without a code_challenge: an error to the (checked) redirect URI, no code.
    const bare = new URL((await rp.start(scope)).url);
    bare.searchParams.delete("code_challenge");
    bare.searchParams.delete("code_challenge_method");
    const noPkce = await followRedirects(bare.href, REDIRECT);
    expect(noPkce.callback?.searchParams.get("error")).toBe("invalid_request");

    await emu(`/${kind}/next`, json({ email, client_id: c.client_id }));
    const s = await rp.start(scope);
    const code = (await followRedirects(s.url, REDIRECT)).callback!.searchParams.get("code")!;
    const token = (verifier: string, secret = c.client_secret) =>
      fetch(rp.as.token_endpoint!, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ grant_type: "authorization_code", code, redirect_uri: REDIRECT, code_verifier: verifier, client_id: c.client_id, client_secret: secret }),
      });
    const wrongVerifier = await token(randomBytes(32).toString("base64url"));
    expect(wrongVerifier.status).toBe(400);
    expect((await wrongVerifier.json()).error).toBe("invalid_grant");
    // The first secret presented was pinned by that request; another one is refused.
    const otherSecret = await token(s.code_verifier, "another-secret");
    expect(otherSecret.status).toBe(401);
    expect((await otherSecret.json()).error).toBe("invalid_client");
    // The right verifier and secret still get the code's tokens, once.
    expect((await token(s.code_verifier)).status).toBe(200);
    const reused = await token(s.code_verifier);
    expect(reused.status).toBe(400);
    expect((await reused.json()).error).toBe("invalid_grant");

    await emu(`/${kind}/next`, json({ email, client_id: c.client_id }));
    const s2 = await rp.start(scope);
    const cb = (await followRedirects(s2.url, REDIRECT)).callback!;
    await rp.finish(cb, s2);
    await expect(rp.finish(cb, s2)).rejects.toMatchObject({ error: "invalid_grant" });
  });

  test("a client registered up front is strict about its redirect URIs and secret", async () => {
    const c = client();
    const reg = await emu(`/${kind}/clients`, json({ client_id: c.client_id, client_secret: c.client_secret, redirect_uris: [REDIRECT] }));
    expect(reg.status).toBe(201);
    expect(await reg.json()).toMatchObject({ client_id: c.client_id, redirect_uris: [REDIRECT], registered: "api" });
    const rp = await relyingParty(issuer(), { ...c, redirect_uri: "http://localhost:3000/elsewhere" });
    const r = await fetch((await rp.start(scope)).url, { redirect: "manual" });
    expect(r.status).toBe(400); // shown, never redirected to an unregistered URI
    expect(await r.text()).toContain("is not registered");
    const good = await relyingParty(issuer(), c);
    await emu(`/${kind}/next`, json({ email: `strict-${uniq()}@example.com`, client_id: c.client_id }));
    const s = await good.start(scope);
    const cb = (await followRedirects(s.url, REDIRECT)).callback!;
    await expect(good.finish(cb, s, "not-the-secret")).rejects.toMatchObject({ error: "invalid_client", status: 401 });
  });

  test("the login page over plain HTTP: lists identities, a typed identity signs in", async () => {
    const c = client();
    const rp = await relyingParty(issuer(), c);
    const known = `known-${uniq()}@example.com`;
    await emu("/identities", json({ email: known, name: "Known Person" }));
    const s = await rp.start(scope);
    const { response, jar } = await followRedirects(s.url, REDIRECT);
    expect(response?.status).toBe(200);
    const html = await response!.text();
    expect(html).toContain(known);
    expect(html).toContain(c.client_id);
    const action = /<form method="post" action="([^"]+\/login)" id="new-identity"/.exec(html)![1]!;
    const typed = `typed-${uniq()}@example.com`;
    const body = new URLSearchParams({ email: typed, name: "Typed Person", picture: "https://img.example/t.png" }); // no email_verified: unchecked
    const done = await followRedirects(new URL(action, k.url).href, REDIRECT, { jar, method: "POST", body });
    const { claims } = await rp.finish(done.callback!, s);
    expect(claims).toMatchObject({ email: typed, email_verified: false });
  });
});

test("apple: response_mode=form_post answers with a form that posts the code to the redirect URI", async () => {
  const c = client();
  const rp = await relyingParty(`${k.url}/_emulators/oauth/apple`, c);
  await emu("/apple/next", json({ email: `form-${uniq()}@example.com`, client_id: c.client_id }));
  // Apple's own scope list, without openid: the emulator adds it, as Apple always answers with an id_token.
  const s = await rp.start("name email", { response_mode: "form_post" });
  const { response } = await followRedirects(s.url, REDIRECT);
  expect(response?.status).toBe(200);
  const html = await response!.text();
  expect(html).toContain(`action="${REDIRECT}"`);
  const field = (name: string) => new RegExp(`name="${name}" value="([^"]+)"`).exec(html)?.[1];
  expect(field("state")).toBe(s.state);
  const callback = new URL(REDIRECT);
  for (const name of ["code", "state", "iss"]) callback.searchParams.set(name, field(name)!.replace(/&#x2F;|&#47;/g, "/").replace(/&#x3A;|&#58;/g, ":"));
  const { claims } = await rp.finish(callback, s);
  expect(claims).toMatchObject({ iss: `${k.url}/_emulators/oauth/apple`, email_verified: true });
});

describe("github: OAuth app", () => {
  const base = () => `${k.url}/_emulators/oauth/github`;
  const authorizeUrl = (c: { client_id: string }, extra: Record<string, string> = {}) =>
    `${base()}/login/oauth/authorize?${new URLSearchParams({ client_id: c.client_id, redirect_uri: REDIRECT, scope: "read:user user:email", state: "st-1", ...extra })}`;
  const exchange = (c: { client_id: string; client_secret: string }, code: string, accept?: string, extra: Record<string, string> = {}) =>
    fetch(`${base()}/login/oauth/access_token`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded", ...(accept ? { accept } : {}) },
      body: new URLSearchParams({ client_id: c.client_id, client_secret: c.client_secret, code, redirect_uri: REDIRECT, ...extra }),
    });
  const codeFor = async (url: string) => {
    const r = await fetch(url, { redirect: "manual" });
    expect(r.status).toBe(302);
    return new URL(r.headers.get("location")!);
  };

  test("authorize → code → token (JSON or form per Accept) → /user and /user/emails", async () => {
    const c = client();
    const email = `octo-${uniq()}@example.com`;
    await emu("/github/next", json({ email, name: "Mona Octocat", email_verified: false }));
    const cb = await codeFor(authorizeUrl(c));
    expect(cb.searchParams.get("state")).toBe("st-1");
    const r = await exchange(c, cb.searchParams.get("code")!, "application/json");
    expect(r.status).toBe(200);
    const tok = await r.json();
    expect(tok).toMatchObject({ access_token: expect.stringMatching(/^gho_/), token_type: "bearer", scope: "read:user,user:email" });
    const user = await fetch(`${base()}/user`, { headers: { authorization: `Bearer ${tok.access_token}` } });
    expect(user.status).toBe(200);
    expect(user.headers.get("x-oauth-scopes")).toBe("read:user, user:email");
    expect(await user.json()).toMatchObject({ login: email.split("@")[0], id: expect.any(Number), name: "Mona Octocat", email, avatar_url: expect.stringMatching(/^https:/) });
    const emails = await fetch(`${base()}/user/emails`, { headers: { authorization: `token ${tok.access_token}` } });
    const list = await emails.json();
    expect(list[0]).toEqual({ email, primary: true, verified: false, visibility: "public" });
    expect(list[1]).toMatchObject({ primary: false, verified: true, email: expect.stringContaining("@users.noreply.github.com") });

    // The same code again, and the default answer: form-encoded, and an error is a 200 with `error`.
    const again = await exchange(c, cb.searchParams.get("code")!);
    expect(again.status).toBe(200);
    expect(again.headers.get("content-type")).toContain("application/x-www-form-urlencoded");
    expect(new URLSearchParams(await again.text()).get("error")).toBe("bad_verification_code");

    await emu("/github/next", json({ identity: email }));
    const form = await exchange(c, (await codeFor(authorizeUrl(c))).searchParams.get("code")!);
    expect(new URLSearchParams(await form.text()).get("access_token")).toMatch(/^gho_/);
  });

  test("the token endpoint checks the pinned secret, the redirect URI and PKCE; the API needs a token and user:email", async () => {
    const c = client();
    const email = `rules-${uniq()}@example.com`;
    await emu("/github/next", json({ email }));
    const first = await codeFor(authorizeUrl(c));
    expect((await (await exchange(c, first.searchParams.get("code")!, "application/json")).json()).access_token).toBeTruthy();

    await emu("/github/next", json({ identity: email }));
    const code = (await codeFor(authorizeUrl(c))).searchParams.get("code")!;
    expect((await (await exchange({ ...c, client_secret: "wrong" }, code, "application/json")).json()).error).toBe("incorrect_client_credentials");

    await emu("/github/next", json({ identity: email }));
    const code2 = (await codeFor(authorizeUrl(c))).searchParams.get("code")!;
    expect((await (await exchange(c, code2, "application/json", { redirect_uri: "http://localhost:3000/other" })).json()).error).toBe("redirect_uri_mismatch");

    const verifier = randomBytes(32).toString("base64url");
    const challenge = createHash("sha256").update(verifier).digest("base64url");
    await emu("/github/next", json({ identity: email }));
    const code3 = (await codeFor(authorizeUrl(c, { code_challenge: challenge, code_challenge_method: "S256", scope: "read:user" }))).searchParams.get("code")!;
    expect((await (await exchange(c, code3, "application/json", { code_verifier: "wrong-verifier" })).json()).error).toBe("invalid_grant");
    await emu("/github/next", json({ identity: email }));
    const code4 = (await codeFor(authorizeUrl(c, { code_challenge: challenge, code_challenge_method: "S256", scope: "read:user" }))).searchParams.get("code")!;
    const tok = await (await exchange(c, code4, "application/json", { code_verifier: verifier })).json();
    expect(tok.scope).toBe("read:user");
    // Without user:email (or user) the emails are not the token's to read; no token at all: 401.
    expect((await fetch(`${base()}/user/emails`, { headers: { authorization: `Bearer ${tok.access_token}` } })).status).toBe(404);
    expect((await fetch(`${base()}/user`)).status).toBe(401);
    expect((await fetch(`${base()}/user`, { headers: { authorization: "Bearer gho_nope" } })).status).toBe(401);
  });

  test("deny → access_denied; the page lists identities and its form signs a typed one in", async () => {
    const c = client();
    await emu("/github/next", json({ deny: true, client_id: c.client_id }));
    const denied = await codeFor(authorizeUrl(c));
    expect(denied.searchParams.get("error")).toBe("access_denied");
    expect(denied.searchParams.get("state")).toBe("st-1");

    const page = await fetch(authorizeUrl(c));
    expect(page.status).toBe(200);
    const html = await page.text();
    const form = /<form method="post" action="([^"]+)" id="new-identity">([\s\S]*?)<\/form>/.exec(html)!;
    const fields = new URLSearchParams([...form[2]!.matchAll(/type="hidden" name="([^"]+)" value="([^"]*)"/g)].map((m) => [m[1]!, m[2]!.replace(/&#38;/g, "&")]));
    const email = `typed-gh-${uniq()}@example.com`;
    fields.set("email", email);
    fields.set("email_verified", "true");
    const r = await fetch(new URL(form[1]!, k.url), { method: "POST", body: fields, redirect: "manual" });
    expect(r.status).toBe(302);
    const cb = new URL(r.headers.get("location")!);
    expect(cb.origin + cb.pathname).toBe(REDIRECT);
    const tok = await (await exchange(c, cb.searchParams.get("code")!, "application/json")).json();
    expect(await (await fetch(`${base()}/user`, { headers: { authorization: `Bearer ${tok.access_token}` } })).json()).toMatchObject({ email });
  });
});

test("kiln emulators oauth runs them alone and prints the issuers (--json)", async () => {
  const proc = spawn(BUN, [KILN, "--json", "emulators", "oauth", "--port", "0"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  try {
    const line = await new Promise<string>((ok, fail) => {
      let out = "";
      const timer = setTimeout(() => fail(new Error(`no output in 20 s: ${out}`)), 20_000);
      proc.stdout!.on("data", (d) => {
        out += d;
        if (out.includes("\n")) {
          clearTimeout(timer);
          ok(out.split("\n")[0]!);
        }
      });
      proc.once("exit", (code) => fail(new Error(`exited ${code}: ${out}`)));
    });
    const printed = JSON.parse(line);
    const google = printed.providers.find((p: { kind: string }) => p.kind === "google");
    expect(google.issuer).toBe(`${printed.url}/_emulators/oauth/google`);
    const d = await (await fetch(google.discovery)).json();
    expect(d.issuer).toBe(google.issuer);
    expect((await fetch(`${printed.url}/_emulators/oauth/identities`, json({ email: "alone@example.com" }))).status).toBe(201);
  } finally {
    proc.kill("SIGTERM");
  }
});

test.runIf(STORE === "postgres")("the production profile serves no emulators unless KILN_OAUTH_EMULATORS=on", async () => {
  const prod = await startKiln();
  try {
    const r = await fetch(`${prod.url}/_emulators/oauth/identities`);
    expect(r.status).toBe(404);
    expect((await fetch(`${prod.url}/_emulators/oauth/google/.well-known/openid-configuration`)).status).toBe(404);
  } finally {
    await prod.stop();
  }
});
