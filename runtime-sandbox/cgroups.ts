import { accessSync, closeSync, constants, existsSync, mkdirSync, openSync, readdirSync, readFileSync, rmdirSync, writeFileSync, writeSync } from "node:fs";
import { basename, dirname, join, relative } from "node:path";
import { hostTool } from "./isolation";
import { isUnder } from "./mounts";

/**
 * Per-worker memory, process and CPU limits through cgroups: v2 where Kiln's own v2 cgroup offers
 * the controller and is writable (root, or a delegated subtree such as a systemd unit with
 * Delegate=yes), else the v1 hierarchy that has it, else none (the caller falls back to rlimits).
 *
 * Layout, per controller: `<Kiln's own cgroup>/kiln-<pid>-<tag>/w<n>`, one folder per pool, one per
 * worker. On v2 one tree holds all three controllers; Kiln's own cgroup must then have no processes
 * of its own ("no internal processes"), so where it has some they are first moved into the leaf
 * `<own>/kiln-main` (as docker-in-docker does), and moved back if the controllers still cannot be
 * enabled.
 *
 * `detectCgroups` reads what the host offers without changing anything (kiln doctor);
 * `CgroupHost.detect` builds on it to make a pool's folders, and falls back controller by
 * controller (v2, then v1, then none) when a write fails.
 */

export type CgroupController = "memory" | "pids" | "cpu";
export type CgroupVersion = 1 | 2;
export type CgroupEnforcement = Record<CgroupController, CgroupVersion | null>;

export const CGROUP_CONTROLLERS: readonly CgroupController[] = ["memory", "pids", "cpu"];
/** CPUs a worker may use when its limits do not say: one. */
export const DEFAULT_CPUS = 1;
/** The CFS period of the CPU limit (cpu.max / cpu.cfs_period_us), in microseconds. */
export const CPU_PERIOD_US = 100_000;
/** The leaf Kiln moves its own cgroup's processes into before enabling v2 controllers there. */
export const MAIN_LEAF = "kiln-main";

export const NO_CGROUPS: CgroupEnforcement = { memory: null, pids: null, cpu: null };

/** What the host offers, read without writing anything. */
export interface CgroupSupport {
  /** Kiln's usable cgroup v2 folder, or null. */
  v2: V2Site | null;
  /** Kiln's own folder in each writable v1 hierarchy, by controller. */
  v1: Partial<Record<CgroupController, string>>;
  /** Which version would enforce each limit. */
  by: CgroupEnforcement;
  /** For a controller no cgroup enforces: why, in a few words. */
  why: Partial<Record<CgroupController, string>>;
  /** What was found and passed over (a v2 folder without controllers, a read-only v1 folder), for kiln doctor. */
  details: string[];
}

export interface V2Site {
  /** Where pool folders go: Kiln's own cgroup (the parent of kiln-main once Kiln moved there). */
  base: string;
  /** The wanted controllers that `base` offers (its cgroup.controllers). */
  controllers: CgroupController[];
  /** `base` holds processes and is not the root: they move to `base/kiln-main` before controllers can be enabled. */
  mustMove: boolean;
}

/** The contents of /proc/self/mountinfo and /proc/self/cgroup (a test passes a fake cgroupfs's). */
export interface ProcView {
  mountinfo: string;
  cgroup: string;
}

/** The one filesystem operation a fake cgroupfs cannot imitate: rmdir of a folder holding control files. */
export interface CgroupIo {
  rmdir(dir: string): void;
}

const realIo: CgroupIo = { rmdir: (d) => rmdirSync(d) };

/** Reads which cgroup can enforce each limit for this process. Changes nothing. */
export function detectCgroups(o: { proc?: ProcView } = {}): CgroupSupport {
  const none: CgroupSupport = { v2: null, v1: {}, by: { ...NO_CGROUPS }, why: {}, details: [] };
  let proc = o.proc;
  if (!proc) {
    try {
      proc = { mountinfo: readFileSync("/proc/self/mountinfo", "utf8"), cgroup: readFileSync("/proc/self/cgroup", "utf8") };
    } catch {
      for (const c of CGROUP_CONTROLLERS) none.why[c] = "no cgroups on this system";
      return none;
    }
  }
  const s = none;
  s.v2 = detectV2(proc, s.details);
  for (const c of CGROUP_CONTROLLERS) {
    if (s.v2?.controllers.includes(c)) {
      s.by[c] = 2;
      continue;
    }
    const dir = v1Dir(proc, c);
    if (dir && writable(dir)) {
      s.v1[c] = dir;
      s.by[c] = 1;
      continue;
    }
    s.why[c] = `no writable ${c} cgroup`;
    s.details.push(dir ? `cgroup v1 ${c}: ${dir} is not writable` : `cgroup v1 ${c}: no hierarchy`);
  }
  return s;
}

