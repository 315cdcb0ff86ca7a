// End users: sign-up, sign-in, sessions, password reset, profile, auth config, rate limits, the
// mail catcher. JWTs are verified with jose against the project's published keys.
import { createRemoteJWKSet, decodeProtectedHeader, jwtVerify } from "jose";
import { beforeEach, describe, expect, test } from "vitest";
import { clearOfWindowEnd, createProject, createToken, eventually, useKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });

let n = 0;
const email = (tag = "user") => `${tag}-${Date.now()}-${++n}@example.com`;

/** A project with its default anon key. */
async function app() {
  const p = await createProject(k);
  const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
  return { id: p.id, anon };
}

async function signup(anon: string, addr = email(), password = "correct horse", data?: object) {
  const r = await k.api("POST", "/auth/signup", { token: anon, body: { email: addr, password, data } });
  if (r.status !== 201) throw new Error(`signup ${r.status} ${r.text}`);
  return { ...r.body, email: addr, password };
}

/** Read with the platform token: the production profile (postgres project) guards the catcher (mail-catcher-access.test.ts). */
async function mailTo(to: string, subject?: RegExp) {
  const r = await eventually(
    () => k.api("GET", `/_emulators/mail/messages?to=${encodeURIComponent(to)}`),
    (r) => r.body.data.some((m: any) => !subject || subject.test(m.subject)),
  );
  return r.body.data.find((m: any) => !subject || subject.test(m.subject));
}

const tokenFrom = (link: string) => new URL(link).searchParams.get("token")!;

describe("sign-up and sign-in", () => {
  test("sign-up returns the auth token response; the JWT verifies against the project's JWKS with the documented claims", async () => {
    const a = await app();
    const addr = email();
    const r = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: addr, password: "correct horse", data: { name: "Ada" } } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ token_type: "bearer", expires_in: 3600, refresh_token: expect.stringMatching(/^rt-/) });
    expect(r.body.user).toEqual({
      id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      email: addr,
      email_confirmed: true,
      raw_user_meta_data: { name: "Ada" },
      status: "active",
      created_at: expect.any(String),
    });
    expect(JSON.stringify(r.body)).not.toContain("correct horse");
    const jwks = createRemoteJWKSet(new URL(`${k.url}/auth/jwks.json?project_id=${a.id}`));
    const { payload, protectedHeader } = await jwtVerify(r.body.access_token, jwks, { audience: "authenticated" });
    expect(protectedHeader.alg).toBe("ES256");
    expect(payload).toMatchObject({ sub: r.body.user.id, email: addr, role: "authenticated", aud: "authenticated", project_id: a.id });
    expect(payload.exp! - payload.iat!).toBe(3600);
    expect(payload.session_id).toEqual(expect.any(String));
    // The JWKS is also reachable with the anon key as bearer, and another project's keys do not verify it.
    const viaKey = await k.api("GET", "/auth/jwks.json", { token: a.anon });
    expect(viaKey.body.keys[0].kid).toBe(protectedHeader.kid);
    const other = await app();
    const otherJwks = createRemoteJWKSet(new URL(`${k.url}/auth/jwks.json?project_id=${other.id}`));
    await expect(jwtVerify(r.body.access_token, otherJwks)).rejects.toThrow();
  });

  test("duplicate email (any case) is 409; weak password is 400 with the rule; bad email is 400", async () => {
    const a = await app();
    const u = await signup(a.anon, "Dup@Example.com");
    expect(u.user.email).toBe("Dup@Example.com");
    const dup = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: "dup@example.COM", password: "another pw" } });
    expect(dup.status).toBe(409);
    expect(dup.body.error).toMatch(/already exists/);
    const weak = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: email(), password: "short" } });
    expect(weak.status).toBe(400);
    expect(weak.body).toEqual({ error: "password must be at least 8 characters" });
    const bad = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: "not-an-email", password: "long enough" } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain("'email'");
  });

  test("sign-in: 200 with a new session; wrong password and unknown email give the same 400", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const ok = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email.toUpperCase(), password: u.password } });
    expect(ok.status).toBe(200);
    expect(ok.body.user.id).toBe(u.user.id);
    const wrong = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: "wrong password" } });
    const unknown = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: email("nobody"), password: "wrong password" } });
    expect(wrong.status).toBe(400);
    expect(wrong.body).toEqual({ error: "invalid credentials" });
    expect(unknown.status).toBe(400);
    expect(unknown.body).toEqual(wrong.body);
    // Users are per project.
    const b = await app();
    expect((await k.api("POST", "/auth/signin", { token: b.anon, body: { email: u.email, password: u.password } })).status).toBe(400);
  });

  test("credential kinds: anon routes refuse user tokens and platform tokens; user routes refuse anon keys; none is 401", async () => {
    const a = await app();
    const u = await signup(a.anon);
    expect((await k.api("POST", "/auth/signin", { token: u.access_token, body: { email: u.email, password: u.password } })).status).toBe(403);
    expect((await k.api("POST", "/auth/signup", { body: { email: email(), password: "long enough" } })).status).toBe(403);
    expect((await k.api("GET", "/auth/user", { token: a.anon })).status).toBe(403);
    expect((await k.api("GET", "/auth/user", { token: null })).status).toBe(401);
    expect((await k.api("GET", "/auth/user", { token: u.access_token + "x" })).status).toBe(401);
    // An end-user token cannot manage the project either.
    expect((await k.api("GET", `/projects/${a.id}`, { token: u.access_token })).status).toBe(403);
  });
});

