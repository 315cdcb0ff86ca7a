import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { isMissing, resolveRuntime } from "../../runtime-sandbox/runtimes";
import { RESERVED_PATH, runtimeFamily, type FunctionBuildConfig } from "./archive";

type Log = (level: "info" | "error", line: string) => Promise<void>;

/** Runs a command, streaming every output line into the build log; resolves with its exit code. */
function run(cmd: string, args: string[], cwd: string, env: Record<string, string>, log: Log, timeoutMs = 300_000): Promise<number> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    const timer = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
    let pending = Promise.resolve();
    const pipe = (level: "info" | "error") => (chunk: Buffer) => {
      for (const line of chunk.toString("utf8").split(/\r?\n/)) if (line.trim()) pending = pending.then(() => log(level, line));
    };
    p.stdout.on("data", pipe("info"));
    p.stderr.on("data", pipe("info"));
    p.on("error", (e) => {
      pending = pending.then(() => log("error", `${cmd}: ${e.message}`));
    });
    p.on("close", (code) => {
      clearTimeout(timer);
      void pending.then(() => resolve(code ?? 1));
    });
  });
}

/** A clean environment for installers: nothing of Kiln's leaks into a build. */
function buildEnv(): Record<string, string> {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", LANG: "C.UTF-8" };
}

/**
 * The compile build of a deployment in its extracted source folder: reserved-path check, runtime
 * check, dependency installation from the manifests. Returns an error message, or null on success.
 */
export async function buildFunction(root: string, build: FunctionBuildConfig & { reserved_path?: boolean }, log: Log): Promise<string | null> {
  await log("info", `build: runtime ${build.runtime}, function root ${build.function_root}, install root ${build.install_root}`);
  if (build.reserved_path || existsSync(join(root, RESERVED_PATH)))
    return `reserved path: the top-level path ${RESERVED_PATH} is reserved and must not be in the source archive`;
  const runtime = await resolveRuntime(build.runtime);
  if (isMissing(runtime)) return `runtime ${build.runtime} is not available on this machine: install ${runtime.missing}`;
  if (!build.entry) {
    const expected = runtimeFamily(build.runtime) === "node" ? "index.js or index.mjs" : runtimeFamily(build.runtime) === "python" ? "main.py" : "main.rb";
    return `no entry file: expected ${expected} in the function root (${build.function_root})`;
  }
  const installDir = join(root, build.install_root);
  const family = runtimeFamily(build.runtime);
  if (family === "node" && existsSync(join(installDir, "package.json"))) {
    const pkg = JSON.parse(readFileSync(join(installDir, "package.json"), "utf8")) as { dependencies?: Record<string, string> };
    if (pkg.dependencies && Object.keys(pkg.dependencies).length > 0) {
      await log("info", "installing Node dependencies (npm install --omit=dev)");
      const code = await run("npm", ["install", "--omit=dev", "--no-audit", "--no-fund", "--ignore-scripts"], installDir, buildEnv(), log);
      if (code !== 0) return `dependency installation failed: npm exited with ${code}`;
    }
  } else if (family === "python" && existsSync(join(installDir, "requirements.txt"))) {
    const reqs = readFileSync(join(installDir, "requirements.txt"), "utf8").split("\n").filter((l) => l.trim() && !l.trim().startsWith("#"));
    if (reqs.length > 0) {
      await log("info", "installing Python dependencies (pip install --target python_deps)");
      const code = await run(runtime.command, ["-m", "pip", "install", "--disable-pip-version-check", "-r", "requirements.txt", "--target", "python_deps"], installDir, buildEnv(), log);
      if (code !== 0) return `dependency installation failed: pip exited with ${code}`;
    }
  } else if (family === "ruby" && existsSync(join(installDir, "Gemfile"))) {
    await log("info", "installing Ruby dependencies (bundle install)");
    const code = await run("bundle", ["install", "--path", "vendor/bundle"], installDir, buildEnv(), log);
    if (code !== 0) return `dependency installation failed: bundler exited with ${code}`;
  }
  return null;
}
