import { COMPILED, extractedDir } from "../server/embedded/embedded";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { SANDBOX_UID, systemMountList, systemPartLength, type Mount } from "./mounts";
import { which } from "./which";
import { seccompLoader } from "./seccomp";

/**
 * How a local worker or build is isolated from the host. Three kinds, best first:
 *
 * - `bubblewrap`: bwrap builds the sandbox (user, mount, pid, ipc, uts and network namespaces).
 * - `namespaces`: the same namespaces and mount list built by namespace-sandbox.sh from util-linux
 *   alone (unshare, mount, pivot_root, setpriv), which every distribution ships: a fresh machine
 *   with nothing but Node and npm is isolated without installing bubblewrap.
 * - `none`: a plain host process. Only when the user asked for it (--allow-unsandboxed-functions).
 *
 * In every kind user code never runs as root: when Kiln runs as root it is dropped to a dedicated
 * unprivileged uid (KILN_SANDBOX_UID, default 64000), and inside a sandbox it sees itself as uid
 * 1000 of a user namespace where the host allows one.
 */

export type SandboxKind = "bubblewrap" | "namespaces" | "none";
export type SandboxChoice = "auto" | "bubblewrap" | "namespaces";

/** What one sandboxed process gets. */
export interface Enclosure {
  /** From sandboxMounts: the system part first, then the rest. */
  mounts: Mount[];
  /** false: its own network namespace with only a loopback. */
  network: boolean;
  tmpfsBytes: number;
  hostname: string;
  chdir: string;
}

export interface EnclosedCommand {
  argv: string[];
  /** Spawn as this user (an unsandboxed process of a root Kiln). */
  uid?: number;
  gid?: number;
}

export interface Isolation {
  readonly kind: SandboxKind;
  /** One line for the start-up log and `kiln doctor`. */
  readonly description: string;
  enclose(e: Enclosure, command: string[]): EnclosedCommand;
}

/** The host uid user code runs as when Kiln is root; null when Kiln is not root (it runs as Kiln's user). */
export function sandboxUser(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const raw = process.env.KILN_SANDBOX_UID ?? "64000";
  const uid = Number(raw);
  if (!Number.isInteger(uid) || uid <= 0 || uid >= 2 ** 31) throw new Error(`KILN_SANDBOX_UID must be a positive uid, got "${raw}"`);
  return { uid, gid: uid };
}

const tools = new Map<string, string | null>();
/** util-linux and bubblewrap tools by absolute path (the sandbox's PATH is not the host's). */
export function hostTool(name: "prlimit" | "chrt" | "setpriv" | "unshare" | "bwrap"): string | null {
  if (!tools.has(name)) tools.set(name, [`/usr/bin/${name}`, `/bin/${name}`, `/usr/sbin/${name}`].find((p) => existsSync(p)) ?? which(name));
  return tools.get(name)!;
}

// ---------------------------------------------------------------------------------------------
// bubblewrap

interface BwrapInfo {
  path: string;
  /** --size for tmpfs and --disable-userns arrived in 0.8.0. */
  modern: boolean;
  /** --perms arrived in 0.5.0 (a root Kiln needs it for a /tmp the dropped uid can write). */
  perms: boolean;
}

class Bubblewrap implements Isolation {
  readonly kind = "bubblewrap" as const;
  readonly description: string;
  constructor(
    private readonly bw: BwrapInfo,
    private readonly user: { uid: number; gid: number; userns: boolean } | null,
  ) {
    this.description = `bubblewrap (${bw.path})${user ? `, user code as uid ${user.uid}` : ""}, ${seccompNote()}`;
  }

