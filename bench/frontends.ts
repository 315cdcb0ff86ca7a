// Frontends benchmark: a static site's asset through Kiln's whole HTTP path (host routing, the
// deployment's manifest, ETag, the file sent) against a bare Bun server sending the same file with
// Bun.file (requests/s and p99 in one run, ratio), and static deploy-to-active (POST to `active`).
// Run: npm run bench:frontends
// Targets: static >= 50% of the bare server's requests/s; static deploy-to-active < 1 s.
//
// Fairness: each server in its own process; the same client (8 concurrent fetch loops in this
// process, N requests each round, after a warm-up) for both, asking for the identity encoding (the
// bare server has no compressed variant); wrk (apt-get install wrk) is used instead when installed.
import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BUN, pct, startKiln, TOKEN } from "./support";

const N = Number(process.env.REQUESTS ?? 4000);
const ASSET = "/assets/app-3f2a9c1eB.js";

async function load(url: string, headers: Record<string, string>): Promise<{ rps: number; p50: number; p99: number }> {
  const lat: number[] = [];
  let i = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (i++ < N) {
        const s = performance.now();
        const r = await fetch(url, { headers });
        await r.arrayBuffer();
        if (r.status !== 200) throw new Error(`${url}: ${r.status}`);
        lat.push(performance.now() - s);
      }
    }),
  );
  return { rps: N / ((performance.now() - t0) / 1000), p50: pct(lat, 50), p99: pct(lat, 99) };
}

function wrk(url: string, host: string): { rps: number; p99: number } | null {
  if (!Bun.which("wrk")) return null;
  const out = Bun.spawnSync(["wrk", "-t1", "-c8", "-d5s", "--latency", "-H", `Host: ${host}`, url]).stdout.toString();
  const rps = /Requests\/sec:\s+([\d.]+)/.exec(out);
  const p99 = /99%\s+([\d.]+)(us|ms|s)/.exec(out);
  if (!rps || !p99) return null;
  const ms = Number(p99[1]) * (p99[2] === "us" ? 0.001 : p99[2] === "s" ? 1000 : 1);
  return { rps: Number(rps[1]), p99: ms };
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-fe-"));
  const src = join(dir, "site");
  mkdirSync(join(src, "assets"), { recursive: true });
  writeFileSync(join(src, "index.html"), `<!doctype html><script src="${ASSET}"></script>`);
  const asset = `/* bench */\n${"console.log('kiln frontends bench');\n".repeat(300)}`; // ~11 KB
  writeFileSync(join(src, ASSET.slice(1)), asset);
  execFileSync("tar", ["-czf", join(dir, "site.tgz"), "-C", src, "."]);
  const archive = readFileSync(join(dir, "site.tgz"));

  const { url, proc } = await startKiln(join(dir, "data"));
  const bare = spawn(BUN, ["-e", `const s = Bun.serve({ port: 0, fetch: () => new Response(Bun.file(${JSON.stringify(join(src, ASSET.slice(1)))})) }); console.log(s.port);`], { stdio: ["ignore", "pipe", "inherit"] });
  const barePort = await new Promise<number>((ok) => bare.stdout!.once("data", (d) => ok(Number(String(d).trim()))));
  try {
    const api = async (method: string, path: string, body?: BodyInit) => (await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}` }, body })).json() as Promise<any>;
    const project = await api("POST", "/projects", new Blob([JSON.stringify({ name: "bench" })], { type: "application/json" }));

    // Deploy-to-active: POST (create, then updates of the same frontend) until GET says it serves the new deployment.
    const deployMs: number[] = [];
    let site = "";
    for (let i = 0; i < 6; i++) {
      const form = new FormData();
      form.set("name", "bench");
      form.set("archive", new Blob([new Uint8Array(archive)]), "site.tgz");
      const t0 = performance.now();
      const f = await api("POST", `/projects/${project.id}/frontends`, form);
      const want = f.pending_deployment_id ?? f.current_deployment_id;
      for (;;) {
        const g = await api("GET", `/projects/${project.id}/frontends/${f.id}`);
        if (g.status === "active" && g.current_deployment_id === want && !g.pending_deployment_id) {
          site = g.site_url;
          break;
        }
        if (g.status === "failed") throw new Error(`deployment failed: ${JSON.stringify(g)}`);
        await new Promise((r) => setTimeout(r, 5));
      }
      deployMs.push(performance.now() - t0);
    }
    const host = new URL(site).host;
    const kilnUrl = `${url}${ASSET}`;
    const bareUrl = `http://127.0.0.1:${barePort}${ASSET}`;
    const check = await fetch(kilnUrl, { headers: { host, "accept-encoding": "identity" } });
    if (check.status !== 200 || (await check.text()) !== asset) throw new Error("Kiln does not serve the asset");

    let k: { rps: number; p99: number };
    let b: { rps: number; p99: number };
    const wk = wrk(kilnUrl, host);
    if (wk) {
      b = wrk(bareUrl, "127.0.0.1")!;
      k = wk;
    } else {
      await load(kilnUrl, { host, "accept-encoding": "identity" });
      await load(bareUrl, { "accept-encoding": "identity" });
      k = await load(kilnUrl, { host, "accept-encoding": "identity" });
      b = await load(bareUrl, { "accept-encoding": "identity" });
    }
    const ratio = k.rps / b.rps;
    const deploy = pct(deployMs.slice(1), 50);
    console.log(`client: ${wk ? "wrk -t1 -c8 -d5s" : `fetch, 8 concurrent, ${N} requests`}; asset ${asset.length} bytes`);
    console.log(`static asset via Kiln:  ${k.rps.toFixed(0)} req/s, p99 ${k.p99.toFixed(2)} ms`);
    console.log(`same file, bare Bun:    ${b.rps.toFixed(0)} req/s, p99 ${b.p99.toFixed(2)} ms`);
    console.log(`ratio: ${(ratio * 100).toFixed(0)}% of bare (target >= 50%) ${ratio >= 0.5 ? "OK" : "MISSED"}`);
    console.log(`static deploy-to-active: first ${deployMs[0]!.toFixed(0)} ms (creates), then median ${deploy.toFixed(0)} ms of ${deployMs.length - 1} updates (target < 1000 ms) ${deploy < 1000 ? "OK" : "MISSED"}`);
  } finally {
    bare.kill();
    proc.kill("SIGTERM");
    await new Promise((r) => proc.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
