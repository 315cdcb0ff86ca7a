// Next.js frontends benchmark: deploy-to-active of the fixture app (test/fixtures/frontends/nextjs-app:
// upload, npm ci from the frontend npm cache, next build, switch), cold time to first byte (the
// sandboxed Node server started by the request), warm TTFB p50/p99 of the dynamic page and of the
// API route through Kiln's host-routed proxy, and the same warm TTFB against the same standalone
// server run bare on Node (no sandbox, no proxy) in the same run, for the proxy's share.
// Run: bun bench/frontends-nextjs.ts   (after `bun runtime-sandbox/frontends/nextjs/npm-cache.ts prepare test/fixtures/frontends/nextjs-app`, as npm test's pretest does)
// Target: warm TTFB p50 < 20 ms.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { cacheDir } from "../runtime-sandbox/runtimes";
import { pct, ROOT, startKiln, TOKEN } from "./support";

const N = Number(process.env.REQUESTS ?? 300);
const COLD = Number(process.env.COLD_STARTS ?? 3);
const IDLE_MS = 1500;

const api = async (base: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(`${base}${path}`, { method, headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { "content-type": "application/json" } : {}) }, body: body ? JSON.stringify(body) : undefined });
  return { status: res.status, body: (await res.json()) as any };
};

/** Milliseconds until the response's headers arrive (fetch resolves then), and the body read after. */
async function ttfb(url: string, host?: string): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(url, { headers: host ? { host } : {} });
  const t = performance.now() - t0;
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`${url}: ${res.status}`);
  return t;
}

async function warm(url: string, host?: string): Promise<{ p50: number; p99: number }> {
  for (let i = 0; i < 30; i++) await ttfb(url, host);
  const xs: number[] = [];
  for (let i = 0; i < N; i++) xs.push(await ttfb(url, host));
  return { p50: pct(xs, 50), p99: pct(xs, 99) };
}

function findFile(dir: string, name: string): string | null {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.name === "node_modules") continue;
    const p = join(dir, e.name);
    if (e.isFile() && e.name === name) return p;
    if (e.isDirectory()) {
      const hit = findFile(p, name);
      if (hit) return hit;
    }
  }
  return null;
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-next-"));
  const kiln = await startKiln(join(dir, "data"), [], { KILN_FRONTEND_IDLE_MS: String(IDLE_MS) });
  let bare: ReturnType<typeof spawn> | null = null;
  try {
    const p = (await api(kiln.url, "POST", "/projects", { name: "bench" })).body;
    const archive = execFileSync("tar", ["-czf", "-", "--exclude=node_modules", "--exclude=.next", "-C", join(ROOT, "test/fixtures/frontends/nextjs-app"), "."], { maxBuffer: 64 << 20 });
    const form = new FormData();
    form.set("name", "web");
    form.set("framework", "nextjs");
    form.set("archive", new Blob([new Uint8Array(archive)]), "app.tgz");
    const t0 = performance.now();
    const created = await fetch(`${kiln.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form });
    const f = (await created.json()) as any;
    if (created.status !== 201) throw new Error(`deploy: ${created.status} ${JSON.stringify(f)}`);
    let got: any;
    for (;;) {
      got = (await api(kiln.url, "GET", `/projects/${p.id}/frontends/${f.id}`)).body;
      if (got.status !== "provisioning") break;
      await Bun.sleep(100);
    }
    const deployToActive = performance.now() - t0;
    if (got.status !== "active") throw new Error(`deployment ${got.status}: ${JSON.stringify((await api(kiln.url, "GET", `/projects/${p.id}/frontends/${f.id}/deployments`)).body)}`);
    const site = new URL(got.site_url);
    const base = `http://127.0.0.1:${site.port}`;

    // Cold: the area warms a new deployment's server before the switch, so each sample waits for the
    // idle stop (IDLE_MS without requests) and then times the request that starts it again.
    const colds: number[] = [];
    for (let i = 0; i < COLD; i++) {
      await Bun.sleep(IDLE_MS + 1500);
      colds.push(await ttfb(`${base}/`, site.host));
    }
    const page = await warm(`${base}/`, site.host);
    const route = await warm(`${base}/api/hello`, site.host);

    // The same standalone server run bare on Node 22 (no sandbox, no proxy): the floor.
    const manifest = findFile(join(dir, "data"), "kiln-nextjs.json")!;
    const serverJs = join(dirname(manifest), (JSON.parse(readFileSync(manifest, "utf8")) as { entry: string }).entry);
    const node = join(cacheDir(), "runtimes/node22", (JSON.parse(readFileSync(join(cacheDir(), "runtimes/node22/kiln-runtime.json"), "utf8")) as { binary: string }).binary);
    const port = 20000 + Math.floor(Math.random() * 20000);
    bare = spawn(node, [serverJs], { cwd: dirname(serverJs), env: { PATH: "/usr/bin:/bin", PORT: String(port), HOSTNAME: "127.0.0.1", NODE_ENV: "production", NEXT_TELEMETRY_DISABLED: "1" }, stdio: "ignore" });
    for (let i = 0; i < 400; i++) {
      try {
        await fetch(`http://127.0.0.1:${port}/api/hello`);
        break;
      } catch {
        await Bun.sleep(50);
      }
    }
    const barePage = await warm(`http://127.0.0.1:${port}/`);
    const bareRoute = await warm(`http://127.0.0.1:${port}/api/hello`);

    const ms = (x: number) => `${x.toFixed(1)} ms`;
    console.log(`Next.js ${JSON.parse(readFileSync(manifest, "utf8")).nextVersion} on Node ${JSON.parse(readFileSync(manifest, "utf8")).nodeVersion}, ${N} sequential requests each, load average ${readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ")}`);
    console.log(`deploy-to-active (upload, npm ci from the cache, next build, switch): ${(deployToActive / 1000).toFixed(1)} s`);
    console.log(`cold TTFB (sandboxed server stopped when idle, started by the request): ${colds.map(ms).join(", ")} (median ${ms(pct(colds, 50))})`);
    console.log(`warm TTFB page /            via Kiln p50 ${ms(page.p50)} p99 ${ms(page.p99)}; bare Node p50 ${ms(barePage.p50)} p99 ${ms(barePage.p99)}`);
    console.log(`warm TTFB API /api/hello    via Kiln p50 ${ms(route.p50)} p99 ${ms(route.p99)}; bare Node p50 ${ms(bareRoute.p50)} p99 ${ms(bareRoute.p99)}`);
    console.log(`target warm TTFB p50 < 20 ms: ${page.p50 < 20 ? "met" : "NOT met"} (page ${ms(page.p50)})`);
  } finally {
    bare?.kill("SIGKILL");
    kiln.proc.kill("SIGTERM");
    await new Promise((r) => kiln.proc.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
