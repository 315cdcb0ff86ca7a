// Frontends (spec part 2: Frontend, Frontend status, the Frontends endpoints, create fields, build and
// runtime rules 3-4, Limits): static sites from archives, their site addresses, deployments.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tgz } from "../support/functions";
import { rawRequest } from "../support/raw-http";
import { createProject, eventually, removeDir, useCli, useKiln, type TestKiln } from "../support/kiln";

const INDEX = "<!doctype html><title>shop</title><h1>version one</h1>";
const BIG_CSS = `body { color: #333; }\n`.repeat(200);

function site(version: string, extra: Record<string, string> = {}) {
  return tgz({ "dist/index.html": INDEX.replace("one", version), "dist/assets/app-3f2a9c1eB.js": `console.log("${version}")`, "dist/style.css": BIG_CSS, "dist/about/index.html": "about", "dist/vendor/lib.js": "lib", ...extra });
}

async function deployFrontend(k: TestKiln, projectId: string, fields: Record<string, string | string[]>, archive: Buffer | null, token?: string) {
  const form = new FormData();
  for (const [key, v] of Object.entries(fields)) for (const one of Array.isArray(v) ? v : [v]) form.append(key, one);
  if (archive) form.set("archive", new Blob([new Uint8Array(archive)]), "site.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/frontends`, { method: "POST", headers: { authorization: `Bearer ${token ?? k.token}` }, body: form });
  return { status: res.status, body: (await res.json()) as any };
}

/** The frontend once nothing of it is provisioning or queued. */
async function settled(k: TestKiln, projectId: string, id: string) {
  return (await eventually(() => k.api("GET", `/projects/${projectId}/frontends/${id}`), (r) => r.status === 200 && r.body.status !== "provisioning" && r.body.status !== "deleting" && !r.body.pending_deployment_id, 60_000)).body;
}

/** A request to a site: to Kiln's port with the site's Host header (stock resolvers do not know *.localhost). */
function siteFetch(siteUrl: string, path: string, init: RequestInit = {}) {
  const u = new URL(siteUrl);
  return fetch(`http://127.0.0.1:${u.port}${path}`, { ...init, headers: { ...(init.headers as Record<string, string>), host: u.host } });
}

describe("frontends", () => {
  const k = useKiln({ env: { KILN_FRONTEND_KEEP_PREVIOUS_MS: "200" } });
  const cliOf = useCli(k, { passToken: true });
  const useCliOf = () => cliOf;

  it("creates a static site that serves at its site URL, with caching, ranges and compression", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "shop" }, site("one"));
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ name: "shop", status: "provisioning", variable_scope: "scoped", current_deployment_id: expect.any(String) });
    expect(r.body.site_url).toBeUndefined();
    const f = await settled(k, p.id, r.body.id);
    expect(f).toMatchObject({ status: "active", framework: "static", custom_domain: null });
    expect(f.site_url).toBe(`http://shop--${p.id}.app.localhost:${new URL(k.url).port}`);

    const home = await siteFetch(f.site_url, "/");
    expect(home.status).toBe(200);
    expect(home.headers.get("content-type")).toMatch(/text\/html/);
    expect(await home.text()).toContain("version one");
    const etag = home.headers.get("etag")!;
    expect(etag).toMatch(/^".+"$/);
    expect(home.headers.get("cache-control")).toBe("public, max-age=0, must-revalidate");
    expect((await siteFetch(f.site_url, "/", { headers: { "if-none-match": etag } })).status).toBe(304);
    // A hashed asset never changes; vendor/ is content (only node_modules is left out of a site).
    const asset = await siteFetch(f.site_url, "/assets/app-3f2a9c1eB.js");
    expect(asset.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    expect(await (await siteFetch(f.site_url, "/vendor/lib.js")).text()).toBe("lib");
    expect(await (await siteFetch(f.site_url, "/about")).text()).toBe("about");
    // Ranges.
    const part = await siteFetch(f.site_url, "/style.css", { headers: { range: "bytes=0-3" } });
    expect(part.status).toBe(206);
    expect(part.headers.get("content-range")).toBe(`bytes 0-3/${BIG_CSS.length}`);
    expect(await part.text()).toBe("body");
    expect((await siteFetch(f.site_url, "/style.css", { headers: { range: `bytes=${BIG_CSS.length + 5}-` } })).status).toBe(416);
    // Compression: the precompressed variant the client accepts.
    const br = await siteFetch(f.site_url, "/style.css", { headers: { "accept-encoding": "br" }, decompress: false } as RequestInit);
    expect(br.headers.get("content-encoding")).toBe("br");
    expect(Number(br.headers.get("content-length"))).toBeLessThan(BIG_CSS.length);
    const gz = await siteFetch(f.site_url, "/style.css", { headers: { "accept-encoding": "gzip" }, decompress: false } as RequestInit);
    expect(gz.headers.get("content-encoding")).toBe("gzip");
    // Client-side routes fall back to index.html; a missing file is 404.
    expect(await (await siteFetch(f.site_url, "/cart/42")).text()).toContain("version one");
    expect((await siteFetch(f.site_url, "/missing.png")).status).toBe(404);
    expect((await siteFetch(f.site_url, "/", { method: "POST" })).status).toBe(405);
    // Paths that climb out of the site (raw, since fetch would normalize them) reach no file outside
    // it: a 4xx, or the client-side route fallback (index.html), never the host's files.
    for (const target of ["/../../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/..%2f..%2f..%2fetc%2fpasswd", "/assets/..%2f..%2f..%2f..%2fetc/hostname", "/%00/index.html"]) {
      const r = await rawRequest(`http://127.0.0.1:${new URL(f.site_url).port}`, "GET", target, { headers: { host: new URL(f.site_url).host } });
      expect(r.status === 200 ? r.text : "", target).not.toMatch(/root:.*:0:0:/);
      if (r.status === 200) expect(r.text, target).toContain("version one");
      else expect(r.status, target).toBeGreaterThanOrEqual(400);
      expect(r.status, target).toBeLessThan(500);
    }
    // Another name of the project: nothing serves there.
    expect((await siteFetch(f.site_url.replace("shop--", "nope--"), "/")).status).toBe(404);

    // Requests are counted (usage) and logged (resource.type=frontend).
    const usage = await eventually(
      () => k.api("GET", `/projects/${p.id}/usage`),
      (u) => (u.body.metrics ?? []).some((m: any) => m.metric === "Frontend Requests" && m.total >= 10),
    );
    expect(usage.status).toBe(200);
    const logs = await eventually(
      () => k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "frontend", ids: [f.id] }, query: "style.css" } }),
      (l) => l.status === 200 && l.body.data?.some((e: any) => String(e.body).includes("206")),
    );
    expect(logs.body.data[0].resource).toMatchObject({ type: "frontend", id: f.id, name: "shop" });
    const build = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "frontend", ids: [f.id], deployments: { ids: [f.current_deployment_id] } } } });
    expect(build.status).toBe(200);
    expect(build.body.data.map((e: any) => e.body).join("\n")).toContain("framework: static site");
  });

  it("updates by name (same id and site URL), redeploys, keeps the previous deployment when one fails, and deletes", async () => {
    const p = await createProject(k);
    const first = await deployFrontend(k, p.id, { name: "blog", variable_scope: "all" }, site("one"));
    const f1 = await settled(k, p.id, first.body.id);
    const second = await deployFrontend(k, p.id, { name: "blog" }, site("two"));
    expect(second.status).toBe(200);
    expect(second.body).toMatchObject({ id: f1.id, site_url: f1.site_url, variable_scope: "all" });
    const f2 = await settled(k, p.id, f1.id);
    expect(await (await siteFetch(f2.site_url, "/")).text()).toContain("version two");

    // A broken upload: the deployment fails, the previous one keeps serving, the frontend stays active.
    const broken = await deployFrontend(k, p.id, { name: "blog" }, tgz({ "README.md": "no site here" }));
    expect(broken.status).toBe(200);
    const f3 = await settled(k, p.id, f1.id);
    expect(f3.status).toBe("active");
    expect(await (await siteFetch(f3.site_url, "/")).text()).toContain("version two");
    const deps = await k.api("GET", `/projects/${p.id}/frontends/${f1.id}/deployments?limit=2`);
    expect(deps.status).toBe(200);
    expect(deps.body).toMatchObject({ total: 3, has_more: true, limit: 2 });
    expect(deps.body.data[0]).toMatchObject({ kind: "deploy", status: "failed", error: expect.stringContaining("no index.html") });

    // Redeploy builds the latest archive again (the broken one): fails, still serving.
    const re = await k.api("POST", `/projects/${p.id}/frontends/${f1.id}/redeploy`);
    expect(re.status).toBe(200);
    await settled(k, p.id, f1.id);
    const all = await k.api("GET", `/projects/${p.id}/frontends/${f1.id}/deployments`);
    expect(all.body.data[0]).toMatchObject({ kind: "redeploy", status: "failed" });
    expect((await siteFetch(f3.site_url, "/")).status).toBe(200);

    // A first deployment that fails leaves the frontend failed.
    const bad = await deployFrontend(k, p.id, { name: "empty" }, tgz({ "a.txt": "x" }));
    expect(bad.status).toBe(201);
    expect((await settled(k, p.id, bad.body.id)).status).toBe("failed");

    // Frontend deployments are in the account's deployment list too.
    const across = await k.api("GET", `/deployments?project_id=${p.id}&limit=100`);
    expect(across.status).toBe(200);
    expect(across.body.data.filter((d: any) => d.resource.id === f1.id).map((d: any) => d.kind)).toEqual(["redeploy", "deploy", "deploy", "deploy"]);
    expect(across.body.data[0].resource).toMatchObject({ type: "frontend" });

    const list = await k.api("GET", `/projects/${p.id}/frontends?limit=1`);
    expect(list.body).toMatchObject({ total: 2, has_more: true });

    const del = await k.api("DELETE", `/projects/${p.id}/frontends/${f1.id}`);
    expect(del.status).toBe(202);
    await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${f1.id}`), (r) => r.status === 404, 30_000);
    expect((await siteFetch(f3.site_url, "/")).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}/frontends`)).body.total).toBe(1);
    // The name is free again.
    expect((await deployFrontend(k, p.id, { name: "blog" }, site("three"))).status).toBe(201);
  });

  it("builds from app_root in a monorepo", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "mono", app_root: "apps/web" }, tgz({ "apps/web/index.html": "<p>web</p>", "apps/api/index.html": "<p>api</p>" }));
    expect(r.status).toBe(201);
    expect(r.body.app_root).toBe("apps/web");
    const f = await settled(k, p.id, r.body.id);
    expect(await (await siteFetch(f.site_url, "/")).text()).toBe("<p>web</p>");
  });

  it("refuses bad input with a 400 naming the field", async () => {
    const p = await createProject(k);
    const cases: Array<[Record<string, string>, Buffer | null, RegExp]> = [
      [{ name: "Bad_Name" }, site("x"), /name.*DNS-safe/],
      [{ name: "-x" }, site("x"), /DNS-safe/],
      [{ name: "a".repeat(42) }, site("x"), /at most 41/],
      [{ name: "ok", framework: "vue" }, site("x"), /framework/],
      [{ name: "ok", app_root: "../up" }, site("x"), /app_root/],
      [{ name: "ok", variable_scope: "some" }, site("x"), /variable_scope/],
      [{ name: "ok" }, null, /archive/],
      [{ name: "ok" }, Buffer.from("not an archive"), /ZIP or tar\.gz/],
    ];
    for (const [fields, archive, msg] of cases) {
      const r = await deployFrontend(k, p.id, fields, archive);
      expect(r.status, JSON.stringify(fields)).toBe(400);
      expect(r.body.error).toMatch(msg);
    }
    expect((await k.api("GET", `/projects/${p.id}/frontends/nope`)).status).toBe(404);
    expect((await k.api("POST", `/projects/${p.id}/frontends/nope/redeploy`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}/frontends`, { token: null })).status).toBe(401);
  });

  it("works from the CLI: deploy (build streamed), list, get, deployments, redeploy, domain get, delete", async () => {
    const cli = useCliOf();
    const p = await createProject(k);
    const dir = mkdtempSync(join(tmpdir(), "kiln-fe-cli-"));
    try {
      mkdirSync(join(dir, "node_modules", "x"), { recursive: true });
      writeFileSync(join(dir, "index.html"), "<p>from the cli</p>");
      writeFileSync(join(dir, "node_modules", "x", "index.js"), "left out");
      const dep = cli.run("frontends", "deploy", dir, "--name", "cli-site", "--project", p.id);
      expect(dep.code, dep.err).toBe(0);
      expect(dep.err).toContain("framework: static site");
      expect(dep.out).toMatch(/status\s+active/);
      const f = cli.json("frontends", "get", "cli-site", "--project", p.id);
      expect(await (await siteFetch(f.site_url, "/")).text()).toBe("<p>from the cli</p>");
      expect((await siteFetch(f.site_url, "/node_modules/x/index.js")).status).toBe(404);
      expect(cli.json("frontends", "list", "--project", p.id).data.map((x: any) => x.name)).toEqual(["cli-site"]);
      expect(cli.json("frontends", "redeploy", "cli-site", "--project", p.id).status).toBe("active");
      expect(cli.json("frontends", "deployments", "cli-site", "--project", p.id).data.map((d: any) => `${d.kind}:${d.status}`)).toEqual(["redeploy:succeeded", "deploy:succeeded"]);
      expect(cli.run("frontends", "domain", "get", "cli-site", "--project", p.id).out).toContain("has no custom domain");
      expect(cli.run("frontends", "delete", "cli-site", "--project", p.id).code).toBe(0);
      const missing = cli.run("frontends", "get", "nope", "--project", p.id);
      expect(missing.code).not.toBe(0);
      expect(missing.err).toContain("frontend nope not found");
    } finally {
      removeDir(dir);
    }
  });

  it("goes with its project: the site stops serving once the project is deleted", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "gone" }, site("x"));
    const f = await settled(k, p.id, r.body.id);
    expect((await siteFetch(f.site_url, "/")).status).toBe(200);
    const del = await k.api("DELETE", `/projects/${p.id}`);
    expect(del.status).toBeLessThan(300);
    await eventually(() => siteFetch(f.site_url, "/"), (res) => res.status === 404, 30_000);
  });

  it("answers 503 to a custom domain when this Kiln has no HTTPS port", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "nossl" }, site("x"));
    const d = await k.api("POST", `/projects/${p.id}/frontends/${r.body.id}/domain`, { body: { domain: "a.example.test", tls: { mode: "byoc", certificate_pem: "x", private_key_pem: "y" } } });
    expect(d.status).toBe(503);
    expect(d.body.error).toMatch(/--frontends-tls-port/);
  });

  it("caps a HOBBY project at one frontend with the spec's message", async () => {
    const acct = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } });
    expect(acct.status).toBe(201);
    const p = await createProject(k, undefined, acct.body.platform_token);
    expect((await deployFrontend(k, p.id, { name: "one" }, site("x"), acct.body.platform_token)).status).toBe(201);
    const second = await deployFrontend(k, p.id, { name: "two" }, site("x"), acct.body.platform_token);
    expect(second.status).toBe(403);
    expect(second.body.error).toBe("frontend deployment limit exceeded for your plan");
    // Updating the one it has is fine.
    expect((await deployFrontend(k, p.id, { name: "one" }, site("y"), acct.body.platform_token)).status).toBe(200);
  });

  it("switches a redeploy with no failed request under a continuous request loop", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "live" }, site("one"));
    const f = await settled(k, p.id, r.body.id);
    let stop = false;
    let failed = 0;
    let ok = 0;
    const seen = new Set<string>();
    const loop = async () => {
      while (!stop) {
        const res = await siteFetch(f.site_url, "/").catch(() => null);
        if (!res || res.status !== 200) failed++;
        else {
          ok++;
          seen.add((await res.text()).includes("version two") ? "two" : "one");
        }
      }
    };
    const loops = [loop(), loop(), loop()];
    await new Promise((res) => setTimeout(res, 100));
    await deployFrontend(k, p.id, { name: "live" }, site("two"));
    await settled(k, p.id, f.id);
    // Past the previous deployment's retention (200 ms here): its files are gone, nothing fails.
    await eventually(async () => seen.has("two"), (v) => v, 30_000);
    await new Promise((res) => setTimeout(res, 500));
    stop = true;
    await Promise.all(loops);
    expect(failed).toBe(0);
    expect(ok).toBeGreaterThan(20);
    expect([...seen].sort()).toEqual(["one", "two"]);
  });

  it("counts each frontend's requests in the project's usage (spec: Project usage, frontends)", async () => {
    const p = await createProject(k);
    const a = await settled(k, p.id, (await deployFrontend(k, p.id, { name: "alpha" }, site("a"))).body.id);
    const b = await settled(k, p.id, (await deployFrontend(k, p.id, { name: "beta" }, site("b"))).body.id);
    // Every answer counts, a 404 of a missing file too; the site of another project does not count here.
    for (let i = 0; i < 3; i++) expect((await siteFetch(a.site_url, "/")).status).toBe(200);
    expect((await siteFetch(a.site_url, "/missing.png")).status).toBe(404);
    for (let i = 0; i < 7; i++) expect((await siteFetch(b.site_url, i % 2 ? "/style.css" : "/")).status).toBe(200);
    const usage = await k.api("GET", `/projects/${p.id}/usage`);
    expect(usage.status).toBe(200);
    // Most requests first; counts are exact (the current minute is read from memory, not yet written).
    expect(usage.body.frontends).toEqual([
      { frontend_id: b.id, frontend_name: "beta", requests: 7 },
      { frontend_id: a.id, frontend_name: "alpha", requests: 4 },
    ]);
    expect(usage.body.metrics.find((m: any) => m.metric === "Frontend Requests").total).toBe(11);
    // A tie is ordered by name.
    for (let i = 0; i < 3; i++) expect((await siteFetch(a.site_url, "/")).status).toBe(200);
    const tie = (await k.api("GET", `/projects/${p.id}/usage`)).body.frontends;
    expect(tie.map((f: any) => [f.frontend_name, f.requests])).toEqual([["alpha", 7], ["beta", 7]]);
    // Another month has none.
    const [y, m] = (usage.body.month as string).split("-").map(Number) as [number, number];
    const before = m === 1 ? `${y - 1}-12` : `${y}-${String(m - 1).padStart(2, "0")}`;
    const other = await k.api("GET", `/projects/${p.id}/usage?month=${before}`);
    expect(other.status).toBe(200);
    expect(other.body).toMatchObject({ month: before, frontends: [] });
  });
});

/** The WebSocket stand-in app (test/fixtures/frontends/ws-app): a Next.js deployment whose `next build` is a local fake. */
function wsApp(): Buffer {
  return execFileSync("tar", ["-czf", "-", "-C", join(import.meta.dirname, "../fixtures/frontends/ws-app"), "."], { maxBuffer: 16 << 20 });
}

/** A WebSocket to a site (Kiln's port, the site's Host header), with every event it gets in order. */
function siteSocket(siteUrl: string, path: string, o: { protocols?: string[]; headers?: Record<string, string> } = {}) {
  const u = new URL(siteUrl);
  const ws = new WebSocket(`ws://127.0.0.1:${u.port}${path}`, { headers: { host: u.host, ...o.headers }, protocols: o.protocols } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  const got: (string | number[])[] = [];
  const closed = new Promise<{ code: number; reason: string }>((resolve) => ws.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason })));
  const opened = new Promise<boolean>((resolve) => {
    ws.addEventListener("open", () => resolve(true));
    ws.addEventListener("error", () => resolve(false));
  });
  ws.addEventListener("message", (e) => got.push(typeof e.data === "string" ? e.data : [...new Uint8Array(e.data as ArrayBuffer)]));
  const next = async (n: number) => (await eventually(async () => got.length, (len) => len >= n, 20_000), got[n - 1]!);
  return { ws, got, opened, closed, next };
}

