import { PGlite, type Extensions } from "@electric-sql/pglite";
import { compiledPglite, pgliteFileOptions } from "./pglite-wasm";
import { copyText, type ControlStore, type Row, type Sql } from "./store";

/**
 * Settings of the embedded control store. Its tables are small and the OS page cache sits behind
 * PostgreSQL's own buffers, so 2 MB of shared_buffers (instead of the default 128 MB) costs nothing
 * measurable and keeps the whole Kiln process near 150 MB.
 */
export const PGLITE_CONF = ["shared_buffers=2MB", "work_mem=2MB", "maintenance_work_mem=8MB"];

/** PGlite extensions by name (`{ pg_trgm }` from `@electric-sql/pglite/contrib/pg_trgm`). */
export type PgliteExtensions = Extensions;

export async function openPglite(dataDir: string, extra: { initDbStartParams?: string[]; postgresqlconf?: string[]; extensions?: PgliteExtensions } = {}): Promise<PGlite> {
  const db = new PGlite(dataDir, { postgresqlconf: PGLITE_CONF, ...pgliteFileOptions(), pgliteWasmModule: await compiledPglite(), ...extra });
  await db.waitReady;
  return db;
}

function clean(params?: unknown[]): unknown[] | undefined {
  return params?.map((p) => (p === undefined ? null : p));
}

/** The embedded control store: one PGlite instance in `<data-dir>/control`. */
export class PgliteStore implements ControlStore {
  readonly kind = "pglite" as const;
  constructor(private readonly db: PGlite) {}

  /** The PGlite instance, for what needs more than SQL text (snapshot images, server/snapshots/store-image.ts). */
  get pglite(): PGlite {
    return this.db;
  }

  async query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]> {
    return (await this.db.query<T>(text, clean(params))).rows;
  }

  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.db.transaction(async (tx) =>
      fn({ query: async <R extends Row>(text: string, params?: unknown[]) => (await tx.query<R>(text, clean(params))).rows }),
    );
  }

  async copyRows(table: string, columns: readonly string[], rows: ReadonlyArray<ReadonlyArray<string | null>>): Promise<void> {
    if (!rows.length) return;
    // PGlite reads COPY input from the blob it is given as /dev/blob.
    await this.db.query(`copy ${table} (${columns.join(", ")}) from '/dev/blob'`, [], { blob: new Blob([copyText(rows)]) });
  }

  async close(): Promise<void> {
    if (!this.db.closed) await this.db.close();
  }
}