function detectV2(proc: ProcView, why: string[]): V2Site | null {
  const mount = findMount(proc.mountinfo, (fstype) => fstype === "cgroup2");
  const line = proc.cgroup.split("\n").find((l) => l.startsWith("0::"));
  if (!mount || !line) {
    why.push("cgroup v2: not mounted");
    return null;
  }
  const path = line.slice(3);
  let own = join(mount.point, isUnder(path, mount.root) ? relative(mount.root, path) : "");
  if (!isUnder(path, mount.root) || !existsSync(own)) {
    why.push(`cgroup v2: Kiln's own cgroup ${path} is not under ${mount.point}`);
    return null;
  }
  // Kiln moved itself into kiln-main earlier (another pool of this process, or its parent Kiln).
  if (basename(own) === MAIN_LEAF && isUnder(dirname(own), mount.point)) own = dirname(own);
  const offered = tokens(join(own, "cgroup.controllers"));
  const controllers = CGROUP_CONTROLLERS.filter((c) => offered.has(c));
  if (!controllers.length) {
    why.push(`cgroup v2 ${own}: offers ${[...offered].join(" ") || "no controllers"}`);
    return null;
  }
  const enabled = tokens(join(own, "cgroup.subtree_control"));
  const missing = controllers.filter((c) => !enabled.has(c));
  // The root cgroup is exempt from the "no internal processes" rule; only non-root ones have cgroup.type.
  const isRoot = !existsSync(join(own, "cgroup.type"));
  const mustMove = missing.length > 0 && !isRoot && readPids(join(own, "cgroup.procs")).length > 0;
  const ok = writable(own) && (!missing.length || writable(join(own, "cgroup.subtree_control"))) && (!mustMove || writable(join(own, "cgroup.procs")));
  if (!ok) {
    why.push(`cgroup v2 ${own}: offers ${controllers.join(" ")} but is not writable`);
    return null;
  }
  return { base: own, controllers, mustMove };
}

// ---------------------------------------------------------------------------------------------
// Describing (kiln doctor and the pool's start-up line)

/**
 * One phrase per limit saying what enforces it: a cgroup, or the rlimit planLaunch falls back to.
 * `sandboxed`: the worker runs in a sandbox (RLIMIT_NPROC is then counted in its own user namespace).
 */
export function describeLimits(by: CgroupEnforcement, o: { sandboxed: boolean; why?: Partial<Record<CgroupController, string>> }): string[] {
  const prlimit = !!hostTool("prlimit");
  const asRoot = process.getuid?.() === 0;
  const why = (c: CgroupController) => o.why?.[c] ?? `no writable ${c} cgroup`;
  const out: string[] = [];
  if (by.memory === 2) out.push("memory by cgroup v2 (memory.max, memory.swap.max 0)");
  else if (by.memory === 1) out.push("memory by cgroup v1 (memory.limit_in_bytes)");
  else if (prlimit) out.push(`memory by RLIMIT_DATA (${why("memory")})`);
  else out.push(`memory by the runtime's own flag only (${why("memory")}; prlimit not found)`);
  if (by.pids) out.push(`processes by cgroup v${by.pids} (pids.max)`);
  else if (prlimit && o.sandboxed && !asRoot) out.push(`processes by RLIMIT_NPROC in the sandbox's user namespace (${why("pids")})`);
  else out.push(`processes not limited (${why("pids")}; RLIMIT_NPROC would count every process of the uid)`);
  if (by.cpu === 2) out.push("cpu by cgroup v2 (cpu.max)");
  else if (by.cpu === 1) out.push("cpu by cgroup v1 (cfs quota)");
  else out.push(`cpu not capped (${why("cpu")}; the per-invocation CPU budget still applies)`);
  return out;
}

// ---------------------------------------------------------------------------------------------
// A pool's folders and its workers' folders

export interface WorkerCgroup {
  /** Files the wrapper writes its pid into before exec'ing the sandbox. */
  procsFiles: string[];
  memory: boolean;
  pids: boolean;
  cpu: boolean;
  /** Which version enforces each limit for this worker. */
  by: CgroupEnforcement;
  /** Kills by the OOM killer inside this cgroup so far. */
  oomKills(): number;
  /** The pids of every process in it (one read of cgroup.procs). */
  processes(): number[];
  killAll(): void;
  remove(): Promise<void>;
}

