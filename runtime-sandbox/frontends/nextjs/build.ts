import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, posix, relative, resolve, sep } from "node:path";
import { runInstaller, type BuildOptions } from "../../build-runner";
import { chooseIsolation, noSandboxMessage } from "../../isolation";
import { FrontendBuildError, type FrontendBuildInput, type FrontendBuildResult, type FrontendBuildLog } from "../types";
import { checkNextEngines, chooseNode, satisfies } from "./node-version";
import { npmCacheForBuild } from "./npm-cache";
import { splitVariables } from "./variables";

/**
 * The Next.js build of a deployment, in the build sandbox (the one function builds use: no host
 * filesystem but the system, the runtime and the archive at /var/task; no network but the build
 * egress to the configured registry; never root; seccomp):
 *
 * 1. Node.js 22 or 24 from the app's `engines.node` (node-version.ts);
 * 2. `npm ci` where a package-lock.json (or npm-shrinkwrap.json) is, else `npm install`, from the
 *    frontend npm cache (`--prefer-offline`; npm-cache.ts);
 * 3. the installed Next.js checked: 15.x or 16.x, and its `engines.node` against the chosen Node;
 * 4. `next build` with the selected variables (reserved names dropped with a warning), so
 *    `NEXT_PUBLIC_*` values are inlined into the client bundle;
 * 5. the standalone server moved to `<outDir>/server`, `.next/static` and `public/` copied to
 *    `<outDir>/static` at their URL paths.
 */

/** Written into the server folder: where server.js is inside it (nested for a monorepo app). */
export const SERVER_MANIFEST = "kiln-nextjs.json";

export interface ServerManifest {
  /** server.js relative to the server folder, POSIX. */
  entry: string;
  nextVersion: string;
  nodeVersion: string;
}

const BUILD_TIMEOUT_MS = Number(process.env.KILN_FRONTEND_BUILD_TIMEOUT_MS) || 15 * 60_000;

export interface NextjsBuildContext {
  hiddenPaths: string[];
  sandbox: BuildOptions["sandbox"];
}

