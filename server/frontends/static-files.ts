import { createHash } from "node:crypto";
import { mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import { dirname, join, posix, relative, sep } from "node:path";
import { promisify } from "node:util";
import { brotliCompress, constants as zc, gzip } from "node:zlib";

/**
 * A deployment's static files as Kiln serves them: a manifest made once at publish (ETag, size,
 * type, precompressed variants) so a request is a map lookup and a file send, never a hash or a
 * compression on the request's path.
 */
export interface StaticEntry {
  size: number;
  etag: string;
  type: string;
  /** Precompressed variants under `<dir>/.kiln-compressed/<path>.{br,gz}` (textual files of 1 KiB or more). */
  br?: number;
  gz?: number;
}

export interface StaticManifest {
  /** URL path (`/a/b.js`) → entry. */
  files: Record<string, StaticEntry>;
  immutablePrefixes: string[];
}

export const MANIFEST_FILE = ".kiln-manifest.json";
export const COMPRESSED_DIR = ".kiln-compressed";
const brotli = promisify(brotliCompress);
const gz = promisify(gzip);
const COMPRESSIBLE = /^(text\/|application\/(javascript|json|xml|wasm|manifest\+json|ld\+json)|image\/svg\+xml)/;
/** Compressing costs publish time; beyond this a file is sent as it is. */
const MAX_COMPRESS_BYTES = 8 * 1_048_576;

async function walk(dir: string, root = dir, out: string[] = []): Promise<string[]> {
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (dir === root && (e.name === COMPRESSED_DIR)) continue;
      await walk(p, root, out);
    } else if (e.isFile() && !(dir === root && e.name === MANIFEST_FILE)) out.push(relative(root, p).split(sep).join("/"));
  }
  return out;
}

/** Hashes, types and precompresses every file of `staticDir`, writing the manifest beside them. */
export async function buildManifest(staticDir: string, immutablePrefixes: string[]): Promise<StaticManifest> {
  const files: Record<string, StaticEntry> = {};
  const paths = await walk(staticDir);
  await Promise.all(
    paths.map(async (rel) => {
      const abs = join(staticDir, rel);
      const data = await readFile(abs);
      const type = Bun.file(abs).type || "application/octet-stream";
      const entry: StaticEntry = { size: data.length, etag: `"${createHash("sha256").update(data).digest("base64url").slice(0, 27)}"`, type };
      if (data.length >= 1024 && data.length <= MAX_COMPRESS_BYTES && COMPRESSIBLE.test(type)) {
        const [b, g] = await Promise.all([
          brotli(data, { params: { [zc.BROTLI_PARAM_QUALITY]: 5, [zc.BROTLI_PARAM_SIZE_HINT]: data.length } }),
          gz(data, { level: 6 }),
        ]);
        const target = join(staticDir, COMPRESSED_DIR, rel);
        await mkdir(dirname(target), { recursive: true });
        // A variant no smaller than the file is not worth a Content-Encoding.
        if (b.length < data.length) await writeFile(`${target}.br`, b).then(() => (entry.br = b.length));
        if (g.length < data.length) await writeFile(`${target}.gz`, g).then(() => (entry.gz = g.length));
      }
      files[`/${rel}`] = entry;
    }),
  );
  const manifest = { files, immutablePrefixes };
  await writeFile(join(staticDir, MANIFEST_FILE), JSON.stringify(manifest));
  return manifest;
}

export async function readManifest(staticDir: string): Promise<StaticManifest> {
  return JSON.parse(await readFile(join(staticDir, MANIFEST_FILE), "utf8")) as StaticManifest;
}

/**
 * A file name that carries a content hash (`index-BkPq3x9a.js`, `main.3f2a9c1e.css`): a segment of
 * 8 or more letters and digits, with at least one of each, before the extension. Such a URL's bytes
 * never change, so browsers may keep it for a year without asking again.
 */
export function looksHashed(path: string): boolean {
  const base = posix.basename(path);
  const m = /[.-]([A-Za-z0-9_]{8,})\.[A-Za-z0-9]+$/.exec(base);
  return !!m && /\d/.test(m[1]!) && /[A-Za-z]/.test(m[1]!);
}

export async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}
