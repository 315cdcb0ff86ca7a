// Functions benchmark: deploy-to-active for a function without dependencies, cold start, warm invoke
// p50/p99 through the whole HTTP path, and throughput against a bare Bun server answering the same
// JSON (ratio in one run). Throughput uses wrk when installed (apt-get install wrk), else fetch.
// Run: npm run bench:functions
// Targets: warm p50 < 2 ms, throughput >= 40% of the bare server, cold start < 150 ms, deploy-to-active < 1 s,
// and a warm invoke in a project with 8,000 variables (VARIABLES=n to change) within 2x + 2 ms of one
// in a project with none, back to back and after a pause longer than the server's 2 s caches.
//
// Fairness of the throughput pair: both servers get the same load (wrk -t1 -c8 -d5s, one client
// thread so the servers keep most of the 2 cores) and the same JSON, each in its own process. Kiln
// runs with its defaults (up to 4 warm workers per function version, logs written every second)
// and, like the bare server, gets a concurrent warm-up first: the measured run is warm invocations,
// not the 3 worker starts that 8 concurrent requests would otherwise trigger inside it.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BUN, pct, startKiln, TOKEN, wrkRps } from "./support";

const N = Number(process.env.INVOCATIONS ?? 2000);
const VARIABLES = Number(process.env.VARIABLES ?? 8000);

async function fetchRps(url: string, init: RequestInit): Promise<number> {
  let i = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: 8 }, async () => {
    while (i++ < N) await (await fetch(url, init)).text();
  }));
  return N / ((performance.now() - t0) / 1000);
}

