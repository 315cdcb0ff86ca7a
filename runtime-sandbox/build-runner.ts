import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { ResolvedRuntime } from "./runtimes";
import { detectBwrap, planBuild } from "./sandbox";

/**
 * Runs one dependency installer (npm, pip, bundler) of a function build: in the build sandbox
 * (planBuild), in its own process group recorded beside the build folder, with a time limit, and
 * stopped when Kiln stops. What to install, and when, is the functions area's (server/functions/builds.ts).
 */

export type BuildLog = (level: "info" | "error", line: string) => Promise<void>;

export interface BuildOptions {
  /** Never visible to a build (Kiln's data dir). */
  hiddenPaths: string[];
  /** false: run installers on the host (no bubblewrap, or the pool runs without isolation). */
  sandbox: boolean;
  /** Kiln is stopping: the installer is killed and the build fails as interrupted. */
  signal?: AbortSignal;
}

// Registry, mirror, proxy and TLS trust settings a build may need (a proxy that re-signs TLS needs
// its CA); nothing else of Kiln's environment goes in.
const PASSED_THROUGH = /^(npm_config_(registry|cafile)|NPM_CONFIG_(REGISTRY|CAFILE)|PIP_(INDEX_URL|EXTRA_INDEX_URL|TRUSTED_HOST|CERT)|BUNDLE_MIRROR__.*|(HTTPS?|NO)_PROXY|(https?|no)_proxy|NODE_EXTRA_CA_CERTS|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE)$/;
// Of those, the ones naming files the sandbox must show (read-only).
const FILE_VALUED = /CAFILE|cafile|CERT|CA_BUNDLE|CA_CERTS/;

function buildEnv(): { env: Record<string, string>; files: string[] } {
  const env: Record<string, string> = {};
  const files = new Set<string>();
  for (const [k, v] of Object.entries(process.env)) {
    if (v === undefined || !PASSED_THROUGH.test(k)) continue;
    env[k] = v;
    if (FILE_VALUED.test(k) && v.startsWith("/") && existsSync(v)) files.add(v);
  }
  return { env, files: [...files] };
}

/**
 * Runs an installer in the build sandbox, streaming every output line into the build log. Resolves
 * with null on success, else the failure for the deployment's error: the exit code and the last
 * line the installer printed on stderr (usually the reason).
 */
export function runInstaller(argv: string[], root: string, cwd: string, runtime: ResolvedRuntime, o: BuildOptions, log: BuildLog, timeoutMs = 300_000): Promise<string | null> {
  const { env, files } = buildEnv();
  const launch = planBuild({ argv, root, cwd, runtime, env, readOnly: files }, { bwrap: o.sandbox ? detectBwrap() : null, hiddenPaths: o.hiddenPaths });
  const cmd = argv[0]!;
  if (o.signal?.aborted) return Promise.resolve(`${cmd} was stopped: Kiln is stopping`);
  return new Promise((resolve) => {
    // Its own process group, whose id is written beside the build folder: a Kiln killed outright
    // mid-build (before bubblewrap's --die-with-parent took hold, or without bubblewrap) leaves it
    // running, and the next start kills it (killLeftoverInstaller).
    const p = spawn(launch.argv[0]!, launch.argv.slice(1), { cwd: launch.cwd, env: launch.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    if (p.pid) writeFileSync(pidFile(root), String(p.pid));
    const killGroup = () => {
      try {
        if (p.pid) process.kill(-p.pid, "SIGKILL");
      } catch {
        // already gone
      }
    };
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, timeoutMs);
    const onAbort = () => killGroup();
    o.signal?.addEventListener("abort", onAbort, { once: true });
    let pending = Promise.resolve();
    let lastError = "";
    const pipe = (stream: "out" | "err") => (chunk: Buffer) => {
      for (const line of chunk.toString("utf8").split(/\r?\n/)) {
        if (!line.trim()) continue;
        if (stream === "err") lastError = line.trim();
        // A log row that cannot be written is lost, never the build: the chain must keep going.
        pending = pending.then(() => log("info", line)).catch(() => {});
      }
    };
    p.stdout.on("data", pipe("out"));
    p.stderr.on("data", pipe("err"));
    p.on("error", (e) => {
      lastError = `${cmd}: ${e.message}`;
      pending = pending.then(() => log("error", lastError)).catch(() => {});
    });
    p.on("close", (code) => {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
      killGroup(); // whatever the installer left running
      rmSync(pidFile(root), { force: true });
      const failure = o.signal?.aborted
        ? `${cmd} was stopped: Kiln is stopping` // the service records it as interrupted
        : timedOut ? `${cmd} did not finish in ${timeoutMs / 1000} s` : code === 0 ? null : `${cmd} exited with ${code ?? "a signal"}${lastError ? `: ${lastError.slice(0, 500)}` : ""}`;
      void pending.then(() => resolve(failure));
    });
  });
}

const pidFile = (root: string) => `${root}.build-pid`;

/**
 * After a crash: kills the installer a build in `root` may have left running, then forgets it. The
 * group is only killed when its leader is still an installer or bubblewrap (pids get reused).
 */
export function killLeftoverInstaller(root: string): void {
  let pid: number;
  try {
    pid = Number(readFileSync(pidFile(root), "utf8"));
  } catch {
    return;
  }
  rmSync(pidFile(root), { force: true });
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    if (/bwrap|npm|pip|bundle|python|ruby/.test(cmdline)) process.kill(-pid, "SIGKILL");
  } catch {
    // not running any more (or not Linux)
  }
}
