// A static frontend in a real browser (headless Chromium, test/support/browser.ts): the site URL
// resolves (Chromium maps *.localhost to loopback itself), the page's hashed script and stylesheet
// load and run, client-side routes fall back to index.html, and a redeploy shows the new version.
import { describe, expect, it } from "vitest";
import { useBrowser } from "../support/browser";
import { tgz } from "../support/functions";
import { createProject, eventually, useKiln, type TestKiln } from "../support/kiln";

const page = (v: string) => ({
  "index.html": `<!doctype html><link rel="stylesheet" href="/assets/site-9b1c2d3eF.css"><h1 id="v">${v}</h1><p id="js">no script</p><script src="/assets/app-4a5b6c7dE.js"></script>`,
  "assets/site-9b1c2d3eF.css": "h1 { color: rgb(1, 2, 3); }",
  "assets/app-4a5b6c7dE.js": `document.getElementById("js").textContent = "script ran at " + location.pathname;`,
});

async function deploy(k: TestKiln, projectId: string, files: Record<string, string>) {
  const form = new FormData();
  form.set("name", "web");
  form.set("archive", new Blob([new Uint8Array(tgz(files))]), "site.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
  const body = (await res.json()) as any;
  return (await eventually(() => k.api("GET", `/projects/${projectId}/frontends/${body.id}`), (r) => r.body.status === "active" && !r.body.pending_deployment_id && r.body.current_deployment_id === (body.pending_deployment_id ?? body.current_deployment_id), 60_000)).body;
}

describe("a static frontend in Chromium", () => {
  const k = useKiln();
  const browser = useBrowser();

  it("renders at its site URL with its assets, routes client-side, and shows a redeploy", async () => {
    const p = await createProject(k);
    const f = await deploy(k, p.id, page("first"));
    const tab = await (await browser.get()).page();
    const res = await tab.goto(`${f.site_url}/`);
    expect(res?.status()).toBe(200);
    expect(await tab.textContent("#v")).toBe("first");
    await tab.waitForFunction(() => document.getElementById("js")?.textContent?.startsWith("script ran"));
    expect(await tab.$eval("h1", (e) => getComputedStyle(e).color)).toBe("rgb(1, 2, 3)");
    await tab.goto(`${f.site_url}/orders/42`);
    expect(await tab.textContent("#js")).toBe("script ran at /orders/42");

    await deploy(k, p.id, page("second"));
    await tab.goto(`${f.site_url}/`);
    expect(await tab.textContent("#v")).toBe("second");
    await tab.close();
  }, 120_000);
});
