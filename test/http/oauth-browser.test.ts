// End-user OAuth through Kiln in a real browser (headless Chromium driven by playwright-core): an
// app of the test's own sends the person to Kiln's authorize, the emulated provider's login page,
// Kiln's callback, and back to the app, whose server exchanges the code; a second sign-in; linking
// and unlinking; the managed device page; a denied consent.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { useBrowser, type Page } from "../support/browser";
import { createProject, useKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });
const browser = useBrowser();
const uniq = () => randomBytes(4).toString("hex");

let appUrl = "";
let appServer: http.Server;
let project: { id: string; anon: string };
/** The app's one signed-in user (its server keeps the session, as a real app's backend would). */
let session: { access_token: string; user: { id: string; email: string } } | null = null;

const show = (v: unknown) => `<!doctype html><title>app</title><pre id="result">${JSON.stringify(v).replace(/</g, "\\u003c")}</pre>`;

/** The app: /login/<provider>, /callback (exchanges the code), /link/<provider>, /linked, /unlink/<provider>. */
async function handle(req: http.IncomingMessage): Promise<{ location?: string; html?: string }> {
  const url = new URL(req.url!, appUrl);
  const [, step, provider] = url.pathname.split("/");
  const kiln = (method: string, path: string, bearer: string, body?: unknown) =>
    fetch(`${k.url}${path}`, { method, headers: { authorization: `Bearer ${bearer}`, ...(body ? { "content-type": "application/json" } : {}) }, body: body ? JSON.stringify(body) : undefined });
  if (step === "login")
    return { location: `${k.url}/auth/oauth/${provider}/authorize?${new URLSearchParams({ anon_key: project.anon, redirect_url: `${appUrl}/callback`, client_state: "app-state" })}` };
  if (step === "callback") {
    if (url.searchParams.get("error")) return { html: show({ error: url.searchParams.get("error"), client_state: url.searchParams.get("client_state") }) };
    const r = await kiln("POST", "/auth/oauth/exchange", project.anon, { code: url.searchParams.get("code"), redirect_url: `${appUrl}/callback` });
    const body = await r.json();
    if (r.ok) session = body;
    return { html: show({ status: r.status, client_state: url.searchParams.get("client_state"), user: body.user, error: body.error }) };
  }
  if (step === "link") {
    const r = await kiln("POST", `/auth/oauth/${provider}/link?redirect_url=${encodeURIComponent(`${appUrl}/linked`)}`, session!.access_token);
    return { location: (await r.json()).authorization_url };
  }
  if (step === "linked" || step === "unlink") {
    if (step === "unlink") await kiln("DELETE", `/auth/oauth/${provider}/unlink`, session!.access_token);
    const list = await (await kiln("GET", "/auth/oauth/providers", session!.access_token)).json();
    return { html: show({ linked: url.searchParams.get("linked"), providers: list.providers.map((p: { provider: string }) => p.provider) }) };
  }
  return { html: show({ error: "no such page" }) };
}

beforeAll(async () => {
  appServer = http.createServer((req, res) => {
    handle(req).then(
      (out) => (out.location ? res.writeHead(302, { location: out.location }).end() : res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(out.html)),
      (err) => res.writeHead(500, { "content-type": "text/html" }).end(show({ failure: String(err) })),
    );
  });
  await new Promise<void>((ok) => appServer.listen(0, "127.0.0.1", ok));
  appUrl = `http://127.0.0.1:${(appServer.address() as AddressInfo).port}`;
  const p = await createProject(k);
  project = { id: p.id, anon: (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key };
  for (const provider of ["google", "github"]) {
    const r = await k.api("POST", `/projects/${p.id}/oauth/configs`, {
      body: { provider, client_id: `app-${provider}`, client_secret: `secret-${uniq()}-${provider}`, redirect_url: `${k.url}/auth/oauth/${provider}/callback` },
    });
    expect(r.status).toBe(201);
  }
  expect((await k.api("POST", `/projects/${p.id}/oauth/configs`, { body: { provider: "device", client_id: "tv" } })).status).toBe(201);
  expect((await k.api("PATCH", `/auth/config?project_id=${p.id}`, { body: { allowed_redirect_urls: [`${appUrl}/callback`, `${appUrl}/linked`] } })).status).toBe(200);
});
afterAll(() => new Promise<void>((ok) => appServer.close(() => ok())));

async function result(page: Page, path: string) {
  await page.waitForURL((u) => u.href.startsWith(`${appUrl}${path}`), { timeout: 30_000 });
  return JSON.parse((await page.locator("#result").textContent())!);
}

async function identity(email: string, name: string) {
  const r = await fetch(`${k.url}/_emulators/oauth/identities`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ email, name }) });
  expect(r.status).toBeLessThan(300);
}