export async function buildNextjs(ctx: NextjsBuildContext, input: FrontendBuildInput): Promise<FrontendBuildResult> {
  const { log } = input;
  const appDir = resolve(input.sourceDir, input.appRoot || ".");
  const pkgPath = join(appDir, "package.json");
  if (!existsSync(pkgPath)) throw new FrontendBuildError(`no package.json in the app root (${input.appRoot || "."})`);
  let pkg: { engines?: { node?: unknown }; dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
  try {
    pkg = JSON.parse(readFileSync(pkgPath, "utf8"));
  } catch (e) {
    throw new FrontendBuildError(`package.json is not valid JSON: ${(e as Error).message}`);
  }

  const node = await chooseNode(pkg.engines?.node);
  if ("error" in node) throw new FrontendBuildError(node.error);
  await log("info", `build: Next.js app in ${input.appRoot || "."}, Node.js ${node.runtime.version} (${node.why})`);

  const openNext = ["open-next.config.ts", "open-next.config.js", "open-next.config.mjs"].find((f) => existsSync(join(appDir, f)));
  const openNextDep = Object.keys({ ...pkg.dependencies, ...pkg.devDependencies }).find((d) => d.startsWith("@opennextjs/") || d === "open-next");
  if (openNext || openNextDep)
    await log("info", `OpenNext set-up found (${openNext ?? openNextDep}): Kiln runs the app's standalone Next.js server on Node.js, as OpenNext's Node.js target does; OpenNext's own adapters (Lambda, Cloudflare) are not used`);

  const vars = splitVariables(input.env);
  for (const w of vars.warnings) await log("warn", w);

  const { isolation, problems } = chooseIsolation(ctx.sandbox);
  if (!isolation) throw new Error(noSandboxMessage(problems));
  const sandboxed = isolation.kind !== "none";
  const cache = npmCacheForBuild(sandboxed);
  const options: BuildOptions = { hiddenPaths: ctx.hiddenPaths, sandbox: ctx.sandbox, signal: input.signal };
  const stepLog = (level: "info" | "error", line: string) => log(level, line);
  const stopped = () => {
    if (input.signal.aborted) throw new Error("the build was stopped");
  };
  // Every step gets the npm cache (mounted writable) and, from `next build` on, the variables.
  const baseEnv = { npm_config_cache: cache.path, npm_config_update_notifier: "false", npm_config_fund: "false", npm_config_audit: "false", NEXT_TELEMETRY_DISABLED: "1" };
  const step = (argv: string[], cwd: string, env: Record<string, string> = {}) =>
    runInstaller(argv, input.sourceDir, cwd, node.runtime, options, stepLog, BUILD_TIMEOUT_MS, { env: { ...env, ...baseEnv }, mounts: cache.mounts });

  // 2. Dependencies: the lockfile nearest the app (a workspace root's for a monorepo app).
  const lockDir = findUp(appDir, input.sourceDir, ["package-lock.json", "npm-shrinkwrap.json"]);
  for (const other of ["yarn.lock", "pnpm-lock.yaml", "bun.lockb", "bun.lock"])
    if (!lockDir && findUp(appDir, input.sourceDir, [other])) await log("warn", `${other} found but no package-lock.json: Kiln installs with npm, so versions are resolved afresh (npm install)`);
  const installDir = lockDir ?? appDir;
  const install = lockDir ? ["npm", "ci", "--prefer-offline"] : ["npm", "install", "--prefer-offline"];
  await log("info", `installing dependencies (${install.join(" ")}) in ${rel(input.sourceDir, installDir)}`);
  const installFailed = await step([...install, "--no-audit", "--no-fund"], installDir);
  stopped();
  if (installFailed) throw new FrontendBuildError(`dependency installation failed: ${installFailed}`);

  // 3. The Next.js that was installed.
  const nextDir = findUp(appDir, input.sourceDir, [join("node_modules", "next", "package.json")]);
  if (!nextDir) throw new FrontendBuildError("next is not installed: add it to the app's dependencies (npm install next)");
  const nextPkgDir = join(nextDir, "node_modules", "next");
  const nextPkg = JSON.parse(readFileSync(join(nextPkgDir, "package.json"), "utf8")) as { version: string; engines?: { node?: string } };
  if (!satisfies(nextPkg.version, "15.x || 16.x")) throw new FrontendBuildError(`Next.js ${nextPkg.version} is not supported: Kiln builds Next.js 15.x and 16.x`);
  const enginesError = checkNextEngines(nextPkg, node.runtime, node.why);
  if (enginesError) throw new FrontendBuildError(enginesError);
  await log("info", `Next.js ${nextPkg.version} (engines.node "${nextPkg.engines?.node ?? "any"}") on Node.js ${node.runtime.version}`);

  // 4. next build. Its binary by a path relative to the app, the same inside the sandbox.
  const nextBin = relative(appDir, join(nextPkgDir, "dist", "bin", "next")).split(sep).join("/");
  await log("info", "running next build");
  const buildFailed = await step([node.runtime.command, nextBin, "build"], appDir, vars.build);
  stopped();
  if (buildFailed) throw new FrontendBuildError(`next build failed: ${buildFailed.replace(node.runtime.command, "node")}`);

  // 5. Outputs.
  const distDir = join(appDir, readDistDir(appDir));
  const standalone = join(distDir, "standalone");
  const serverJs = existsSync(standalone) ? findServerJs(standalone) : null;
  if (!serverJs)
    throw new FrontendBuildError('next build made no standalone server: set output: "standalone" in next.config (Kiln runs the standalone server.js on Node.js)');
  const serverDir = join(input.outDir, "server");
  move(standalone, serverDir);
  const entry = relative(standalone, serverJs).split(sep).join("/");
  const manifest: ServerManifest = { entry, nextVersion: nextPkg.version, nodeVersion: node.runtime.version };
  writeFileSync(join(serverDir, SERVER_MANIFEST), JSON.stringify(manifest));

  const staticDir = join(input.outDir, "static");
  mkdirSync(staticDir, { recursive: true });
  if (existsSync(join(appDir, "public"))) cpSync(join(appDir, "public"), staticDir, { recursive: true, verbatimSymlinks: true, dereference: false });
  if (existsSync(join(distDir, "static"))) cpSync(join(distDir, "static"), join(staticDir, "_next", "static"), { recursive: true });
  await log("info", `standalone server ${posix.join("server", entry)}; ${countFiles(staticDir)} static files`);

  return {
    kind: "nextjs",
    staticDir: "static",
    immutablePrefixes: ["/_next/static/"],
    serverDir: "server",
    nodeVersion: node.major,
    runtimeEnv: vars.runtime,
    warnings: vars.warnings,
  };
}

/** The first folder from `start` up to `stop` (inclusive) holding one of `names`. */
function findUp(start: string, stop: string, names: string[]): string | null {
  const top = resolve(stop);
  for (let dir = resolve(start); ; dir = dirname(dir)) {
    if (names.some((n) => existsSync(join(dir, n)))) return dir;
    if (dir === top || dirname(dir) === dir || !dir.startsWith(top)) return null;
  }
}

/** next.config's distDir when written as a plain string literal; `.next` otherwise (the config is code: not run here). */
function readDistDir(appDir: string): string {
  for (const f of ["next.config.js", "next.config.mjs", "next.config.ts", "next.config.cjs", "next.config.mts"]) {
    try {
      const m = /distDir\s*:\s*["'`]([^"'`]+)["'`]/.exec(readFileSync(join(appDir, f), "utf8"));
      if (m && !m[1]!.includes("..")) return m[1]!;
    } catch {
      // no such config
    }
  }
  return ".next";
}

/** standalone/server.js, or nested as standalone/<app path from the tracing root>/server.js (monorepos). */
function findServerJs(standalone: string, depth = 0): string | null {
  if (existsSync(join(standalone, "server.js"))) return join(standalone, "server.js");
  if (depth >= 6) return null;
  for (const e of readdirSync(standalone, { withFileTypes: true })) {
    if (!e.isDirectory() || e.name === "node_modules" || e.name.startsWith(".")) continue;
    const hit = findServerJs(join(standalone, e.name), depth + 1);
    if (hit) return hit;
  }
  return null;
}

function move(from: string, to: string): void {
  try {
    renameSync(from, to);
  } catch {
    cpSync(from, to, { recursive: true, verbatimSymlinks: true });
    rmSync(from, { recursive: true, force: true });
  }
}

function countFiles(dir: string): number {
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) n += e.isDirectory() ? countFiles(join(dir, e.name)) : 1;
  return n;
}

function rel(root: string, dir: string): string {
  return relative(realpathSync(root), realpathSync(dir)) || ".";
}

/** Whether `appDir` holds a Next.js app: its package.json depends on `next`. */
export function isNextjsApp(appDir: string): boolean {
  try {
    if (!statSync(join(appDir, "package.json")).isFile()) return false;
    const pkg = JSON.parse(readFileSync(join(appDir, "package.json"), "utf8")) as { dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
    return !!(pkg.dependencies?.next ?? pkg.devDependencies?.next);
  } catch {
    return false;
  }
}

export type { FrontendBuildLog };
