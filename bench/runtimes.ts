// Runtimes benchmark (issue 30): per runtime name, deploy-to-active, cold start (first invocation of
// a fresh deployment: a worker started in the sandbox) and warm invoke p50 through the whole HTTP
// path; and a first-ever install of one runtime root (FIRST_EVER=python3.13: downloads from Debian,
// so not run by default) against the cached case.
// Run: bun bench/runtimes.ts   (SANDBOX=namespaces|bubblewrap, RUNTIMES=a,b, INVOCATIONS=n, COLD=n)
// Targets: cold start < 150 ms for Node and Python, < 300 ms for Ruby; warm p50 < 2 ms.
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT_RECIPES } from "../runtime-sandbox/runtime-roots";
import { RUNTIME_NAMES } from "../runtime-sandbox/runtimes";
import { pct, startKiln, TOKEN } from "./support";

const N = Number(process.env.INVOCATIONS ?? 300);
// Cold starts per runtime (each a fresh deployment): the p50 of 9 moves less with the machine than of 5.
const COLD = Number(process.env.COLD ?? 9);
const SOURCES = {
  node: ["index.js", "exports.handler = async (e) => ({ ok: true, n: e?.n ?? 0 });"],
  python: ["main.py", "def handler(event, context):\n    return {'ok': True, 'n': (event or {}).get('n', 0)}\n"],
  ruby: ["main.rb", "def handler(event:, context:)\n  { 'ok' => true, 'n' => (event || {})['n'] || 0 }\nend\n"],
} as const;

function pack(kind: keyof typeof SOURCES): Buffer {
  const src = mkdtempSync(join(tmpdir(), "kiln-bench-rt-"));
  writeFileSync(join(src, SOURCES[kind][0]), SOURCES[kind][1]);
  execFileSync("tar", ["-czf", join(src, "code.tgz"), "-C", src, SOURCES[kind][0]]);
  const b = readFileSync(join(src, "code.tgz"));
  rmSync(src, { recursive: true, force: true });
  return b;
}

