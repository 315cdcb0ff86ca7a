// Who reads the built-in mail catcher (every project's reset and confirmation links): anyone in the
// embedded profile (`--mail-catcher open`), only the platform token of the instance's own account in
// the production profile (`--mail-catcher token`), nobody with `--mail-catcher off` (which needs
// KILN_SMTP_URL). The shared Kiln runs the vitest project's profile with its default; the other mode
// is started explicitly, so each mode runs on both control stores. `kiln mail` sends the token.
import { describe, expect, test } from "vitest";
import { createProject, createToken, eventually, startKiln, STORE, useCli, useKiln, withKiln, type TestKiln } from "../support/kiln";

const k = useKiln();
const defaultMode = STORE === "postgres" ? "token" : "open";
const otherMode = STORE === "postgres" ? "open" : "token";

let n = 0;
/** A project with an end user who asked for a password reset: the catcher holds one message to them. */
async function resetMailed(kiln: TestKiln) {
  const p = await createProject(kiln);
  const to = `reader-${Date.now()}-${++n}@example.com`;
  expect((await kiln.api("POST", `/projects/${p.id}/users`, { body: { email: to, password: "long enough" } })).status).toBe(201);
  const anon = (await kiln.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
  expect((await kiln.api("POST", "/auth/forgot-password", { token: anon, body: { email: to } })).status).toBe(200);
  return { project: p, to, anon };
}

const page = (kiln: TestKiln, token?: string) => fetch(`${kiln.url}/_emulators/mail`, { headers: token ? { Authorization: `Bearer ${token}` } : {} });

/** No credential reads and clears it. */
async function expectOpen(kiln: TestKiln) {
  const { to } = await resetMailed(kiln);
  const list = await eventually(() => kiln.api("GET", `/_emulators/mail/messages?to=${to}`, { token: null }), (r) => r.status !== 200 || r.body.data.length === 1);
  expect(list.status).toBe(200);
  expect(list.body.data[0]).toMatchObject({ subject: "Reset your password", links: [expect.stringContaining("/auth/reset-password?token=")] });
  expect((await kiln.api("GET", `/_emulators/mail/messages/${list.body.data[0].id}`, { token: null })).status).toBe(200);
  const html = await page(kiln);
  expect(html.status).toBe(200);
  expect(await html.text()).toContain("Reset your password");
  expect((await kiln.api("DELETE", "/_emulators/mail/messages", { token: null })).status).toBe(204);
}

/** Only the platform token of the instance's own account reads or clears it; everything else is 401 or 403. */
async function expectGuarded(kiln: TestKiln) {
  const { project, to, anon } = await resetMailed(kiln);
  const paths = ["/_emulators/mail", "/_emulators/mail/messages", `/_emulators/mail/messages?to=${to}`, "/_emulators/mail/messages/some-id"];
  for (const path of paths) {
    const none = await kiln.api("GET", path, { token: null });
    expect([path, none.status, none.body]).toEqual([path, 401, { error: "authentication required: send Authorization: Bearer <token>" }]);
    const wrong = await kiln.api("GET", path, { token: "pk-notatokenofthiskilnatall" });
    expect([path, wrong.status, wrong.body]).toEqual([path, 401, { error: "invalid token" }]);
  }
  expect((await kiln.api("DELETE", "/_emulators/mail/messages", { token: null })).status).toBe(401);
  expect((await page(kiln)).status).toBe(401);

  // Credentials of this Kiln that are not the operator's: a project's tokens and keys, an end user,
  // and another account's platform token (accounts made through /admin/accounts are other tenants).
  const projectToken = (await createToken(kiln, project.id)).token;
  const serviceKey = (await kiln.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
  const user = (await kiln.api("POST", "/auth/signin", { token: anon, body: { email: to, password: "long enough" } })).body.access_token as string;
  const tenant = await kiln.api("POST", "/admin/accounts", { token: kiln.adminToken, body: { plan: "hobby" } });
  expect(tenant.status).toBe(201);
  for (const token of [projectToken, serviceKey, anon, user, tenant.body.platform_token]) {
    const r = await kiln.api("GET", "/_emulators/mail/messages", { token });
    expect(r.status).toBe(403);
    expect(r.body).toEqual({ error: expect.any(String) });
    expect(JSON.stringify(r.body)).not.toContain("reset-password");
    expect((await kiln.api("DELETE", "/_emulators/mail/messages", { token })).status).toBe(403);
  }
  expect((await kiln.api("GET", "/_emulators/mail/messages", { token: tenant.body.platform_token })).body.error).toMatch(/only a platform token of this Kiln's own account/);

  // The operator's platform token reads the page, the list and a message, and clears them.
  const list = await eventually(() => kiln.api("GET", `/_emulators/mail/messages?to=${to}`), (r) => r.status !== 200 || r.body.data.length === 1);
  expect(list.status).toBe(200);
  expect(list.body.data[0]).toMatchObject({ subject: "Reset your password", links: [expect.stringContaining("/auth/reset-password?token=")] });
  expect((await kiln.api("GET", `/_emulators/mail/messages/${list.body.data[0].id}`)).body.id).toBe(list.body.data[0].id);
  const html = await page(kiln, kiln.token);
  expect(html.status).toBe(200);
  expect(await html.text()).toContain("Reset your password");
  expect((await kiln.api("DELETE", "/_emulators/mail/messages")).status).toBe(204);
  expect((await kiln.api("GET", "/_emulators/mail/messages")).body.data).toEqual([]);
}

const check = { open: expectOpen, token: expectGuarded };

describe("--mail-catcher", () => {
  test(`the ${STORE} profile's default is ${defaultMode}`, async () => {
    await check[defaultMode](k);
  });

  test(`--mail-catcher ${otherMode} on the ${STORE} profile`, async () => {
    await withKiln({ args: ["--mail-catcher", otherMode] }, (kiln) => check[otherMode](kiln));
  });

  test("KILN_MAIL_CATCHER=token does the same as the flag", async () => {
    await withKiln({ env: { KILN_MAIL_CATCHER: "token" } }, async (kiln) => {
      expect((await kiln.api("GET", "/_emulators/mail/messages", { token: null })).status).toBe(401);
      expect((await kiln.api("GET", "/_emulators/mail/messages")).status).toBe(200);
    });
  });

  test("off: no catcher (404), and Kiln refuses to start without KILN_SMTP_URL; an unknown mode is refused", async () => {
    await expect(startKiln({ args: ["--mail-catcher", "off"] })).rejects.toThrow(/--mail-catcher off needs KILN_SMTP_URL/);
    await expect(startKiln({ args: ["--mail-catcher", "public"] })).rejects.toThrow(/--mail-catcher must be open, token or off, got "public"/);
    // Nothing is mailed here, so the SMTP server need not exist.
    await withKiln({ args: ["--mail-catcher", "off"], env: { KILN_SMTP_URL: "smtp://127.0.0.1:9" } }, async (kiln) => {
      const r = await kiln.api("GET", "/_emulators/mail/messages");
      expect(r.status).toBe(404);
      expect(r.body.error).toMatch(/mail catcher is off/);
    });
  });
});

describe("kiln mail", () => {
  const cli = useCli(k, { passToken: true });

  test(`lists the reset link with the platform token (${defaultMode}); a token that is not the operator's is refused when guarded`, async () => {
    const { to } = await resetMailed(k);
    const out = await eventually(async () => cli.run("mail", "--to", to), (r) => r.out.includes("Reset your password"));
    expect(out.code).toBe(0);
    expect(out.out).toMatch(new RegExp(`to ${to.replace(/\./g, "\\.")}\\s+Reset your password`));
    expect(out.out).toMatch(/\/auth\/reset-password\?token=/);
    const wrong = cli.run("--token", "pk-notatokenofthiskilnatall", "mail", "--to", to);
    if (defaultMode === "token") {
      expect(wrong.code).toBe(1);
      expect(wrong.err).toMatch(/^kiln: 401 invalid token/);
    } else expect(wrong.out).toContain("Reset your password");
  });
});
