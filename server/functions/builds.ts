import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, posix } from "node:path";
import { runInstaller, type BuildLog, type BuildOptions } from "../../runtime-sandbox/build-runner";
import { checkCodeLoads } from "../../runtime-sandbox/load-check";
import { isMissing, needsProvisioning, resolveRuntime } from "../../runtime-sandbox/runtimes";
import { extractSource, RESERVED_PATH, runtimeFamily, type FunctionBuildConfig } from "./archive";

// Loaded with the first build (the deployment queue imports it then), with tar and the runtime resolver.

export type StoredBuildConfig = FunctionBuildConfig & { reserved_path?: boolean };

/**
 * Where a deployment's build lines go: the logs area's ingest (buffered, then written with the
 * rest), and what the deployment history reads back of them.
 */
export interface BuildLogs {
  line(ref: { id: string; name: string; project_id: string; deploymentId: string }, level: "info" | "error", text: string): void;
  /** Every line so far is stored (a build's end, before its status changes). */
  flush(): Promise<void>;
  summaries(deploymentIds: readonly string[]): Promise<Map<string, { lines: number; first_at: string | null; last_at: string | null }>>;
}

export interface DeploymentBuild {
  logs: BuildLogs;
  /** The function built, as its build lines name it. */
  fn: { id: string; name: string; project_id: string };
  deploymentId: string;
  /** The deployment's code folder: emptied, filled from the source, removed again on failure. */
  root: string;
  build: StoredBuildConfig;
  /** The normalized source archive. */
  source: () => Promise<Uint8Array>;
  /** Where installers run; an aborted signal kills them and the build fails as `interrupted`. */
  options: BuildOptions;
  interrupted: string;
}

/** Every line of a deployment's build, into the log store (stream `build`, with the deployment's id). */
function buildLog(b: DeploymentBuild): BuildLog {
  const ref = { ...b.fn, deploymentId: b.deploymentId };
  return async (level, line) => b.logs.line(ref, level, line.slice(0, 4000));
}

/**
 * Builds a deployment in its code folder: the source extracted, then the compile build. Every line
 * goes to the build log, the last one saying how it ended. Returns the deployment's error, or null
 * when the folder is ready to serve. Records no status: that is the deployment queue's.
 */
export async function buildDeployment(b: DeploymentBuild): Promise<string | null> {
  const log = buildLog(b);
  let error: string | null = null;
  try {
    rmSync(b.root, { recursive: true, force: true });
    mkdirSync(b.root, { recursive: true });
    await extractSource(await b.source(), b.root);
    error = await buildFunction(b.root, b.build, b.options, log);
    if (error && b.options.signal?.aborted) error = b.interrupted;
  } catch (err) {
    error = `build failed: ${(err as Error).message}`;
  }
  if (error) {
    await log("error", error).catch(() => {});
    rmSync(b.root, { recursive: true, force: true });
  } else await log("info", "build succeeded");
  // The deployment's status changes only once its whole build log can be read.
  await b.logs.flush().catch(() => {});
  return error;
}

function hasLines(file: string): boolean {
  return existsSync(file) && readFileSync(file, "utf8").split("\n").some((l) => l.trim() && !l.trim().startsWith("#"));
}

/**
 * The compile build of a deployment in its extracted source folder: reserved-path check, runtime
 * check, dependency installation from the manifests, then the code loaded once in the worker
 * sandbox (its handler must exist). Returns an error message, or null on success.
 */
