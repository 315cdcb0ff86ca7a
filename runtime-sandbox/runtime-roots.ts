import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { accessSync, constants, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";

/**
 * Root filesystems Kiln provisions for the Python and Ruby runtime names: for each name whose exact
 * minor version some Debian suite ships, a root extracted once by `mmdebstrap --variant=extract`
 * (the interpreter, its standard library, pip's wheel or Bundler, util-linux and perl-base for the
 * sandbox's own tools) from that suite. The sandbox mounts the root's /usr instead of the host's, so
 * a function sees the same interpreter and libraries on every machine, in bubblewrap, in the
 * namespaces sandbox and in a container alike.
 *
 * A root lives at `<cache>/runtimes/<name>-<recipe hash>`: the hash covers everything that decides
 * its content (suite, mirrors, packages, format), so a changed recipe is a new folder and an old one
 * is only ever removed by `kiln runtimes prune`. It is built in a temporary folder and renamed into
 * place with a marker written last, as the Node installs are.
 *
 * Names with no Debian source (python3.10, python3.12, ruby4.0) have no recipe: they are served by a
 * host interpreter of exactly that version (`--runtime-path`, PATH, pyenv/rbenv) or refused.
 */

export interface RootRecipe {
  kind: "python" | "ruby";
  /** major.minor the interpreter must report. */
  version: string;
  suite: string;
  /** apt source lines; empty: mmdebstrap's default mirror for the suite. */
  mirrors: string[];
  packages: string[];
  /** The interpreter inside the root. */
  binary: string;
  /** The suite it comes from, as people name it ("experimental" for ruby3.4, on top of sid). */
  from?: string;
}

const DEBIAN = "http://deb.debian.org/debian";
// The sandbox's own tools run inside the root: setpriv, unshare, umount and mount (namespace-sandbox.sh
// after its pivot_root, and a root Kiln's drop to the sandbox uid), prlimit, and perl for the seccomp loader.
// libc-bin: the C.UTF-8 locale (/usr/lib/locale/C.utf8) the sandbox's LANG names; without it Perl
// warns on every start and Ruby's default encoding falls back to US-ASCII.
// dash: /bin/sh, for os.system, subprocess with shell=True, Ruby's system/backticks.
const SANDBOX_TOOLS = ["util-linux", "mount", "perl-base", "ca-certificates", "libc-bin", "dash"];
const py = (v: string, suite: string, mirrors: string[] = []): RootRecipe => ({
  kind: "python",
  version: v,
  suite,
  mirrors,
  // pip comes as Debian's wheel (python3-pip-whl), run from the wheel: python3-pip would pull in the
  // suite's default python3, another minor version.
  packages: [`python${v}-minimal`, `libpython${v}-stdlib`, "python3-pip-whl", ...SANDBOX_TOOLS],
  binary: `/usr/bin/python${v}`,
});

export const ROOT_RECIPES: Record<string, RootRecipe> = {
  "python3.11": py("3.11", "bookworm"),
  "python3.13": py("3.13", "trixie"),
  "python3.14": py("3.14", "sid"),
  "ruby3.3": { kind: "ruby", version: "3.3", suite: "trixie", mirrors: [], packages: ["ruby3.3", ...SANDBOX_TOOLS], binary: "/usr/bin/ruby3.3" },
  "ruby3.4": {
    kind: "ruby",
    version: "3.4",
    suite: "sid",
    mirrors: [`deb ${DEBIAN} sid main`, `deb ${DEBIAN} experimental main`],
    // apt takes only the named packages from experimental: the C library it was built against too.
    packages: ["ruby3.4/experimental", "libruby3.4/experimental", "libc6/experimental", "libc-gconv-modules-extra/experimental", "libc-bin/experimental", ...SANDBOX_TOOLS.filter((p) => p !== "libc-bin")],
    binary: "/usr/bin/ruby3.4",
    from: "experimental",
  },
};

/** Where no reachable source ships the version: what serves it instead, for doctor and the docs. */
export const NO_SOURCE: Record<string, string> = {
  "python3.10": "no Debian suite ships Python 3.10 (PyPI and python.org builds are not reachable from here)",
  "python3.12": "no Debian suite ships Python 3.12 (bookworm has 3.11, trixie 3.13)",
  "ruby4.0": "no Debian suite ships Ruby 4.0 (experimental stops at 3.4)",
};

/** The suite as people name it: "experimental" for a root of experimental packages on sid. */
export function sourceName(r: RootRecipe): string {
  return r.from ?? r.suite;
}

export function howToProvide(name: string): string {
  const manager = name.startsWith("python") ? "pyenv" : "rbenv";
  return `give Kiln an interpreter of exactly that version: kiln start --runtime-path ${name}=/path/to/${name} (KILN_RUNTIME_PATHS), or put it on PATH as ${name} or in ${manager} (${manager} install ${name.replace(/^\D+/, "")}); it serves both --function-runtime process and docker (where an image of it also does: --runtime-image ${name}=<image>)`;
}

// 2: Python roots carry the standard library's bytecode.
const FORMAT = 2;
const MARKER = "kiln-root.json";

export interface RootInfo {
  name: string;
  dir: string;
  /** Full interpreter version, e.g. "3.13.5". */
  version: string;
  binary: string;
  suite: string;
  packages: string[];
  bytes: number;
  builtAt: string;
}

export function recipeKey(r: RootRecipe): string {
  return createHash("sha256").update(JSON.stringify({ FORMAT, suite: r.suite, mirrors: r.mirrors, packages: r.packages, variant: "extract" })).digest("hex").slice(0, 16);
}

export function runtimesDir(cache: string): string {
  return join(cache, "runtimes");
}

export function rootDir(cache: string, name: string): string {
  return join(runtimesDir(cache), `${name}-${recipeKey(ROOT_RECIPES[name]!)}`);
}

export function readRoot(dir: string): RootInfo | null {
  try {
    const m = JSON.parse(readFileSync(join(dir, MARKER), "utf8")) as Omit<RootInfo, "dir">;
    if (!existsSync(join(dir, m.binary))) return null;
    return { ...m, dir };
  } catch {
    return null;
  }
}

export function cachedRoot(cache: string, name: string): RootInfo | null {
  return ROOT_RECIPES[name] ? readRoot(rootDir(cache, name)) : null;
}

export type Progress = (p: { phase: string; bytes: number }) => void;

/** Checks the interpreter inside the finished root (in the sandbox); returns its full version. */
export type RootProbe = (root: string, recipe: RootRecipe) => Promise<string>;

const installs = new Map<string, Promise<RootInfo | { missing: string }>>();

/** The root of `name`, built now if it is not cached. Concurrent calls in this process share one build. */
export function ensureRoot(cache: string, name: string, probe: RootProbe, progress?: Progress): Promise<RootInfo | { missing: string }> {
  const ready = cachedRoot(cache, name);
  if (ready) return Promise.resolve(ready);
  let p = installs.get(name);
  if (!p) {
    p = buildRoot(cache, name, probe, progress).finally(() => installs.delete(name));
    installs.set(name, p);
  }
  return p;
}

async function buildRoot(cache: string, name: string, probe: RootProbe, progress?: Progress): Promise<RootInfo | { missing: string }> {
  const recipe = ROOT_RECIPES[name]!;
  const what = `${recipe.kind === "python" ? "Python" : "Ruby"} ${recipe.version}`;
  const mmdebstrap = ["/usr/bin/mmdebstrap", "/usr/local/bin/mmdebstrap"].find(isExecutable);
  if (!mmdebstrap) return { missing: `${what} (Kiln builds its root from Debian's ${sourceName(recipe)} with mmdebstrap, which is not installed: apt-get install mmdebstrap; or ${howToProvide(name)})` };
  const dir = rootDir(cache, name);
  mkdirSync(runtimesDir(cache), { recursive: true });
  removeDeadBuilds(cache);
  const tmp = `${dir}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  const args = [
    "--variant=extract",
    // Debian's Release files carry a Valid-Until; a machine whose clock runs ahead of the mirror's
    // snapshot would refuse them. The signatures are still checked.
    "--aptopt=Acquire::Check-Valid-Until \"false\"",
    `--include=${recipe.packages.join(",")}`,
    recipe.suite,
    tmp,
    ...recipe.mirrors,
  ];
  const t0 = Date.now();
  try {
    await runWithProgress(mmdebstrap, args, tmp, progress);
    // apt's lists and downloaded .debs are not part of the runtime.
    for (const d of ["var/cache/apt", "var/lib/apt/lists"]) rmSync(join(tmp, d), { recursive: true, force: true });
    mergeUsr(tmp);
    if (recipe.kind === "python") {
      progress?.({ phase: "compiling the standard library", bytes: du(tmp) });
      compileStdlib(tmp, recipe);
    }
    progress?.({ phase: "checking the interpreter", bytes: du(tmp) });
    const version = await probe(tmp, recipe);
    if (version.split(".").slice(0, 2).join(".") !== recipe.version) return { missing: `${what} (the root from ${sourceName(recipe)} runs ${version})` };
    const info: Omit<RootInfo, "dir"> = { name, version, binary: recipe.binary, suite: sourceName(recipe), packages: recipe.packages, bytes: du(tmp), builtAt: new Date().toISOString() };
    writeFileSync(join(tmp, MARKER), JSON.stringify({ ...info, seconds: (Date.now() - t0) / 1000 }));
    if (existsSync(dir) && !readRoot(dir)) rmSync(dir, { recursive: true, force: true });
    try {
      renameSync(tmp, dir);
    } catch {
      // another process finished first; its root is as good as ours
    }
    return readRoot(dir) ?? { missing: `${what} (the root in ${dir} is unusable)` };
  } catch (e) {
    return { missing: `${what} (building its root from Debian ${sourceName(recipe)} failed: ${(e as Error).message})` };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * The sandbox binds only the root's /usr, so the root must be merged-/usr: the links come from
 * base-files' maintainer scripts, which an extract never runs, and bookworm's packages still ship
 * files under /bin and /lib (its usrmerge is a conversion script): those are moved into /usr first.
 */
function mergeUsr(root: string): void {
  for (const l of ["bin", "sbin", "lib", "lib64"]) {
    const top = join(root, l);
    const usr = join(root, "usr", l);
    if (isDir(top) && !lstatSync(top).isSymbolicLink()) {
      mkdirSync(usr, { recursive: true });
      const r = spawnSync("cp", ["-a", "--remove-destination", `${top}/.`, `${usr}/`], { stdio: ["ignore", "ignore", "pipe"] });
      if (r.status !== 0) throw new Error(`merging /${l} into /usr/${l}: ${String(r.stderr).trim()}`);
      rmSync(top, { recursive: true, force: true });
    }
    if (!existsSync(top) && isDir(usr)) symlinkSync(`usr/${l}`, top);
  }
}

/**
 * Debian byte-compiles Python's standard library in its maintainer scripts, which an extract never
 * runs, and the sandbox's /usr is read-only: without this every cold start compiles what it imports
 * (measured: 5.5 s against 1.4 s for two sandboxed starts importing json, logging, asyncio). The
 * root's own interpreter does it, started through the root's dynamic loader and libraries (this runs
 * on the host, where its /usr is writable); `-s ROOT -p /` records the paths as the sandbox sees them.
 */
function compileStdlib(root: string, recipe: RootRecipe): void {
  const loader = ["usr/lib64/ld-linux-x86-64.so.2", "usr/lib/ld-linux-aarch64.so.1"].map((l) => join(root, l)).find((l) => existsSync(l));
  const libDirs = safeList(join(root, "usr/lib")).filter((d) => /-linux-gnu/.test(d)).map((d) => join(root, "usr/lib", d));
  if (!loader || !libDirs.length) throw new Error("no dynamic loader in the root to byte-compile Python's standard library with");
  const lib = join(root, "usr/lib", basename(recipe.binary));
  const r = spawnSync(
    loader,
    ["--library-path", libDirs.join(":"), join(root, recipe.binary), "-m", "compileall", "-q", "-s", root, "-p", "/", "-x", "/(test|idlelib|tkinter|turtledemo|lib2to3|ensurepip)/", lib],
    { env: { PYTHONHOME: join(root, "usr"), LANG: "C.UTF-8" }, stdio: ["ignore", "ignore", "pipe"], timeout: 10 * 60_000 },
  );
  if (r.status !== 0) throw new Error(`byte-compiling Python's standard library failed: ${String(r.stderr).trim().split("\n").pop() ?? r.status}`);
}

function runWithProgress(cmd: string, args: string[], dir: string, progress?: Progress): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C.UTF-8", ...(process.env.http_proxy ? { http_proxy: process.env.http_proxy } : {}) } });
    let phase = "starting mmdebstrap";
    const tail: string[] = [];
    const onLine = (l: string) => {
      if (!l.trim()) return;
      tail.push(l);
      if (tail.length > 20) tail.shift();
      const m = /^I: (.*?)\.*$/.exec(l);
      if (m) {
        phase = m[1]!;
        progress?.({ phase, bytes: du(dir) });
      }
    };
    for (const s of [child.stdout!, child.stderr!]) {
      let buf = "";
      s.on("data", (d: Buffer) => {
        buf += d.toString();
        const lines = buf.split("\n");
        buf = lines.pop()!;
        lines.forEach(onLine);
      });
    }
    const timer = progress ? setInterval(() => progress({ phase, bytes: du(dir) }), 1000) : null;
    const limit = setTimeout(() => child.kill("SIGKILL"), 15 * 60_000);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (timer) clearInterval(timer);
      clearTimeout(limit);
      if (code === 0) resolve();
      else reject(new Error(tail.filter((l) => /^E: /.test(l)).join("; ") || tail.pop() || `mmdebstrap ended with ${code ?? signal}`));
    });
  });
}

