import type { ContainerEngine } from "./container";
import { spawn } from "node:child_process";
import { lchownSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostBuildConfig, stageBuildConfig, type HostBuildConfig, type StagedConfig } from "./build-config";
import { egressWiring, startBuildEgress } from "./build-egress";
import { describeCause, diagnoseInstall } from "./install-failure";
import { chooseIsolation, noSandboxMessage, sandboxUser, type SandboxChoice } from "./isolation";
import type { ResolvedRuntime } from "./runtimes";
import { planBuild, type Launch, type Mount } from "./sandbox";

/**
 * Runs one dependency installer (npm, pip, bundler) of a function build: in the build sandbox
 * (planBuild), in its own process group recorded beside the build folder, with a time limit, and
 * stopped when Kiln stops. What to install, and when, is the functions area's (server/functions/builds.ts).
 */

export type BuildLog = (level: "info" | "error", line: string) => Promise<void>;

export interface BuildOptions {
  /** Never visible to a build (Kiln's data dir). */
  hiddenPaths: string[];
  /** The sandbox builds run in: the same choice as the function workers'. */
  sandbox: { want: SandboxChoice; allowUnsandboxed: boolean };
  /** Kiln is stopping: the installer is killed and the build fails as interrupted. */
  signal?: AbortSignal;
  /** --function-runtime docker: the build imports the runtime's image, and loads a --runtime-image runtime's code in a container. */
  containers?: ContainerEngine;
}

/**
 * Runs an installer in the build sandbox, streaming every output line into the build log. Resolves
 * with null on success, else the failure for the deployment's error: its cause when one shows
 * (network, resolution, compile: install-failure.ts), the exit code and the last line the installer
 * printed on stderr (usually the symptom). The host's package-manager configuration goes in
 * (build-config.ts).
 */
export async function runInstaller(
  argv: string[],
  root: string,
  cwd: string,
  runtime: ResolvedRuntime,
  o: BuildOptions,
  log: BuildLog,
  timeoutMs = 300_000,
  /** More for this step: environment (over the host's registry settings) and mounts (a package cache, say). */
  extra: { env?: Record<string, string>; mounts?: Mount[] } = {},
): Promise<string | null> {
  const cfg = hostBuildConfig();
  const { isolation, problems } = chooseIsolation(o.sandbox);
  if (!isolation) return noSandboxMessage(problems);
  const cmd = argv[0]!;
  if (o.signal?.aborted) return `${cmd} was stopped: Kiln is stopping`;
  const sandboxed = isolation.kind !== "none";
  // A sandboxed build has a network namespace of its own; its one way out is an egress proxy of its
  // own, which refuses the host's and other local addresses and says so in this build's log.
  const egressProblems: string[] = [];
  const egress = sandboxed ? await openEgress(cfg, log, egressProblems) : null;
  let staged: StagedConfig | null = null;
  try {
    staged = stageBuildConfig(cfg, sandboxed);
    const wiring = egress ? { ...egress.wiring, mounts: [...egress.wiring.mounts, ...staged.mounts] } : null;
    const env = { ...staged.env, ...(extra.env ?? {}) };
    const launch = planBuild({ argv, root, cwd, runtime, env, readOnly: cfg.readOnly, mounts: extra.mounts }, { isolation, hiddenPaths: o.hiddenPaths, egress: wiring });
    const run = await spawnInstaller(launch, cmd, root, o, log, timeoutMs);
    if (!run.failure || run.stopped) return run.failure;
    const why = diagnoseInstall(run.lines, egressProblems);
    return why ? `${describeCause(why)}; ${run.failure}` : run.failure;
  } finally {
    staged?.close();
    await egress?.close();
  }
}

