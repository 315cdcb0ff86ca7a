// Startup benchmark: spawn `kiln start` until the first 200 on /healthz, median of 10 runs, for a
// fresh data dir and for an existing one, and the server's RSS once started.
// Run: npm run bench:startup   (targets: existing < 500 ms, fresh < 1 s, RSS < 150 MB)
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import JSC_OPTIONS from "../cmd/jsc-options.json";

const ROOT = resolve(import.meta.dirname, "..");
const BUN = join(ROOT, "node_modules/.bin/bun");
const RUNS = Number(process.env.RUNS ?? 10);

function freePort(): Promise<number> {
  return new Promise((ok) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => ok(p));
    });
  });
}

async function startOnce(dataDir: string): Promise<{ ms: number; rssMb: number; proc: ChildProcess }> {
  const port = await freePort();
  const t0 = performance.now();
  const proc = spawn(BUN, [join(ROOT, "cmd/kiln.ts"), "start", "--port", String(port), "--pg-port", "0", "--data-dir", dataDir], {
    cwd: ROOT,
    env: { ...JSC_OPTIONS, ...process.env, KILN_PLATFORM_TOKEN: "pk-benchbenchbenchbenchbench", KILN_LOG: "quiet", KILN_TRACE_STARTUP: process.env.KILN_TRACE_STARTUP ?? "" },
    stdio: process.env.KILN_TRACE_STARTUP ? ["ignore", "ignore", "inherit"] : "ignore",
  });
  for (;;) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`);
      if (r.status === 200) break;
    } catch {}
    if (proc.exitCode !== null) throw new Error(`kiln exited with ${proc.exitCode}`);
    await new Promise((r) => setTimeout(r, 2));
  }
  const ms = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 300)); // let start-up settle before reading memory
  const status = readFileSync(`/proc/${proc.pid}/status`, "utf8");
  const rssMb = Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
  return { ms, rssMb, proc };
}

function stop(proc: ChildProcess): Promise<void> {
  return new Promise((ok) => {
    proc.once("exit", () => ok());
    proc.kill("SIGTERM");
  });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main() {
  const fresh: number[] = [];
  const existing: number[] = [];
  const rss: number[] = [];
  // Warm the template cache and the OS file cache once, outside the measurements.
  const warm = mkdtempSync(join(tmpdir(), "kiln-bench-"));
  await stop((await startOnce(warm)).proc);

  for (let i = 0; i < RUNS; i++) {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    const f = await startOnce(dir);
    fresh.push(f.ms);
    await stop(f.proc);
    const e = await startOnce(dir);
    existing.push(e.ms);
    rss.push(e.rssMb);
    await stop(e.proc);
    rmSync(dir, { recursive: true, force: true });
  }
  rmSync(warm, { recursive: true, force: true });
  const fmt = (x: number) => x.toFixed(0);
  console.log(`startup (spawn -> first 200 on /healthz), median of ${RUNS}:`);
  console.log(`  fresh data dir:    ${fmt(median(fresh))} ms   (target < 1000 ms)  runs: ${fresh.map(fmt).join(" ")}`);
  console.log(`  existing data dir: ${fmt(median(existing))} ms   (target < 500 ms)   runs: ${existing.map(fmt).join(" ")}`);
  console.log(`  RSS after start:   ${fmt(median(rss))} MB    (target < 150 MB)`);
}

await main();
