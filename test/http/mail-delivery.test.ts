// Where Kiln's email goes: the built-in catcher by default, a real SMTP server with KILN_SMTP_URL.
// The "real server" here is the catcher run alone (`kiln emulators mail`), as self-hosters would
// run any SMTP server.
import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { BUN, KILN, ROOT, createProject, eventually, removeDir, startKiln, type TestKiln } from "../support/kiln";
import { freePort } from "../support/free-port";


describe("KILN_SMTP_URL", () => {
  let k: TestKiln;
  let catcher: ReturnType<typeof spawn>;
  let catcherUrl: string;
  beforeAll(async () => {
    const [smtpPort, httpPort] = [await freePort(), await freePort()];
    catcher = spawn(BUN, [KILN, "emulators", "mail", "--smtp-port", String(smtpPort), "--port", String(httpPort)], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
    await new Promise<void>((ok) => catcher.stdout!.on("data", (d) => String(d).includes("Mail catcher") && ok()));
    catcherUrl = `http://127.0.0.1:${httpPort}`;
    k = await startKiln({ env: { KILN_SMTP_URL: `smtp://127.0.0.1:${smtpPort}`, KILN_MAIL_FROM: "Accounts <accounts@myapp.test>" } });
  });
  afterAll(async () => {
    await k.stop();
    removeDir(k.dataDir);
    catcher.kill("SIGTERM");
  });

  test("mail goes to the configured server, from the configured sender; the built-in catcher is off", async () => {
    const p = await createProject(k);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    await k.api("POST", `/projects/${p.id}/users`, { body: { email: "lin@example.com", password: "long enough" } });
    expect((await k.api("POST", "/auth/forgot-password", { token: anon, body: { email: "lin@example.com" } })).status).toBe(200);
    const got = await eventually(
      async () => (await fetch(`${catcherUrl}/_emulators/mail/messages?to=lin@example.com`)).json(),
      (b: any) => b.data.length === 1,
    );
    expect(got.data[0]).toMatchObject({ from: "accounts@myapp.test", subject: "Reset your password" });
    expect(got.data[0].links[0]).toContain(`${k.url}/auth/reset-password?token=`);
    const off = await k.api("GET", "/_emulators/mail/messages", { token: null });
    expect(off.status).toBe(404);
    expect(off.body.error).toMatch(/KILN_SMTP_URL/);
  });

  test("--public-url changes the address links point at", async () => {
    const other = await startKiln({ args: ["--public-url", "https://kiln.example.test/"] });
    try {
      const p = await createProject(other);
      const anon = (await other.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
      await other.api("POST", `/projects/${p.id}/users`, { body: { email: "mo@example.com", password: "long enough" } });
      await other.api("POST", "/auth/forgot-password", { token: anon, body: { email: "mo@example.com" } });
      const mail = await eventually(() => other.api("GET", "/_emulators/mail/messages?to=mo@example.com", { token: null }), (r) => r.body.data.length === 1);
      expect(mail.body.data[0].links[0]).toMatch(/^https:\/\/kiln\.example\.test\/auth\/reset-password\?token=/);
    } finally {
      await other.stop();
      removeDir(other.dataDir);
    }
  });
});