  enclose(e: Enclosure, command: string[]): EnclosedCommand {
    const a = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"];
    if (!e.network) a.push("--unshare-net");
    if (this.user) {
      // A root Kiln: bwrap runs privileged (no user namespace, which would map the sandbox to
      // root), keeps only what setpriv needs to drop to the sandbox uid, and setpriv drops the rest.
      a.push("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP");
    } else {
      a.push("--unshare-user");
      if (this.bw.modern) a.push("--disable-userns");
      a.push("--uid", SANDBOX_UID, "--gid", SANDBOX_UID, "--cap-drop", "ALL");
    }
    a.push("--hostname", e.hostname);
    // The system part, then /proc, /dev and the private /tmp, then the runtime, bootstraps and code
    // (a runtime cached under /tmp stays visible), then the covers on top of what they hide.
    const system = systemPartLength(e.mounts);
    // The folders leading to a bind (/etc, /root/.cache/... for a runtime under root's home) are
    // made 0755 first: a privileged bwrap would make them 0700, shutting the dropped uid out.
    if (this.user) for (const d of parentDirs(e.mounts)) a.push("--perms", "0755", "--dir", d);
    a.push(...toBwrap(e.mounts.slice(0, system)));
    a.push("--proc", "/proc", "--dev", "/dev");
    if (this.bw.modern) a.push("--size", String(e.tmpfsBytes));
    if (this.user) a.push("--perms", "1777");
    a.push("--tmpfs", "/tmp");
    a.push(...toBwrap(e.mounts.slice(system)));
    a.push("--chdir", e.chdir);
    return { argv: [this.bw.path, ...a, "--", ...dropTo(this.user), ...seccompPrefix(), ...command] };
  }
}

/** The seccomp loader (seccomp.ts) goes last, after every namespace the sandbox makes, right before the command. */
function seccompPrefix(): string[] {
  const s = seccompLoader();
  return typeof s === "string" ? [] : s.prefix;
}

