import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { badRequest } from "../http/errors";

/** At most this many files in one inline deploy (a function's sources, not a dependency tree). */
export const MAX_INLINE_FILES = 1000;
const MAX_PATH = 512;

/** Why a path of an inline deploy is refused, or null: relative, `/`-separated, no `.`/`..`/empty segment. */
export function inlinePathProblem(path: string): string | null {
  if (!path || path.length > MAX_PATH) return `must be 1 to ${MAX_PATH} characters`;
  if (path.startsWith("/")) return "must be relative (no leading '/')";
  // biome-ignore lint: control characters are exactly what is refused
  if (/[\u0000-\u001f\u007f\\]/.test(path)) return "must not contain control characters or '\\' (separate folders with '/')";
  if (path.split("/").some((s) => s === "" || s === "." || s === "..")) return "must not have empty, '.' or '..' segments";
  return null;
}

/**
 * The tar.gz the deploy API would take, made from a map of path → text content (the MCP
 * `deploy_function` tool). The files are written to a private temporary folder and packed by the
 * `tar` library as `kiln functions deploy` packs a folder; the archive then goes through the same
 * normalization as an uploaded one.
 */
export async function inlineArchive(files: Record<string, string>, tmpRoot: string): Promise<Uint8Array> {
  const paths = Object.keys(files);
  if (paths.length === 0) throw badRequest("invalid arguments: field 'files': give at least one file (path → content)");
  if (paths.length > MAX_INLINE_FILES) throw badRequest(`invalid arguments: field 'files': at most ${MAX_INLINE_FILES} files`);
  for (const p of paths) {
    const problem = inlinePathProblem(p);
    if (problem) throw badRequest(`invalid arguments: field 'files': path ${JSON.stringify(p.slice(0, 100))} ${problem}`);
  }
  const sorted = [...paths].sort();
  for (let i = 1; i < sorted.length; i++)
    if (sorted[i]!.startsWith(`${sorted[i - 1]}/`)) throw badRequest(`invalid arguments: field 'files': '${sorted[i - 1]}' is a file and a folder of '${sorted[i]}'`);
  await mkdir(tmpRoot, { recursive: true });
  const dir = await mkdtemp(join(tmpRoot, "mcp-deploy-"));
  try {
    for (const p of sorted) {
      await mkdir(dirname(join(dir, p)), { recursive: true });
      await writeFile(join(dir, p), files[p]!);
    }
    const tar = await import("tar");
    const chunks: Buffer[] = [];
    for await (const c of tar.c({ gzip: true, cwd: dir, portable: true }, sorted) as AsyncIterable<Buffer>) chunks.push(c);
    return Buffer.concat(chunks);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
