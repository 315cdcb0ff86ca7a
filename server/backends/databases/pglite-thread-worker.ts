/// <reference lib="webworker" />
// The body of a database thread: one PGlite instance, driven by messages from `PgliteThread`.
// It runs off Kiln's main thread so that a long statement stalls only its own database.
import { PGlite } from "@electric-sql/pglite";
import { execRaw, runQuery, sqlState } from "./pglite-calls";
import type { ThreadReply, ThreadRequest } from "./pglite-thread";

declare const self: Worker;

let db: PGlite | null = null;

function reply(r: ThreadReply, transfer: Transferable[] = []): void {
  self.postMessage(r, transfer);
}

async function handle(m: ThreadRequest): Promise<void> {
  try {
    switch (m.op) {
      case "open": {
        db = new PGlite(m.dataDir, { pgliteWasmModule: m.module, postgresqlconf: m.conf } as unknown as ConstructorParameters<typeof PGlite>[0]);
        await db.waitReady;
        return reply({ id: m.id, ok: true });
      }
      case "exec": {
        const out = await execRaw(db!, m.bytes);
        return reply({ id: m.id, ok: true, bytes: out }, [out.buffer as ArrayBuffer]);
      }
      case "query":
        return reply({ id: m.id, ok: true, result: await runQuery(db!, m.init, m.text, m.params) });
      case "close": {
        if (db && !db.closed) await db.close();
        return reply({ id: m.id, ok: true });
      }
    }
  } catch (err) {
    reply({ id: m.id, ok: false, message: (err as Error)?.message ?? String(err), code: sqlState(err) });
  }
}

// One message at a time, in order: PGlite has one session and the main side never overlaps calls anyway.
let chain: Promise<void> = Promise.resolve();
self.onmessage = (e: MessageEvent<ThreadRequest>) => {
  chain = chain.then(() => handle(e.data));
};