describe("frontend deployment queue", () => {
  // Each build first waits an hour of platform time: deploys made meanwhile queue behind it, whatever
  // the machine's speed, until the test advances the clock. The next six switches away from a serving
  // deployment fail (the `degraded` test takes all of them; it runs first).
  const k = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "frontend_build_delay:3600000,frontend_switch:6", npm_config_registry: "http://127.0.0.1:9/" } });
  const advance = async (seconds: number) => expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);
  const history = async (projectId: string, id: string) => (await k.api("GET", `/projects/${projectId}/frontends/${id}/deployments`)).body.data as any[];

  it("marks a frontend degraded when a switch cannot complete: the previous deployment keeps serving, recovery retries without a rebuild, a redeploy retries", async () => {
    const p = await createProject(k);
    const first = await deployFrontend(k, p.id, { name: "edge" }, site("one"));
    await advance(3600);
    const f1 = await settled(k, p.id, first.body.id);
    expect(f1.status).toBe("active");

    // A switch that fails (fault 1): degraded at once, still serving version one; its recovery stands
    // down once a newer deploy is queued.
    const two = await deployFrontend(k, p.id, { name: "edge" }, site("two"));
    expect(two.status).toBe(200);
    await advance(3600);
    const degraded = await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${f1.id}`), (r) => r.body.status === "degraded", 60_000);
    expect(degraded.body.current_deployment_id).toBe(two.body.current_deployment_id);
    expect(await (await siteFetch(f1.site_url, "/")).text()).toContain("version one");
    expect((await history(p.id, f1.id))[0]).toMatchObject({ id: two.body.current_deployment_id, status: "building" });
    const three = await deployFrontend(k, p.id, { name: "edge" }, site("three"));
    expect(three.body.pending_deployment_id).toEqual(expect.any(String));
    const stoodDown = await eventually(
      async () => (await advance(10), history(p.id, f1.id)),
      (d) => d.find((x: any) => x.id === two.body.current_deployment_id)?.status !== "building",
      60_000,
    );
    expect(stoodDown.find((x: any) => x.id === two.body.current_deployment_id)).toMatchObject({ status: "failed", error: expect.stringMatching(/recovery stood down: deployment .* was queued after it/) });

    // Every attempt of the next one's switch fails (faults 2-5): recovery runs on the platform clock
    // (retries after 5 s, 30 s, 120 s), then gives up; the frontend stays degraded, serving version one.
    await advance(3600);
    const given = await eventually(
      async () => (await advance(150), history(p.id, f1.id)),
      (d) => d[0].id === three.body.pending_deployment_id && d[0].status !== "building" && d[0].status !== "queued",
      60_000,
    );
    expect(given[0]).toMatchObject({ status: "failed", error: expect.stringMatching(/switch to it could not complete after 4 attempts.*a redeploy retries/) });
    expect((await k.api("GET", `/projects/${p.id}/frontends/${f1.id}`)).body.status).toBe("degraded");
    expect(await (await siteFetch(f1.site_url, "/")).text()).toContain("version one");

    // A redeploy (of the latest archive: version three) retries: its first switch fails (fault 6), the recovery's next attempt completes.
    expect((await k.api("POST", `/projects/${p.id}/frontends/${f1.id}/redeploy`)).status).toBe(200);
    await advance(3600);
    const recovered = await eventually(
      async () => (await advance(10), k.api("GET", `/projects/${p.id}/frontends/${f1.id}`)),
      (r) => r.body.status === "active" && !r.body.pending_deployment_id,
      60_000,
    );
    expect((await history(p.id, f1.id))[0]).toMatchObject({ id: recovered.body.current_deployment_id, kind: "redeploy", status: "succeeded" });
    expect(await (await siteFetch(f1.site_url, "/")).text()).toContain("version three");
  });

  it("proxies WebSockets to the app's server both ways, closes them on redeploy and delete; stops the idle server on the platform clock and restarts one that died", async () => {
    const p = await createProject(k);
    const r = await deployFrontend(k, p.id, { name: "live", framework: "nextjs" }, wsApp());
    expect(r.status).toBe(201);
    await advance(3600);
    const f = await settled(k, p.id, r.body.id);
    expect(f.status, JSON.stringify(await history(p.id, r.body.id))).toBe("active");
    expect(f.framework).toBe("nextjs");
    const boot = async () => ((await (await siteFetch(f.site_url, "/boot")).json()) as { boot: string }).boot;
    const boot1 = await boot();

    // Through the site URL to the app's /ws: the handshake's path, cookie, host and subprotocol reach it;
    // text and binary frames go both ways.
    const s = siteSocket(f.site_url, "/ws?room=7", { protocols: ["fixture.v1", "fixture.v2"], headers: { cookie: "session=abc" } });
    expect(await s.opened, "the first socket opens").toBe(true);
    expect(s.ws.protocol).toBe("fixture.v2");
    expect(JSON.parse((await s.next(1)) as string)).toEqual({ hello: boot1, path: "/ws?room=7", cookie: "session=abc", forwardedHost: new URL(f.site_url).host, protocol: "fixture.v2" });
    s.ws.send("hi");
    expect(await s.next(2)).toBe("echo:hi");
    s.ws.send(new Uint8Array([1, 2, 3, 250]));
    expect(await s.next(3)).toEqual([250, 3, 2, 1]);
    // An open socket keeps the server up past its idle time.
    await advance(11 * 60);
    s.ws.send("still there");
    expect(await s.next(4)).toBe("echo:still there");
    expect(await boot()).toBe(boot1);
    // A path the app does not take: no socket (502), nothing else harmed.
    expect(await siteSocket(f.site_url, "/nows").opened).toBe(false);

    // A redeploy closes it cleanly (1012: reconnect), and a new socket reaches the new deployment's server.
    expect((await k.api("POST", `/projects/${p.id}/frontends/${f.id}/redeploy`)).status).toBe(200);
    await advance(3600);
    expect(await s.closed).toEqual({ code: 1012, reason: "the site was redeployed: reconnect" });
    await settled(k, p.id, f.id);
    const boot2 = await boot();
    expect(boot2).not.toBe(boot1);
    const s2 = siteSocket(f.site_url, "/ws");
    expect(JSON.parse((await s2.next(1)) as string).hello).toBe(boot2);
    // The client closes: the app hears the same code and reason (it answers the close in kind).
    s2.ws.close(4000, "done here");
    expect(await s2.closed).toEqual({ code: 4000, reason: "done here" });

    // Idle: ten minutes of platform time without a request stop the server; the next request starts a new one.
    expect(await boot()).toBe(boot2);
    await advance(11 * 60);
    const boot3 = await boot();
    expect(boot3).not.toBe(boot2);
    // A server that dies is started again by the next request.
    expect((await siteFetch(f.site_url, "/die")).status).toBe(200);
    const boot4 = await eventually(boot, (b) => b !== boot3, 20_000);
    expect(boot4).not.toBe(boot3);

    // Deleting the frontend closes its sockets (1001).
    const s3 = siteSocket(f.site_url, "/ws");
    expect(await s3.opened, "a socket after the restart opens").toBe(true);
    expect((await k.api("DELETE", `/projects/${p.id}/frontends/${f.id}`)).status).toBe(202);
    expect((await s3.closed).code).toBe(1001);
  });

  it("runs one deployment at a time, supersedes queued ones, queues a delete behind the running one, and deploys other frontends concurrently", async () => {
    const p = await createProject(k);
    const a = await deployFrontend(k, p.id, { name: "a" }, site("one"));
    expect(a.status).toBe(201);
    const other = await deployFrontend(k, p.id, { name: "b" }, site("b"));
    expect(other.body.status).toBe("provisioning");
    expect(other.body.pending_deployment_id).toBeUndefined();
    const q1 = await deployFrontend(k, p.id, { name: "a" }, site("two"));
    expect(q1.status).toBe(200);
    expect(q1.body.status).toBe("provisioning");
    expect(q1.body.pending_deployment_id).toEqual(expect.any(String));
    expect(q1.body.current_deployment_id).toBe(a.body.current_deployment_id);
    const q2 = await k.api("POST", `/projects/${p.id}/frontends/${a.body.id}/redeploy`);
    expect(q2.status).toBe(200);
    expect(q2.body.pending_deployment_id).toEqual(expect.any(String));
    expect(q2.body.pending_deployment_id).not.toBe(q1.body.pending_deployment_id);
    const del = await k.api("DELETE", `/projects/${p.id}/frontends/${a.body.id}`);
    expect(del.status).toBe(202);
    expect(del.body.pending_deployment_id).toEqual(expect.any(String));
    // While the deletion is queued, deploys are refused.
    const refused = await deployFrontend(k, p.id, { name: "a" }, site("four"));
    expect(refused.status).toBe(409);
    expect(refused.body.error).toMatch(/deletion is queued/);
    expect((await k.api("POST", `/projects/${p.id}/frontends/${a.body.id}/redeploy`)).status).toBe(409);
    const history = await k.api("GET", `/projects/${p.id}/frontends/${a.body.id}/deployments`);
    expect(history.body.data.map((d: any) => `${d.kind}:${d.status}`)).toEqual(["delete:queued", "redeploy:superseded", "deploy:superseded", "deploy:building"]);
    // The other frontend builds at the same time (not behind a's queue).
    const b = await k.api("GET", `/projects/${p.id}/frontends/${other.body.id}/deployments`);
    expect(b.body.data.map((d: any) => `${d.kind}:${d.status}`)).toEqual(["deploy:building"]);
    // Release the builds.
    expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 3600 } })).status).toBe(200);
    await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${a.body.id}`), (r) => r.status === 404, 60_000);
    expect((await settled(k, p.id, other.body.id)).status).toBe("active");
  });
});