describe("sessions", () => {
  test("refresh rotates the pair; reusing a spent refresh token revokes the whole session (401)", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const r1 = await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: u.refresh_token } });
    expect(r1.status).toBe(200);
    expect(r1.body.refresh_token).not.toBe(u.refresh_token);
    expect((await k.api("GET", "/auth/user", { token: r1.body.access_token })).status).toBe(200);
    const reuse = await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: u.refresh_token } });
    expect(reuse.status).toBe(401);
    expect(reuse.body.error).toMatch(/revoked/);
    // The family is gone: the newest refresh token and the session's access tokens no longer work.
    expect((await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: r1.body.refresh_token } })).status).toBe(401);
    expect((await k.api("GET", "/auth/user", { token: r1.body.access_token })).status).toBe(401);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    // Other sessions of the same user are unaffected.
    const other = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } });
    expect((await k.api("GET", "/auth/user", { token: other.body.access_token })).status).toBe(200);
    expect((await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: "rt-nonsense" } })).status).toBe(401);
  });

  test("logout ends the session: its access and refresh tokens stop working", async () => {
    const a = await app();
    const u = await signup(a.anon);
    expect((await k.api("POST", "/auth/logout", { token: u.access_token })).status).toBe(204);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    expect((await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: u.refresh_token } })).status).toBe(401);
  });

  test("access_token_ttl_seconds sets expires_in and exp; a token past exp is refused", async () => {
    const a = await app();
    const cfg = await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { access_token_ttl_seconds: 60 } });
    expect(cfg.status).toBe(200);
    const u = await signup(a.anon);
    expect(u.expires_in).toBe(60);
    const claims = JSON.parse(Buffer.from(u.access_token.split(".")[1], "base64url").toString());
    expect(claims.exp - claims.iat).toBe(60);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(200);
    const moved = await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 61 } });
    expect(moved.body.offset_ms).toBeGreaterThanOrEqual(61_000);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    // The refresh token still works and gives a fresh access token.
    const r = await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: u.refresh_token } });
    expect((await k.api("GET", "/auth/user", { token: r.body.access_token })).status).toBe(200);
  });

  test("ECDSA malleability: every issued token has low S; its high-S twin (s' = n - s, same claims, valid for jose) is 401", async () => {
    const P256_N = 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n;
    const parts = (jwt: string) => {
      const [h, p, sig] = jwt.split(".");
      const raw = Buffer.from(sig!, "base64url");
      return { head: `${h}.${p}`, r: raw.subarray(0, 32), s: BigInt("0x" + raw.subarray(32).toString("hex")) };
    };
    const twin = (jwt: string) => {
      const { head, r, s } = parts(jwt);
      return `${head}.${Buffer.concat([r, Buffer.from((P256_N - s).toString(16).padStart(64, "0"), "hex")]).toString("base64url")}`;
    };
    const a = await app();
    const u = await signup(a.anon);
    // WebCrypto picks either S at random; Kiln must hand out the low one every time (2^-8 by chance).
    const tokens = [u.access_token as string];
    for (let i = 0; i < 7; i++) tokens.push((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } })).body.access_token);
    for (const t of tokens) expect(parts(t).s <= P256_N / 2n).toBe(true);
    const jwks = createRemoteJWKSet(new URL(`${k.url}/auth/jwks.json?project_id=${a.id}`));
    for (const t of tokens.slice(0, 2)) {
      const high = twin(t);
      // The twin is a valid signature over the same claims: a generic verifier accepts it...
      expect((await jwtVerify(high, jwks, { audience: "authenticated" })).payload.sub).toBe(u.user.id);
      // ...Kiln does not, on the end-user routes and wherever an end-user token is a credential.
      const r = await k.api("GET", "/auth/user", { token: high });
      expect(r.status).toBe(401);
      expect(r.body).toEqual({ error: "invalid token" });
      expect((await k.api("POST", "/auth/logout", { token: high })).status).toBe(401);
      expect((await k.api("GET", "/auth/user", { token: t })).status).toBe(200);
    }
  });

  test("signing key rotation: new tokens use the new key, old tokens keep verifying, JWKS lists both", async () => {
    const a = await app();
    const before = await signup(a.anon);
    const rot = await k.api("POST", `/projects/${a.id}/auth/signing-keys/rotate`);
    expect(rot.status).toBe(200);
    const after = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: before.email, password: before.password } });
    expect(decodeProtectedHeader(after.body.access_token).kid).toBe(rot.body.kid);
    expect(decodeProtectedHeader(before.access_token).kid).not.toBe(rot.body.kid);
    expect((await k.api("GET", "/auth/user", { token: before.access_token })).status).toBe(200);
    const jwks = await k.api("GET", `/auth/jwks.json?project_id=${a.id}`, { token: null });
    expect(jwks.body.keys).toHaveLength(2);
    expect(jwks.body.keys.some((x: any) => "d" in x)).toBe(false); // never a private part
  });
});

