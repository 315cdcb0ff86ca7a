import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import postgres from "postgres";
import type { CopyText } from "./sql-store";

/**
 * The production log store's writes: COPY on a connection of its own, so a batch of lines never
 * holds one of the control store's pooled connections that requests wait for, and the COPY text is
 * the log store's own (built without row arrays, see `copyTexts`).
 */
export function pgCopyWriter(url: string): { copy: CopyText; close: () => Promise<void> } {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10, idle_timeout: 60 });
  return {
    copy: async (table, columns, text) => {
      const target = await sql.unsafe(`copy ${table} (${columns.join(", ")}) from stdin`).writable();
      await pipeline(Readable.from([text]), target);
    },
    close: () => sql.end({ timeout: 5 }),
  };
}
