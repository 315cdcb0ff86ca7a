import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, lchownSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { sandboxUser } from "../../isolation";
import type { Mount } from "../../mounts";
import { cacheDir, npmEnv, which } from "../../runtimes";

/**
 * The npm cache frontend builds install from: one per machine, `<KILN_CACHE_DIR>/npm` (or
 * `KILN_FRONTEND_NPM_CACHE`), shared by every build and kept across them, so a redeploy of the same
 * lockfile downloads nothing. Builds run npm with `--prefer-offline`: what the cache holds is used
 * without asking the registry. `prepareNpmCache` fills it for a lockfile ahead of time (the test
 * set-up does so for the Next.js fixture, then the tests build with an unreachable registry).
 *
 * The cache is writable by builds (a new dependency lands in it). npm's cache is content-addressed
 * and every tarball is checked against the lockfile's integrity on extraction, so a build cannot
 * slip another build a different package under a name; at worst it can fill the disk or spoil
 * entries, which makes the next install fetch them again.
 */

/** Where the cache appears inside the build sandbox. */
export const NPM_CACHE_IN_SANDBOX = "/var/cache/kiln-npm";

export function frontendNpmCache(): string {
  return process.env.KILN_FRONTEND_NPM_CACHE || join(cacheDir(), "npm");
}

/**
 * The cache as a build sees it: its path for npm_config_cache and the mount that shows it. A root
 * Kiln builds as the sandbox uid, which must own the cache to add to it (what `prepare` wrote as
 * root is handed over here; entries already right are skipped, so a warm cache costs a walk).
 */
export function npmCacheForBuild(sandboxed: boolean): { path: string; mounts: Mount[] } {
  const dir = frontendNpmCache();
  mkdirSync(dir, { recursive: true });
  const user = sandboxUser();
  if (user) chownTreeIfNeeded(dir, user.uid, user.gid);
  return sandboxed ? { path: NPM_CACHE_IN_SANDBOX, mounts: [{ kind: "bind", src: dir, dest: NPM_CACHE_IN_SANDBOX, writable: true }] } : { path: dir, mounts: [] };
}

function chownTreeIfNeeded(dir: string, uid: number, gid: number): void {
  const st = lstatSync(dir);
  if (st.uid !== uid || st.gid !== gid) lchownSync(dir, uid, gid);
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) chownTreeIfNeeded(p, uid, gid);
    else {
      const s = lstatSync(p);
      if (s.uid !== uid || s.gid !== gid) lchownSync(p, uid, gid);
    }
  }
}

/**
 * Fills the cache with every package of `appDir`'s package-lock.json (an `npm ci` into a scratch
 * copy, from npm's configured registry), once per lockfile content: a marker named after its hash
 * says it was done. Returns what happened, for the set-up's log.
 */
export async function prepareNpmCache(appDir: string): Promise<string> {
  const lock = readFileSync(join(appDir, "package-lock.json"));
  const pkg = readFileSync(join(appDir, "package.json"));
  const hash = createHash("sha256").update(pkg).update(lock).digest("hex").slice(0, 16);
  const cache = frontendNpmCache();
  const marker = join(cache, "_kiln-prepared", hash);
  if (existsSync(marker)) return `npm cache for ${appDir} already prepared (${cache})`;
  const npm = which("npm");
  if (!npm) throw new Error("npm is not on PATH (needed once to fill the frontend npm cache)");
  const scratch = mkdtempSync(join(cacheDir(), "npm-prepare-"));
  try {
    copyFileSync(join(appDir, "package.json"), join(scratch, "package.json"));
    copyFileSync(join(appDir, "package-lock.json"), join(scratch, "package-lock.json"));
    await new Promise<void>((resolve, reject) => {
      execFile(
        npm,
        ["ci", "--cache", cache, "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        { cwd: scratch, timeout: 15 * 60_000, maxBuffer: 16 << 20, env: npmEnv() },
        (err, _stdout, stderr) => (err ? reject(new Error(`npm ci for the frontend npm cache failed: ${String(stderr).trim().split("\n").pop() || err.message}`)) : resolve()),
      );
    });
    mkdirSync(join(cache, "_kiln-prepared"), { recursive: true });
    writeFileSync(marker, `${appDir}\n`);
    return `npm cache for ${appDir} prepared (${cache})`;
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

// `bun runtime-sandbox/frontends/nextjs/npm-cache.ts prepare APP_DIR...`: fill the cache for each app's
// lockfile now (npm test's pretest does it for the Next.js fixture, after the Node runtimes).
// No top-level await: importers never wait on this module.
if (import.meta.main) {
  const [cmd, ...apps] = process.argv.slice(2);
  if (cmd !== "prepare" || !apps.length) {
    console.error("usage: bun runtime-sandbox/frontends/nextjs/npm-cache.ts prepare APP_DIR...");
    process.exit(2);
  }
  void (async () => {
    let failed = false;
    for (const app of apps) {
      const t0 = performance.now();
      try {
        console.log(`kiln: ${await prepareNpmCache(app)} (${Math.round(performance.now() - t0)} ms)`);
      } catch (e) {
        failed = true;
        console.error(`kiln: ${(e as Error).message}`);
      }
    }
    process.exit(failed ? 1 : 0);
  })();
}