describe("password reset through the mail catcher", () => {
  test("forgot-password mails a one-time link; reset sets the password, ends old sessions and signs in", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const f = await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: u.email } });
    expect(f.status).toBe(200);
    const mail = await mailTo(u.email, /reset/i);
    const link = mail.links.find((l: string) => l.includes("/auth/reset-password"));
    expect(link).toBeDefined();
    // The link opens a page with a form.
    const page = await fetch(link);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain("<form");
    const reset = await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: tokenFrom(link), password: "brand new pw" } });
    expect(reset.status).toBe(200);
    expect(reset.body.user.id).toBe(u.user.id);
    expect((await k.api("GET", "/auth/user", { token: reset.body.access_token })).status).toBe(200);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    expect((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } })).status).toBe(400);
    expect((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: "brand new pw" } })).status).toBe(200);
    const again = await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: tokenFrom(link), password: "another pw 1" } });
    expect(again.status).toBe(400);
    expect(again.body).toEqual({ error: "invalid or expired token" });
  });

  test("an unknown email gets the same 200 and no mail; a weak new password is refused without spending the token", async () => {
    const a = await app();
    const ghost = email("ghost");
    const r = await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: ghost } });
    const u = await signup(a.anon);
    const known = await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: u.email } });
    expect(r.status).toBe(200);
    expect(r.body).toEqual(known.body);
    const mail = await mailTo(u.email, /reset/i);
    expect((await k.api("GET", `/_emulators/mail/messages?to=${ghost}`)).body.data).toEqual([]);
    const link = mail.links[0];
    const weak = await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: tokenFrom(link), password: "x" } });
    expect(weak.body).toEqual({ error: "password must be at least 8 characters" });
    expect((await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: tokenFrom(link), password: "good enough" } })).status).toBe(200);
  });

  test("redirect_url must be an allowed redirect URL; the link then leads there", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const denied = await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: u.email, redirect_url: "https://app.example.com/reset" } });
    expect(denied.status).toBe(400);
    expect(denied.body.error).toMatch(/allowed_redirect_urls/);
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { allowed_redirect_urls: ["https://app.example.com/reset"] } });
    expect((await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: u.email, redirect_url: "https://app.example.com/reset" } })).status).toBe(200);
    const mail = await mailTo(u.email, /reset/i);
    expect(mail.links[0]).toMatch(/^https:\/\/app\.example\.com\/reset\?token=[\w-]+&type=recovery$/);
  });
});

