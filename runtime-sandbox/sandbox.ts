import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { hostTool, type Isolation } from "./isolation";
import { BOOTSTRAP_DIR, isUnder, RUNTIME_ROOT, sandboxMounts, TASK_ROOT, type Mount } from "./mounts";
import type { ResolvedRuntime } from "./runtimes";

export { SANDBOX_PATHS, sandboxMounts, isUnder, type Mount } from "./mounts";

/**
 * How a worker or build process is started: its sandbox (isolation.ts over the mount plan of
 * mounts.ts), the rlimits applied through prlimit, and the per-worker cgroups. Everything here is
 * decided before the spawn; the worker itself (worker.ts) only runs the resulting argv.
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
  b: { argv: string[]; root: string; cwd: string; runtime: ResolvedRuntime; env: Record<string, string>; readOnly?: string[]; tmpfsMb?: number },
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
  const mounts = sandboxMounts({ runtime, codeDir: b.root, network: !o.egress }, o.hiddenPaths, { codeWritable: true, extra: o.egress?.mounts });
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
      const mb = s.runtime.kind === "node" ? Math.max(NODE_MIN_DATA_MB, s.limits.memoryMb) : s.limits.memoryMb;
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
  return {
    PATH: [dirname(s.runtime.command), "/usr/local/bin", "/usr/bin", "/bin"].join(":"),
    HOME: "/tmp",
    TMPDIR: "/tmp",
    LANG: "C.UTF-8",
    ...s.env,
  };
}

// ---------------------------------------------------------------------------------------------
// cgroup v1 (memory, pids)

export interface WorkerCgroup {
  /** Files the wrapper writes its pid into before exec'ing the sandbox. */
  procsFiles: string[];
  memory: boolean;
  pids: boolean;
  /** Kills by the OOM killer inside this cgroup so far. */
  oomKills(): number;
  killAll(): void;
  remove(): Promise<void>;
}

interface Controller {
  dir: string;
}

/**
 * One folder per pool (`kiln-<pid>`) under this process's own cgroup in each v1 hierarchy, one
 * sub-folder per worker. Only usable where those folders are writable (root, or a delegated tree).
 */
export class CgroupHost {
  private seq = 0;
  private constructor(
    private readonly memory: Controller | null,
    private readonly pids: Controller | null,
  ) {}

  static detect(tag: string): CgroupHost | null {
    const mem = prepareController("memory", tag);
    const pids = prepareController("pids", tag);
    if (!mem && !pids) return null;
    return new CgroupHost(mem, pids);
  }

  get hasMemory(): boolean {
    return !!this.memory;
  }
  get hasPids(): boolean {
    return !!this.pids;
  }

  create(limits: Limits): WorkerCgroup {
    const name = `w${++this.seq}`;
    const made: string[] = [];
    let memDir: string | null = null;
    let pidsDir: string | null = null;
    try {
      if (this.memory) {
        memDir = join(this.memory.dir, name);
        mkdirSync(memDir);
        made.push(memDir);
        const bytes = String(limits.memoryMb * 1024 * 1024);
        writeFileSync(join(memDir, "memory.limit_in_bytes"), bytes);
        // With swap accounting, memory+swap gets the same cap so a hog cannot page out instead.
        if (existsSync(join(memDir, "memory.memsw.limit_in_bytes"))) writeFileSync(join(memDir, "memory.memsw.limit_in_bytes"), bytes);
      }
      if (this.pids) {
        pidsDir = join(this.pids.dir, name);
        mkdirSync(pidsDir);
        made.push(pidsDir);
        writeFileSync(join(pidsDir, "pids.max"), String(limits.maxProcesses ?? DEFAULT_MAX_PROCESSES));
      }
    } catch (e) {
      for (const d of made) tryRmdir(d);
      throw e;
    }
    const dirs = made;
    return {
      procsFiles: dirs.map((d) => join(d, "cgroup.procs")),
      memory: !!memDir,
      pids: !!pidsDir,
      oomKills: () => {
        if (!memDir) return 0;
        try {
          const ctl = readFileSync(join(memDir, "memory.oom_control"), "utf8");
          const m = /oom_kill (\d+)/.exec(ctl);
          // Kernels before 4.13 have no oom_kill counter; a hit limit is the next best sign.
          if (m) return Number(m[1]);
          return Number(readFileSync(join(memDir, "memory.failcnt"), "utf8")) > 0 ? 1 : 0;
        } catch {
          return 0;
        }
      },
      killAll: () => {
        for (const d of dirs) {
          for (const pid of readPids(join(d, "cgroup.procs"))) {
            try {
              process.kill(pid, "SIGKILL");
            } catch {
              // already gone
            }
          }
        }
      },
      remove: async () => {
        // A cgroup can be removed once its last task is reaped, which trails the kill a little.
        for (const d of dirs) {
          for (let i = 0; i < 50 && !tryRmdir(d); i++) await new Promise((r) => setTimeout(r, 20));
        }
      },
    };
  }

