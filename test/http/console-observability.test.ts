// The web console's observability views in headless Chromium against a real Kiln: an invocation's
// timeline (from the function page's invoke and from a log line), live tails of the logs page and of
// a function (pause, resume, a bounded number of lines kept), the virtualized log table, a build log
// followed live while the deployment builds, and the console driven by the keyboard alone (its
// confirmation dialogs too). Screenshots go to test-results/console/ like console.test.ts's.
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { useBrowser, type Page } from "../support/browser";
import { removeDir } from "../support/dirs";
import { deploy, npmTarball, settled, tgz } from "../support/functions";
import { createProject, eventually, useKiln } from "../support/kiln";

/**
 * The npm registry builds install from (hermetic: on 127.0.0.1, named by Kiln's npm user config):
 * one package, `held`; the metadata of `held` and of `missing` (which it does not have: 404) is
 * answered only once the test calls `release(path)`, so a build can be caught in its install for as
 * long as the test needs.
 */
const registry = await (async () => {
  const asked: string[] = [];
  const waiting = new Map<string, ServerResponse[]>();
  const holding = new Set(["/held", "/missing"]);
  let url = "";
  const files = new Map<string, () => Buffer>();
  const answer = (path: string, res: ServerResponse) => {
    const f = files.get(path);
    res.writeHead(f ? 200 : 404, { "content-type": path.endsWith(".tgz") ? "application/octet-stream" : "application/json" }).end(f ? f() : "not found");
  };
  const server = createServer((req, res) => {
    asked.push(req.url ?? "");
    const path = req.url ?? "";
    if (holding.has(path)) waiting.set(path, [...(waiting.get(path) ?? []), res]);
    else answer(path, res);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const tarball = npmTarball("held", "module.exports = 'from the held registry';");
  files.set("/held/-/held-1.0.0.tgz", () => tarball);
  files.set("/held", () => Buffer.from(JSON.stringify({ name: "held", "dist-tags": { latest: "1.0.0" }, versions: { "1.0.0": { name: "held", version: "1.0.0", main: "index.js", dist: { tarball: `${url}/held/-/held-1.0.0.tgz` } } } })));
  return {
    url,
    asked,
    release(path: string) {
      holding.delete(path);
      for (const res of waiting.get(path) ?? []) answer(path, res);
      waiting.delete(path);
    },
    close: () => server.close(),
  };
})();
const npmDir = mkdtempSync(join(tmpdir(), "kiln-console-npm-"));
writeFileSync(join(npmDir, "npmrc"), `registry=${registry.url}/\nfetch-retries=0\n`);
afterAll(() => {
  for (const path of ["/held", "/missing"]) registry.release(path);
  registry.close();
  removeDir(npmDir);
});

const k = useKiln({ env: { NPM_CONFIG_USERCONFIG: join(npmDir, "npmrc"), npm_config_userconfig: undefined, npm_config_registry: undefined, NPM_CONFIG_REGISTRY: undefined } });
const browser = useBrowser();
const SHOTS = join(import.meta.dirname, "..", "..", "test-results", "console");
mkdirSync(SHOTS, { recursive: true });

let page: Page;
const problems: string[] = [];
let projectId = "";
let fnId = "";
let serviceKey = "";

// Prints `said <name>` and, with `lines`, that many numbered lines; with `fail`, throws.
const SOURCE = `exports.handler = async (e) => {
  console.log("said " + e.name);
  if (e.fail) throw new Error("boom " + e.name);
  for (let i = 0; i < (e.lines || 0); i++) console.log("bulk " + e.name + " " + i);
  return { hello: e.name };
};`;

beforeAll(async () => {
  const p = await createProject(k, "observed");
  projectId = p.id;
  serviceKey = (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "test" } })).body.key;
  const d = await deploy(k, projectId, { name: "echo", runtime: "nodejs22.x" }, tgz({ "index.js": SOURCE }));
  expect(d.status, JSON.stringify(d.body)).toBe(201);
  fnId = d.body.id;
  expect((await settled(k, projectId, fnId)).status).toBe("active");
  page = await (await browser.get()).page();
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(m.text());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${k.url}/_console`);
  await page.evaluate((t) => sessionStorage.setItem("kiln.console.token", t), k.token);
}, 120_000);

beforeEach(() => void problems.splice(0));

afterAll(async () => {
  await page?.close().catch(() => {});
});

async function open(hash: string) {
  await page.goto("about:blank");
  await page.goto(`${k.url}/_console${hash}`);
  await page.waitForFunction(() => !document.querySelector("main")?.textContent?.includes("Loading…"), null, { timeout: 15_000 }).catch(() => {});
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

async function invoke(payload: unknown) {
  const r = await k.api("POST", `/functions/${fnId}/invoke`, { token: serviceKey, body: { payload } });
  expect(r.status, r.text).toBe(200);
  return r.headers.get("x-service-invocation-id")!;
}

/** The phases list of the timeline shown, as text per phase. */
const phases = (root = page.locator("main")) => root.getByRole("list", { name: "phases" }).locator("li").allTextContents();

describe("invocation timeline", () => {
  test("the function page's invoke: arrival, worker start then reuse, handler, response, its lines and the X-Service-* headers beside", async () => {
    await open(`#/p/${projectId}/functions`);
    await page.getByRole("link", { name: "echo" }).click();
    await page.getByRole("heading", { name: /^Function echo/ }).waitFor();

    const run = async (name: string) => {
      await page.getByLabel("JSON payload").fill(JSON.stringify({ name }));
      await page.getByRole("button", { name: "Invoke", exact: true }).click();
      const section = page.locator("section.invocation");
      await section.getByText(`said ${name}`).waitFor();
      return section;
    };
    const first = await run("first");
    const firstPhases = await phases(first);
    expect(firstPhases.map((t) => t.split(" · ")[0])).toEqual(["Arrival", "Invoke endpoint", "Worker", "Handler", "Response"]);
    // The deploy did not start a worker: the first call started one.
    expect(firstPhases[2]).toMatch(/^Worker · new worker started in [\d.]+ ms; [\d.]+ ms from hand-over to the handler$/);
    expect(firstPhases[4]).toMatch(/^Response · status 200 at \+[\d.]+ ms$/);

    const second = await run("second");
    expect((await phases(second))[2]).toMatch(/^Worker · warm worker reused; [\d.]+ ms from hand-over to the handler$/);
    // The headers the page got, beside the timeline, are the invoke's own.
    const shownHeaders = (await page.locator(".invoke-response + pre").textContent())!;
    const compute = /x-service-compute-ms: (\d+)/i.exec(shownHeaders)![1]!;
    const aside = second.getByRole("complementary", { name: "timings" });
    const computeRow = await aside.getByRole("row").filter({ has: page.getByRole("cell", { name: /^x-service-compute-ms$/i }) }).locator("td").allTextContents();
    expect(computeRow).toEqual([expect.stringMatching(/^x-service-compute-ms$/i), compute, "response header"]);
    expect((await phases(second))[3]).toMatch(/^Handler · [\d.]+ ms \(X-Service-Compute-Ms\)$/);
    // Its log lines: the handler's and Kiln's finish line, in order, with offsets from arrival.
    const lines = await second.locator(".invocation-lines tbody tr").allTextContents();
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^\+[\d.]+ ms.*info\s*said second$/);
    expect(lines[1]).toMatch(/finished with status 200 in [\d.]+ ms \(proxy [\d.]+ ms, worker reused, compute [\d.]+ ms\)$/);
    await shot("function-invocation");

    // The invocation's own page, from the link under the response: the same, headers included.
    const id = (await page.getByRole("link", { name: /^Invocation / }).textContent())!.replace("Invocation ", "");
    await page.getByRole("link", { name: /^Invocation / }).click();
    await page.getByRole("heading", { name: `Invocation ${id}` }).waitFor();
    await page.getByText("said second").waitFor();
    expect((await phases())[2]).toMatch(/^Worker · warm worker reused; /);
    expect(await page.getByRole("cell", { name: "response header" }).count()).toBeGreaterThan(0);
    noProblems();
  });

  test("a failed run: the API's message, and the timeline of that invocation with its lines", async () => {
    await open(`#/p/${projectId}/functions`);
    await page.getByRole("link", { name: "echo" }).click();
    await page.getByLabel("JSON payload").fill(JSON.stringify({ name: "broken", fail: true }));
    await page.getByRole("button", { name: "Invoke", exact: true }).click();
    const alert = page.getByRole("alert");
    await alert.waitFor();
    expect(await alert.textContent()).toMatch(/^5\d\d: /);
    const section = page.locator("section.invocation");
    await section.getByText("said broken").waitFor();
    expect((await phases(section))[4]).toMatch(/^Response · status 5\d\d at \+[\d.]+ ms$/);
    expect(await section.locator(".invocation-lines").textContent()).toContain("boom broken");
    expectLoadFailures(/5\d\d/); // the failed call, shown above
  });

  test("from a log line: its timeline link shows the invocation from log search alone", async () => {
    const id = await invoke({ name: "from-logs" });
    await open(`#/p/${projectId}/logs?q=${encodeURIComponent('"said from-logs"')}`);
    const row = page.getByRole("row").filter({ hasText: "said from-logs" });
    await row.getByRole("link", { name: "timeline" }).click();
    await page.getByRole("heading", { name: `Invocation ${id}` }).waitFor();
    await page.getByText("said from-logs").waitFor();
    const ps = await phases();
    expect(ps[2]).toMatch(/^Worker · (warm worker reused|new worker started in [\d.]+ ms); [\d.]+ ms from hand-over to the handler$/);
    expect(ps[3]).toMatch(/^Handler · [\d.]+ ms/);
    // Not seen by this browser: the figures come from the finish line, and the page says so.
    const aside = page.getByRole("complementary", { name: "timings" });
    expect(await aside.getByRole("cell", { name: "finish line" }).count()).toBe(2);
    await aside.getByText(/No public route keeps a past response's headers/).waitFor();
    await shot("invocation");

    // An id with no lines: said plainly, no error.
    await open(`#/p/${projectId}/invocation?id=nope`);
    await page.getByText(/No log lines of invocation nope/).waitFor();
    noProblems();
  });
});

