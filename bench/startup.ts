// Startup benchmark, for two launch paths: the compiled binary (dist/kiln, `npm run build:binary`;
// built here when missing) and the `kiln` bin that `npx kiln start` runs (node cmd/kiln.mjs, which
// starts cmd/kiln.ts under the bundled Bun). For each: spawn `kiln start` until the first 200 on
// /healthz with a fresh data dir and with an existing one (median of RUNS), the server's RSS once
// started and idle, and the CPU time of a whole start+stop (user + system of the process tree, from
// wait4). Prints the load average too: on a shared machine compare the paths' ratios, not the figures.
// Run: npm run bench:startup   (targets: existing < 300 ms, fresh < 500 ms, RSS < 120 MB, start+stop < 1 CPU-s)
// PATHS=binary or PATHS=npx runs one path; KILN_TRACE_STARTUP=1 prints each start's phases.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import JSC_OPTIONS from "../cmd/jsc-options.json";
import { freePort } from "../test/support/free-port";

const ROOT = resolve(import.meta.dirname, "..");
const RUNS = Number(process.env.RUNS ?? 5);
const BINARY = process.env.KILN_BINARY ?? join(ROOT, "dist/kiln");
const PATHS = (process.env.PATHS ?? "binary,npx").split(",");
const TOKEN = "pk-benchbenchbenchbenchbench";


function command(path: string): string[] {
  return path === "binary" ? [BINARY] : ["node", join(ROOT, "cmd/kiln.mjs")];
}

interface Run {
  ms: number;
  /** To the first answer of an API route (GET /projects with the platform token), after /healthz. */
  apiMs: number;
  rssMb: number;
  cpuMs: number;
}

/** RSS of the Kiln server process: the binary itself, or the Bun child of the node shim. */
function serverRss(pid: number, shim: boolean): number {
  const kids = !shim ? [] : (() => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
    } catch {
      return [];
    }
  })();
  const target = kids.length ? kids[0]! : pid;
  return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${target}/status`, "utf8"))![1]) / 1024;
}

async function startStop(path: string, dataDir: string): Promise<Run> {
  const port = await freePort();
  const t0 = performance.now();
  const proc = Bun.spawn([...command(path), "start", "--port", String(port), "--pg-port", "0", "--smtp-port", "0", "--data-dir", dataDir], {
    cwd: path === "binary" ? tmpdir() : ROOT,
    // The test fixture's JavaScriptCore settings (kiln/testing sets them): issue 31's start targets are Kiln's as a test fixture.
    env: { ...JSC_OPTIONS, ...process.env, KILN_PLATFORM_TOKEN: TOKEN, KILN_LOG: "quiet", KILN_TRACE_STARTUP: process.env.KILN_TRACE_STARTUP ?? "" },
    stdio: ["ignore", "ignore", process.env.KILN_TRACE_STARTUP ? "inherit" : "ignore"],
  });
  for (;;) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`);
      if (r.status === 200) break;
    } catch {}
    if (proc.exitCode !== null) throw new Error(`kiln exited with ${proc.exitCode}`);
    if (performance.now() - t0 > 120_000) {
      proc.kill("SIGKILL");
      throw new Error("kiln did not answer /healthz in 120 s");
    }
    await Bun.sleep(2);
  }
  const ms = performance.now() - t0;
  // /healthz answers before the areas' deferred start-up work is done (server/main.ts); an API request
  // waits for it: this is when Kiln really serves.
  const api = await fetch(`http://127.0.0.1:${port}/projects`, { headers: { authorization: `Bearer ${TOKEN}` } });
  if (api.status !== 200) throw new Error(`GET /projects answered ${api.status}: ${await api.text()}`);
  const apiMs = performance.now() - t0;
  let rssMb: number;
  try {
    await Bun.sleep(500); // idle: let start-up settle before reading memory
    rssMb = serverRss(proc.pid, path !== "binary");
  } finally {
    proc.kill("SIGTERM");
    await proc.exited;
  }
  const u = proc.resourceUsage()!;
  const cpuMs = Number(u.cpuTime.user + u.cpuTime.system) / 1000;
  return { ms, apiMs, rssMb, cpuMs };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (x: number) => x.toFixed(0);

async function main() {
  if (PATHS.includes("binary") && !existsSync(BINARY)) {
    const b = Bun.spawnSync([process.execPath, join(ROOT, "cmd/build-binary.ts"), BINARY], { stdout: "inherit", stderr: "inherit" });
    if (b.exitCode !== 0) throw new Error("build:binary failed");
  }
  console.log(`load average before: ${loadavg().map((l) => l.toFixed(1)).join(" ")} (${navigator.hardwareConcurrency} cores)`);
  for (const path of PATHS) {
    // Warm the template cache and the OS file cache once, outside the measurements.
    const warm = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    await startStop(path, warm);
    rmSync(warm, { recursive: true, force: true });
    const fresh: Run[] = [];
    const existing: Run[] = [];
    for (let i = 0; i < RUNS; i++) {
      const dir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
      fresh.push(await startStop(path, dir));
      existing.push(await startStop(path, dir));
      rmSync(dir, { recursive: true, force: true });
    }
    const col = (rs: Run[], k: keyof Run) => rs.map((r) => fmt(r[k])).join(" ");
    console.log(`${path === "binary" ? "binary (dist/kiln)" : "kiln bin (node cmd/kiln.mjs, what npx kiln runs)"}, median of ${RUNS}:`);
    console.log(`  fresh data dir:      ${fmt(median(fresh.map((r) => r.ms)))} ms to /healthz (target < 500)   runs: ${col(fresh, "ms")}`);
    console.log(`  existing data dir:   ${fmt(median(existing.map((r) => r.ms)))} ms to /healthz (target < 300)   runs: ${col(existing, "ms")}`);
    console.log(`  first API answer:    ${fmt(median(fresh.map((r) => r.apiMs)))} ms fresh, ${fmt(median(existing.map((r) => r.apiMs)))} ms existing (GET /projects, after /healthz)   runs: ${col(fresh, "apiMs")} / ${col(existing, "apiMs")}`);
    console.log(`  idle RSS:            ${fmt(median(existing.map((r) => r.rssMb)))} MB (target < 120)   runs: ${col(existing, "rssMb")}`);
    console.log(`  start+stop CPU:      ${fmt(median(existing.map((r) => r.cpuMs)))} ms existing, ${fmt(median(fresh.map((r) => r.cpuMs)))} ms fresh (target < 1000)`);
  }
  console.log(`load average after: ${loadavg().map((l) => l.toFixed(1)).join(" ")}`);
}

await main();