async function main() {
  const loadBefore = loadavg().map((x) => x.toFixed(2)).join(" ");
  const names = process.env.RUNTIMES ? process.env.RUNTIMES.split(",") : RUNTIME_NAMES;
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-runtimes-"));
  const args = process.env.SANDBOX ? ["--function-sandbox", process.env.SANDBOX] : [];
  const { url, proc } = await startKiln(dir, args, { KILN_RUNTIME_INSTALL: process.env.FIRST_EVER ? "on" : "off" });
  const api = async (method: string, path: string, body?: unknown) =>
    (await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined })).json() as Promise<any>;
  const project = await api("POST", "/projects", { name: "bench" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key;
  const invoke = (id: string) =>
    fetch(`${url}/functions/${id}/invoke`, { method: "POST", headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" }, body: '{"payload":{"n":1}}' }).then((r) => r.text());

  async function deployOnce(name: string, runtime: string, code: Buffer): Promise<{ id: string; ms: number; error?: string }> {
    const form = new FormData();
    form.set("name", name);
    form.set("runtime", runtime);
    form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
    const t0 = performance.now();
    let fn = (await (await fetch(`${url}/projects/${project.id}/functions`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form })).json()) as any;
    while (fn.status === "provisioning") {
      await new Promise((r) => setTimeout(r, 5));
      fn = await api("GET", `/projects/${project.id}/functions/${fn.id}`);
    }
    const ms = performance.now() - t0;
    if (fn.status !== "active") {
      const deps = await api("GET", `/projects/${project.id}/functions/${fn.id}/deployments`);
      return { id: fn.id, ms, error: deps.data?.[0]?.error ?? fn.status };
    }
    return { id: fn.id, ms };
  }

  const rows: Array<Record<string, string | number>> = [];
  try {
    for (const runtime of names) {
      const kind = runtime.startsWith("nodejs") ? "node" : runtime.startsWith("python") ? "python" : "ruby";
      const code = pack(kind);
      const deploy: number[] = [];
      const cold: number[] = [];
      let id = "";
      let error: string | undefined;
      for (let i = 0; i < COLD && !error; i++) {
        const d = await deployOnce(`${runtime.replace(/\W/g, "-")}-${i}`, runtime, code);
        if (d.error) {
          error = d.error;
          break;
        }
        deploy.push(d.ms);
        const c0 = performance.now();
        await invoke(d.id);
        cold.push(performance.now() - c0);
        id = d.id;
      }
      if (error) {
        rows.push({ runtime, result: `not served: ${error.slice(0, 90)}` });
        continue;
      }
      for (let i = 0; i < 50; i++) await invoke(id);
      const warm: number[] = [];
      for (let i = 0; i < N; i++) {
        const t = performance.now();
        await invoke(id);
        warm.push(performance.now() - t);
      }
      const target = kind === "ruby" ? 300 : 150;
      rows.push({
        runtime,
        served_by: kind === "node" ? "npm node" : ROOT_RECIPES[runtime] ? "runtime root" : "host interpreter",
        deploy_p50_ms: Math.round(pct(deploy, 50)),
        cold_p50_ms: Math.round(pct(cold, 50)),
        cold_target: `< ${target} ${pct(cold, 50) < target ? "ok" : "MISSED"}`,
        warm_p50_ms: Number(pct(warm, 50).toFixed(2)),
        warm_target: `< 2 ${pct(warm, 50) < 2 ? "ok" : "MISSED"}`,
      });
    }
  } finally {
    // Its data dir goes once Kiln has stopped (removed under it, its last flushes print errors).
    const exited = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    await exited;
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(`sandbox: ${process.env.SANDBOX ?? "auto"}, ${COLD} cold starts per runtime, load average before/after: ${loadBefore} / ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  console.table(rows);

  await sandboxSetup();

  // First-ever install of one root (network: Debian's mirror) against the cached lookup.
  const first = process.env.FIRST_EVER;
  if (first) {
    const cache = mkdtempSync(join(tmpdir(), "kiln-bench-cache-"));
    const { ensureRoot } = await import("../runtime-sandbox/runtime-roots");
    const { probeRoot } = await import("../runtime-sandbox/runtimes");
    const t0 = performance.now();
    const r = await ensureRoot(cache, first, probeRoot);
    const firstMs = performance.now() - t0;
    const t1 = performance.now();
    await ensureRoot(cache, first, probeRoot);
    const cachedMs = performance.now() - t1;
    console.log(`first-ever ${first} root: ${Math.round(firstMs)} ms (${"missing" in r ? r.missing : `${(r.bytes / 1e6).toFixed(0)} MB`}); cached: ${cachedMs.toFixed(2)} ms`);
    rmSync(cache, { recursive: true, force: true });
  }
}

/**
 * Where a cold start's time goes before the runtime: one sandbox around `/bin/true` and around
 * `node -e 0` (the nodejs22.x runtime, a worker's mount plan), bubblewrap against the namespaces
 * sandbox with its set-up done by the seccomp loader (one Perl process) and by the util-linux tools
 * (ln, ip, pivot_root, umount, mount, setpriv, unshare), interleaved so load hits each alike.
 * SETUP_RUNS=n (30), SETUP_RUNS=0 skips it.
 */
async function sandboxSetup() {
  const runs = Number(process.env.SETUP_RUNS ?? 30);
  if (!runs) return;
  const { chooseIsolation } = await import("../runtime-sandbox/isolation");
  const { sandboxMounts } = await import("../runtime-sandbox/mounts");
  const { resolveRuntime, isMissing } = await import("../runtime-sandbox/runtimes");
  const node = await resolveRuntime("nodejs22.x");
  if (isMissing(node)) return console.log(`sandbox set-up: skipped (${node.missing})`);
  const code = mkdtempSync(join(tmpdir(), "kiln-bench-setup-"));
  writeFileSync(join(code, "index.js"), "");
  const e = { mounts: sandboxMounts({ runtime: node, codeDir: code, network: false }, []), network: false, tmpfsBytes: 16 << 20, hostname: "kiln-function", chdir: "/var/task" };
  const kinds: Record<string, (cmd: string[]) => string[]> = {};
  const bw = chooseIsolation({ want: "bubblewrap", allowUnsandboxed: false }).isolation;
  if (bw) kinds.bubblewrap = (cmd) => bw.enclose(e, cmd).argv;
  const ns = chooseIsolation({ want: "namespaces", allowUnsandboxed: false }).isolation;
  if (ns) {
    kinds["namespaces (loader)"] = (cmd) => ns.enclose(e, cmd).argv;
    kinds["namespaces (tools)"] = (cmd) => ns.enclose(e, cmd).argv.filter((a) => a !== "--setup-by-loader");
  }
  const rows: Array<Record<string, string | number>> = [];
  for (const [what, cmd] of [["/bin/true", ["/bin/true"]], ["node -e 0", [node.command, "-e", "0"]]] as const) {
    const t: Record<string, number[]> = {};
    for (let i = 0; i < runs; i++) {
      for (const [k, argv] of Object.entries(kinds)) {
        const a = argv([...cmd]);
        const t0 = performance.now();
        const r = spawnSync(a[0]!, a.slice(1), { stdio: "ignore", env: { PATH: "/usr/bin:/bin" }, cwd: "/" });
        (t[k] ??= []).push(performance.now() - t0);
        if (r.status !== 0) throw new Error(`sandbox set-up: ${k} exited ${r.status}`);
      }
    }
    for (const [k, v] of Object.entries(t)) rows.push({ command: what, sandbox: k, p50_ms: Number(pct(v, 50).toFixed(1)), min_ms: Number(Math.min(...v).toFixed(1)) });
  }
  rmSync(code, { recursive: true, force: true });
  console.log(`sandbox set-up alone (${runs} runs each, interleaved), load average now ${loadavg().map((x) => x.toFixed(2)).join(" ")}:`);
  console.table(rows);
}

await main();
process.exit(0);