describe("OAuth sign-in through Kiln in Chromium", () => {
  const email = `ada-${uniq()}@example.com`;

  test("sign in with Google: the provider's page, Kiln's callback, the app's code exchange (201); a second sign-in is the same user (200)", async () => {
    await identity(email, "Ada Lovelace");
    const page = await (await browser.get()).page();
    await page.goto(`${appUrl}/login/google`);
    await expect(page.title()).resolves.toContain("Sign in with Google");
    await page.click(`button[data-email="${email}"]`);
    const first = await result(page, "/callback");
    expect(first).toMatchObject({ status: 201, client_state: "app-state", user: { email, raw_user_meta_data: { name: "Ada Lovelace", provider: "google", email_verified: true } } });
    // The code came in the URL, the tokens never did.
    expect(page.url()).not.toContain("access_token");

    await page.goto(`${appUrl}/login/google`);
    await page.click(`button[data-email="${email}"]`);
    const second = await result(page, "/callback");
    expect(second.status).toBe(200);
    expect(second.user.id).toBe(first.user.id);
    await page.close();
  });

  test("link GitHub to the signed-in user, then unlink it", async () => {
    const gh = `ada-gh-${uniq()}@example.com`;
    await identity(gh, "Ada on GitHub");
    const page = await (await browser.get()).page();
    await page.goto(`${appUrl}/link/github`);
    await expect(page.title()).resolves.toContain("Sign in with GitHub");
    await page.click(`button[data-email="${gh}"]`);
    expect(await result(page, "/linked")).toEqual({ linked: "github", providers: ["google", "github"] });
    await page.goto(`${appUrl}/unlink/github`);
    expect(await result(page, "/unlink")).toEqual({ linked: null, providers: ["google"] });
    await page.close();
  });

  test("denied consent: the app hears error=access_denied with its client_state, and nobody is signed in", async () => {
    const users = async () => (await k.api("GET", `/projects/${project.id}/users`)).body.total;
    const before = await users();
    const page = await (await browser.get()).page();
    await page.goto(`${appUrl}/login/google`);
    await page.click("#deny");
    expect(await result(page, "/callback")).toEqual({ error: "access_denied", client_state: "app-state" });
    expect(await users()).toBe(before);
    await page.close();
  });

  test("the managed sign-in page without a redirect_url: sign in with GitHub there, and it says who signed in", async () => {
    const gh = `hosted-${uniq()}@example.com`;
    await identity(gh, "Hosted Person");
    const page = await (await browser.get()).page();
    await page.goto(`${k.url}/auth/oauth/hosted?anon_key=${project.anon}`);
    await page.click("#signin-github");
    await page.click(`button[data-email="${gh}"]`);
    await page.waitForURL((u) => u.pathname === "/auth/oauth/hosted");
    await page.locator("#who").waitFor({ timeout: 30_000 });
    await expect(page.locator("#who").textContent()).resolves.toBe(gh);
    await expect(page.locator("#msg").textContent()).resolves.toContain("(a new account)");
    expect(page.url()).not.toContain("code=");
    await page.close();
  });

  test("device flow: the managed device page, signing in with Google there, approving; the device's poll gets the session", async () => {
    const poll = (device_code: string) =>
      k.api("POST", "/auth/device/token", { token: project.anon, body: { grant_type: "urn:ietf:params:oauth:grant-type:device_code", device_code, client_id: "tv" } });
    const d = await k.api("POST", "/auth/device/code", { token: project.anon, body: { client_id: "tv" } });
    expect(d.status).toBe(200);
    expect((await poll(d.body.device_code)).body.error).toBe("authorization_pending");
    const page = await (await browser.get()).page();
    await page.goto(d.body.verification_uri_complete);
    await expect(page.locator("#user-code").textContent()).resolves.toBe(d.body.user_code);
    await page.click("#signin-google");
    await page.click(`button[data-email="${email}"]`);
    await page.waitForURL((u) => u.pathname === "/auth/device");
    await page.locator("#approve").waitFor({ state: "visible", timeout: 30_000 });
    await expect(page.locator("#who").textContent()).resolves.toBe(email);
    await page.click("#approve");
    await page.waitForFunction(() => document.getElementById("msg")?.textContent?.startsWith("Device approved"), undefined, { timeout: 30_000 });
    await page.close();
    // The device polls no sooner than its interval: Kiln's clock moves instead of the test waiting.
    expect((await k.api("POST", "/_kiln/clock/advance", { body: { seconds: 6 } })).status).toBe(200);
    const t = await poll(d.body.device_code);
    expect(t.status).toBe(200);
    expect(t.body.user.email).toBe(email);
  });
});
