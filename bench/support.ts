// Shared by the benchmarks: a real `kiln start` to measure, percentiles, and wrk load.
import { spawn, type ChildProcess } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import JSC_OPTIONS from "../cmd/jsc-options.json";

export const ROOT = resolve(import.meta.dirname, "..");
export const BUN = join(ROOT, "node_modules/.bin/bun");
export const TOKEN = "pk-benchbenchbenchbenchbench";

/** `kiln start` on free ports in `dataDir` (and `args`), resolved once it prints its listening line. */
export async function startKiln(dataDir: string, args: string[] = [], env: Record<string, string> = {}): Promise<{ url: string; proc: ChildProcess }> {
  const proc = spawn(BUN, [join(ROOT, "cmd/kiln.ts"), "start", "--port", "0", "--pg-port", "0", "--data-dir", dataDir, ...args], {
    cwd: ROOT,
    env: { ...JSC_OPTIONS, ...process.env, KILN_PLATFORM_TOKEN: TOKEN, KILN_LOG: "quiet", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  // A Kiln that exits before it listens (a bad flag, a busy port) fails the bench instead of hanging it.
  const url = await new Promise<string>((ok, fail) => {
    let out = "";
    proc.stdout!.on("data", (d) => {
      out += d;
      const m = /Kiln listening on (\S+)/.exec(out);
      if (m) ok(m[1]!);
    });
    proc.once("exit", (code, signal) => fail(new Error(`kiln start exited (${signal ?? code}) before listening:\n${out}`)));
  });
  return { url, proc };
}

export const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))]!;

/**
 * Requests per second of POSTs with wrk (Debian package `wrk`, 8 connections, 5 s) when installed:
 * a native client leaves the two cores to the server, as a separate load machine would. null without
 * wrk, so callers fall back to a fetch client that shares the CPU.
 */
export function wrkRps(url: string, headers: Record<string, string>, body: string): number | null {
  if (!Bun.which("wrk")) return null;
  const script = join(tmpdir(), `kiln-wrk-${process.pid}-${Date.now()}.lua`);
  writeFileSync(script, `wrk.method = "POST"\nwrk.body = '${body}'\n` + Object.entries(headers).map(([k, v]) => `wrk.headers["${k}"] = "${v}"`).join("\n") + "\n");
  try {
    const out = Bun.spawnSync(["wrk", "-t1", "-c8", "-d5s", "-s", script, url]).stdout.toString();
    const m = /Requests\/sec:\s+([\d.]+)/.exec(out);
    return m ? Number(m[1]) : null;
  } finally {
    rmSync(script, { force: true });
  }
}