  /** Removes the pool's folders (after all workers are gone). */
  dispose(): void {
    for (const c of [this.memory, this.pids]) if (c) tryRmdir(c.dir);
  }
}

function prepareController(name: "memory" | "pids", tag: string): Controller | null {
  const base = controllerDir(name);
  if (!base) return null;
  // Folders left by Kiln processes that died: empty by now (their workers died with them).
  try {
    for (const e of readdirSync(base)) {
      const m = /^kiln-(\d+)-/.exec(e);
      if (m && !pidAlive(Number(m[1]))) {
        for (const w of safeReaddir(join(base, e))) if (/^w\d+$/.test(w)) tryRmdir(join(base, e, w));
        tryRmdir(join(base, e));
      }
    }
  } catch {
    // not listable: the mkdir below decides
  }
  const dir = join(base, `kiln-${process.pid}-${tag}`);
  try {
    mkdirSync(dir);
    // Prove we can put a limit and a process in (a read-only or foreign hierarchy fails here).
    const probe = join(dir, "probe");
    mkdirSync(probe);
    writeFileSync(join(probe, name === "memory" ? "memory.limit_in_bytes" : "pids.max"), name === "memory" ? String(64 << 20) : "16");
    tryRmdir(probe);
    return { dir };
  } catch {
    tryRmdir(join(dir, "probe"));
    tryRmdir(dir);
    return null;
  }
}

/** This process's own cgroup in the v1 hierarchy that has `name`, as a path under its mount. */
function controllerDir(name: string): string | null {
  let mounts: string, own: string;
  try {
    mounts = readFileSync("/proc/self/mountinfo", "utf8");
    own = readFileSync("/proc/self/cgroup", "utf8");
  } catch {
    return null;
  }
  // mountinfo: id parent major:minor root mountpoint opts ... - fstype source superopts
  let mountRoot: string | null = null;
  let mountPoint: string | null = null;
  for (const line of mounts.split("\n")) {
    const [pre, post] = line.split(" - ");
    if (!post) continue;
    const [fstype, , superOpts] = post.split(" ");
    if (fstype !== "cgroup" || !superOpts?.split(",").includes(name)) continue;
    const f = pre!.split(" ");
    mountRoot = f[3]!;
    mountPoint = f[4]!;
    break;
  }
  if (!mountPoint || !mountRoot) return null;
  const entry = own.split("\n").find((l) => l.split(":")[1]?.split(",").includes(name));
  const path = entry?.split(":").slice(2).join(":") ?? "/";
  const rel = isUnder(path, mountRoot) ? relative(mountRoot, path) : "";
  const dir = join(mountPoint, rel);
  return existsSync(dir) ? dir : mountPoint;
}

// ---------------------------------------------------------------------------------------------

function tryRmdir(d: string): boolean {
  try {
    rmdirSync(d);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "ENOENT";
  }
}

function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

function readPids(file: string): number[] {
  try {
    return readFileSync(file, "utf8").split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The wrapper that joins the worker's cgroups before becoming the sandbox (so nothing escapes). */
export function withCgroup(argv: string[], cg: WorkerCgroup | null): string[] {
  if (!cg || cg.procsFiles.length === 0) return argv;
  const script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"';
  return ["/bin/sh", "-c", script, "kiln-sandbox", String(cg.procsFiles.length), ...cg.procsFiles, ...argv];
}