function seccompNote(): string {
  const s = seccompLoader();
  return typeof s === "string" ? `no seccomp filter (${s})` : "seccomp filter";
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

function parentDirs(mounts: Mount[]): string[] {
  const out = new Set<string>();
  for (const m of mounts) {
    const parts = m.dest.split("/").filter(Boolean);
    for (let i = 1; i < parts.length; i++) out.add("/" + parts.slice(0, i).join("/"));
  }
  // /tmp is the private tmpfs already: a runtime cached under it keeps that tmpfs's own mode.
  return [...out].filter((d) => d !== "/tmp").sort((x, y) => x.length - y.length);
}

/** For a root Kiln: become the sandbox uid with no capabilities, seen as uid 1000 where user namespaces work. */
function dropTo(user: { uid: number; gid: number; userns: boolean } | null): string[] {
  if (!user) return [];
  const setpriv = [hostTool("setpriv")!, `--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"];
  return user.userns ? [...setpriv, hostTool("unshare")!, "--user", `--map-user=${SANDBOX_UID}`, `--map-group=${SANDBOX_UID}`, "--"] : setpriv;
}

// ---------------------------------------------------------------------------------------------
// Namespaces from util-linux (namespace-sandbox.sh)

const NS_SCRIPT = COMPILED ? join(extractedDir("sandbox-scripts"), "namespace-sandbox.sh") : join(import.meta.dirname, "namespace-sandbox.sh");
let nsRoot: string | null = null;

/** The empty dir sandboxes mount their root on (in their own mount namespaces); gone when Kiln exits. */
function sandboxMountPoint(): string {
  const dir = mkdtempSync(join(tmpdir(), "kiln-sandbox-root-"));
  process.once("exit", () => {
    try {
      rmdirSync(dir);
    } catch {}
  });
  return dir;
}

class Namespaces implements Isolation {
  readonly kind = "namespaces" as const;
  readonly description: string;
  constructor(private readonly user: { uid: number; gid: number; userns: boolean } | null) {
    this.description = `Linux namespaces through util-linux (unshare, mount, pivot_root, setpriv)${user ? `, user code as uid ${user.uid}` : ""}, ${seccompNote()}`;
  }

  enclose(e: Enclosure, command: string[]): EnclosedCommand {
    // One empty directory serves every sandbox of this Kiln as the mount point of its new root:
    // each mounts its own tmpfs there, in its own mount namespace.
    nsRoot ??= sandboxMountPoint();
    const unshare = [hostTool("unshare")!, ...(this.user ? [] : ["--user", "--map-root-user"]), "--mount", "--pid", "--ipc", "--uts", "--cgroup"];
    if (!e.network) unshare.push("--net");
    unshare.push("--kill-child", "--propagation", "private", "--");
    const plan: string[] = ["--root", nsRoot];
    const system = systemPartLength(e.mounts);
    plan.push(...toPlan(e.mounts.slice(0, system)), "--proc", "--dev", "--tmpfs", "/tmp", String(e.tmpfsBytes), ...toPlan(e.mounts.slice(system)));
    plan.push("--hostname", e.hostname, "--chdir", e.chdir);
    if (!e.network) plan.push("--lo-up");
    if (this.user) plan.push("--drop-to", String(this.user.uid), String(this.user.gid));
    if (!this.user || this.user.userns) plan.push("--map-user", SANDBOX_UID);
    // The seccomp loader, when there is one, also finishes the sandbox (one process instead of ten).
    const loader = seccompPrefix();
    if (loader.length) plan.push("--setup-by-loader");
    // setpriv --pdeathsig: unshare dies with Kiln, and --kill-child takes the sandbox with it.
    return { argv: [hostTool("setpriv")!, "--pdeathsig", "KILL", "--", ...unshare, "/bin/sh", NS_SCRIPT, ...plan, "--", ...loader, ...command] };
  }
}

function toPlan(mounts: Mount[]): string[] {
  const a: string[] = [];
  for (const m of mounts) {
    if (m.kind === "bind") a.push(m.writable ? "--bind" : "--ro-bind", m.src, m.dest);
    else if (m.kind === "symlink") a.push("--symlink", m.target, m.dest);
    else a.push(m.kind === "cover-dir" ? "--cover-dir" : "--cover-file", m.dest);
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// none

class Unsandboxed implements Isolation {
  readonly kind = "none" as const;
  readonly description: string;
  constructor(private readonly user: { uid: number; gid: number } | null) {
    this.description = `none: functions and builds run as plain processes on the host${user ? ` as uid ${user.uid}` : ""} (--allow-unsandboxed-functions)`;
  }
  enclose(_e: Enclosure, command: string[]): EnclosedCommand {
    if (!this.user) return { argv: command };
    // setpriv in the argv rather than a spawn as that uid: the cgroup wrapper before it still runs
    // as root and can put the process into its cgroups.
    const setpriv = hostTool("setpriv");
    if (!setpriv) return { argv: command, uid: this.user.uid, gid: this.user.gid };
    return { argv: [setpriv, `--reuid=${this.user.uid}`, `--regid=${this.user.gid}`, "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", ...command] };
  }
}

// ---------------------------------------------------------------------------------------------
// Choosing

export interface IsolationChoice {
  /** null: no sandbox works here and running without one was not allowed. */
  isolation: Isolation | null;
  /** Why each better kind was passed over, for the 503 message, the start-up log and doctor. */
  problems: string[];
}

const probes = new Map<string, Isolation | string>();

/** A sandbox is only taken after it ran a command here (hosts may forbid namespaces). */
function probe(kind: "bubblewrap" | "namespaces"): Isolation | string {
  const cached = probes.get(kind);
  if (cached) return cached;
  const result = kind === "bubblewrap" ? probeBubblewrap() : probeNamespaces();
  probes.set(kind, result);
  return result;
}

function userFor(kind: SandboxKind): { uid: number; gid: number; userns: boolean } | null {
  const user = sandboxUser();
  if (!user) return null;
  return { ...user, userns: kind !== "none" && sandboxUidHasUserns(user.uid) };
}

let usernsProbe: boolean | undefined;
/** Whether the dropped uid may make a user namespace (to appear as uid 1000 inside). */
function sandboxUidHasUserns(uid: number): boolean {
  if (usernsProbe !== undefined) return usernsProbe;
  const setpriv = hostTool("setpriv");
  const unshare = hostTool("unshare");
  usernsProbe = false;
  if (setpriv && unshare) {
    const r = spawnSync(setpriv, [`--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "--", unshare, "--user", `--map-user=${SANDBOX_UID}`, `--map-group=${SANDBOX_UID}`, "--", "/bin/true"], { stdio: "ignore", timeout: 10_000, env: {}, cwd: "/" });
    usernsProbe = r.status === 0;
  }
  return usernsProbe;
}

const PROBE_ENCLOSURE = (): Enclosure => ({ mounts: systemMountList(), network: false, tmpfsBytes: 1 << 20, hostname: "kiln-probe", chdir: "/" });

function probeBubblewrap(): Isolation | string {
  if (process.platform !== "linux") return "bubblewrap: not Linux";
  const path = hostTool("bwrap");
  if (!path) return "bubblewrap: not installed (apt-get install bubblewrap, dnf install bubblewrap, ...)";
  const version = /(\d+)\.(\d+)/.exec(String(spawnSync(path, ["--version"], { env: {} }).stdout ?? ""));
  const minor = version ? Number(version[1]) * 1000 + Number(version[2]) : 0;
  const info: BwrapInfo = { path, modern: minor >= 8, perms: minor >= 5 };
  const user = userFor("bubblewrap");
  if (user && !info.perms) return "bubblewrap: older than 0.5 (a root Kiln needs --perms)";
  if (user && !hostTool("setpriv")) return "bubblewrap: setpriv (util-linux) is missing, needed to drop root";
  return tryRun(new Bubblewrap(info, user), "bubblewrap");
}

