/// <reference lib="webworker" />
// The body of a database thread: one PGlite instance, driven by messages from `PgliteThread`.
// It runs off Kiln's main thread so that a long statement stalls only its own database.
import { pgliteFileOptions } from "../../store/pglite-wasm";
import { PGlite } from "@electric-sql/pglite";
import { execRaw, sqlState } from "./pglite-calls";
import { mountExtensions } from "./extension-mount";
import { CHANNEL_CAPACITY, CHANNEL_HEADER, SLOT, type ThreadReply, type ThreadRequest } from "./pglite-thread";

declare const self: Worker;

let db: PGlite | null = null;

function reply(r: ThreadReply, transfer: Transferable[] = []): void {
  self.postMessage(r, transfer);
}

async function handle(m: ThreadRequest): Promise<void> {
  try {
    switch (m.op) {
      case "open": {
        if (m.niceness) lowerPriority(m.niceness);
        // PostgreSQL's wall clock (CLOCK_REALTIME reads Date.now() in PGlite) keeps the platform's time.
        const offset = new Float64Array(m.clock);
        const realNow = Date.now;
        Date.now = () => realNow() + offset[0]!;
        db = new PGlite(m.dataDir, { ...pgliteFileOptions(), pgliteWasmModule: m.module, postgresqlconf: m.conf } as unknown as ConstructorParameters<typeof PGlite>[0]);
        await db.waitReady;
        // Before the first statement: nothing reads the extension files until one needs them.
        if (m.extensions) mountExtensions(db.Module as unknown as Parameters<typeof mountExtensions>[0], m.extensions);
        void serveChannel(m.channel);
        return reply({ id: m.id, ok: true });
      }
      case "exec": {
        const out = await execRaw(db!, m.bytes);
        return reply({ id: m.id, ok: true, bytes: out }, [out.buffer as ArrayBuffer]);
      }
      case "dump": {
        const { pgDumpBytes } = await import("./pg-dump-wasm");
        await Bun.write(m.path, await pgDumpBytes(db!, m.args));
        return reply({ id: m.id, ok: true });
      }
      case "close": {
        if (db && !db.closed) await db.close();
        return reply({ id: m.id, ok: true });
      }
    }
  } catch (err) {
    reply({ id: m.id, ok: false, message: (err as Error)?.message ?? String(err), code: sqlState(err) });
  }
}

/** This thread's nice value (Linux, per thread); where that is not possible it runs as it is. */
function lowerPriority(niceness: number): void {
  try {
    const { dlopen, FFIType } = require("bun:ffi") as typeof import("bun:ffi");
    const libc = dlopen("libc.so.6", {
      gettid: { args: [], returns: FFIType.i32 },
      setpriority: { args: [FFIType.i32, FFIType.u32, FFIType.i32], returns: FFIType.i32 },
    });
    libc.symbols.setpriority(0 /* PRIO_PROCESS: with a thread id, that thread */, libc.symbols.gettid(), niceness);
    libc.close();
  } catch {
    // no glibc here
  }
}

/** Execs through the shared channel (see `CHANNEL_CAPACITY`), in the same order as messages. */
async function serveChannel(channel: SharedArrayBuffer): Promise<void> {
  const slots = new Int32Array(channel, 0, CHANNEL_HEADER / 4);
  const area = new Uint8Array(channel, CHANNEL_HEADER);
  let seen = 0;
  for (;;) {
    const wait = Atomics.waitAsync(slots, SLOT.request, seen);
    if (wait.async) await wait.value;
    // Bun's waitAsync can wake without the matching notify: trust only the counter.
    if (Atomics.load(slots, SLOT.request) === seen) continue;
    seen = Atomics.load(slots, SLOT.request);
    const id = slots[SLOT.callId]!;
    const bytes = area.slice(0, slots[SLOT.requestLength]);
    await enqueue(async () => {
      let out: Uint8Array | null = null;
      try {
        out = await execRaw(db!, bytes);
      } catch (err) {
        reply({ id, ok: false, message: (err as Error)?.message ?? String(err), code: sqlState(err) });
      }
      if (out && out.length <= CHANNEL_CAPACITY) {
        area.set(out);
        slots[SLOT.answerLength] = out.length;
      } else {
        slots[SLOT.answerLength] = -1;
        if (out) reply({ id, ok: true, bytes: out }, [out.buffer as ArrayBuffer]);
      }
      Atomics.store(slots, SLOT.answered, seen);
      Atomics.notify(slots, SLOT.answered);
    });
  }
}

// One call at a time, in order: PGlite has one session (the main side never overlaps calls anyway).
let chain: Promise<void> = Promise.resolve();
function enqueue(fn: () => Promise<void>): Promise<void> {
  chain = chain.then(fn, fn);
  return chain;
}
self.onmessage = (e: MessageEvent<ThreadRequest>) => void enqueue(() => handle(e.data));
