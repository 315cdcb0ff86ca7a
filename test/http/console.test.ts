// The web console (/_console/) in headless Chromium against a real Kiln: sign-in (the start line's
// one-time link and the token form), every page loading with no browser console errors, and one
// journey per area done through the page alone. A screenshot of each page goes to
// test-results/console/ (git-ignored) for review.
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { useBrowser, type Page } from "../support/browser";
import { connect } from "../support/database-clients";
import { activeDatabase } from "../support/databases";
import { tgz } from "../support/functions";
import { createProject, eventually, useKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });
const browser = useBrowser();
const SHOTS = join(import.meta.dirname, "..", "..", "test-results", "console");
mkdirSync(SHOTS, { recursive: true });

let page: Page;
/** Errors the page logged or threw; every test ends with none. */
const problems: string[] = [];

beforeAll(async () => {
  page = await (await browser.get()).page();
  page.on("console", (m) => {
    // A failed API call the page shows as an error box is logged by Chromium as a failed resource load;
    // the tests that provoke one clear it. Anything else is a fault of the page.
    if (m.type() === "error") problems.push(m.text());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
}, 90_000);

// Each test answers for its own page's errors only.
beforeEach(() => void problems.splice(0));

afterAll(async () => {
  await page?.close().catch(() => {});
});

/** A fresh load of the page at `hash` (going to the same address again would change nothing). */
async function open(hash: string) {
  await page.goto("about:blank");
  await page.goto(`${k.url}/_console${hash}`);
  await page.waitForFunction(() => !document.querySelector("main")?.textContent?.includes("Loading…"), null, { timeout: 15_000 }).catch(() => {});
}

/** Mail is delivered to the catcher over SMTP after the request: the page's Refresh mail until `link` shows. */
async function mailArrives(link: ReturnType<Page["getByRole"]>) {
  for (let i = 0; i < 50 && (await link.count()) === 0; i++) {
    await new Promise((r) => setTimeout(r, 200));
    await page.getByRole("button", { name: "Refresh mail" }).click();
    await page.getByRole("heading", { name: /^Mail to / }).waitFor();
  }
  await link.first().waitFor();
}

/** Answers yes in the console's confirmation dialog (named after its confirming button) and waits until it closes. */
async function confirmWith(label: string) {
  const dialog = page.getByRole("dialog", { name: label });
  await dialog.getByRole("button", { name: label, exact: true }).click();
  await dialog.waitFor({ state: "detached" });
}

const shot = (name: string) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
const noProblems = () => expect(problems.splice(0)).toEqual([]);
/**
 * A call the test provoked to fail, which the page showed: Chromium logs its response as a failed
 * resource load. Only those lines (of that status) are taken off; anything else stays a problem.
 */
const expectLoadFailures = (status: number | RegExp) => {
  const re = new RegExp(`^Failed to load resource: the server responded with a status of ${typeof status === "number" ? status : status.source} `);
  const failed = problems.filter((p) => re.test(p));
  expect(failed.length, problems.join("\n")).toBeGreaterThan(0);
  for (const f of failed) problems.splice(problems.indexOf(f), 1);
};

test("/_console serves one self-contained page; /_console/ sends people there", async () => {
  const res = await fetch(`${k.url}/_console`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/html");
  const html = await res.text();
  // Nothing fetched from elsewhere: no external script, style or font. (The SVG namespace name the
  // metrics charts are created with is an identifier, never fetched.)
  expect(html).not.toMatch(/<script[^>]+src=|<link[^>]+href="(?!data:)|https?:\/\/(?!127\.0\.0\.1|www\.w3\.org\/2000\/svg")[a-z]/i);
  const slash = await fetch(`${k.url}/_console/`, { redirect: "manual" });
  expect([slash.status, slash.headers.get("location")]).toEqual([308, "/_console"]);
});

describe("sign-in", () => {
  test("the start line's one-time link signs in, leaves the URL and cannot be used twice", async () => {
    const link = /Console: (http:\/\/\S+\/_console#code=[A-Za-z0-9_-]+)/.exec(k.stdout)?.[1];
    expect(link, k.stdout).toBeTruthy();
    await page.goto(link!);
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    expect(page.url()).not.toContain("code=");
    const token = await page.evaluate(() => sessionStorage.getItem("kiln.console.token"));
    expect(token).toMatch(/^pk-/);
    // The token it got is a working platform token of this Kiln's account.
    expect((await k.api("GET", "/projects", { token })).status).toBe(200);
    noProblems();

    await page.evaluate(() => sessionStorage.clear());
    await page.goto(link!);
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toContain("invalid or used sign-in code");
    expectLoadFailures(400); // the refused exchange, shown above
  });

  test("the token form shows the API's refusal, then signs in with the platform token", async () => {
    await page.evaluate(() => sessionStorage.clear());
    await open("");
    await page.getByLabel("Platform token").fill("pk-wrongwrongwrongwrong");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toMatch(/^401: /);
    expectLoadFailures(401);
    await shot("sign-in");
    await page.getByLabel("Platform token").fill(k.token);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    expect(await page.evaluate(() => sessionStorage.getItem("kiln.console.token"))).toBe(k.token);
    noProblems();
  });
});

describe("pages and journeys", () => {
  let projectId = "";
  // Signed in as the sign-in tests leave it, also when they are skipped (-t).
  beforeAll(async () => {
    await page.goto(`${k.url}/_console`);
    await page.evaluate((t) => sessionStorage.setItem("kiln.console.token", t), k.token);
  });

  test("projects: create one, then its keys, access tokens and variables", async () => {
    await open("#/");
    await page.getByLabel("Name").fill("console-demo");
    await page.getByRole("button", { name: "Create project" }).click();
    await page.getByRole("heading", { name: "Service keys" }).waitFor();
    projectId = /#\/p\/([^/?]+)/.exec(page.url())![1]!;
    expect((await k.api("GET", `/projects/${projectId}`)).body.name).toBe("console-demo");

    const forms = page.locator("form");
    await forms.nth(0).getByLabel("Name").fill("laptop");
    await page.getByRole("button", { name: "Create service key" }).click();
    await page.getByText(/Service key laptop \(shown once/).waitFor();
    const shownKey = await page.locator(".notice code").textContent();
    expect(shownKey).toMatch(/^sk-/);
    // The key shown works against the API.
    expect((await k.api("GET", `/projects/${projectId}/storage/buckets`, { token: shownKey! })).status).not.toBe(401);

    await forms.nth(2).getByLabel("Name").fill("ci");
    await forms.nth(2).getByLabel("Scope").selectOption("read_only");
    await page.getByRole("button", { name: "Create access token" }).click();
    await page.getByRole("button", { name: "Revoke ci" }).waitFor();
    await forms.nth(3).getByLabel("Name").fill("GREETING");
    await forms.nth(3).getByLabel("Value").fill("hello");
    await page.getByRole("button", { name: "Set variable" }).click();
    await page.getByRole("button", { name: "Delete GREETING" }).waitFor();
    const vars = (await k.api("GET", `/projects/${projectId}/variables`)).body.data;
    expect(vars.map((v: any) => [v.name, v.value])).toEqual([["GREETING", "hello"]]);
    await shot("project");

    // The list shows it; a second project is deleted from the list.
    const other = await createProject(k, "to-delete");
    await open("#/");
    await page.getByRole("link", { name: "console-demo" }).waitFor();
    await page.getByRole("button", { name: "Delete to-delete" }).click();
    await confirmWith("Delete project to-delete");
    await eventually(() => k.api("GET", `/projects/${other.id}`), (r) => r.status === 404 || r.body.status === "deleting", 15_000);
    await shot("projects");
    noProblems();
  });

  test("project settings: access tokens and variables page through the API's pages", async () => {
    for (let i = 0; i < 50; i++) {
      const r = await k.api("POST", `/projects/${projectId}/variables`, { body: { name: `V${String(i).padStart(2, "0")}`, value: String(i) } });
      expect(r.status, r.text).toBe(201);
    }
    await open(`#/p/${projectId}`);
    const vars = page.getByRole("navigation", { name: "variable pages" });
    await vars.getByText(/page 1 \(51 in all\)/).waitFor();
    // The other list keeps its own page.
    await page.getByRole("navigation", { name: "access token pages" }).getByText(/page 1 \(1 in all\)/).waitFor();
    await vars.getByRole("link", { name: "Next →" }).click();
    await vars.getByText(/page 2 \(51 in all\)/).waitFor();
    expect(page.url()).toContain("vars_page=2");
    expect(await page.getByRole("button", { name: /^Delete (V\d\d|GREETING)$/ }).count()).toBe(1);
    await vars.getByRole("link", { name: "← Previous" }).click();
    await vars.getByText(/page 1 \(51 in all\)/).waitFor();
    noProblems();
  });

  test("functions: deploy an archive, see the build log, invoke with a JSON body, read its logs", async () => {
    await open(`#/p/${projectId}/functions`);
    await page.getByLabel("Name").fill("hello");
    await page.getByLabel("Handler (optional)").fill("handler");
    const code = tgz({ "index.js": readFileSync(join(import.meta.dirname, "..", "..", "docs", "examples", "hello", "index.js"), "utf8") });
    await page.getByLabel("Source archive").setInputFiles({ name: "hello.tgz", mimeType: "application/gzip", buffer: code });
    await page.getByRole("button", { name: "Deploy" }).click();
    await page.locator("h2, [role=alert]").first().waitFor();
    expect(await page.locator("[role=alert]").allTextContents()).toEqual([]);
    await page.getByRole("heading", { name: /^Function hello/ }).waitFor();
    const fn = (await k.api("GET", `/projects/${projectId}/functions`)).body.data[0];
    await eventually(() => k.api("GET", `/projects/${projectId}/functions/${fn.id}`), (r) => r.body.status !== "provisioning" && !r.body.pending_deployment_id, 60_000);
    await page.getByRole("button", { name: "Refresh" }).first().click();
    await page.getByText(/^active · nodejs22\.x/).waitFor();

    await page.getByRole("button", { name: /^Build log/ }).first().click();
    await page.locator("pre").first().waitFor();

    await page.getByLabel("JSON payload").fill('{"name":"ada"}');
    await page.getByRole("button", { name: "Invoke" }).click();
    await page.locator(".invoke-response").waitFor();
    expect(JSON.parse((await page.locator(".invoke-response pre").textContent())!)).toEqual({ hello: "ada" });

    // Not JSON: the page says so and sends nothing.
    await page.getByLabel("JSON payload").fill("{nope");
    await page.getByRole("button", { name: "Invoke" }).click();
    await page.getByText(/the payload is not JSON/).waitFor();

    await eventually(async () => (await k.api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "function" }, q: '"hello ada"' } })).body.data.length, (n) => n > 0, 15_000);
    await page.getByRole("button", { name: "Refresh logs" }).click();
    await page.getByText(/hello ada/).first().waitFor();
    await shot("functions");
    noProblems();
  });

  test("logs: search with the query grammar", async () => {
    await open(`#/p/${projectId}/logs`);
    await page.getByLabel("Query").fill('"hello ada" -level:error');
    await page.getByRole("button", { name: "Search" }).click();
    await page.getByRole("cell", { name: "hello ada" }).first().waitFor();
    // A query the grammar refuses: the API's message, as the API words it.
    await page.getByLabel("Query").fill("level:(");
    await page.getByRole("button", { name: "Search" }).click();
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toMatch(/^400: /);
    expectLoadFailures(400);
    await shot("logs");
    noProblems();
  });

  // A branch is a copy of the database: its provisioning takes most of this test on a loaded machine.
  test("databases: tables and their exposure, the SQL editor with rows in a grid and PostgreSQL's errors, branches", { timeout: 120_000 }, async () => {
    const db = await activeDatabase(k, projectId, "shop");
    const c = connect(db.connection_string);
    try {
      await c`create table items (name text primary key, qty int not null)`;
      await c`insert into items values ('apple', 7), ('pear', 2), ('plum', 9)`;
      await c`grant select on items to anonymous`;
    } finally {
      await c.end({ timeout: 1 });
    }
    await open(`#/p/${projectId}/databases`);
    await page.getByRole("link", { name: "shop" }).click();
    await page.getByRole("heading", { name: "Database shop" }).waitFor();
    await page.getByText(/Exposed to the anon key or end users with no row check: public\.items/).waitFor();

    // The SQL editor: one statement through the SQL API, with parameters; rows in the grid.
    await page.getByLabel(/^SQL/).fill("select name, qty from items where qty >= $1 order by name");
    await page.getByLabel(/^Parameters/).fill('["5"]');
    await page.getByRole("button", { name: "Run SQL" }).click();
    await page.getByText(/^SELECT · 2 rows · \d+ ms$/).waitFor();
    expect(await page.locator(".query-results th").allTextContents()).toEqual(["nametext", "qtyinteger"]);
    expect(await page.locator(".query-results td").allTextContents()).toEqual(["apple", "7", "plum", "9"]);
    await shot("databases-sql");
    // The editor's statement counts in the database's top queries, as a wire client's does.
    await page.getByRole("button", { name: "Refresh top queries" }).click();
    const counted = page.getByRole("row").filter({ has: page.getByRole("cell", { name: "select name, qty from items where qty >= $1 order by name", exact: true }) });
    await counted.waitFor();
    const cells = await counted.locator("td").allTextContents();
    expect([cells[1], cells[5], cells[6]]).toEqual(["1", "2", `service_client_${db.id}`]);

    // PostgreSQL's error: the API's message, its SQLSTATE and a caret under the position.
    await page.getByLabel(/^Parameters/).fill("");
    await page.getByLabel(/^SQL/).fill("select nope\nfrom items");
    await page.getByLabel(/^SQL/).press("Control+Enter");
    await page.getByRole("alert").waitFor();
    const alert = await page.getByRole("alert").textContent();
    expect(alert).toContain('400: column "nope" does not exist');
    expect(alert).toContain("SQLSTATE 42703 at character 8");
    expect(await page.locator(".query-results pre.caret").textContent()).toBe("LINE 1: select nope\n               ^");
    expectLoadFailures(400);
    await page.getByLabel(/^SQL/).fill("create table notes (body text)");
    await page.getByRole("button", { name: "Run SQL" }).click();
    await page.getByText(/^CREATE TABLE · 0 rows/).waitFor();
    expect((await k.api("POST", `/projects/${projectId}/databases/shop/sql`, { body: { query: "select count(*)::int from notes" } })).body.rows).toEqual([[0]]);

    await page.locator("form").filter({ has: page.getByRole("button", { name: "Create branch" }) }).getByLabel("Name").fill("dev");
    await page.getByRole("button", { name: "Create branch" }).click();
    await page.getByRole("button", { name: "Delete branch dev" }).waitFor();
    await eventually(() => k.api("GET", `/projects/${projectId}/databases/shop/branches/dev`), (r) => r.body.status === "active", 60_000);
    await page.getByRole("button", { name: "Refresh branches" }).click();
    await page.getByLabel("Run on").locator("option", { hasText: "dev" }).waitFor({ state: "attached" });
    await page.getByLabel("Run on").selectOption("dev");
    await page.getByLabel(/^SQL/).fill("insert into items values ('fig', 4) returning name");
    await page.getByRole("button", { name: "Run SQL" }).click();
    await page.getByText(/^INSERT · 1 row/).waitFor();
    // The branch changed, the main database did not.
    expect((await k.api("POST", `/projects/${projectId}/databases/shop/branches/dev/sql`, { body: { query: "select count(*)::int from items" } })).body.rows).toEqual([[4]]);
    expect((await k.api("POST", `/projects/${projectId}/databases/shop/sql`, { body: { query: "select count(*)::int from items" } })).body.rows).toEqual([[3]]);
    await shot("databases");
    noProblems();
  });

  test("storage: a bucket, upload, list, download, delete", async () => {
    await open(`#/p/${projectId}/storage`);
    await page.getByLabel("Name").fill("avatars");
    await page.getByRole("button", { name: "Create bucket" }).click();
    await page.getByRole("link", { name: "avatars" }).click();
    await page.getByRole("heading", { name: "Bucket avatars" }).waitFor();
    const content = Buffer.from("hello from the console\n");
    await page.getByLabel("File", { exact: true }).setInputFiles({ name: "note.txt", mimeType: "text/plain", buffer: content });
    await page.getByLabel(/^Object name/).fill("u1/note.txt");
    await page.getByRole("button", { name: "Upload" }).click();
    await page.getByRole("cell", { name: "u1/note.txt", exact: true }).waitFor();

    const download = page.waitForEvent("download");
    await page.getByRole("button", { name: "Download u1/note.txt" }).click();
    const file = await (await download).path();
    expect(readFileSync(file!)).toEqual(content);
    await shot("storage");

    await page.getByRole("button", { name: "Delete u1/note.txt" }).click();
    await confirmWith("Delete object u1/note.txt");
    await page.getByText("No objects here.").waitFor();
    noProblems();
  });

  test("clock: advance it from the page", async () => {
    await open("#/clock");
    await page.getByText(/moved forward 0 s/).waitFor();
    await page.getByLabel("Seconds").fill("3600");
    await page.getByRole("button", { name: "Advance" }).click();
    await page.getByText(/moved forward 3600 s/).waitFor();
    expect((await k.api("GET", "/_kiln/clock", { token: null })).body.offset_ms).toBeGreaterThanOrEqual(3_600_000);
    await shot("clock");
    noProblems();
  });

  test("end users: create, search, paginate, delete", { timeout: 120_000 }, async () => {
    await open(`#/p/${projectId}/users`);
    await page.getByLabel("Email", { exact: true }).fill("ada@example.com");
    await page.getByLabel("Password").fill("long enough pass");
    await page.getByRole("button", { name: "Create end user" }).click();
    await page.getByRole("cell", { name: "ada@example.com", exact: true }).waitFor();
    // The API's refusal of a second user with the same email, as the API words it.
    await page.getByLabel("Email", { exact: true }).fill("ada@example.com");
    await page.getByRole("button", { name: "Create end user" }).click();
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toMatch(/^4\d\d: /);
    expectLoadFailures(/4\d\d/);
    // Fifty more to page through, made without passwords (each password is an argon2id hash: CPU the page never needs).
    for (let i = 0; i < 50; i++) {
      const r = await k.api("POST", `/projects/${projectId}/users`, { body: { email: `u${i}@example.com` } });
      expect(r.status, r.text).toBe(201);
    }
    await open(`#/p/${projectId}/users`);
    await page.getByText(/page 1 \(51 in all\)/).waitFor();
    await page.getByRole("link", { name: "Next →" }).click();
    await page.getByText(/page 2 \(51 in all\)/).waitFor();
    await open(`#/p/${projectId}/users?search=ada`);
    await page.getByRole("button", { name: "Delete ada@example.com" }).waitFor();
    await shot("users");
    await page.getByRole("button", { name: "Delete ada@example.com" }).click();
    await confirmWith("Delete end user ada@example.com");
    await page.getByText("No end user matches.").waitFor();
    noProblems();
  });

  test("schedulers: create one for a function, advance the clock, see its run", async () => {
    await open(`#/p/${projectId}/schedulers`);
    await page.getByLabel("Name").fill("hourly");
    await page.getByLabel("Function").selectOption("hello");
    await page.getByLabel("Cron schedule").fill("0 * * * *");
    await page.getByLabel(/^Payload/).fill('{"name":"cron"}');
    await page.getByRole("button", { name: "Create scheduler" }).click();
    await page.locator("button:text('Runs of hourly'), [role=alert]").first().waitFor();
    expect(await page.locator("[role=alert]").allTextContents()).toEqual([]);
    await page.getByRole("button", { name: "Runs of hourly" }).waitFor();
    await open("#/clock");
    await page.getByLabel("Seconds").fill("3700");
    await page.getByRole("button", { name: "Advance" }).click();
    await page.getByText(/moved forward \d+ s/).waitFor();
    const s = (await k.api("GET", `/projects/${projectId}/schedulers`)).body.data[0];
    await eventually(() => k.api("GET", `/projects/${projectId}/functions/${s.function_id}/schedulers/${s.id}/runs`), (r) => r.body.data.some((x: any) => x.finished_at), 30_000);
    await open(`#/p/${projectId}/schedulers`);
    await page.getByRole("button", { name: "Runs of hourly" }).click();
    await page.getByRole("heading", { name: "Runs of hourly" }).waitFor();
    expect(await page.getByText("No runs yet.").count()).toBe(0);
    await shot("schedulers");
    noProblems();
  });

  test("durable executions: a function's executions by status, an execution's steps on a timeline", async () => {
    const form = new FormData();
    form.set("name", "flow");
    form.set("runtime", "nodejs22.x");
    const code = `exports.handler = async (event, step) => {
  const a = await step.run("pick", () => ({ got: event.x }));
  await step.sleep("nap", "1h");
  return { doubled: a.got * 2 };
};`;
    form.set("code", new Blob([new Uint8Array(tgz({ "index.js": code }))]), "code.tgz");
    const created = await fetch(`${k.url}/projects/${projectId}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    expect(created.status).toBe(201);
    const fn = (await created.json()) as any;
    await eventually(() => k.api("GET", `/projects/${projectId}/durable-functions/${fn.id}`), (r) => r.body.status === "active" && !r.body.pending_deployment_id, 60_000);
    const base = `/projects/${projectId}/durable-functions/${fn.id}/executions`;
    const started = await k.api("POST", base, { body: { input: { x: 21 } } });
    expect(started.status, started.text).toBe(202);
    await eventually(() => k.api("GET", `${base}/${started.body.id}`), (r) => r.body.status === "sleeping", 30_000);

    await open(`#/p/${projectId}/durable`);
    await page.getByRole("link", { name: "flow" }).click();
    await page.getByRole("link", { name: started.body.id }).waitFor();
    // The status filter is the API's: nothing completed yet.
    await page.getByRole("link", { name: "completed", exact: true }).click();
    await page.getByText("No executions.").waitFor();
    await page.getByRole("link", { name: "sleeping", exact: true }).click();
    await page.getByRole("link", { name: started.body.id }).click();
    await page.getByRole("heading", { name: `Execution ${started.body.id}` }).waitFor();
    const steps = page.getByRole("list", { name: "steps" }).locator("li");
    await expect.poll(() => steps.count()).toBe(2);
    expect(await steps.nth(0).textContent()).toMatch(/^1\. pick · run · completed · 1 attempt · started /);
    expect(await steps.nth(1).textContent()).toMatch(/^2\. nap · sleep · sleeping · 0 attempts · .*wakes /);
    await steps.nth(0).getByText("Output of pick").click();
    expect(JSON.parse((await steps.nth(0).locator("pre").textContent())!)).toEqual({ got: 21 });
    expect(JSON.parse((await page.locator("section > div pre").first().textContent())!)).toEqual({ x: 21 });

    // The sleep ends when the clock moves; the page then shows the output.
    await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 3700 } });
    await eventually(() => k.api("GET", `${base}/${started.body.id}`), (r) => r.body.status === "completed", 30_000);
    await open(`#/p/${projectId}/durable?function=${fn.id}&execution=${started.body.id}`);
    await page.getByText(/^completed · created /).waitFor();
    expect(await steps.nth(1).textContent()).toMatch(/^2\. nap · sleep · completed/);
    expect(JSON.parse((await page.locator("section > div pre").last().textContent())!)).toEqual({ doubled: 42 });
    await shot("durable");
    noProblems();
  });

  test("metrics: requests, errors, availability and p95 per window, charted and tabled as the query API answers", async () => {
    const fn = (await k.api("GET", `/projects/${projectId}/functions`)).body.data.find((f: any) => f.name === "hello");
    const key = (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "metrics" } })).body.key;
    for (let i = 0; i < 5; i++) expect((await k.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { name: "m" } } })).status).toBe(200);
    // The window ends at the last completed minute: move past it.
    await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 61 } });
    const metrics = ["request_count", "server_error_count", "availability", "p95_latency"];
    // The page and this query must see the same window (a minute may complete between them, and a
    // scheduler run land in it): ask again until both report the same fresh_through.
    let asked: any;
    for (let i = 0; i < 5; i++) {
      asked = (await k.api("POST", `/projects/${projectId}/metrics/query`, { body: { time_range: { window: "30m" }, queries: metrics.map((metric) => ({ id: metric, metric })) } })).body;
      await open(`#/p/${projectId}/metrics`);
      await page.getByRole("cell", { name: "request_count" }).waitFor();
      const through = asked.fresh_through.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC");
      if ((await page.getByText(/complete through/).textContent())?.includes(through)) break;
      asked = undefined;
    }
    expect(asked, "the page and the query API never agreed on the window").toBeTruthy();
    const count = asked.results.find((r: any) => r.id === "request_count").values[0].value;
    expect(count).toBeGreaterThanOrEqual(5);

    const row = async (m: string) => (await page.getByRole("row").filter({ has: page.getByRole("cell", { name: m, exact: true }) }).locator("td").allTextContents()).slice(1);
    expect((await row("request_count"))[0]).toBe(String(count));
    const avail = asked.results.find((r: any) => r.id === "availability").values[0].value;
    expect((await row("availability"))[0]).toBe(`${(avail * 100).toFixed(2)}%`);
    const p95 = asked.results.find((r: any) => r.id === "p95_latency").values[0].value;
    expect((await row("p95_latency"))[0]).toBe(`${p95.toFixed(1)} ms`);
    // One chart per metric, its bars labelled with the same values.
    expect(await page.locator("svg.chart").count()).toBe(4);
    expect(await page.getByRole("img", { name: /^request_count: / }).getAttribute("aria-label")).toContain(`30m ${count}`);
    expect(await page.locator("svg.chart").first().locator("rect").count()).toBe(4);
    await shot("metrics");
    noProblems();
  });

  test("locks: inspect a held lease by key, force-release it", async () => {
    const key = (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "locker" } })).body.key;
    const headers = { "X-Service-Lock-Token": crypto.randomUUID(), "X-Service-Request-Id": crypto.randomUUID() };
    const lease = await fetch(`${k.url}/locks/nightly-job/lease`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers }, body: JSON.stringify({ ttl_seconds: 600 }) });
    expect(lease.status).toBe(200);
    const held = (await lease.json()) as any;

    await open(`#/p/${projectId}/locks`);
    await page.getByLabel("Lock key").fill("nightly-job");
    await page.getByRole("button", { name: "Inspect" }).click();
    await page.getByRole("heading", { name: "Lock nightly-job" }).waitFor();
    const expires = held.expires_at.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC");
    await page.getByText(`held · expires ${expires} · fencing token ${held.fencing_token}`).waitFor();
    await shot("locks");
    await page.getByRole("button", { name: "Force release nightly-job" }).click();
    await confirmWith("Release the lock nightly-job");
    await page.getByText("free: an acquire would succeed now").waitFor();
    const after = await fetch(`${k.url}/locks/nightly-job`, { headers: { authorization: `Bearer ${key}`, "X-Service-Request-Id": crypto.randomUUID() } });
    expect(await after.json()).toEqual({ held: false });
    noProblems();
  });

  test("API explorer: every route of /openapi.json, tried with the signed-in token", async () => {
    await open("#/api");
    const doc = (await k.api("GET", "/openapi.json", { token: null })).body;
    const count = Object.values<any>(doc.paths).reduce((n, ops) => n + Object.keys(ops).length, 0);
    await page.getByText(`${count} routes`).waitFor();
    await page.getByLabel("Filter").fill("/projects/{projectId}/variables");
    await page.getByRole("button", { name: "Filter" }).click();
    await page.locator("summary", { hasText: /^GET\/projects\/\{projectId\}\/variables / }).click();
    await page.getByLabel("projectId").fill(projectId);
    await page.getByRole("button", { name: "Try GET /projects/{projectId}/variables" }).click();
    await page.getByText(/^200 OK in/).waitFor();
    expect(await page.locator("details[open] pre").last().textContent()).toContain("GREETING");
    await shot("api-explorer");
    noProblems();
  });

  test("database backups: take one, see the schedule, restore from it and follow the restore's states", async () => {
    await open(`#/p/${projectId}/databases`);
    await page.getByRole("link", { name: "shop" }).click();
    await page.getByRole("heading", { name: "Backups" }).waitFor();
    await page.getByText("No backups yet.").waitFor();
    await page.getByText("No automated backups (no schedule entries).").waitFor();
    await page.getByLabel("Backup name").fill("before-cleanup");
    await page.getByRole("button", { name: "Take backup" }).click();
    await page.getByRole("button", { name: "Restore from before-cleanup" }).waitFor();
    expect((await k.api("GET", `/projects/${projectId}/databases/shop/backups`)).body.data.map((b: any) => b.name)).toEqual(["before-cleanup"]);
    // A name the API refuses: its message.
    await page.getByLabel("Backup name").fill("before-cleanup");
    await page.getByRole("button", { name: "Take backup" }).click();
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toMatch(/^4\d\d: /);
    expectLoadFailures(/4\d\d/);

    await page.getByLabel("Frequency").selectOption("weekly");
    await page.getByLabel("Hour (UTC)").fill("4");
    await page.getByLabel(/^Day/).fill("7");
    await page.getByRole("button", { name: "Add schedule entry" }).click();
    await page.getByRole("cell", { name: "weekly at 04:00 UTC on Sunday", exact: true }).waitFor();
    const schedule = (await k.api("GET", `/projects/${projectId}/databases/shop/backup-schedule`)).body.entries;
    expect(schedule).toMatchObject([{ frequency: "weekly", hour: 4, day: 7 }]);
    await page.getByRole("cell", { name: schedule[0].next_run_at.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC") }).waitFor();

    await k.api("POST", `/projects/${projectId}/databases/shop/sql`, { body: { query: "delete from items" } });
    await page.getByRole("button", { name: "Restore from before-cleanup" }).click();
    await confirmWith("Restore from backup before-cleanup");
    await page.getByText("Restore from backup before-cleanup requested.").waitFor();
    // The page follows the restore through the API's states until it completes.
    await page.locator(".backups td .state.completed").waitFor({ timeout: 60_000 });
    const restores = (await k.api("GET", `/projects/${projectId}/databases/shop/restores`)).body.data;
    expect(restores[0]).toMatchObject({ kind: "snapshot", status: "completed", backup_name: "before-cleanup" });
    await page.getByRole("cell", { name: restores[0].id }).waitFor();
    const count = await eventually(() => k.api("POST", `/projects/${projectId}/databases/shop/sql`, { body: { query: "select count(*)::int from items" } }), (r) => r.status === 200);
    expect(count.body.rows).toEqual([[3]]);
    await page.locator(".backups").screenshot({ path: join(SHOTS, "database-backups.png") });
    await page.getByRole("button", { name: "Remove weekly at 04:00 UTC on Sunday" }).click();
    await page.getByText("No automated backups (no schedule entries).").waitFor();
    noProblems();
  });

  test("storage policies: create one, an edit the API refuses leaves it as it was, an edit it accepts replaces it", async () => {
    await open(`#/p/${projectId}/storage?bucket=avatars`);
    await page.getByRole("heading", { name: "Policies" }).waitFor();
    await page.getByText(/^No policies/).waitFor();
    await page.getByLabel("Policy name").fill("own folder");
    await page.getByLabel("Operation").selectOption("SELECT");
    await page.getByLabel(/^Definition/).fill("auth.uid()::text = (storage.foldername(name))[1]");
    await page.getByRole("button", { name: "Save policy" }).click();
    await page.getByRole("button", { name: "Edit policy own folder" }).waitFor();
    const bucket = (await k.api("GET", `/projects/${projectId}/storage/buckets`)).body.buckets.find((b: any) => b.name === "avatars");
    const key = (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "policies" } })).body.key;
    const policies = async () => (await k.api("GET", `/storage/buckets/${bucket.id}/policies`, { token: key })).body.policies.map((p: any) => [p.name, p.operation, p.definition]);
    expect(await policies()).toEqual([["own folder", "SELECT", "auth.uid()::text = (storage.foldername(name))[1]"]]);

    await page.getByRole("button", { name: "Edit policy own folder" }).click();
    await page.getByRole("heading", { name: "Edit policy own folder" }).waitFor();
    await page.getByLabel(/^Definition/).fill("select pg_sleep(1)");
    await page.getByRole("button", { name: "Save policy" }).click();
    await page.getByRole("alert").waitFor();
    expect(await page.getByRole("alert").textContent()).toMatch(/^400: invalid request: body field 'definition': /);
    expectLoadFailures(400);
    expect(await policies()).toEqual([["own folder", "SELECT", "auth.uid()::text = (storage.foldername(name))[1]"]]);

    await page.getByLabel(/^Definition/).fill("auth.role() = 'authenticated'");
    await page.getByLabel("Operation").selectOption("INSERT");
    await page.getByRole("button", { name: "Save policy" }).click();
    await page.getByText("Saved policy own folder").waitFor();
    await page.getByRole("cell", { name: "auth.role() = 'authenticated'" }).waitFor();
    expect(await policies()).toEqual([["own folder", "INSERT", "auth.role() = 'authenticated'"]]);
    await shot("storage-policies");
    noProblems();
  });

  test("durable executions: rerun one from a step, then stop the new one", async () => {
    const fn = (await k.api("GET", `/projects/${projectId}/durable-functions`)).body.data.find((f: any) => f.name === "flow");
    const base = `/projects/${projectId}/durable-functions/${fn.id}/executions`;
    const first = await k.api("POST", base, { body: { input: { x: 5 } } });
    await eventually(() => k.api("GET", `${base}/${first.body.id}`), (r) => r.body.status === "sleeping", 30_000);

    await open(`#/p/${projectId}/durable?function=${fn.id}&execution=${first.body.id}`);
    await page.getByRole("heading", { name: `Execution ${first.body.id}` }).waitFor();
    await page.getByRole("button", { name: "Rerun from nap" }).click();
    // The page moves to the new execution: a re-run of the first, which reused the step before nap.
    await page.getByText(new RegExp(`re-run of ${first.body.id}`)).waitFor();
    const rerunId = /execution=([^&]+)/.exec(page.url())![1]!;
    expect(rerunId).not.toBe(first.body.id);
    const rerun = await eventually(() => k.api("GET", `${base}/${rerunId}`), (r) => r.body.status === "sleeping", 30_000);
    expect(rerun.body).toMatchObject({ rerun_of: first.body.id, input: { x: 5 } });
    expect(rerun.body.steps[0]).toMatchObject({ name: "pick", output: { got: 5 } });

    await open(`#/p/${projectId}/durable?function=${fn.id}&execution=${rerunId}`);
    await page.getByRole("button", { name: `Stop execution ${rerunId}` }).click();
    await confirmWith(`Stop the execution ${rerunId}`);
    await page.getByText(/^stopped · created /).waitFor();
    expect(await page.getByRole("button", { name: /^Stop execution/ }).count()).toBe(0);
    expect((await k.api("GET", `${base}/${rerunId}`)).body.status).toBe("stopped");
    await shot("durable-rerun");
    // A step name the API does not know (the page's buttons only offer real ones): its 400, as worded.
    const bad = await k.api("POST", `${base}/${rerunId}/rerun`, { body: { from_step: "nope" } });
    expect(bad.status).toBe(400);
    await k.api("POST", `${base}/${first.body.id}/stop`);
    noProblems();
  });

  test("end users: sign one up, follow the confirmation link from the mail catcher, mail a reset link", async () => {
    const cfg = await k.api("PATCH", `/auth/config?project_id=${projectId}`, { body: { require_email_confirmation: true } });
    expect(cfg.status, cfg.text).toBe(200);
    await open(`#/p/${projectId}/users`);
    await page.getByLabel("Email", { exact: true }).fill("grace@example.com");
    await page.getByLabel("Password").fill("long enough pass");
    await page.getByLabel("Create as").selectOption("sign-up (the app's flow)");
    await page.getByRole("button", { name: "Create end user" }).click();
    await page.getByText("Signed up grace@example.com: a confirmation link was mailed.").waitFor();
    await page.getByRole("heading", { name: "Mail to grace@example.com" }).waitFor();
    const confirmLink = page.getByRole("link", { name: /\/auth\/confirm\?token=/ });
    await mailArrives(confirmLink);
    const user = async () => (await k.api("GET", `/projects/${projectId}/users?search=grace`)).body.data[0];
    expect((await user()).email_confirmed).toBe(false);
    // The link works: following it confirms the user.
    const followed = await fetch((await confirmLink.first().getAttribute("href"))!);
    expect(followed.status).toBe(200);
    expect((await user()).email_confirmed).toBe(true);

    await open(`#/p/${projectId}/users?search=grace`);
    await page.getByRole("button", { name: "Send reset link to grace@example.com" }).click();
    await page.getByText(/reset link has been sent \(grace@example\.com\)/).waitFor();
    await mailArrives(page.getByRole("link", { name: /\/auth\/reset-password\?token=/ }));
    const mails = (await k.api("GET", "/_emulators/mail/messages?to=grace@example.com")).body.data;
    expect(mails.length).toBe(2);
    expect(await page.locator("article.mail").count()).toBe(2);

    // An admin-created user who is not confirmed.
    await page.getByLabel("Email", { exact: true }).fill("lin@example.com");
    await page.getByLabel("Create as").selectOption("unconfirmed (admin)");
    await page.getByRole("button", { name: "Create end user" }).click();
    await eventually(() => k.api("GET", `/projects/${projectId}/users?search=lin`), (r) => r.body.data.length === 1);
    expect((await k.api("GET", `/projects/${projectId}/users?search=lin`)).body.data[0].email_confirmed).toBe(false);
    await shot("users-mail");
    await k.api("PATCH", `/auth/config?project_id=${projectId}`, { body: { require_email_confirmation: false } });
    noProblems();
  });
});
