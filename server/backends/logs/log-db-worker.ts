/// <reference lib="webworker" />
// The body of the thread of an earlier version's embedded log store: its PGlite database driven by
// messages from `LogDbThread`, read here (off Kiln's main thread) while its lines move to the segment files.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import { pg_trgm } from "@electric-sql/pglite/contrib/pg_trgm";
import { embeddedFile } from "../../embedded/embedded";
import { pgliteFileOptions } from "../../store/pglite-wasm";
import { migrate } from "../../store/migrations";
import { PGLITE_CONF, PgliteStore } from "../../store/pglite-store";
import type { LogDbReply, LogDbRequest } from "./log-db";
import { LOG_SCHEMA } from "./migrations";

declare const self: Worker;

/** PGlite's pg_trgm finds its bundle next to its module; in the compiled binary it is embedded elsewhere. */
function trgm(): typeof pg_trgm {
  const embedded = embeddedFile("pglite-ext/pg_trgm.tar.gz");
  return embedded ? { name: "pg_trgm", setup: async () => ({ bundlePath: new URL(`file://${embedded}`) }) } : pg_trgm;
}

let db: PGlite | null = null;

function reply(r: LogDbReply): void {
  self.postMessage(r);
}

async function handle(m: LogDbRequest): Promise<void> {
  try {
    switch (m.op) {
      case "open": {
        if (!existsSync(join(m.dataDir, "PG_VERSION"))) throw new Error(`no log database in ${m.dataDir}`);
        // pg_trgm: log stores made before segments have the extension (their trigram index is dropped by logs/003).
        db = new PGlite(m.dataDir, { ...pgliteFileOptions(), pgliteWasmModule: m.module, postgresqlconf: PGLITE_CONF, extensions: { pg_trgm: trgm() } } as ConstructorParameters<typeof PGlite>[0]);
        await db.waitReady;
        const store = new PgliteStore(db);
        await migrate(store, LOG_SCHEMA);
        return reply({ id: m.id, ok: true });
      }
      case "query": {
        const r = await db!.query(m.sql, m.params);
        return reply({ id: m.id, ok: true, rows: r.rows as Record<string, unknown>[] });
      }
      case "copy": {
        await db!.query(`copy ${m.table} (${m.columns.join(", ")}) from '/dev/blob'`, [], { blob: new Blob([m.text]) });
        return reply({ id: m.id, ok: true });
      }
      case "close": {
        if (db && !db.closed) await db.close();
        return reply({ id: m.id, ok: true });
      }
    }
  } catch (err) {
    const e = err as { message?: string; code?: string };
    reply({ id: m.id, ok: false, message: e?.message ?? String(err), code: typeof e?.code === "string" ? e.code : undefined });
  }
}

// One call at a time, in order: PGlite has one session.
let chain: Promise<void> = Promise.resolve();
self.onmessage = (e: MessageEvent<LogDbRequest>) => {
  chain = chain.then(() => handle(e.data));
};
