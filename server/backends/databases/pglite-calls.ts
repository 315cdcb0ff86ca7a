import type { PGlite } from "@electric-sql/pglite";
import { concatBytes } from "./wire/protocol";

// What a PGlite session is asked to do, written once for both places it runs (a database thread and
// the calling thread). Imports nothing heavy: the database thread loads this file.

/** Everything PGlite answers to raw frontend messages, in one buffer. */
export async function execRaw(db: PGlite, bytes: Uint8Array): Promise<Uint8Array> {
  // PGlite hands out views of its WebAssembly memory: copy each chunk before the next call.
  const chunks: Uint8Array[] = [];
  let total = 0;
  await db.execProtocolRawStream(bytes, {
    syncToFs: false,
    onRawData: (d) => {
      chunks.push(d.slice());
      total += d.length;
    },
  });
  return chunks.length === 0 ? new Uint8Array(0) : concatBytes(chunks, total);
}

/** PostgreSQL's SQLSTATE on an error PGlite raised, if it carries one. */
export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}
