import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MailCatcher, extractLinks } from "../../emulators/mail/catcher";
import { createSmtpMailer, type Mailer } from "../../emulators/mail/mailer";

// Real SMTP on loopback: nodemailer → smtp-server → mailparser, no mocks.
const catcher = new MailCatcher();
let mailer: Mailer;

beforeAll(async () => {
  const { host, port } = await catcher.start({ port: 0 });
  expect(port).toBeGreaterThan(0);
  // Credentials in the URL: the catcher accepts any, as a self-hoster's config might carry them.
  mailer = createSmtpMailer({ url: `smtp://dev:secret@${host}:${port}`, from: "Kiln <kiln@localhost>" });
  await mailer.send({ to: "ada@example.com", subject: "First", text: "plain only, see https://a.test/one." });
  await mailer.send({
    to: "Bob@Example.com",
    subject: "Confirm your email",
    text: "Confirm at https://kiln.test/confirm?token=abc&x=1",
    html: `<p>Hi <a href="https://kiln.test/confirm?token=abc&amp;x=1">confirm</a> or <a href='https://kiln.test/help'>help</a> <a href="mailto:x@y.z">mail</a></p>`,
  });
  await mailer.send({ to: "carol@example.com, DAVE@example.com", subject: "Third", text: "two recipients" });
});

afterAll(async () => {
  await mailer?.close();
  await catcher.stop();
});

describe("mail catcher", () => {
  test("lists newest first with parsed fields", () => {
    const all = catcher.list();
    expect(all.map((m) => m.subject)).toEqual(["Third", "Confirm your email", "First"]);
    const [third, confirm, first] = all;
    expect(third!.to).toEqual(["carol@example.com", "dave@example.com"]);
    expect(first!.from).toBe("kiln@localhost");
    expect(first!.to).toEqual(["ada@example.com"]);
    expect(first!.html).toBeNull();
    expect(first!.text.trim()).toBe("plain only, see https://a.test/one.");
    expect(first!.headers["subject"]).toBe("First");
    expect(first!.headers["from"]).toContain("kiln@localhost");
    expect(Date.parse(first!.received_at)).not.toBeNaN();
    expect(first!.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(confirm!.html).toContain("<a href=");
    expect(catcher.list({ limit: 2 }).map((m) => m.subject)).toEqual(["Third", "Confirm your email"]);
  });

  test("filters by recipient case-insensitively", () => {
    expect(catcher.list({ to: "BOB@example.COM" }).map((m) => m.subject)).toEqual(["Confirm your email"]);
    expect(catcher.list({ to: "dave@EXAMPLE.com" }).map((m) => m.subject)).toEqual(["Third"]);
    expect(catcher.list({ to: "carol@example.com" }).map((m) => m.subject)).toEqual(["Third"]);
    expect(catcher.list({ to: "nobody@example.com" })).toEqual([]);
  });

  test("extracts http(s) links from text and hrefs, de-duplicated, in order", () => {
    const [confirm] = catcher.list({ to: "bob@example.com" });
    // The text URL and the entity-encoded href are the same link; mailto: is not http(s).
    expect(confirm!.links).toEqual(["https://kiln.test/confirm?token=abc&x=1", "https://kiln.test/help"]);
    const [first] = catcher.list({ to: "ada@example.com" });
    expect(first!.links).toEqual(["https://a.test/one"]);
    expect(
      extractLinks("(see https://x.test/wiki/A_(b)) and <https://y.test/p>, http://z.test/q?a=1.", null),
    ).toEqual(["https://x.test/wiki/A_(b)", "https://y.test/p", "http://z.test/q?a=1"]);
  });

  test("get returns a message by id, undefined for an unknown id", () => {
    const [newest] = catcher.list();
    expect(catcher.get(newest!.id)).toEqual(newest);
    expect(catcher.get("no-such-id")).toBeUndefined();
  });

  test("waitFor resolves with an existing message and with one sent after the call", async () => {
    const existing = await catcher.waitFor({ to: "ADA@example.com", subjectIncludes: "Fir" }, 100);
    expect(existing.subject).toBe("First");

    const pending = catcher.waitFor({ to: "late@example.com", subjectIncludes: "reset" }, 5000);
    await mailer.send({ to: "late@example.com", subject: "Wrong one", text: "x" });
    await mailer.send({ to: "late@example.com", subject: "Password reset", text: "https://kiln.test/reset" });
    const late = await pending;
    expect(late.subject).toBe("Password reset");
    expect(late.links).toEqual(["https://kiln.test/reset"]);

    await expect(catcher.waitFor({ to: "never@example.com" }, 50)).rejects.toThrow(/never@example.com/);
  });

  test("onMessage is called for each stored message until unsubscribed", async () => {
    const seen: string[] = [];
    const off = catcher.onMessage((m) => seen.push(m.subject));
    await mailer.send({ to: "ada@example.com", subject: "Heard", text: "x" });
    off();
    await mailer.send({ to: "ada@example.com", subject: "Not heard", text: "x" });
    expect(seen).toEqual(["Heard"]);
  });

  test("renderHtml escapes user-controlled fields and links the URLs", async () => {
    await mailer.send({
      to: "eve@example.com",
      subject: `<script>alert("x")</script> & more`,
      text: "body <img src=x onerror=alert(1)> https://kiln.test/a?b=1&c=2",
    });
    const page = catcher.renderHtml({ basePath: `/_mail"><script>` });
    expect(page).not.toContain("<script>");
    expect(page).toContain("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more");
    expect(page).toContain("body &lt;img src=x onerror=alert(1)&gt;");
    expect(page).toContain(`<a href="https://kiln.test/a?b=1&amp;c=2"`);
    expect(page).toContain(`href="/_mail&quot;&gt;&lt;script&gt;"`);
    // Newest first on the page too.
    expect(page.indexOf("&lt;script&gt;alert")).toBeLessThan(page.indexOf(">Third<"));
  });

  test("clear empties the store", async () => {
    const other = new MailCatcher();
    const { host, port } = await other.start({});
    const m = createSmtpMailer({ url: `smtp://${host}:${port}`, from: "kiln@localhost" });
    try {
      await m.send({ to: "a@example.com", subject: "x", text: "x" });
      expect(other.list()).toHaveLength(1);
      other.clear();
      expect(other.list()).toEqual([]);
      expect(other.renderHtml({ basePath: "/_mail" })).toContain("No emails caught yet.");
    } finally {
      await m.close();
      await other.stop();
    }
  });

  test("maxMessages drops the oldest", async () => {
    const small = new MailCatcher({ maxMessages: 2 });
    const { host, port } = await small.start({ port: 0 });
    const m = createSmtpMailer({ url: `smtp://localhost:${port}`, from: "kiln@localhost" });
    expect(host).toBe("127.0.0.1");
    try {
      for (const subject of ["one", "two", "three"]) await m.send({ to: "a@example.com", subject, text: subject });
      expect(small.list().map((x) => x.subject)).toEqual(["three", "two"]);
    } finally {
      await m.close();
      await small.stop();
    }
  });
});
