// The emulated providers' login page in a real browser: headless Chromium (Debian's, driven by
// playwright-core) signs in through a tiny relying party of the test's own (oauth4webapi), which
// runs the authorization-code flow with PKCE and verifies the id_token against the issuer's JWKS
// (jose). A person picks an identity, types one, or denies consent.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { useBrowser } from "../support/browser";
import { useKiln } from "../support/kiln";
import { relyingParty } from "../support/oauth-relying-party";

const k = useKiln({ env: { KILN_OAUTH_EMULATORS: "on" } });
const browser = useBrowser();
const uniq = () => randomBytes(4).toString("hex");

/**
 * The relying party: `/login/<provider>` starts a sign-in, `/cb/<provider>` finishes it and shows
 * what it learned as JSON in `#result` (the verified id_token's claims, or GitHub's user and emails,
 * or the error the provider sent back).
 */
let rpUrl = "";
let rpServer: http.Server;
const client = { client_id: `browser-${uniq()}`, client_secret: `secret-${uniq()}` };
const pending = new Map<string, { code_verifier: string; state: string; nonce: string }>();

beforeAll(async () => {
  rpServer = http.createServer((req, res) => {
    handle(req).then(
      (html) => {
        if (html.startsWith("http")) {
          res.writeHead(302, { location: html }).end();
          return;
        }
        res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(html);
      },
      (err) => res.writeHead(500, { "content-type": "text/html" }).end(`<pre id="result">${JSON.stringify({ failure: String(err?.error ?? err?.message ?? err) })}</pre>`),
    );
  });
  await new Promise<void>((ok) => rpServer.listen(0, "127.0.0.1", ok));
  rpUrl = `http://127.0.0.1:${(rpServer.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((ok) => rpServer.close(() => ok())));

const show = (v: unknown) => `<!doctype html><title>app</title><pre id="result">${JSON.stringify(v).replace(/</g, "\\u003c")}</pre>`;

async function handle(req: http.IncomingMessage): Promise<string> {
  const url = new URL(req.url!, rpUrl);
  const [, step, provider] = url.pathname.split("/");
  const redirect_uri = `${rpUrl}/cb/${provider}`;
  if (provider === "github") {
    const gh = `${k.url}/_emulators/oauth/github`;
    if (step === "login") return `${gh}/login/oauth/authorize?${new URLSearchParams({ client_id: client.client_id, redirect_uri, scope: "read:user user:email", state: "gh-state" })}`;
    if (url.searchParams.get("error")) return show({ error: url.searchParams.get("error"), state: url.searchParams.get("state") });
    const tok = await (
      await fetch(`${gh}/login/oauth/access_token`, {
        method: "POST",
        headers: { accept: "application/json", "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ ...client, code: url.searchParams.get("code")!, redirect_uri }),
      })
    ).json();
    const auth = { authorization: `Bearer ${tok.access_token}` };
    return show({ user: await (await fetch(`${gh}/user`, { headers: auth })).json(), emails: await (await fetch(`${gh}/user/emails`, { headers: auth })).json() });
  }
  const rp = await relyingParty(`${k.url}/_emulators/oauth/${provider}`, { ...client, redirect_uri });
  if (step === "login") {
    const started = await rp.start(provider === "apple" ? "openid email name" : "openid email profile");
    pending.set(started.state, started);
    return started.url;
  }
  const state = url.searchParams.get("state") ?? "";
  if (url.searchParams.get("error")) return show({ error: url.searchParams.get("error"), state_known: pending.has(state) });
  const started = pending.get(state);
  if (!started) return show({ failure: "unknown state" });
  pending.delete(state);
  const { claims } = await rp.finish(url, started);
  return show({ claims });
}

async function result(page: import("playwright-core").Page) {
  await page.waitForURL((u) => u.href.startsWith(rpUrl + "/cb/"), { timeout: 30_000 });
  return JSON.parse((await page.locator("#result").textContent())!);
}

describe("the login page in Chromium", () => {
  test("pick an identity: Google signs in, the relying party verifies the id_token", async () => {
    const email = `picked-${uniq()}@example.com`;
    const made = await fetch(`${k.url}/_emulators/oauth/identities`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ email, name: "Picked Person", picture: "https://img.example/p.png" }),
    });
    expect(made.status).toBe(201);
    const page = await (await browser.get()).page();
    await page.goto(`${rpUrl}/login/google`);
    await expect(page.title()).resolves.toContain("Sign in with Google");
    await page.click(`button[data-email="${email}"]`);
    const { claims } = await result(page);
    expect(claims).toMatchObject({ iss: `${k.url}/_emulators/oauth/google`, aud: client.client_id, email, email_verified: true, name: "Picked Person", picture: "https://img.example/p.png" });
    await page.close();
  });

  test("type an identity with an unverified email: Microsoft says email_verified false", async () => {
    const email = `typed-${uniq()}@example.com`;
    const page = await (await browser.get()).page();
    await page.goto(`${rpUrl}/login/microsoft`);
    await page.fill('#new-identity input[name="email"]', email);
    await page.fill('#new-identity input[name="name"]', "Typed Person");
    await page.uncheck('#new-identity input[name="email_verified"]');
    await page.click("#sign-in");
    const { claims } = await result(page);
    expect(claims).toMatchObject({ iss: `${k.url}/_emulators/oauth/microsoft`, email, email_verified: false, name: "Typed Person", preferred_username: email });
    // The typed identity is now one of the identities the page offers.
    const list = await (await fetch(`${k.url}/_emulators/oauth/identities`)).json();
    expect(list.identities.map((i: { email: string }) => i.email)).toContain(email);
    await page.close();
  });

  test("deny consent: the relying party gets error=access_denied with its own state", async () => {
    const page = await (await browser.get()).page();
    await page.goto(`${rpUrl}/login/apple`);
    await page.click("#deny");
    expect(await result(page)).toEqual({ error: "access_denied", state_known: true });
    await page.close();
  });

  test("GitHub's page: pick an identity, the app reads /user and /user/emails; deny too", async () => {
    const email = `gh-${uniq()}@example.com`;
    await fetch(`${k.url}/_emulators/oauth/identities`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ email, name: "Mona" }) });
    const page = await (await browser.get()).page();
    await page.goto(`${rpUrl}/login/github`);
    await expect(page.title()).resolves.toContain("Sign in with GitHub");
    await page.click(`button[data-email="${email}"]`);
    const got = await result(page);
    expect(got.user).toMatchObject({ email, name: "Mona" });
    expect(got.emails[0]).toEqual({ email, primary: true, verified: true, visibility: "public" });
    await page.goto(`${rpUrl}/login/github`);
    await page.click("#deny");
    expect(await result(page)).toEqual({ error: "access_denied", state: "gh-state" });
    await page.close();
  });
});
