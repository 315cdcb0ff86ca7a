import type { PGlite } from "@electric-sql/pglite";
import type { QueryResult } from "./engine";
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

/** One query-API statement: alone (it commits on its own) or in a transaction after `init` (role and claims). */
export async function runQuery(db: PGlite, init: string[], text: string, params: unknown[]): Promise<QueryResult> {
  const run = async (q: Pick<PGlite, "query">) => {
    const t0 = performance.now();
    const r = await q.query<Record<string, unknown>>(text, params);
    return { rows: r.rows, computeMs: performance.now() - t0 };
  };
  try {
    return init.length === 0 ? await run(db) : await db.transaction(async (tx) => (await tx.exec(init.join(";\n")), run(tx)));
  } finally {
    if (!db.closed && db.isInTransaction()) await db.exec("ROLLBACK");
  }
}

/** PostgreSQL's SQLSTATE on an error PGlite raised, if it carries one. */
export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}