describe("the signed-in user", () => {
  test("PUT /auth/user merges data (null removes a key) and changes the password, ending other sessions only", async () => {
    const a = await app();
    const u = await signup(a.anon, email(), "first password", { a: 1, b: 2 });
    const other = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } });
    const r = await k.api("PUT", "/auth/user", { token: u.access_token, body: { data: { b: null, c: 3 }, password: "second password" } });
    expect(r.status).toBe(200);
    expect(r.body.raw_user_meta_data).toEqual({ a: 1, c: 3 });
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).body.raw_user_meta_data).toEqual({ a: 1, c: 3 });
    expect((await k.api("GET", "/auth/user", { token: other.body.access_token })).status).toBe(401);
    expect((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: "second password" } })).status).toBe(200);
    expect((await k.api("PUT", "/auth/user", { token: u.access_token, body: { password: "short" } })).status).toBe(400);
  });

  test("changing email mails a confirmation to the new address; the email changes when the link is followed", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const taken = await signup(a.anon);
    expect((await k.api("PUT", "/auth/user", { token: u.access_token, body: { email: taken.email } })).status).toBe(409);
    const next = email("new");
    const r = await k.api("PUT", "/auth/user", { token: u.access_token, body: { email: next } });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ email: u.email, new_email: next });
    expect(r.headers.get("x-ratelimit-limit")).toBe("30");
    const mail = await mailTo(next, /new email/i);
    const confirm = await fetch(mail.links[0]);
    expect(confirm.status).toBe(200);
    expect((await confirm.json()).email).toBe(next);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).body.email).toBe(next);
    expect((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: next, password: u.password } })).status).toBe(200);
    expect((await fetch(mail.links[0])).status).toBe(400); // links work once
  });
});

describe("auth config", () => {
  test("defaults; platform token needs project_id; a full project token uses its own project", async () => {
    const a = await app();
    const noId = await k.api("GET", "/auth/config");
    expect(noId.status).toBe(400);
    expect(noId.body.error).toMatch(/project_id/);
    const cfg = await k.api("GET", `/auth/config?project_id=${a.id}`);
    expect(cfg.body).toEqual({
      allowed_redirect_urls: [],
      allowed_email_domains: [],
      device_verification_url: null,
      require_email_confirmation: false,
      access_token_ttl_seconds: 3600,
      rate_limits: { signup: 100, signin: 300, refresh: 1800, forgot_password: 30, reset_password: 30, change_email: 30 },
      updated_at: null,
    });
    const t = await createToken(k, a.id, { scope: "full" });
    const viaToken = await k.api("PATCH", "/auth/config", { token: t.token, body: { rate_limits: { signin: 5 } } });
    expect(viaToken.status).toBe(200);
    expect(viaToken.body.rate_limits).toMatchObject({ signin: 5, signup: 100 });
    const ro = await createToken(k, a.id, { scope: "read_only" });
    expect((await k.api("GET", "/auth/config", { token: ro.token })).status).toBe(403);
    expect((await k.api("PATCH", "/auth/config", { token: ro.token, body: {} })).status).toBe(403);
    const other = await app();
    expect((await k.api("GET", `/auth/config?project_id=${other.id}`, { token: t.token })).status).toBe(403);
    expect((await k.api("GET", `/auth/config?project_id=nope`)).status).toBe(404);
  });

  test("validation: redirect URL rules, domains, TTL range, unknown rate-limit names", async () => {
    const a = await app();
    const patch = (body: object) => k.api("PATCH", `/auth/config?project_id=${a.id}`, { body });
    for (const bad of ["javascript:alert(1)", "http://example.com/cb", "https://*.example.com", "https://u@example.com"]) {
      const r = await patch({ allowed_redirect_urls: ["https://ok.example.com", bad] });
      expect(r.status, bad).toBe(400);
      expect(r.body.error).toContain("allowed_redirect_urls.1");
    }
    expect((await patch({ allowed_redirect_urls: ["http://localhost:3000/cb", "https://ok.example.com/x?y=1"] })).status).toBe(200);
    expect((await patch({ device_verification_url: "ftp://x" })).status).toBe(400);
    expect((await patch({ allowed_email_domains: ["not a domain"] })).status).toBe(400);
    expect((await patch({ access_token_ttl_seconds: 59 })).status).toBe(400);
    expect((await patch({ access_token_ttl_seconds: 86_401 })).status).toBe(400);
    expect((await patch({ rate_limits: { nonsense: 1 } })).status).toBe(400);
    const kept = await k.api("GET", `/auth/config?project_id=${a.id}`);
    expect(kept.body.allowed_redirect_urls).toEqual(["http://localhost:3000/cb", "https://ok.example.com/x?y=1"]);
    expect(kept.body.updated_at).toEqual(expect.any(String));
  });

  test("allowed_email_domains restricts sign-up and email changes", async () => {
    const a = await app();
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { allowed_email_domains: ["Example.com"] } });
    const out = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: "x@elsewhere.org", password: "long enough" } });
    expect(out.status).toBe(400);
    expect(out.body.error).toMatch(/elsewhere\.org.*not allowed/);
    const u = await signup(a.anon, email());
    expect((await k.api("PUT", "/auth/user", { token: u.access_token, body: { email: "me@elsewhere.org" } })).status).toBe(400);
  });

  test("require_email_confirmation: sign-up mails a link and opens no session until it is followed", async () => {
    const a = await app();
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, {
      body: { require_email_confirmation: true, allowed_redirect_urls: ["http://localhost:3000/welcome"] },
    });
    const addr = email();
    const r = await k.api("POST", "/auth/signup", {
      token: a.anon,
      body: { email: addr, password: "long enough", redirect_url: "http://localhost:3000/welcome" },
    });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ confirmation_sent: true, user: { email: addr, email_confirmed: false } });
    expect(r.body.access_token).toBeUndefined();
    const early = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: addr, password: "long enough" } });
    expect(early.status).toBe(400);
    expect(early.body).toEqual({ error: "email not confirmed" });
    const mail = await mailTo(addr, /confirm/i);
    const follow = await fetch(mail.links[0], { redirect: "manual" });
    expect(follow.status).toBe(303);
    expect(follow.headers.get("location")).toBe("http://localhost:3000/welcome?type=email_confirmed");
    const ok = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: addr, password: "long enough" } });
    expect(ok.status).toBe(200);
    expect(ok.body.user.email_confirmed).toBe(true);
  });
});

