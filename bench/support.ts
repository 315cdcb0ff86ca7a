// Shared by the benchmarks: a real `kiln start` to measure, percentiles, and wrk load.
import { spawn, type ChildProcess } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import postgres from "postgres";
import { makeSecretKey, parseKey } from "../server/secrets/secret-key";

export const ROOT = resolve(import.meta.dirname, "..");
export const BUN = join(ROOT, "node_modules/.bin/bun");
export const TOKEN = "pk-benchbenchbenchbenchbench";

/** `kiln start` on free ports in `dataDir` (and `args`), resolved once it prints its listening line. */
export async function startKiln(dataDir: string, args: string[] = [], env: Record<string, string> = {}): Promise<{ url: string; proc: ChildProcess }> {
  // KILN_BENCH_CPU_PROF=<dir>: Kiln writes a CPU profile (markdown) there when it exits.
  const prof = process.env.KILN_BENCH_CPU_PROF ? ["--cpu-prof-md", `--cpu-prof-dir=${process.env.KILN_BENCH_CPU_PROF}`] : [];
  const proc = spawn(BUN, [...prof, join(ROOT, "cmd/kiln.ts"), "start", "--port", "0", "--pg-port", "0", "--data-dir", dataDir, ...args], {
    cwd: ROOT,
    // As `npx kiln start` runs it: Bun's own JavaScriptCore thresholds (a server, not a test fixture).
    env: { ...process.env, KILN_PLATFORM_TOKEN: TOKEN, KILN_LOG: "quiet", ...env },
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

/** The secret key the production-profile benches give Kiln (tenant role passwords derive from it). */
export const BENCH_SECRET_KEY = "9mXo0r1y2gq0bJ7wO2jA3pXv6tK8yL4sQ1dF5hN7uE0=";

/** A tenant role's password as Kiln derives it from BENCH_SECRET_KEY (to connect past Kiln's proxy). */
export function benchTenantPassword(role: string): string {
  return makeSecretKey(parseKey(BENCH_SECRET_KEY, "bench key")).derive(`postgres tenant role ${role}`);
}

/**
 * On a PostgreSQL server of the bench's own: Kiln's least-privilege operator role (LOGIN CREATEDB
 * CREATEROLE, docs/production.md) and its control database; `kilnArgs` start Kiln on them.
 */
export async function operatorRole(serverUrl: string) {
  const admin = postgres(serverUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create role kiln_op login password 'op-password' createdb createrole`);
  await admin.unsafe(`create database kiln_control owner kiln_op`);
  const opUrl = (db: string) => {
    const u = new URL(serverUrl);
    u.username = "kiln_op";
    u.password = "op-password";
    u.pathname = `/${db}`;
    return u.toString();
  };
  return { admin, kilnArgs: ["--database-url", opUrl("kiln_control"), "--postgres-url", opUrl("postgres")] };
}