/** Bytes under `dir` (files only; links count as themselves). */
export function du(dir: string): number {
  let total = 0;
  const walk = (d: string) => {
    let entries: string[];
    try {
      entries = readdirSync(d);
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(d, e);
      try {
        const st = lstatSync(p);
        if (st.isDirectory()) walk(p);
        else total += st.size;
      } catch {
        // vanished while counting
      }
    }
  };
  walk(dir);
  return total;
}

function removeDeadBuilds(cache: string): void {
  for (const e of safeList(runtimesDir(cache))) {
    const m = /\.tmp-(\d+)-/.exec(e);
    if (!m || Number(m[1]) === process.pid || alive(Number(m[1]))) continue;
    rmSync(join(runtimesDir(cache), e), { recursive: true, force: true });
  }
}

function safeList(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
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

/** Everything in the runtimes folder: roots (current or stale), Node installs, leftovers. */
export function listCache(cache: string): Array<{ entry: string; name: string; current: boolean; bytes: number; version: string | null }> {
  const out: Array<{ entry: string; name: string; current: boolean; bytes: number; version: string | null }> = [];
  for (const e of safeList(runtimesDir(cache))) {
    const p = join(runtimesDir(cache), e);
    const root = readRoot(p);
    if (root) {
      out.push({ entry: e, name: root.name, current: ROOT_RECIPES[root.name] !== undefined && basename(rootDir(cache, root.name)) === e, bytes: root.bytes, version: root.version });
      continue;
    }
    const node = /^node(\d+)$/.exec(e);
    let version: string | null = null;
    if (node) {
      try {
        version = (JSON.parse(readFileSync(join(p, "kiln-runtime.json"), "utf8")) as { version: string }).version;
      } catch {
        // not finished
      }
    }
    out.push({ entry: e, name: node ? `nodejs${node[1]}.x` : e, current: !!node && version !== null, bytes: du(p), version });
  }
  return out;
}

/** Removes stale roots (an old recipe), unfinished builds of dead processes, and with `all` everything. */
export function pruneCache(cache: string, all = false): Array<{ entry: string; bytes: number }> {
  const removed: Array<{ entry: string; bytes: number }> = [];
  for (const e of listCache(cache)) {
    const m = /\.tmp-(\d+)-/.exec(e.entry);
    if (m && alive(Number(m[1]))) continue; // a build in progress
    if (e.current && !all) continue;
    rmSync(join(runtimesDir(cache), e.entry), { recursive: true, force: true });
    removed.push({ entry: e.entry, bytes: e.bytes });
  }
  return removed;
}

/** The root's top-level merged-/usr links (bin → usr/bin, lib64 → usr/lib64, ...). */
export function rootLinks(root: string): Array<{ dest: string; target: string }> {
  const out: Array<{ dest: string; target: string }> = [];
  for (const p of ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]) {
    try {
      if (lstatSync(join(root, p)).isSymbolicLink()) out.push({ dest: `/${p}`, target: readlinkSync(join(root, p)) });
    } catch {
      // not in this root
    }
  }
  return out;
}

/** A regular file this process may execute. */
export function isExecutable(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

export function isDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}