function probeNamespaces(): Isolation | string {
  if (process.platform !== "linux") return "namespaces: not Linux";
  for (const t of ["unshare", "setpriv"] as const) if (!hostTool(t)) return `namespaces: ${t} (util-linux) is missing`;
  return tryRun(new Namespaces(userFor("namespaces")), "namespaces");
}

function tryRun(iso: Isolation, name: string): Isolation | string {
  const cmd = iso.enclose(PROBE_ENCLOSURE(), ["/bin/true"]);
  const r = spawnSync(cmd.argv[0]!, cmd.argv.slice(1), { stdio: ["ignore", "ignore", "pipe"], timeout: 10_000, env: { PATH: "/usr/bin:/bin" }, cwd: "/" });
  if (r.status === 0) return iso;
  const why = String(r.stderr ?? "").trim().split("\n").pop() || (r.error ? r.error.message : `exit ${r.status ?? r.signal}`);
  return `${name}: cannot create namespaces here (${why.slice(0, 200)})`;
}

/**
 * The isolation local workers and builds use: the wanted kind, or for `auto` the best that works;
 * `none` only when allowed. Probes run once per process.
 */
export function chooseIsolation(o: { want: SandboxChoice; allowUnsandboxed: boolean }): IsolationChoice {
  const kinds: Array<"bubblewrap" | "namespaces"> = o.want === "auto" ? ["bubblewrap", "namespaces"] : [o.want];
  const problems: string[] = [];
  for (const k of kinds) {
    const r = probe(k);
    if (typeof r !== "string") return { isolation: r, problems };
    problems.push(r);
  }
  if (o.allowUnsandboxed) return { isolation: unsandboxedIsolation(), problems };
  return { isolation: null, problems };
}

/** Plain host processes (as the sandbox uid when Kiln is root): only when asked for. */
export function unsandboxedIsolation(): Isolation {
  return new Unsandboxed(sandboxUser());
}

/**
 * For an unsandboxed worker of a root Kiln: the first of `paths` the sandbox uid cannot reach (a
 * folder on the way without o+x, a file without o+r), or null. Sandboxes mount what they need, so
 * only this case depends on the host's folder modes.
 */
export function unreachableByOthers(paths: string[]): string | null {
  for (const target of paths) {
    let p = resolve(target);
    try {
      const st = statSync(p);
      if (!(st.mode & (st.isDirectory() ? 0o005 : 0o004))) return p;
      for (p = dirname(p); ; p = dirname(p)) {
        if (!(statSync(p).mode & 0o001)) return p;
        if (p === "/") break;
      }
    } catch {
      return p;
    }
  }
  return null;
}

/** The message of a 503 (and of the start-up warning) when no sandbox works here. */
export function noSandboxMessage(problems: string[]): string {
  return (
    `function code cannot run here: no sandbox is available (${problems.join("; ")}). ` +
    "Install bubblewrap, or start Kiln with --function-runtime docker, or, to run function code and builds unisolated on this host, --allow-unsandboxed-functions"
  );
}

/** Test hook: forget the probes (a test that changes PATH or the environment). */
export function resetIsolationProbes(): void {
  probes.clear();
  usernsProbe = undefined;
}

/** Kiln's own process: not dumpable, so processes of the same uid cannot read its /proc entries. */
export function hideOwnProcEntries(): boolean {
  if (process.platform !== "linux") return false;
  try {
    // bun:ffi is Bun's; under another runtime this is skipped.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { dlopen, FFIType } = require("bun:ffi") as typeof import("bun:ffi");
    const libc = dlopen("libc.so.6", { prctl: { args: [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64], returns: FFIType.i32 } });
    const PR_SET_DUMPABLE = 4;
    const ok = libc.symbols.prctl(PR_SET_DUMPABLE, 0n, 0n, 0n, 0n) === 0;
    libc.close();
    return ok;
  } catch {
    return false;
  }
}
