// A Next.js frontend end to end through the API (spec part 2: build and runtime rules 1-2): the
// fixture app (test/fixtures/frontends/nextjs-app: App Router page, an API route, a NEXT_PUBLIC_
// value, a server component calling a Kiln function) deployed as an archive, built in the sandbox
// from the frontend npm cache the test set-up fills (npm's registry points at an address nothing
// listens on: a download fails the build), served at its site URL by Kiln (static files) and its
// Node server (pages), and rendered in headless Chromium.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { useBrowser } from "../support/browser";
import { deploy as deployFunction, settled as functionSettled, tgz } from "../support/functions";
import { createProject, eventually, removeDir, ROOT, useKiln } from "../support/kiln";

const FIXTURE = join(ROOT, "test/fixtures/frontends/nextjs-app");
const GREETING = `hello-${Math.random().toString(36).slice(2, 8)}`;
const SECRET = `secret-${Math.random().toString(36).slice(2, 8)}`;

function fixtureArchive(): Buffer {
  const dir = mkdtempSync(join(tmpdir(), "kiln-next-archive-"));
  try {
    execFileSync("tar", ["-czf", join(dir, "app.tgz"), "--exclude=./node_modules", "--exclude=./.next", "-C", FIXTURE, "."]);
    return readFileSync(join(dir, "app.tgz"));
  } finally {
    removeDir(dir);
  }
}

describe("a Next.js frontend", () => {
  const k = useKiln({ env: { npm_config_registry: "http://127.0.0.1:9/" } });
  const browser = useBrowser();
  let site = "";
  let projectId = "";
  let frontendId = "";
  const siteFetch = (path: string) => {
    const u = new URL(site);
    return fetch(`http://127.0.0.1:${u.port}${path}`, { headers: { host: u.host } });
  };

  beforeAll(async () => {
    const p = await createProject(k);
    projectId = p.id;
    // The Kiln function the page's server component calls (HTTP mode, public, no token).
    const fn = await deployFunction(
      k,
      p.id,
      { name: "backend", runtime: "nodejs22.x", invocation_mode: "http", is_public: "true", http_auth_mode: "none" },
      tgz({ "index.js": `exports.handler = async (e) => ({ statusCode: 200, headers: { "content-type": "application/json" }, body: JSON.stringify({ answer: 42, from: JSON.parse(e.body || "{}").from ?? null }) });` }),
    );
    const backend = await functionSettled(k, p.id, fn.body.id);
    for (const [name, value] of Object.entries({ NEXT_PUBLIC_GREETING: GREETING, SERVER_SECRET: SECRET, BACKEND_URL: backend.invoke_url, UNSELECTED: "nope" }))
      expect((await k.api("POST", `/projects/${p.id}/variables`, { body: { name, value } })).status).toBe(201);
    const form = new FormData();
    form.set("name", "web");
    for (const v of ["NEXT_PUBLIC_GREETING", "SERVER_SECRET", "BACKEND_URL"]) form.append("variables", v);
    form.set("archive", new Blob([new Uint8Array(fixtureArchive())]), "app.tgz");
    const res = await fetch(`${k.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    const created = (await res.json()) as any;
    expect(res.status).toBe(201);
    frontendId = created.id;
    const f = (await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${created.id}`), (r) => r.body.status !== "provisioning", 900_000)).body;
    if (f.status !== "active") {
      const d = await k.api("GET", `/projects/${p.id}/frontends/${created.id}/deployments`);
      throw new Error(`the Next.js deployment failed: ${d.body.data[0]?.error}`);
    }
    expect(f.framework).toBe("nextjs");
    site = f.site_url;
  }, 960_000);

  it("serves the page (server component calling a Kiln function), the API route, and static files with immutable caching", async () => {
    const page = await siteFetch("/");
    expect(page.status).toBe(200);
    // React separates text parts with empty comments.
    const html = (await page.text()).replaceAll("<!-- -->", "");
    expect(html).toContain("Hello from Next.js on Kiln");
    expect(html).toContain(`backend said: 200 {&quot;answer&quot;:42,&quot;from&quot;:&quot;nextjs&quot;}`);
    // Rule 1: NEXT_PUBLIC_* is inlined into the client bundle and kept out of the server runtime.
    expect(html).toContain("NEXT_PUBLIC_ names in the server environment: (none)");
    const api = (await (await siteFetch("/api/hello")).json()) as any;
    expect(api).toMatchObject({ hello: "world", runtime_variable: SECRET, public_in_server_env: [] });
    expect(api.node).toMatch(/^v22\./);
    const chunk = /\/_next\/static\/[^"]+\.js/.exec(html)![0];
    const asset = await siteFetch(chunk);
    expect(asset.status).toBe(200);
    expect(asset.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    expect(asset.headers.get("etag")).toBeTruthy();
    expect(await (await siteFetch("/hello.txt")).text()).toContain("hello");

    const build = await k.api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "frontend", ids: [frontendId] }, query: "npm ci", limit: 5 } });
    expect(build.body.data.length).toBeGreaterThan(0);
  });

  it("renders and hydrates in Chromium with the NEXT_PUBLIC_ value", async () => {
    const tab = await (await browser.get()).page();
    await tab.goto(`${site}/`);
    await tab.waitForSelector("#hydrated:has-text('hydrated')");
    expect(await tab.textContent("#greeting")).toBe(GREETING);
    await tab.click("#increment");
    expect(await tab.textContent("#increment")).toBe("clicked 1");
    await tab.close();
  }, 120_000);
});