describe("rate limits", () => {
  // Budgets count in hourly windows of Kiln's clock, which runs with the wall clock: an hour boundary
  // between a test's requests (CI once crossed one) would start a fresh budget. Each test starts with
  // at least 5 minutes of its window left, moving the clock past the boundary when it is closer.
  beforeEach(() => clearOfWindowEnd(k, 3600));

  test("signup reports X-RateLimit-Limit/Remaining and, on 429, X-RateLimit-Reset (Unix seconds)", async () => {
    const a = await app();
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { rate_limits: { signup: 2 } } });
    const first = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: email(), password: "long enough" } });
    expect(first.headers.get("x-ratelimit-limit")).toBe("2");
    expect(first.headers.get("x-ratelimit-remaining")).toBe("1");
    // Errors count and carry the headers too.
    const second = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: email(), password: "short" } });
    expect(second.status).toBe(400);
    expect(second.headers.get("x-ratelimit-remaining")).toBe("0");
    const third = await k.api("POST", "/auth/signup", { token: a.anon, body: { email: email(), password: "long enough" } });
    expect(third.status).toBe(429);
    const reset = Number(third.headers.get("x-ratelimit-reset"));
    // Kiln's clock may have been moved forward by another test of this file.
    const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now) / 1000;
    expect(reset).toBeGreaterThan(now);
    expect(reset).toBeLessThanOrEqual(now + 3600 + 1);
    expect(reset % 3600).toBe(0); // hourly windows
    expect(third.headers.get("x-ratelimit-remaining")).toBe("0");
    // Limits are per project: another project is unaffected.
    const b = await app();
    expect((await k.api("POST", "/auth/signup", { token: b.anon, body: { email: email(), password: "long enough" } })).status).toBe(201);
  });

  test("signin and refresh are limited too but send none of the X-RateLimit headers", async () => {
    const a = await app();
    const u = await signup(a.anon);
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { rate_limits: { signin: 1, refresh: 1 } } });
    const ok = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } });
    expect(ok.status).toBe(200);
    expect(ok.headers.get("x-ratelimit-limit")).toBeNull();
    const over = await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } });
    expect(over.status).toBe(429);
    expect(over.headers.get("x-ratelimit-limit")).toBeNull();
    expect(over.headers.get("x-ratelimit-reset")).toBeNull();
    expect((await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: u.refresh_token } })).status).toBe(200);
    const r2 = await k.api("POST", "/auth/refresh", { token: a.anon, body: { refresh_token: ok.body.refresh_token } });
    expect(r2.status).toBe(429);
    expect(r2.headers.get("x-ratelimit-remaining")).toBeNull();
  });

  test("forgot-password and reset-password report their budgets", async () => {
    const a = await app();
    await k.api("PATCH", `/auth/config?project_id=${a.id}`, { body: { rate_limits: { forgot_password: 1, reset_password: 1 } } });
    const f = await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: email() } });
    expect(f.headers.get("x-ratelimit-limit")).toBe("1");
    expect((await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: email() } })).status).toBe(429);
    const r = await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: "nope", password: "long enough" } });
    expect(r.status).toBe(400);
    expect(r.headers.get("x-ratelimit-remaining")).toBe("0");
    expect((await k.api("POST", "/auth/reset-password", { token: a.anon, body: { token: "nope", password: "long enough" } })).headers.get("x-ratelimit-reset")).toMatch(/^\d+$/);
  });
});