describe("live tails", () => {
  test("logs page: follow, pause holds new lines, resume shows them, the oldest go past the cap", async () => {
    await open(`#/p/${projectId}/logs?keep=20`);
    await page.getByLabel("Query").fill("resource.name:echo");
    await page.getByRole("button", { name: "Follow live" }).click();
    await page.getByRole("status").filter({ hasText: /^Following live\.$/ }).waitFor();
    await invoke({ name: "live-1" });
    await page.getByRole("cell", { name: "said live-1" }).waitFor();

    await page.getByRole("button", { name: "Pause" }).click();
    await invoke({ name: "live-2" });
    // Two lines (the handler's and the finish line) held, not shown.
    await page.getByRole("status").filter({ hasText: /^Paused: 2 new lines held\.$/ }).waitFor();
    expect(await page.getByRole("cell", { name: "said live-2" }).count()).toBe(0);
    await page.getByRole("button", { name: "Resume" }).click();
    await page.getByRole("cell", { name: "said live-2" }).waitFor();
    // Newest first: live-2's lines above live-1's.
    const bodies = await page.locator(".vspacer [role=row] [role=cell]:nth-child(4)").allTextContents();
    expect(bodies.indexOf("said live-2")).toBeLessThan(bodies.indexOf("said live-1"));

    // 30 more lines: only the newest 20 stay.
    await invoke({ name: "many", lines: 30 });
    await page.getByText(/^20 rows \(\d+ oldest dropped to keep at most 20\)$/).waitFor();
    await page.getByRole("cell", { name: "bulk many 29" }).waitFor();
    expect(await page.getByRole("cell", { name: "said live-1" }).count()).toBe(0);
    await shot("logs-live");
    await page.getByRole("button", { name: "Stop" }).click();
    await page.getByRole("status").filter({ hasText: "Stopped." }).waitFor();
    noProblems();
  });

  test("logs table: a thousand lines loaded, a few dozen rows in the DOM, scrolling shows the others", async () => {
    await invoke({ name: "big", lines: 3000 });
    await open(`#/p/${projectId}/logs?q=${encodeURIComponent('"bulk big"')}`);
    await page.getByText(/^200 rows$/).waitFor();
    for (let i = 2; i <= 5; i++) {
      await page.getByRole("button", { name: "Older lines →" }).click();
      await page.getByText(`${200 * i} rows`, { exact: true }).waitFor();
    }
    const domRows = await page.locator(".vspacer [role=row]").count();
    expect(domRows).toBeGreaterThan(10);
    expect(domRows).toBeLessThan(80);
    expect(await page.getByRole("table", { name: "log lines" }).getAttribute("aria-rowcount")).toBe("1001");
    // The last row loaded is not in the DOM until scrolled to; then it is, with a line of the function.
    const last = page.locator('.vspacer [aria-rowindex="1001"]');
    expect(await last.count()).toBe(0);
    await page.locator(".vbox").evaluate((el) => (el.scrollTop = el.scrollHeight));
    await last.waitFor();
    expect(await last.textContent()).toMatch(/bulk big \d+/);
    noProblems();
  });

  test("function page: its logs follow live; the page's first load of stored lines, answered late, does not wipe them", async () => {
    await open(`#/p/${projectId}/functions`);
    // The page loads its stored lines as it opens: that answer is held until the tail has shown a
    // new line (CI once clicked Follow live before it came, and the late answer replaced the table).
    let releaseSearch = () => {};
    const searchHeld = new Promise<void>((r) => (releaseSearch = r));
    let searched = 0;
    await page.route("**/logs/search", async (route) => {
      searched++;
      // Asked of Kiln now (before the line below exists), delivered to the page later.
      const response = await route.fetch();
      await searchHeld;
      await route.fulfill({ response });
    });
    try {
      await page.getByRole("link", { name: "echo" }).click();
      await page.getByRole("heading", { name: /^Function echo/ }).waitFor();
      await page.getByRole("button", { name: "Follow live" }).click();
      await page.getByRole("status").filter({ hasText: /^Following live\.$/ }).waitFor();
      await invoke({ name: "tailed" });
      await page.getByRole("cell", { name: "said tailed" }).waitFor();
      expect(searched).toBe(1);
      releaseSearch();
      // The held search answers (an older view of the stored lines); the tail's lines stay, and it goes on.
      await page.waitForResponse("**/logs/search");
      await invoke({ name: "tailed-2" });
      await page.getByRole("cell", { name: "said tailed-2" }).waitFor();
      expect(await page.getByRole("cell", { name: "said tailed", exact: true }).count()).toBe(1);
    } finally {
      releaseSearch();
      await page.unroute("**/logs/search");
    }
    await shot("functions-live");
    noProblems();
  });
});