export interface CgroupLimits {
  memoryMb: number;
  maxProcesses: number;
  /** CPUs' worth of time per period (0.5 = half a CPU). */
  cpus: number;
}

interface PoolDir {
  version: CgroupVersion;
  dir: string;
  controllers: CgroupController[];
}

/**
 * One folder per pool (`kiln-<pid>-<tag>`) under Kiln's own cgroup (v2: one folder for every
 * controller; v1: one per hierarchy), one sub-folder per worker.
 */
export class CgroupHost {
  private seq = 0;
  readonly by: CgroupEnforcement;
  private constructor(
    private readonly dirs: PoolDir[],
    private readonly io: CgroupIo,
  ) {
    this.by = { ...NO_CGROUPS };
    for (const d of dirs) for (const c of d.controllers) this.by[c] = d.version;
  }

  /** The pool's folders, or null when no cgroup can enforce anything here. */
  static detect(tag: string, o: { support?: CgroupSupport; proc?: ProcView; io?: CgroupIo } = {}): CgroupHost | null {
    const io = o.io ?? realIo;
    const support = o.support ?? detectCgroups({ proc: o.proc });
    const dirs: PoolDir[] = [];
    const v2 = support.v2 ? prepareV2(support.v2, tag, io) : null;
    if (v2) dirs.push(v2);
    for (const c of CGROUP_CONTROLLERS) {
      if (v2?.controllers.includes(c)) continue;
      // v2 preferred; v1 for a controller bound to a v1 hierarchy (a controller is in one or the other).
      const own = support.v1[c];
      const dir = own ? prepareV1(c, own, tag, io) : null;
      if (dir) dirs.push({ version: 1, dir, controllers: [c] });
    }
    return dirs.length ? new CgroupHost(dirs, io) : null;
  }

  get hasMemory(): boolean {
    return this.by.memory !== null;
  }
  get hasPids(): boolean {
    return this.by.pids !== null;
  }
  get hasCpu(): boolean {
    return this.by.cpu !== null;
  }

