import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { dirname } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

// A built folder kept in the control store for other instances (production profile): functions'
// `function_code` and frontends' `frontend_code` rows hold it as a tar.gz.

/** A folder as a tar.gz (before the transaction that records it: packing takes a while). */
export async function packFolder(root: string): Promise<Buffer> {
  const { c } = await import("tar");
  const chunks: Buffer[] = [];
  for await (const chunk of c({ gzip: true, cwd: root, portable: true }, ["."]) as AsyncIterable<Buffer>) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** Unpacks `bytes` at `root` through a temporary folder beside it, renamed into place: nobody sees it half-unpacked. */
export async function unpackFolder(bytes: Uint8Array, root: string): Promise<void> {
  const { x } = await import("tar");
  const temp = `${root}.${process.pid}.unpacking`;
  rmSync(temp, { recursive: true, force: true });
  mkdirSync(temp, { recursive: true });
  try {
    await pipeline(Readable.from([Buffer.from(bytes)]), x({ cwd: temp }));
    mkdirSync(dirname(root), { recursive: true });
    if (!existsSync(root)) renameSync(temp, root);
  } finally {
    rmSync(temp, { recursive: true, force: true });
  }
}
