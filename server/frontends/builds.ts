import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { FrameworkContext, FrontendBuildLog, FrontendBuildResult, FrontendFramework } from "../../runtime-sandbox/frontends/types";
import { FrontendBuildError } from "../../runtime-sandbox/frontends/types";
import { buildManifest, exists, type StaticManifest } from "./static-files";

export const RESULT_FILE = ".kiln-result.json";
/** Folders a static site's files may sit in, tried in order when the app root has no index.html. */
const SITE_DIRS = ["", "dist", "build", "out", "public", "_site"];

/** The Next.js framework (runtime-sandbox/frontends/nextjs.ts), loaded at the first Next.js deployment. */
let nextjs: Promise<FrontendFramework> | null = null;
export function nextjsFramework(ctx: FrameworkContext): Promise<FrontendFramework> {
  return (nextjs ??= import("../../runtime-sandbox/frontends/nextjs").then((m) => m.createNextjsFramework(ctx)));
}

/** Kiln stops: the Next.js framework's servers, if it was ever loaded. */
export async function closeFrameworks(): Promise<void> {
  if (nextjs) await (await nextjs.catch(() => null))?.close();
}

export interface BuildInput {
  /** The unpacked normalized archive. */
  sourceDir: string;
  appRoot: string;
  framework: "nextjs" | null;
  outDir: string;
  env: Record<string, string>;
  log: FrontendBuildLog;
  signal: AbortSignal;
  ctx: FrameworkContext;
}

/** Whether the app's package.json depends on `next`. */
async function hasNext(appDir: string): Promise<boolean> {
  try {
    const pkg = JSON.parse(await readFile(join(appDir, "package.json"), "utf8")) as { dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
    return Boolean(pkg.dependencies?.next ?? pkg.devDependencies?.next);
  } catch {
    return false;
  }
}

/**
 * Builds one deployment into `outDir`: a Next.js app through its framework (in the sandbox), else a
 * static site (the app root's files, or its dist/, build/, out/, public/ or _site/ folder, whichever
 * holds an index.html first). Then the manifest of the files Kiln serves.
 */
export async function buildDeployment(i: BuildInput): Promise<{ result: FrontendBuildResult; manifest: StaticManifest }> {
  const appDir = i.appRoot ? join(i.sourceDir, i.appRoot) : i.sourceDir;
  if (!(await exists(appDir))) throw new FrontendBuildError(`app_root '${i.appRoot}' is not a folder of the archive`);
  let result: FrontendBuildResult;
  if (i.framework === "nextjs" || (await hasNext(appDir))) {
    const fw = await nextjsFramework(i.ctx);
    await i.log("info", `framework: Next.js${i.framework ? "" : " (detected: package.json depends on next)"}`);
    result = await fw.build({ sourceDir: i.sourceDir, appRoot: i.appRoot, outDir: i.outDir, env: i.env, log: i.log, signal: i.signal });
  } else {
    result = await buildStatic(appDir, i);
  }
  const manifest = await buildManifest(join(i.outDir, result.staticDir), result.immutablePrefixes);
  await i.log("info", `published ${Object.keys(manifest.files).length} static files`);
  await writeFile(join(i.outDir, RESULT_FILE), JSON.stringify(result));
  return { result, manifest };
}

async function buildStatic(appDir: string, i: BuildInput): Promise<FrontendBuildResult> {
  let site: string | null = null;
  for (const d of SITE_DIRS) {
    if (await exists(join(appDir, d, "index.html"))) {
      site = d;
      break;
    }
  }
  if (site === null)
    throw new FrontendBuildError(
      `no index.html in the app root${i.appRoot ? ` '${i.appRoot}'` : ""} or its ${SITE_DIRS.filter(Boolean).join("/, ")}/ folders: a static site is uploaded built (frameworks other than Next.js build before the upload)`,
    );
  await i.log("info", `framework: static site (files of ${site ? `${i.appRoot ? `${i.appRoot}/` : ""}${site}/` : i.appRoot ? `${i.appRoot}/` : "the archive root"})`);
  const warnings: string[] = [];
  if (Object.keys(i.env).length) {
    const w = "static site: the selected variables are not used (a static site has no build or server here)";
    warnings.push(w);
    await i.log("warn", w);
  }
  await mkdir(i.outDir, { recursive: true });
  await rename(join(appDir, site), join(i.outDir, "site"));
  return { kind: "static", staticDir: "site", immutablePrefixes: [], warnings };
}

/** Under the data dir, so a static site's folder moves into its deployment by a rename. */
export async function scratchDir(base: string): Promise<string> {
  await mkdir(base, { recursive: true });
  return mkdtemp(join(base, "build-"));
}

export async function removeDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true }).catch(() => {});
}
