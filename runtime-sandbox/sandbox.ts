import { spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";
import type { ResolvedRuntime } from "./runtimes";
import { which } from "./runtimes";

/**
 * How a worker process is started: the bubblewrap command line (or none), the rlimits applied
 * through prlimit, and the per-worker cgroups. Everything here is decided before the spawn; the
 * worker itself (worker.ts) only runs the resulting argv.
 */

export const BOOTSTRAP_DIR = join(import.meta.dirname, "bootstraps");
const SANDBOX_ETC = join(import.meta.dirname, "sandbox-etc");

/** Where the code and the bootstraps appear inside the sandbox (Lambda's layout). */
const TASK_ROOT = "/var/task";
const RUNTIME_ROOT = "/var/runtime";
/** The sandbox user; sandbox-etc/passwd names it so getpwuid() works for the function. */
const SANDBOX_UID = "1000";

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
}

// ---------------------------------------------------------------------------------------------
// bubblewrap

export interface Bwrap {
  path: string;
  /** --size for tmpfs and --disable-userns arrived in 0.8.0. */
  modern: boolean;
}

let bwrapProbe: Bwrap | null | undefined;

/** bubblewrap when installed and able to make namespaces here (some hosts forbid user namespaces). */
export function detectBwrap(): Bwrap | null {
  if (bwrapProbe !== undefined) return bwrapProbe;
  bwrapProbe = null;
  const path = which("bwrap") ?? (existsSync("/usr/bin/bwrap") ? "/usr/bin/bwrap" : null);
  if (!path) return null;
  const trial = spawnSync(path, ["--unshare-all", "--die-with-parent", ...systemMounts(), "--", "/usr/bin/true"], { stdio: "ignore", timeout: 10_000, env: {} });
  if (trial.status !== 0) return null;
  const version = /(\d+)\.(\d+)/.exec(String(spawnSync(path, ["--version"], { env: {} }).stdout ?? ""));
  const modern = !!version && (Number(version[1]) > 0 || Number(version[2]) >= 8);
  bwrapProbe = { path, modern };
  return bwrapProbe;
}

/** /usr read-only, and the merged-/usr symlinks (/lib → usr/lib) or the real directories. */
function systemMounts(): string[] {
  return toBwrap(systemMountList());
}

function systemMountList(): Mount[] {
  const out: Mount[] = [{ kind: "bind", src: "/usr", dest: "/usr" }];
  for (const p of ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]) {
    try {
      const st = lstatSync(p);
      if (st.isSymbolicLink()) out.push({ kind: "symlink", target: readlinkSync(p), dest: p });
      else if (st.isDirectory()) out.push({ kind: "bind", src: p, dest: p });
    } catch {
      // not on this system
    }
  }
  return out;
}

/** Host files a runtime reads: the dynamic linker's cache, TLS roots, time zone, alternatives. */
const ETC_ALWAYS = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/localtime", "/etc/alternatives"];
const ETC_NETWORK = ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf", "/etc/services", "/etc/protocols"];

/**
 * What a sandboxed function sees of the filesystem, whatever builds the sandbox (bubblewrap here,
 * a container engine in container.ts): read-only binds, the merged-/usr symlinks, and covers over
 * hidden paths. /proc, /dev and the private /tmp are each engine's own.
 */
export type Mount =
  | { kind: "bind"; src: string; dest: string; writable?: boolean }
  | { kind: "symlink"; target: string; dest: string }
  /** An empty directory over a hidden directory. */
  | { kind: "cover-dir"; dest: string }
  /** /dev/null over a hidden file. */
  | { kind: "cover-file"; dest: string };

export function sandboxMounts(s: Pick<LaunchSpec, "runtime" | "codeDir" | "network">, hiddenPaths: string[], opts: { networkEtc?: boolean; codeWritable?: boolean } = {}): Mount[] {
  // Never the host root: only what the runtime needs, so Kiln's data dir, the user's home and
  // everything else simply does not exist inside.
  const m: Mount[] = systemMountList();
  for (const p of [...ETC_ALWAYS, ...(s.network && opts.networkEtc !== false ? ETC_NETWORK : [])]) {
    if (existsSync(p)) m.push({ kind: "bind", src: realpathSync(p), dest: p });
  }
  m.push({ kind: "bind", src: join(SANDBOX_ETC, "passwd"), dest: "/etc/passwd" }, { kind: "bind", src: join(SANDBOX_ETC, "group"), dest: "/etc/group" });
  for (const r of s.runtime.mounts) if (!isUnder(r, "/usr")) m.push({ kind: "bind", src: r, dest: r });
  m.push({ kind: "bind", src: realpathSync(BOOTSTRAP_DIR), dest: RUNTIME_ROOT }, { kind: "bind", src: realpathSync(s.codeDir), dest: TASK_ROOT, writable: !!opts.codeWritable });
  // A hidden path that lies inside something bound (a data dir under the code dir, say) is
  // covered up: an empty directory over a directory, /dev/null over a file.
  const binds = m.filter((x): x is Extract<Mount, { kind: "bind" }> => x.kind === "bind");
  for (const h of hiddenPaths.map(realOrSelf)) {
    if (!existsSync(h)) continue;
    for (const b of binds) {
      if (!isUnder(h, b.src)) continue;
      const dest = join(b.dest, relative(b.src, h));
      let isDir = true;
      try {
        isDir = statSync(h).isDirectory();
      } catch {
        // vanished: cover as a directory
      }
      m.push(isDir ? { kind: "cover-dir", dest } : { kind: "cover-file", dest });
    }
  }
  return m;
}