async function openEgress(cfg: HostBuildConfig, log: BuildLog, problems: string[]) {
  const dir = mkdtempSync(join(tmpdir(), "kiln-egress-"));
  try {
    const proxy = await startBuildEgress({
      socketDir: dir,
      // Registries the host's configuration names (a local mirror configured on purpose), and the operator's list.
      allowHosts: [...cfg.registryHosts, ...(process.env.KILN_BUILD_ALLOW_HOSTS ?? "").split(",").map((h) => h.trim()).filter(Boolean)],
      upstreamProxy: cfg.upstreamProxy,
      noProxy: cfg.noProxy,
      log: (m) => {
        if (problems.length < 20) problems.push(m);
        void log("error", m).catch(() => {});
      },
    });
    const w = egressWiring(proxy.socketPath);
    return {
      wiring: { mounts: w.mounts, prefix: w.argvPrefix, env: { npm_config_update_notifier: "false" } },
      close: async () => {
        await proxy.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}

/** The installer's end: its failure (null on success), whether Kiln stopped it, its last output lines. */
interface InstallerRun {
  failure: string | null;
  stopped: boolean;
  lines: string[];
}

// Output lines kept for diagnoseInstall (the cause is near the end).
const KEPT_LINES = 400;

function spawnInstaller(launch: Launch, cmd: string, root: string, o: BuildOptions, log: BuildLog, timeoutMs: number): Promise<InstallerRun> {
  // A root Kiln builds as the sandbox uid, which must own the function root it installs into; the
  // tree is Kiln's again afterwards.
  const user = sandboxUser();
  if (user) chownTree(root, user.uid, user.gid);
  const handBack = () => {
    if (user) chownTree(root, process.getuid!(), process.getgid!());
  };
  return new Promise((resolve) => {
    // Its own process group, whose id is written beside the build folder: a Kiln killed outright
    // mid-build (before bubblewrap's --die-with-parent took hold, or without bubblewrap) leaves it
    // running, and the next start kills it (killLeftoverInstaller).
    const p = spawn(launch.argv[0]!, launch.argv.slice(1), {
      cwd: launch.cwd,
      env: launch.env,
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
      ...(launch.uid === undefined ? {} : { uid: launch.uid, gid: launch.gid }),
    });
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
    const lines: string[] = [];
    const pipe = (stream: "out" | "err") => (chunk: Buffer) => {
      for (const line of chunk.toString("utf8").split(/\r?\n/)) {
        if (!line.trim()) continue;
        if (stream === "err" && !BOILERPLATE.test(line)) lastError = line.trim();
        lines.push(line.slice(0, 2000));
        if (lines.length > KEPT_LINES) lines.shift();
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
      handBack();
      const failure = o.signal?.aborted
        ? `${cmd} was stopped: Kiln is stopping` // the service records it as interrupted
        : timedOut ? `${cmd} did not finish in ${timeoutMs / 1000} s` : code === 0 ? null : `${cmd} exited with ${code ?? "a signal"}${lastError ? `: ${lastError.slice(0, 500)}` : ""}`;
      void pending.then(() => resolve({ failure, stopped: !!o.signal?.aborted || timedOut, lines }));
    });
  });
}

// Lines an installer ends with that say nothing of why (npm's pointer to its debug log, its codes).
const BOILERPLATE = /complete log of this run can be found|^npm (error|ERR!) (code|errno|syscall|path)\b|^npm (error|ERR!)\s*$/;

const pidFile = (root: string) => `${root}.build-pid`;

/** chown -R without following links (a link the build made must not redirect the chown). */
function chownTree(dir: string, uid: number, gid: number): void {
  lchownSync(dir, uid, gid);
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) chownTree(p, uid, gid);
    else lchownSync(p, uid, gid);
  }
}

const INSTALLER_COMMAND = /bwrap|setpriv|unshare|npm|pip|bundle|python|ruby/;

/**
 * After a crash: kills the installer a build in `root` may have left running, then forgets it. The
 * group is only killed when its leader is still an installer or bubblewrap (pids get reused). The
 * group is not all: bubblewrap's inner process starts a session of its own (--new-session), and when
 * Kiln dies before that process armed --die-with-parent it outlives the group, reparented to init
 * (CI saw one); so every installer or sandbox process whose command line names the build folder
 * goes too (killing bubblewrap's inner process ends its whole pid namespace).
 */
export function killLeftoverInstaller(root: string): void {
  let pid: number | null = null;
  try {
    pid = Number(readFileSync(pidFile(root), "utf8"));
  } catch {
    // no installer was started, or it finished: still look for strays below
  }
  rmSync(pidFile(root), { force: true });
  if (pid) {
    try {
      if (INSTALLER_COMMAND.test(readFileSync(`/proc/${pid}/cmdline`, "utf8"))) process.kill(-pid, "SIGKILL");
    } catch {
      // not running any more (or not Linux)
    }
  }
  let entries: string[] = [];
  try {
    entries = readdirSync("/proc").filter((e) => /^\d+$/.test(e));
  } catch {
    return; // not Linux
  }
  const roots = [root];
  try {
    roots.push(realpathSync(root));
  } catch {
    // the folder is gone
  }
  const namesRoot = (a: string) => roots.some((r) => a === r || a.startsWith(`${r}/`));
  for (const e of entries) {
    try {
      const args = readFileSync(`/proc/${e}/cmdline`, "utf8").split("\0");
      if (INSTALLER_COMMAND.test(args[0] ?? "") && args.some(namesRoot)) process.kill(Number(e), "SIGKILL");
    } catch {
      // gone meanwhile, or not ours to kill
    }
  }
}
