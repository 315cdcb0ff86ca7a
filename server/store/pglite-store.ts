import { PGlite } from "@electric-sql/pglite";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import type { ControlStore, Row, Sql } from "./store";

let compiling: Promise<WebAssembly.Module> | null = null;

/**
 * Compiling PGlite's 9 MB WebAssembly takes ~170 ms. `kiln start` calls this first thing so the
 * compile runs on a background thread while the rest of Kiln loads and the data dir is copied;
 * every PGlite instance in the process then shares the compiled module.
 */
export function compiledPglite(): Promise<WebAssembly.Module> {
  if (!compiling) {
    const dir = dirname(createRequire(import.meta.url).resolve("@electric-sql/pglite/package.json"));
    compiling = readFile(join(dir, "dist", "pglite.wasm")).then((bytes) => WebAssembly.compile(bytes));
  }
  return compiling;
}

/**
 * Settings for every embedded PGlite instance: a small shared_buffers keeps an open instance at
 * tens of MB instead of hundreds, which matters on a laptop and in CI.
 */
export const PGLITE_CONF = ["shared_buffers=8MB", "work_mem=2MB", "maintenance_work_mem=8MB"];

export async function openPglite(dataDir: string, extra: { initDbStartParams?: string[] } = {}): Promise<PGlite> {
  const db = new PGlite(dataDir, { postgresqlconf: PGLITE_CONF, pgliteWasmModule: await compiledPglite(), ...extra });
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

  async query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]> {
    return (await this.db.query<T>(text, clean(params))).rows;
  }

  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.db.transaction(async (tx) =>
      fn({ query: async <R extends Row>(text: string, params?: unknown[]) => (await tx.query<R>(text, clean(params))).rows }),
    );
  }

  async close(): Promise<void> {
    if (!this.db.closed) await this.db.close();
  }
}