describe("build log", () => {
  test("a deployment being built: its lines on the function page as they are written, before it is active; its end refreshes the page", async () => {
    await open(`#/p/${projectId}/functions`);
    await page.getByLabel("Name").fill("slowbuild");
    const source = { "index.js": "const held = require('held'); exports.handler = async () => held;", "package.json": JSON.stringify({ dependencies: { held: "^1.0.0" } }) };
    await page.getByLabel("Source archive").setInputFiles({ name: "slow.tgz", mimeType: "application/gzip", buffer: tgz(source) });
    await page.getByRole("button", { name: "Deploy" }).click();
    await page.getByRole("heading", { name: /^Function slowbuild/ }).waitFor();
    // npm asked the registry for the package: the build is in its install, and stays there.
    await eventually(async () => registry.asked.includes("/held"), (x) => x, 60_000);
    const log = page.locator("pre.build-log");
    await expect.poll(() => log.textContent(), { timeout: 15_000 }).toMatch(/installing Node dependencies/);
    const fn = (await k.api("GET", `/projects/${projectId}/functions`)).body.data.find((f: any) => f.name === "slowbuild");
    expect(fn.status).toBe("provisioning");
    const building = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data.find((d: any) => d.kind === "deploy");
    expect(building.status).toBe("building");
    expect(await page.getByRole("status").filter({ hasText: /^Building: following the build log live…$/ }).count()).toBe(1);
    expect(await log.textContent()).not.toMatch(/build succeeded/);
    expect(await page.getByRole("region", { name: "function slowbuild" }).innerText()).not.toMatch(/\bnull\b|undefined/);
    await shot("functions-build-live");

    registry.release("/held");
    await page.getByRole("status").filter({ hasText: "Build succeeded: the deployment is active." }).waitFor({ timeout: 60_000 });
    const text = (await log.textContent())!;
    // Every line of the build, once each, in order, the last one its end.
    expect(text.trimEnd().split("\n").at(-1)).toMatch(/ info  build succeeded$/);
    expect(text.indexOf("installing Node dependencies")).toBeLessThan(text.indexOf("code check: index.js loads and exports handler"));
    expect(text.match(/installing Node dependencies/g)).toHaveLength(1);
    const stored = (await k.api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "function", ids: [fn.id], deployments: { ids: [building.id] } }, limit: 1000 } })).body.data;
    expect(text.trimEnd().split("\n")).toHaveLength(stored.length);
    // The page around it was refreshed: the function is active, its deployment succeeded.
    await page.getByText(/^active · nodejs22\.x/).waitFor();
    await page.getByRole("cell", { name: "succeeded" }).waitFor();
    expect((await k.api("POST", `/functions/${fn.id}/invoke`, { token: serviceKey, body: { payload: {} } })).body).toBe("from the held registry");
    noProblems();
  });

  test("a build that fails: followed until its error, which ends the log and the page says", async () => {
    await open(`#/p/${projectId}/functions`);
    await page.getByLabel("Name").fill("badbuild");
    const source = { "index.js": "exports.handler = async () => require('missing');", "package.json": JSON.stringify({ dependencies: { missing: "^1.0.0" } }) };
    await page.getByLabel("Source archive").setInputFiles({ name: "bad.tgz", mimeType: "application/gzip", buffer: tgz(source) });
    await page.getByRole("button", { name: "Deploy" }).click();
    await page.getByRole("heading", { name: /^Function badbuild/ }).waitFor();
    await eventually(async () => registry.asked.includes("/missing"), (x) => x, 60_000);
    const log = page.locator("pre.build-log");
    await expect.poll(() => log.textContent(), { timeout: 15_000 }).toMatch(/installing Node dependencies/);
    await page.getByRole("status").filter({ hasText: /^Building: following the build log live…$/ }).waitFor();

    registry.release("/missing");
    const failed = page.getByRole("status").filter({ hasText: /^Build failed: dependency installation failed: / });
    await failed.waitFor({ timeout: 60_000 });
    const fn = (await k.api("GET", `/projects/${projectId}/functions`)).body.data.find((f: any) => f.name === "badbuild");
    const [deployment] = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data;
    expect(deployment.status).toBe("failed");
    expect(await failed.textContent()).toBe(`Build failed: ${deployment.error}`);
    // The error is the log's last line; the page around it shows the function failed.
    expect((await log.textContent())!.trimEnd().endsWith(` error ${deployment.error}`)).toBe(true);
    await page.getByText(/^failed · nodejs22\.x/).waitFor();
    noProblems();
  });
});

