import { realpathSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { hostTool, type Isolation } from "./isolation";
import { BOOTSTRAP_DIR, RUNTIME_ROOT, sandboxMounts, TASK_ROOT, type Mount } from "./mounts";
import type { ResolvedRuntime } from "./runtimes";

export { SANDBOX_PATHS, sandboxMounts, isUnder, type Mount } from "./mounts";
// The per-worker cgroups live in cgroups.ts; re-exported for the files that import them from here.
export { CgroupHost, pidAlive, withCgroup, type WorkerCgroup } from "./cgroups";

/**
 * How a worker or build process is started: its sandbox (isolation.ts over the mount plan of
 * mounts.ts) and the rlimits applied through prlimit (the per-worker cgroups are in cgroups.ts).
 * Everything here is decided before the spawn; the worker itself (worker.ts) only runs the argv.
 */

export interface Limits {
  memoryMb: number;
  timeoutMs: number;
  cpuSeconds?: number;
  maxProcesses?: number;
}

export const DEFAULT_MAX_PROCESSES = 128;

export interface LaunchSpec {
  runtime: ResolvedRuntime;
  codeDir: string;
  entry: string;
  handler: string;
  env: Record<string, string>;
  limits: Limits;
  network: boolean;
}

export interface Launch {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  /** Spawn as this user (unsandboxed processes of a root Kiln). */
  uid?: number;
  gid?: number;
}

/**
 * A build step (npm, pip, bundler) in the sandbox: the function root writable at /var/task, the
 * working directory `cwd` inside it, everything else as for a worker (read-only system and runtime,
 * private /tmp as HOME, Kiln's data dir invisible). Its network is what `egress` says: none of the
 * host's (a private loopback) plus the extra mounts and argv prefix that reach the build proxy.
 */
export function planBuild(
  b: { argv: string[]; root: string; cwd: string; runtime: ResolvedRuntime; env: Record<string, string>; readOnly?: string[]; tmpfsMb?: number; mounts?: Mount[] },
  o: { isolation: Isolation; hiddenPaths: string[]; egress?: { mounts: Mount[]; prefix: string[]; env: Record<string, string> } | null },
): Launch {
  const env = { ...sandboxEnv({ runtime: b.runtime, env: b.env }), ...(o.egress?.env ?? {}) };
  const argv = [...(o.egress?.prefix ?? []), ...b.argv];
  if (o.isolation.kind === "none") {
    const run = o.isolation.enclose({ mounts: [], network: true, tmpfsBytes: 0, hostname: "", chdir: b.cwd }, argv);
    return { argv: run.argv, env: { ...env, HOME: tmpdir(), TMPDIR: tmpdir() }, cwd: b.cwd, uid: run.uid, gid: run.gid };
  }
  const rel = relative(realpathSync(b.root), realpathSync(b.cwd));
  // Extra host files (a CA bundle outside /usr and /etc/ssl, say) ride along as runtime mounts.
  const runtime = { ...b.runtime, mounts: [...b.runtime.mounts, ...(b.readOnly ?? [])] };
  const mounts = sandboxMounts({ runtime, codeDir: b.root, network: !o.egress }, o.hiddenPaths, { codeWritable: true, extra: [...(o.egress?.mounts ?? []), ...(b.mounts ?? [])] });
  const run = o.isolation.enclose(
    { mounts, network: !o.egress, tmpfsBytes: (b.tmpfsMb ?? 1024) * 1024 * 1024, hostname: "kiln-build", chdir: join(TASK_ROOT, rel) },
    argv,
  );
  return { argv: run.argv, env, cwd: "/", uid: run.uid, gid: run.gid };
}

// ---------------------------------------------------------------------------------------------
// rlimits (prlimit) and the runtime's own flags

// Below this, node does not start (it hangs in start-up with a smaller RLIMIT_DATA).
const NODE_MIN_DATA_MB = 96;
const NODE24_CODE_RANGE_MB = 512;

export interface LaunchPlan extends Launch {
  /** Which limits are enforced and how, for the pool's one-time report. */
  notes: string[];
}

/**
 * The argv for one worker. `cgroupMemory`/`cgroupPids` tell whether the cgroups enforce those limits
 * (then no rlimit is needed for them).
 */
export function planLaunch(s: LaunchSpec, o: { isolation: Isolation; hiddenPaths: string[]; cgroupMemory: boolean; cgroupPids: boolean }): LaunchPlan {
  const notes: string[] = [];
  const sandboxed = o.isolation.kind !== "none";
  const inside = sandboxed ? { task: TASK_ROOT, runtime: RUNTIME_ROOT } : { task: realpathSync(s.codeDir), runtime: BOOTSTRAP_DIR };
  const memBytes = s.limits.memoryMb * 1024 * 1024;
  const maxProcs = s.limits.maxProcesses ?? DEFAULT_MAX_PROCESSES;
  const asRoot = process.getuid?.() === 0;

  const rt = runtimeArgv(s, inside);

  // prlimit runs inside the sandbox: RLIMIT_NPROC is then counted in the sandbox's own user
  // namespace rather than across every process of the user running Kiln.
  const limits: string[] = [];
  const pl = hostTool("prlimit");
  if (pl) {
    limits.push(pl, "--core=0");
    if (!o.cgroupMemory) {
      // Node 24's V8 reserves a 512 MB code range at start-up, which RLIMIT_DATA counts ("Failed to
      // reserve virtual memory for CodeRange" below it); the heap stays bounded by --max-old-space-size.
      const codeRange = s.runtime.kind === "node" && Number(s.runtime.version.split(".")[0]) >= 24 ? NODE24_CODE_RANGE_MB : 0;
      const mb = s.runtime.kind === "node" ? Math.max(NODE_MIN_DATA_MB, s.limits.memoryMb) + codeRange : s.limits.memoryMb;
      limits.push(`--data=${mb * 1024 * 1024}`);
      notes.push("memory: RLIMIT_DATA (no writable memory cgroup)");
    }
    if (!o.cgroupPids) {
      if (sandboxed && !asRoot) {
        limits.push(`--nproc=${maxProcs}`);
        notes.push("processes: RLIMIT_NPROC in the sandbox's user namespace");
      } else {
        notes.push("processes: not limited (no pids cgroup; RLIMIT_NPROC would count every worker of the sandbox uid)");
      }
    }
    limits.push("--");
  } else if (!o.cgroupMemory) {
    notes.push("memory: only the runtime's own flag (prlimit not found)");
  }

  const env = sandboxEnv(s);
  // SCHED_BATCH: a frame Kiln writes to a worker no longer preempts Kiln on the spot to run the
  // worker (bench:functions, 3 alternating runs on 2 cores: 8.2k vs 7.5k req/s; p50 unchanged).
  const chrt = hostTool("chrt");
  const sched = chrt ? [chrt, "--batch", "0"] : [];
  // The environment is handed over as the sandbox's own (it passes it through), never as arguments:
  // argv is readable by every user of the host in `ps`, the environment is not.
  const mounts = sandboxed ? sandboxMounts(s, o.hiddenPaths) : [];
  const run = o.isolation.enclose({ mounts, network: s.network, tmpfsBytes: memBytes, hostname: "kiln-function", chdir: TASK_ROOT }, [...limits, ...rt]);
  return { argv: [...sched, ...run.argv], env, cwd: sandboxed ? "/" : inside.task, uid: run.uid, gid: run.gid, notes };
}

/** The interpreter's command line: runtime, its own limit flags, bootstrap, code folder, entry, handler. */
export function runtimeArgv(s: Pick<LaunchSpec, "runtime" | "entry" | "handler" | "limits">, inside: { task: string; runtime: string }): string[] {
  const rt: string[] = [s.runtime.command];
  if (s.runtime.kind === "node") {
    // V8 fails cleanly ("heap out of memory") before the cgroup's OOM killer would strike.
    rt.push(`--max-old-space-size=${Math.max(16, Math.floor(s.limits.memoryMb * 0.75))}`, join(inside.runtime, "node.mjs"));
  } else if (s.runtime.kind === "python") {
    // -s: no user site-packages; -B: never write __pycache__ into the (read-only) code.
    rt.push("-s", "-B", join(inside.runtime, "python.py"));
  } else {
    rt.push(join(inside.runtime, "ruby.rb"));
  }
  rt.push(inside.task, s.entry, s.handler);
  return rt;
}

/** The whole environment a function sees: a fixed minimum plus the function's own values. */
export function sandboxEnv(s: Pick<LaunchSpec, "runtime" | "env">): Record<string, string> {
  // KILN_SANDBOX_SETUP is the namespaces sandbox's word to its seccomp loader (seccomp.ts), never a function's.
  const { KILN_SANDBOX_SETUP: _, ...env } = s.env;
  return {
    PATH: [dirname(s.runtime.command), "/usr/local/bin", "/usr/bin", "/bin"].join(":"),
    HOME: "/tmp",
    TMPDIR: "/tmp",
    LANG: "C.UTF-8",
    ...env,
  };
}