  create(limits: CgroupLimits): WorkerCgroup {
    const name = `w${++this.seq}`;
    const made: PoolDir[] = [];
    const io = this.io;
    try {
      for (const p of this.dirs) {
        const dir = join(p.dir, name);
        mkdirSync(dir);
        made.push({ ...p, dir });
        for (const c of p.controllers) writeLimit(p.version, c, dir, limits);
      }
    } catch (e) {
      for (const d of made) tryRmdir(d.dir, io);
      throw e;
    }
    const by = { ...this.by };
    const memDir = made.find((d) => d.controllers.includes("memory"));
    return {
      procsFiles: made.map((d) => join(d.dir, "cgroup.procs")),
      memory: by.memory !== null,
      pids: by.pids !== null,
      cpu: by.cpu !== null,
      by,
      oomKills: () => (memDir ? oomKills(memDir) : 0),
      // Every hierarchy holds the same processes: the wrapper joins each before the sandbox starts.
      processes: () => (made[0] ? readPids(join(made[0].dir, "cgroup.procs")) : []),
      killAll: () => {
        for (const d of made) {
          // v2 (5.14+): the kernel kills every process of the folder at once.
          if (d.version === 2 && existsSync(join(d.dir, "cgroup.kill"))) {
            try {
              writeFileSync(join(d.dir, "cgroup.kill"), "1");
              continue;
            } catch {
              // fall through to one by one
            }
          }
          for (const pid of readPids(join(d.dir, "cgroup.procs"))) {
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
        for (const d of made) {
          for (let i = 0; i < 50 && !tryRmdir(d.dir, io); i++) await new Promise((r) => setTimeout(r, 20));
        }
      },
    };
  }

  /** Removes the pool's folders (after all workers are gone). Kiln stays in kiln-main, if it moved there. */
  dispose(): void {
    for (const d of this.dirs) tryRmdir(d.dir, this.io);
  }
}

function writeLimit(version: CgroupVersion, c: CgroupController, dir: string, l: CgroupLimits): void {
  const bytes = String(Math.floor(l.memoryMb * 1024 * 1024));
  const quota = cpuQuota(l.cpus);
  if (version === 2) {
    if (c === "memory") {
      writeFileSync(join(dir, "memory.max"), bytes);
      // No paging out instead of hitting the limit; kernels without swap accounting lack the file.
      tryWrite(join(dir, "memory.swap.max"), "0");
      // The OOM killer takes the whole worker (sandbox, runtime, children), not one of its processes.
      tryWrite(join(dir, "memory.oom.group"), "1");
    } else if (c === "pids") {
      writeFileSync(join(dir, "pids.max"), String(l.maxProcesses));
    } else {
      writeFileSync(join(dir, "cpu.max"), `${quota} ${CPU_PERIOD_US}`);
    }
    return;
  }
  if (c === "memory") {
    writeFileSync(join(dir, "memory.limit_in_bytes"), bytes);
    // With swap accounting, memory+swap gets the same cap so a hog cannot page out instead.
    if (existsSync(join(dir, "memory.memsw.limit_in_bytes"))) writeFileSync(join(dir, "memory.memsw.limit_in_bytes"), bytes);
  } else if (c === "pids") {
    writeFileSync(join(dir, "pids.max"), String(l.maxProcesses));
  } else {
    writeFileSync(join(dir, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
    writeFileSync(join(dir, "cpu.cfs_quota_us"), String(quota));
  }
}

/** The CFS quota for `cpus` CPUs per period; the kernel's minimum is 1 ms. */
export function cpuQuota(cpus: number): number {
  return Math.max(1000, Math.round((Number.isFinite(cpus) && cpus > 0 ? cpus : DEFAULT_CPUS) * CPU_PERIOD_US));
}

function oomKills(d: PoolDir): number {
  try {
    if (d.version === 2) {
      const m = /^oom_kill (\d+)/m.exec(readFileSync(join(d.dir, "memory.events"), "utf8"));
      return m ? Number(m[1]) : 0;
    }
    const m = /oom_kill (\d+)/.exec(readFileSync(join(d.dir, "memory.oom_control"), "utf8"));
    // Kernels before 4.13 have no oom_kill counter; a hit limit is the next best sign.
    if (m) return Number(m[1]);
    return Number(readFileSync(join(d.dir, "memory.failcnt"), "utf8")) > 0 ? 1 : 0;
  } catch {
    return 0;
  }
}

const PROBE: CgroupLimits = { memoryMb: 64, maxProcesses: 16, cpus: 1 };

function prepareV2(site: V2Site, tag: string, io: CgroupIo): PoolDir | null {
  const base = site.base;
  sweepStale(base, io);
  const enabled = tokens(join(base, "cgroup.subtree_control"));
  let controllers = site.controllers.filter((c) => enabled.has(c));
  const missing = site.controllers.filter((c) => !enabled.has(c));
  if (missing.length) {
    const moved = site.mustMove ? moveProcesses(base, join(base, MAIN_LEAF)) : null;
    if (site.mustMove && !moved) return null;
    const now = enableControllers(base, missing);
    if (!now.length && moved) {
      // Something in Kiln's cgroup could not move (another user's process): put everything back.
      moveBack(moved, base, io);
    }
    controllers = [...controllers, ...now];
  }
  if (!controllers.length) return null;
  const dir = join(base, `kiln-${process.pid}-${tag}`);
  try {
    mkdirSync(dir);
  } catch {
    return null;
  }
  controllers = enableControllers(dir, controllers);
  // Prove a limit can be put on a worker's folder (a foreign or read-only tree fails here).
  const probe = join(dir, "probe");
  try {
    mkdirSync(probe);
    controllers = controllers.filter((c) => {
      try {
        writeLimit(2, c, probe, PROBE);
        return true;
      } catch {
        return false;
      }
    });
  } catch {
    controllers = [];
  }
  tryRmdir(probe, io);
  if (!controllers.length) {
    tryRmdir(dir, io);
    return null;
  }
  return { version: 2, dir, controllers };
}

/** Writes `+<controller>` to the folder's cgroup.subtree_control, one write each; returns those that took. */
function enableControllers(dir: string, controllers: CgroupController[]): CgroupController[] {
  const ok: CgroupController[] = [];
  let fd: number;
  try {
    fd = openSync(join(dir, "cgroup.subtree_control"), "w");
  } catch {
    return ok;
  }
  try {
    for (const c of controllers) {
      try {
        writeSync(fd, `+${c}\n`);
        ok.push(c);
      } catch {
        // not delegated here, or processes still inside (EBUSY)
      }
    }
  } finally {
    closeSync(fd);
  }
  return ok;
}

interface Moved {
  leaf: string;
  created: boolean;
  pids: number[];
}

/**
 * Moves every process of `from` into the leaf `to` ("no internal processes": a non-root v2 cgroup
 * with processes cannot enable controllers for its children). Null if the leaf cannot be made.
 */
function moveProcesses(from: string, to: string): Moved | null {
  let created = false;
  try {
    mkdirSync(to);
    created = true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EEXIST") return null;
  }
  const pids: number[] = [];
  let fd: number;
  try {
    fd = openSync(join(to, "cgroup.procs"), "w");
  } catch {
    return null;
  }
  try {
    // Kiln first: if anything else cannot move, Kiln at least is where later pools look for it.
    const all = readPids(join(from, "cgroup.procs"));
    for (const pid of [...all.filter((p) => p === process.pid), ...all.filter((p) => p !== process.pid)]) {
      try {
        writeSync(fd, `${pid}\n`);
        pids.push(pid);
      } catch {
        // gone meanwhile, or not ours to move: the enabling below then fails and everything moves back
      }
    }
  } finally {
    closeSync(fd);
  }
  return { leaf: to, created, pids };
}

function moveBack(m: Moved, to: string, io: CgroupIo): void {
  try {
    const fd = openSync(join(to, "cgroup.procs"), "w");
    try {
      for (const pid of m.pids) {
        try {
          writeSync(fd, `${pid}\n`);
        } catch {
          // gone
        }
      }
    } finally {
      closeSync(fd);
    }
  } catch {
    return;
  }
  if (m.created) tryRmdir(m.leaf, io);
}

function prepareV1(name: CgroupController, base: string, tag: string, io: CgroupIo): string | null {
  sweepStale(base, io);
  const dir = join(base, `kiln-${process.pid}-${tag}`);
  try {
    mkdirSync(dir);
    // Prove we can put a limit and a process in (a read-only or foreign hierarchy fails here).
    const probe = join(dir, "probe");
    mkdirSync(probe);
    writeLimit(1, name, probe, PROBE);
    tryRmdir(probe, io);
    return dir;
  } catch {
    tryRmdir(join(dir, "probe"), io);
    tryRmdir(dir, io);
    return null;
  }
}

/** Folders left by Kiln processes that died: empty by now (their workers died with them). */
function sweepStale(base: string, io: CgroupIo): void {
  for (const e of safeReaddir(base)) {
    const m = /^kiln-(\d+)-/.exec(e);
    if (m && !pidAlive(Number(m[1]))) {
      for (const w of safeReaddir(join(base, e))) if (/^w\d+$|^probe$/.test(w)) tryRmdir(join(base, e, w), io);
      tryRmdir(join(base, e), io);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Where the hierarchies are

interface MountSite {
  root: string;
  point: string;
}

function findMount(mountinfo: string, match: (fstype: string, superOpts: string[]) => boolean): MountSite | null {
  // mountinfo: id parent major:minor root mountpoint opts ... - fstype source superopts
  for (const line of mountinfo.split("\n")) {
    const [pre, post] = line.split(" - ");
    if (!post) continue;
    const [fstype, , superOpts] = post.split(" ");
    if (!fstype || !match(fstype, superOpts?.split(",") ?? [])) continue;
    const f = pre!.split(" ");
    if (f[3] && f[4]) return { root: unescapeMount(f[3]), point: unescapeMount(f[4]) };
  }
  return null;
}

/** mountinfo writes space, tab, newline and backslash as octal escapes. */
function unescapeMount(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** This process's own folder in the v1 hierarchy that has `name`. */
function v1Dir(proc: ProcView, name: CgroupController): string | null {
  const mount = findMount(proc.mountinfo, (fstype, opts) => fstype === "cgroup" && opts.includes(name));
  if (!mount) return null;
  const entry = proc.cgroup.split("\n").find((l) => l.split(":")[1]?.split(",").includes(name));
  const path = entry?.split(":").slice(2).join(":") ?? "/";
  const rel = isUnder(path, mount.root) ? relative(mount.root, path) : "";
  const dir = join(mount.point, rel);
  return existsSync(dir) ? dir : existsSync(mount.point) ? mount.point : null;
}

// ---------------------------------------------------------------------------------------------

function writable(p: string): boolean {
  try {
    accessSync(p, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

function tokens(file: string): Set<string> {
  try {
    return new Set(readFileSync(file, "utf8").split(/\s+/).map((t) => t.replace(/^\+/, "")).filter(Boolean));
  } catch {
    return new Set();
  }
}

function tryWrite(file: string, value: string): void {
  try {
    writeFileSync(file, value);
  } catch {
    // optional
  }
}

function tryRmdir(d: string, io: CgroupIo = realIo): boolean {
  try {
    io.rmdir(d);
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