describe("keyboard", () => {
  /** Presses Tab until the focused element's accessible text matches, at most `max` times; returns the texts passed. */
  async function tabTo(match: RegExp, max = 80): Promise<string[]> {
    const passed: string[] = [];
    for (let i = 0; i < max; i++) {
      await page.keyboard.press("Tab");
      const t = await page.evaluate(() => {
        const a = document.activeElement as HTMLElement | null;
        return a ? (a.getAttribute("aria-label") ?? a.textContent ?? "").trim() || (a as HTMLInputElement).name || a.tagName : "";
      });
      passed.push(t);
      if (match.test(t)) return passed;
    }
    throw new Error(`never focused ${match}: ${passed.join(" | ")}`);
  }
  const positiveTabindex = () => page.evaluate(() => [...document.querySelectorAll("[tabindex]")].filter((e) => Number(e.getAttribute("tabindex")) > 0).length);

  test("sign in, move between pages, search and follow logs, all from the keyboard", async () => {
    await page.evaluate(() => sessionStorage.clear());
    await open("");
    await tabTo(/^token$/);
    await page.keyboard.type(k.token);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    // Focus follows the page's order: the header's links first, then the page.
    const order = await tabTo(/^Sign out$/);
    expect(order).toEqual(["Projects", "Clock", "API explorer", "Mail catcher", "Sign out"]);
    await tabTo(/^observed$/);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Service keys" }).waitFor();
    await tabTo(/^Logs$/);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Logs" }).waitFor();
    expect(await positiveTabindex()).toBe(0);
    await tabTo(/^q$/);
    await page.keyboard.type('"said live-1"');
    await page.keyboard.press("Enter");
    await page.getByRole("cell", { name: "said live-1" }).waitFor();
    await tabTo(/^Follow live$/);
    await page.keyboard.press("Enter");
    await page.getByRole("status").filter({ hasText: /^Following live\.$/ }).waitFor();
    // Follow live is disabled now: focus went on to Pause, not back to the page's start.
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Pause");
    // The tail starts from an empty table: its backlog brings the line back (paused before, it would be held).
    await page.getByRole("cell", { name: "said live-1" }).waitFor();
    await page.keyboard.press("Space");
    await page.getByRole("status").filter({ hasText: /^Paused/ }).waitFor();
    // The table's scroll box takes focus (its rows scroll with the keys).
    await tabTo(/^log lines \(scroll with the arrow and page keys\)$/);
    // A line's timeline link is reachable and opens with Enter.
    await tabTo(/^timeline$/);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: /^Invocation / }).waitFor();
    await page.getByText("said live-1").waitFor();
    noProblems();
  });

  test("a dialog: Escape cancels, Enter confirms, focus returns", async () => {
    const d = await deploy(k, projectId, { name: "doomed", runtime: "nodejs22.x" }, tgz({ "index.js": SOURCE }));
    await settled(k, projectId, d.body.id);
    await open(`#/p/${projectId}/functions`);
    await page.getByRole("button", { name: "Delete doomed" }).waitFor();
    expect(await positiveTabindex()).toBe(0);
    await tabTo(/^Delete doomed$/);
    await page.keyboard.press("Enter");
    const dialog = page.getByRole("dialog", { name: "Delete function doomed" });
    await dialog.waitFor();
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Cancel");
    await shot("dialog");
    await page.keyboard.press("Escape");
    await dialog.waitFor({ state: "detached" });
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Delete doomed");
    expect((await k.api("GET", `/projects/${projectId}/functions/${d.body.id}`)).status).toBe(200);

    await page.keyboard.press("Enter");
    await dialog.waitFor();
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Delete function doomed");
    await page.keyboard.press("Enter");
    await eventually(() => k.api("GET", `/projects/${projectId}/functions/${d.body.id}`), (r) => r.status === 404, 15_000);
    await page.getByRole("button", { name: "Delete doomed" }).waitFor({ state: "detached" });
    noProblems();
  });

  test("a dialog whose action the API refuses: its message in the dialog, focus kept in it, Escape leaves", async () => {
    const u = await k.api("POST", `/projects/${projectId}/users`, { body: { email: "gone@example.com", password: "long enough pass" } });
    expect(u.status, u.text).toBe(201);
    await open(`#/p/${projectId}/users?search=gone`);
    await page.getByRole("button", { name: "Delete gone@example.com" }).waitFor();
    // Deleted behind the page's back: the page's delete is refused.
    expect((await k.api("DELETE", `/projects/${projectId}/users/${u.body.id}`)).status).toBeLessThan(300);
    await tabTo(/^Delete gone@example\.com$/);
    await page.keyboard.press("Enter");
    const dialog = page.getByRole("dialog", { name: "Delete end user gone@example.com" });
    await dialog.waitFor();
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Delete end user gone@example.com");
    await page.keyboard.press("Enter");
    await dialog.getByRole("alert").waitFor();
    expect(await dialog.getByRole("alert").textContent()).toMatch(/^404: /);
    expectLoadFailures(404);
    // Still open, focus on its confirming button; Tab cycles inside the dialog only.
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Delete end user gone@example.com");
    const cycle: string[] = [];
    for (let i = 0; i < 3; i++) {
      await page.keyboard.press("Tab");
      cycle.push((await page.evaluate(() => document.activeElement?.textContent)) ?? "");
    }
    expect(cycle).toEqual(["Cancel", "Delete end user gone@example.com", "Cancel"]);
    await shot("dialog-refused");
    await page.keyboard.press("Escape");
    await dialog.waitFor({ state: "detached" });
    noProblems();
  });
});