/** 8 concurrent clients for a moment: starts every worker that load will use and warms the JIT. */
async function warmUp(url: string, init: RequestInit): Promise<void> {
  await Promise.all(Array.from({ length: 8 }, async () => {
    for (let i = 0; i < 250; i++) await (await fetch(url, init)).text();
  }));
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-fn-"));
  const { url, proc } = await startKiln(dir);
  const api = async (method: string, path: string, body?: unknown) =>
    (await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined })).json() as Promise<any>;
  const project = await api("POST", "/projects", { name: "bench" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key;

  // The function's source, packed once.
  const src = mkdtempSync(join(tmpdir(), "kiln-bench-src-"));
  writeFileSync(join(src, "index.js"), `exports.handler = async (e) => ({ ok: true, n: e?.n ?? 0 });`);
  execFileSync("tar", ["-czf", join(src, "code.tgz"), "-C", src, "index.js"]);
  const code = readFileSync(join(src, "code.tgz"));

  const deployMs: number[] = [];
  const coldMs: number[] = [];
  let fnId = "";
  for (let i = 0; i < 5; i++) {
    const form = new FormData();
    form.set("name", `fn${i}`);
    form.set("runtime", "nodejs22.x");
    form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
    const t0 = performance.now();
    let fn = (await (await fetch(`${url}/projects/${project.id}/functions`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form })).json()) as any;
    while (fn.status === "provisioning") {
      await new Promise((r) => setTimeout(r, 5));
      fn = await api("GET", `/projects/${project.id}/functions/${fn.id}`);
    }
    if (fn.status !== "active") throw new Error(`deploy failed: ${JSON.stringify(fn)}`);
    deployMs.push(performance.now() - t0);
    const c0 = performance.now();
    await (await fetch(`${url}/functions/${fn.id}/invoke`, { method: "POST", headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" }, body: '{"payload":{}}' })).text();
    coldMs.push(performance.now() - c0);
    fnId = fn.id;
  }

  const invokeInit: RequestInit = { method: "POST", headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" }, body: '{"payload":{"n":1}}' };
  for (let i = 0; i < 200; i++) await (await fetch(`${url}/functions/${fnId}/invoke`, invokeInit)).text();
  const warm: number[] = [];
  for (let i = 0; i < N; i++) {
    const t = performance.now();
    await (await fetch(`${url}/functions/${fnId}/invoke`, invokeInit)).text();
    warm.push(performance.now() - t);
  }
  await warmUp(`${url}/functions/${fnId}/invoke`, invokeInit);
  const kilnRps = wrkRps(`${url}/functions/${fnId}/invoke`, { Authorization: `Bearer ${sk}`, "Content-Type": "application/json" }, '{"payload":{"n":1}}') ?? (await fetchRps(`${url}/functions/${fnId}/invoke`, invokeInit));

  // The bare server runs in its own process, as Kiln does, so the load generator never blocks it.
  const bare = spawn(BUN, ["-e", `const s = Bun.serve({ port: 0, fetch: async (req) => Response.json({ ok: true, n: (await req.json())?.payload?.n ?? 0 }) }); console.log(s.port);`], { stdio: ["ignore", "pipe", "inherit"] });
  const barePort = await new Promise<string>((ok) => bare.stdout!.once("data", (d) => ok(String(d).trim())));
  const bareUrl = `http://127.0.0.1:${barePort}/`;
  const bareInit: RequestInit = { method: "POST", headers: { "content-type": "application/json" }, body: '{"payload":{"n":1}}' };
  await warmUp(bareUrl, bareInit);
  const bareRps = wrkRps(bareUrl, { "Content-Type": "application/json" }, '{"payload":{"n":1}}') ?? (await fetchRps(bareUrl, bareInit));
  bare.kill();

  // The same function in a project with VARIABLES variables, against the one above (none), interleaved.
  const many = await api("POST", "/projects", { name: "bench-variables" });
  const manySk = (await api("POST", `/projects/${many.id}/service-keys`, { name: "bench" })).key;
  let next = 0;
  await Promise.all(Array.from({ length: 8 }, async () => {
    while (next < VARIABLES) {
      const i = next++;
      const r = await fetch(`${url}/projects/${many.id}/variables`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name: `V${i}`, value: `value-${i}-${"x".repeat(24)}` }) });
      if (r.status !== 201) throw new Error(`variable: ${r.status} ${await r.text()}`);
      await r.text();
    }
  }));
  const form = new FormData();
  form.set("name", "fn");
  form.set("runtime", "nodejs22.x");
  form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
  let manyFn = (await (await fetch(`${url}/projects/${many.id}/functions`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form })).json()) as any;
  while (manyFn.status === "provisioning") {
    await new Promise((r) => setTimeout(r, 5));
    manyFn = await api("GET", `/projects/${many.id}/functions/${manyFn.id}`);
  }
  const manyInit: RequestInit = { ...invokeInit, headers: { authorization: `Bearer ${manySk}`, "content-type": "application/json" } };
  const call = async (id: string, init: RequestInit) => {
    const t = performance.now();
    await (await fetch(`${url}/functions/${id}/invoke`, init)).text();
    return performance.now() - t;
  };
  for (let i = 0; i < 200; i++) await Promise.all([call(fnId, invokeInit), call(manyFn.id, manyInit)]);
  const vars = { none: [] as number[], many: [] as number[], nonePaused: [] as number[], manyPaused: [] as number[] };
  for (let i = 0; i < Math.min(N, 1000); i++) {
    vars.none.push(await call(fnId, invokeInit));
    vars.many.push(await call(manyFn.id, manyInit));
  }
  for (let i = 0; i < 8; i++) {
    await new Promise((r) => setTimeout(r, 2200));
    if (i % 2) vars.manyPaused.push(await call(manyFn.id, manyInit)), vars.nonePaused.push(await call(fnId, invokeInit));
    else vars.nonePaused.push(await call(fnId, invokeInit)), vars.manyPaused.push(await call(manyFn.id, manyInit));
  }

  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
  rmSync(src, { recursive: true, force: true });

  const f = (x: number) => x.toFixed(2);
  console.log(`deploy -> active (no dependencies, 5 functions): median ${pct(deployMs, 50).toFixed(0)} ms   (target < 1000 ms)`);
  console.log(`cold start (first invocation of a new deployment): median ${pct(coldMs, 50).toFixed(0)} ms   (target < 150 ms)`);
  console.log(`warm invoke through HTTP, ${N} sequential: p50 ${f(pct(warm, 50))} ms  p99 ${f(pct(warm, 99))} ms   (target p50 < 2 ms)`);
  console.log(`warm invoke p50, 0 vs ${VARIABLES} project variables: back to back ${f(pct(vars.none, 50))} vs ${f(pct(vars.many, 50))} ms, after a 2.2 s pause ${f(pct(vars.nonePaused, 50))} vs ${f(pct(vars.manyPaused, 50))} ms   (target: within 2x + 2 ms)`);
  console.log(`throughput, 8 concurrent (${Bun.which("wrk") ? "wrk" : "fetch client"}): Kiln ${kilnRps.toFixed(0)} req/s, bare Bun server ${bareRps.toFixed(0)} req/s, ratio ${((kilnRps / bareRps) * 100).toFixed(0)}%   (target >= 40%)`);
}

await main();