describe("users administration", () => {
  test("list, create, get and delete users with a platform or project token; deleting ends the user's sessions", async () => {
    const a = await app();
    const u = await signup(a.anon);
    const made = await k.api("POST", `/projects/${a.id}/users`, { body: { email: email("admin-made"), password: "long enough", data: { x: 1 } } });
    expect(made.status).toBe(201);
    expect(made.body).toMatchObject({ email_confirmed: true, raw_user_meta_data: { x: 1 }, last_sign_in_at: null });
    const list = await k.api("GET", `/projects/${a.id}/users`);
    expect(list.body).toMatchObject({ total: 2, page: 1 });
    expect(list.body.data.map((x: any) => x.id)).toEqual([made.body.id, u.user.id]);
    const ro = await createToken(k, a.id, { scope: "read_only" });
    expect((await k.api("GET", `/projects/${a.id}/users/${u.user.id}`, { token: ro.token })).body.last_sign_in_at).toEqual(expect.any(String));
    expect((await k.api("DELETE", `/projects/${a.id}/users/${u.user.id}`, { token: ro.token })).status).toBe(403);
    expect((await k.api("DELETE", `/projects/${a.id}/users/${u.user.id}`)).status).toBe(204);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    expect((await k.api("GET", `/projects/${a.id}/users/${u.user.id}`)).status).toBe(404);
    expect((await k.api("POST", `/projects/${a.id}/users`, { body: { email: made.body.email } })).status).toBe(409);
  });

  test("deleting the project removes its users: its keys and tokens stop working", async () => {
    const a = await app();
    const u = await signup(a.anon);
    await k.api("DELETE", `/projects/${a.id}`);
    await eventually(() => k.api("GET", `/projects/${a.id}`), (r) => r.status === 404);
    expect((await k.api("GET", "/auth/user", { token: u.access_token })).status).toBe(401);
    expect((await k.api("POST", "/auth/signin", { token: a.anon, body: { email: u.email, password: u.password } })).status).toBe(401);
    expect((await k.api("GET", `/auth/jwks.json?project_id=${a.id}`, { token: null })).status).toBe(404);
  });
});

describe("mail catcher", () => {
  test("lists messages newest first, filters by recipient, shows a page, and can be cleared", async () => {
    const a = await app();
    const one = await signup(a.anon);
    await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: one.email } });
    await k.api("POST", "/auth/forgot-password", { token: a.anon, body: { email: one.email } });
    const msgs = await eventually(
      () => k.api("GET", `/_emulators/mail/messages?to=${one.email.toUpperCase()}`),
      (r) => r.body.data.length === 2,
    );
    const [newest, older] = msgs.body.data;
    expect(Date.parse(newest.received_at)).toBeGreaterThanOrEqual(Date.parse(older.received_at));
    expect(newest).toMatchObject({ to: [one.email.toLowerCase()], subject: "Reset your password", from: expect.stringContaining("@") });
    expect((await k.api("GET", `/_emulators/mail/messages/${newest.id}`)).body.id).toBe(newest.id);
    const page = await fetch(`${k.url}/_emulators/mail`, { headers: { Authorization: `Bearer ${k.token}` } });
    expect(await page.text()).toContain("Reset your password");
    expect((await k.api("DELETE", "/_emulators/mail/messages")).status).toBe(204);
    expect((await k.api("GET", "/_emulators/mail/messages")).body.data).toEqual([]);
  });
});