function toBwrap(mounts: Mount[]): string[] {
  const a: string[] = [];
  for (const m of mounts) {
    if (m.kind === "bind") a.push(m.writable ? "--bind" : "--ro-bind", m.src, m.dest);
    else if (m.kind === "symlink") a.push("--symlink", m.target, m.dest);
    else if (m.kind === "cover-dir") a.push("--tmpfs", m.dest);
    else a.push("--ro-bind", "/dev/null", m.dest);
  }
  return a;
}

function bwrapArgs(
  bw: Bwrap,
  s: Pick<LaunchSpec, "runtime" | "codeDir" | "network">,
  hiddenPaths: string[],
  extra: { tmpfsBytes: number; codeWritable?: boolean; hostname?: string; chdir?: string },
): string[] {
  const a = ["--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"];
  if (!s.network) a.push("--unshare-net");
  if (bw.modern) a.push("--disable-userns");
  a.push("--uid", SANDBOX_UID, "--gid", SANDBOX_UID, "--cap-drop", "ALL", "--hostname", extra.hostname ?? "kiln-function");
  const mounts = sandboxMounts(s, hiddenPaths, { codeWritable: extra.codeWritable });
  // The system part, then /proc, /dev and the private /tmp, then the runtime, bootstraps and code
  // (a runtime cached under /tmp stays visible), then the covers on top of what they hide.
  const system = mounts.findIndex((m) => m.dest === "/etc/group") + 1;
  a.push(...toBwrap(mounts.slice(0, system)));
  a.push("--proc", "/proc", "--dev", "/dev");
  if (bw.modern) a.push("--size", String(extra.tmpfsBytes));
  a.push("--tmpfs", "/tmp");
  a.push(...toBwrap(mounts.slice(system)));
  a.push("--chdir", extra.chdir ?? TASK_ROOT);
  return a;
}

/**
 * A build step (npm, pip, bundler) in the sandbox: the network (registries), the function root
 * writable at /var/task, the working directory `cwd` inside it, everything else as for a worker
 * (read-only system and runtime, private /tmp as HOME, Kiln's data dir invisible). Without
 * bubblewrap the command runs on the host in the same cleared environment.
 */
export function planBuild(
  b: { argv: string[]; root: string; cwd: string; runtime: ResolvedRuntime; env: Record<string, string>; readOnly?: string[]; tmpfsMb?: number },
  o: { bwrap: Bwrap | null; hiddenPaths: string[] },
): Launch {
  const env = { ...sandboxEnv({ runtime: b.runtime, env: b.env }) };
  if (!o.bwrap) return { argv: b.argv, env: { ...env, HOME: process.env.HOME ?? "/tmp", TMPDIR: process.env.TMPDIR ?? "/tmp" }, cwd: b.cwd };
  const rel = relative(realpathSync(b.root), realpathSync(b.cwd));
  // Extra host files (a CA bundle outside /usr and /etc/ssl, say) ride along as runtime mounts.
  const runtime = { ...b.runtime, mounts: [...b.runtime.mounts, ...(b.readOnly ?? [])] };
  const args = bwrapArgs(o.bwrap, { runtime, codeDir: b.root, network: true }, o.hiddenPaths, {
    tmpfsBytes: (b.tmpfsMb ?? 1024) * 1024 * 1024,
    codeWritable: true,
    hostname: "kiln-build",
    chdir: join(TASK_ROOT, rel),
  });
  return { argv: [o.bwrap.path, ...args, "--", ...b.argv], env, cwd: "/" };
}

// ---------------------------------------------------------------------------------------------
// rlimits (prlimit) and the runtime's own flags

// util-linux tools, looked up once: absolute paths, since the sandbox's PATH is not the host's.
const hostTools = new Map<string, string | null>();
function hostTool(name: "prlimit" | "chrt"): string | null {
  if (!hostTools.has(name)) hostTools.set(name, [`/usr/bin/${name}`, `/bin/${name}`].find((p) => existsSync(p)) ?? null);
  return hostTools.get(name)!;
}

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
export function planLaunch(
  s: LaunchSpec,
  o: { bwrap: Bwrap | null; hiddenPaths: string[]; cgroupMemory: boolean; cgroupPids: boolean; asRoot: boolean },
): LaunchPlan {
  const notes: string[] = [];
  const inside = o.bwrap ? { task: TASK_ROOT, runtime: RUNTIME_ROOT } : { task: realpathSync(s.codeDir), runtime: BOOTSTRAP_DIR };
  const memBytes = s.limits.memoryMb * 1024 * 1024;
  const maxProcs = s.limits.maxProcesses ?? DEFAULT_MAX_PROCESSES;

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
      if (o.bwrap && !o.asRoot) {
        limits.push(`--nproc=${maxProcs}`);
        notes.push("processes: RLIMIT_NPROC in the sandbox's user namespace");
      } else {
        notes.push("processes: not limited (no pids cgroup; RLIMIT_NPROC would count all of this user's processes or not apply to root)");
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
  if (!o.bwrap) return { argv: [...sched, ...limits, ...rt], env, cwd: inside.task, notes };
  // The environment is handed over as bwrap's own (it passes it through), not as --setenv
  // arguments: argv is readable by every user of the host in `ps`, the environment is not.
  const args = bwrapArgs(o.bwrap, s, o.hiddenPaths, { tmpfsBytes: memBytes });
  return { argv: [...sched, o.bwrap.path, ...args, "--", ...limits, ...rt], env, cwd: "/", notes };
}

/** Inside the sandbox: where the code and the bootstraps are. */
export const SANDBOX_PATHS = { task: TASK_ROOT, runtime: RUNTIME_ROOT, uid: SANDBOX_UID };

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

export function isUnder(p: string, parent: string): boolean {
  const a = resolve(p);
  const b = resolve(parent);
  return a === b || a.startsWith(b.endsWith(sep) ? b : b + sep);
}

function realOrSelf(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return resolve(p);
  }
}

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