export async function buildFunction(root: string, build: StoredBuildConfig, o: BuildOptions, log: BuildLog): Promise<string | null> {
  await log("info", `build: runtime ${build.runtime}, function root ${build.function_root}, install root ${build.install_root}`);
  if (build.reserved_path || existsSync(join(root, RESERVED_PATH)))
    return `reserved path: the top-level path ${RESERVED_PATH} is reserved and must not be in the source archive`;
  // A runtime root not cached yet is built now (once per machine), and the build log says so.
  const provisioning = needsProvisioning(build.runtime);
  if (provisioning) await log("info", `runtime ${build.runtime}: first use on this machine, ${provisioning} (later deploys reuse it)`);
  let lastPhase = "";
  const runtime = await resolveRuntime(build.runtime, {
    progress: provisioning
      ? (p) => {
          if (p.phase === lastPhase) return;
          lastPhase = p.phase;
          void log("info", `runtime ${build.runtime}: ${p.phase} (${(p.bytes / 1e6).toFixed(1)} MB)`);
        }
      : undefined,
  });
  if (isMissing(runtime)) return `runtime ${build.runtime} is not available on this machine: ${runtime.missing}`;
  if (provisioning) await log("info", `runtime ${build.runtime}: installed (${runtime.version}, ${runtime.source ?? runtime.command})`);
  if (o.containers && runtime.root) {
    // The containers run on the root itself: imported into the engine once, here rather than at the first invocation.
    try {
      const image = await o.containers.imageFor(runtime, (m) => void log("info", `runtime ${build.runtime}: ${m.replace(/^container runtime: /, "")}`));
      await log("info", `runtime ${build.runtime}: containers run on the image ${image} (${runtime.version})`);
    } catch (e) {
      return `runtime ${build.runtime}: importing its root filesystem into the container engine failed: ${(e as Error).message}`;
    }
  }
  if (runtime.image) await log("info", `runtime ${build.runtime}: containers run on --runtime-image ${runtime.image} (${runtime.command}, ${runtime.version})`);
  if (!build.entry) {
    const expected = runtimeFamily(build.runtime) === "node" ? "index.js or index.mjs" : runtimeFamily(build.runtime) === "python" ? "main.py" : "main.rb";
    return `no entry file: expected ${expected} in the function root (${build.function_root})`;
  }
  const installDir = join(root, build.install_root);
  const family = runtimeFamily(build.runtime);
  if (runtime.image && ((family === "python" && hasLines(join(installDir, "requirements.txt"))) || (family === "ruby" && existsSync(join(installDir, "Gemfile")))))
    // Installers run in this host's build sandbox (its egress proxy, its package-manager settings), where an image's interpreter is not.
    return `dependency installation: runtime ${build.runtime} is served by --runtime-image ${runtime.image}, whose interpreter does not run in the build sandbox on this host; give Kiln an interpreter of that version for builds too (--runtime-path ${build.runtime}=/path), or deploy without ${family === "python" ? "requirements.txt" : "a Gemfile"}`;
  if (family === "node" && existsSync(join(installDir, "package.json"))) {
    const pkg = JSON.parse(readFileSync(join(installDir, "package.json"), "utf8")) as { dependencies?: Record<string, string> };
    if (pkg.dependencies && Object.keys(pkg.dependencies).length > 0) {
      await log("info", "installing Node dependencies (npm install --omit=dev)");
      const failed = await runInstaller(["npm", "install", "--omit=dev", "--no-audit", "--no-fund", "--ignore-scripts"], root, installDir, runtime, o, log);
      if (failed) return `dependency installation failed: ${failed}`;
    }
  } else if (family === "python" && existsSync(join(installDir, "requirements.txt"))) {
    const reqs = readFileSync(join(installDir, "requirements.txt"), "utf8").split("\n").filter((l) => l.trim() && !l.trim().startsWith("#"));
    if (reqs.length > 0) {
      await log("info", "installing Python dependencies (pip install --target python_deps)");
      const pip = runtime.pip ?? [runtime.command, "-m", "pip"];
      const failed = await runInstaller([...pip, "install", "--disable-pip-version-check", "--no-cache-dir", "-r", "requirements.txt", "--target", "python_deps"], root, installDir, runtime, o, log);
      if (failed) return `dependency installation failed: ${failed.replace(pip.join(" "), "pip").replace(runtime.command, "pip")}`;
    }
  } else if (family === "ruby" && existsSync(join(installDir, "Gemfile"))) {
    await log("info", "installing Ruby dependencies (bundle install)");
    // What `bundle config set --local path vendor/bundle` writes (`--path` is deprecated in Bundler 2
    // and gone in 4): the function's own `require "bundler/setup"` finds the gems through it too.
    mkdirSync(join(installDir, ".bundle"), { recursive: true });
    writeFileSync(join(installDir, ".bundle", "config"), '---\nBUNDLE_PATH: "vendor/bundle"\n');
    const failed = await runInstaller([...(runtime.bundle ?? ["bundle"]), "install"], root, installDir, runtime, o, log);
    if (failed) return `dependency installation failed: ${failed}`;
  }
  // Loaded as invoke.ts's worker loads it (same entry path and PYTHONPATH), without project variables.
  const prefix = build.function_root === "." ? "" : `${build.function_root}/`;
  await log("info", `code check: loading ${prefix}${build.entry} in the sandbox`);
  const env = { PYTHONPATH: [build.function_root, posix.join(build.install_root, "python_deps")].join(":") };
  return checkCodeLoads({ root, entry: `${prefix}${build.entry}`, handler: build.handler || "handler", runtime, env }, o, log);
}
