import { workerScript } from "../../embedded/embedded";
import { PGlite } from "@electric-sql/pglite";
import { compiledPglite } from "../../store/pglite-wasm";
import { DatabaseQueryError } from "./engine";
import { execRaw } from "./pglite-calls";
import type { ExtensionFiles } from "./extension-mount";

/**
 * One PGlite backend session, as the session mux and the engine use it. Two implementations: a
 * database thread (`PgliteThread`, what Kiln runs) and PGlite in the calling thread
 * (`InProcessSession`, for tests and the benchmark's baseline).
 */
export interface PgliteSession {
  /** Resolves when the session can run statements (after an open or a restart). */
  ready(): Promise<void>;
  /** Raw frontend messages in; everything PGlite answered, in one buffer (queries: `runOverProtocol`). */
  exec(bytes: Uint8Array): Promise<Uint8Array>;
  /**
   * Ends the session at once, whatever it is running, and opens the database again: what a crash of
   * one PostgreSQL backend does. Calls in flight reject with `SessionKilled`; uncommitted work is lost.
   * False when this kind of session cannot be interrupted.
   */
  restart(): Promise<boolean>;
  close(): Promise<void>;
  readonly closed: boolean;
}

/** The session was ended under a call (restart or close). */
export class SessionKilled extends Error {}

export type ThreadRequest =
  | { id: number; op: "open"; dataDir: string; module: WebAssembly.Module; conf: string[]; channel: SharedArrayBuffer; clock: SharedArrayBuffer; niceness?: number; extensions?: ExtensionFiles }
  | { id: number; op: "exec"; bytes: Uint8Array }
  | { id: number; op: "dump"; args: string[]; path: string }
  | { id: number; op: "close" };

export type ThreadReply =
  | { id: number; ok: true; bytes?: Uint8Array }
  | { id: number; ok: false; message: string; code?: string };

type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

interface Pending {
  resolve: (r: ThreadReply & { ok: true }) => void;
  reject: (e: Error) => void;
}

const WORKER_URL = workerScript(new URL("./pglite-thread-worker.ts", import.meta.url), "server/backends/databases/pglite-thread-worker.ts");

/**
 * The fast lane for `exec`: shared memory and Atomics instead of postMessage, which costs about
 * 50 µs more per call in Bun (a point select through the thread: ~135 µs by message, ~80 µs here;
 * ~42 µs in the calling thread). Layout: CHANNEL_HEADER bytes of Int32 slots, then the data area,
 * which holds the request and then the answer. An answer that does not fit (or an error) comes as
 * an ordinary message with the call's id.
 */
export const CHANNEL_CAPACITY = 256 * 1024;
export const CHANNEL_HEADER = 32;
/** Int32 slots of the channel header. */
export const SLOT = { request: 0, requestLength: 1, answerLength: 2, answered: 3, callId: 4 } as const;

/**
 * A PGlite instance on its own thread. Statements run there, so a long one holds up only this
 * database; `restart` terminates the thread (WebAssembly cannot be interrupted any other way) and
 * opens the data dir again, which PostgreSQL recovers like a crashed backend.
 */
export class PgliteThread implements PgliteSession {
  private worker: Worker | null = null;
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private opening: Promise<void> | null = null;
  private isClosed = false;
  /** This thread's channel (a new one for every thread, so a killed thread's late writes go nowhere). */
  private slots = new Int32Array(new SharedArrayBuffer(CHANNEL_HEADER));
  private area = new Uint8Array(new SharedArrayBuffer(0));
  private sequence = 0;

  /**
   * The platform clock's offset from real time (ms), shared with the thread: PostgreSQL's clock there
   * (now(), clock_timestamp(), commit timestamps in the WAL) reads real time plus it, so the database
   * keeps the platform's time, which point-in-time restore relies on. Written before every call.
   */
  private readonly clock = new Float64Array(new SharedArrayBuffer(8));

  private constructor(
    private readonly dataDir: string,
    private readonly conf: string[],
    private readonly clockOffset: () => number,
    private readonly niceness?: number,
    private readonly extensions?: ExtensionFiles,
  ) {}

  /**
   * `niceness`: the thread runs at this lower CPU priority (Linux: the thread's own nice value), for
   * background work that must not take CPU from databases serving clients (a branch's first open).
   * `extensions`: the unpacked extension bundles, mounted into the instance (extensions.ts).
   */
  static async open(dataDir: string, conf: string[] = [], clockOffset: () => number = () => 0, opts: { niceness?: number; extensions?: ExtensionFiles } = {}): Promise<PgliteThread> {
    const t = new PgliteThread(dataDir, conf, clockOffset, opts.niceness, opts.extensions);
    await t.start();
    return t;
  }

  get closed(): boolean {
    return this.isClosed;
  }

  async ready(): Promise<void> {
    await this.opening;
  }

  private start(): Promise<void> {
    const opening = (async () => {
      const module = await compiledPglite();
      const channel = new SharedArrayBuffer(CHANNEL_HEADER + CHANNEL_CAPACITY);
      this.slots = new Int32Array(channel, 0, CHANNEL_HEADER / 4);
      this.area = new Uint8Array(channel, CHANNEL_HEADER);
      this.sequence = 0;
      const w = new Worker(WORKER_URL);
      this.worker = w;
      w.onmessage = (e: MessageEvent<ThreadReply>) => {
        const p = this.pending.get(e.data.id);
        if (!p) return;
        this.pending.delete(e.data.id);
        if (e.data.ok) p.resolve(e.data);
        else p.reject(e.data.code ? new DatabaseQueryError(e.data.message, e.data.code) : new Error(e.data.message));
      };
      // A thread that died takes its session with it: start a new one, as for a restart.
      w.onerror = () => {
        if (this.worker === w) void this.restart().catch(() => {});
      };
      try {
        this.clock[0] = this.clockOffset();
        await this.call(w, { op: "open", dataDir: this.dataDir, module, conf: this.conf, channel, clock: this.clock.buffer as SharedArrayBuffer, niceness: this.niceness, extensions: this.extensions });
      } catch (e) {
        w.terminate();
        throw e;
      }
    })();
    // Awaited by whoever calls next; a start overtaken by another restart must not go unhandled.
    opening.catch(() => {});
    this.opening = opening;
    return opening;
  }

  private call(w: Worker | null, req: DistributiveOmit<ThreadRequest, "id">, transfer: Transferable[] = []): Promise<ThreadReply & { ok: true }> {
    if (!w || this.isClosed) return Promise.reject(new SessionKilled("the database session is closed"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      w.postMessage({ ...req, id } as ThreadRequest, transfer);
    });
  }

  private failAll(err: Error): void {
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.reject(err);
  }

  async exec(bytes: Uint8Array): Promise<Uint8Array> {
    await this.opening;
    this.clock[0] = this.clockOffset();
    try {
      const r = bytes.length <= CHANNEL_CAPACITY ? await this.execShared(bytes) : await this.call(this.worker, { op: "exec", bytes });
      return r.bytes!;
    } catch (err) {
      if (err instanceof SessionKilled) throw err;
      // PostgreSQL answers protocol errors in the protocol: a thrown one means PGlite itself failed
      // and its instance is unusable. Start over, like a crashed backend.
      await this.restart().catch(() => {});
      throw new SessionKilled(`the database session failed: ${(err as Error).message}`);
    }
  }

  /** One call through the channel; the caller (the session mux) never overlaps two. */
  private execShared(bytes: Uint8Array): Promise<ThreadReply & { ok: true }> {
    const w = this.worker;
    if (!w || this.isClosed) return Promise.reject(new SessionKilled("the database session is closed"));
    const id = this.nextId++;
    const { slots, area } = this;
    const seq = ++this.sequence;
    const answer = new Promise<ThreadReply & { ok: true }>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    area.set(bytes);
    slots[SLOT.requestLength] = bytes.length;
    slots[SLOT.callId] = id;
    Atomics.store(slots, SLOT.request, seq);
    Atomics.notify(slots, SLOT.request);
    // Bun's waitAsync can wake without the matching notify: trust only the counter.
    const answered = (): void => {
      const p = this.pending.get(id);
      if (!p) return; // the thread was killed meanwhile (already rejected)
      if (Atomics.load(slots, SLOT.answered) !== seq) {
        const again = Atomics.waitAsync(slots, SLOT.answered, seq - 1);
        if (again.async) void again.value.then(answered);
        else answered();
        return;
      }
      if (slots[SLOT.answerLength]! < 0) return; // the answer comes as a message
      this.pending.delete(id);
      p.resolve({ id, ok: true, bytes: area.slice(0, slots[SLOT.answerLength]) });
    };
    answered();
    return answer;
  }

  /**
   * Runs pg_dump (WebAssembly, pg-dump-wasm.ts) on this thread against its instance, writing the
   * output to `path`. The thread does nothing else meanwhile: run it on a copy, not a serving database.
   */
  async dump(args: string[], path: string): Promise<void> {
    await this.opening;
    await this.call(this.worker, { op: "dump", args, path });
  }

  async restart(): Promise<boolean> {
    if (this.isClosed) return false;
    this.worker?.terminate();
    this.worker = null;
    this.failAll(new SessionKilled("the database session was restarted"));
    await this.start();
    return true;
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    const w = this.worker;
    try {
      await this.opening;
      await this.call(w, { op: "close" });
    } catch {
      // a thread that cannot close cleanly is ended below; PostgreSQL recovers at the next open
    } finally {
      this.isClosed = true;
      w?.terminate();
      this.worker = null;
      this.failAll(new SessionKilled("the database session is closed"));
    }
  }
}

/** PGlite in the calling thread (unit tests, benchmarks). It cannot be interrupted. */
export class InProcessSession implements PgliteSession {
  constructor(readonly db: PGlite) {}

  get closed(): boolean {
    return this.db.closed;
  }

  async ready(): Promise<void> {}

  exec(bytes: Uint8Array): Promise<Uint8Array> {
    return execRaw(this.db, bytes);
  }

  async restart(): Promise<boolean> {
    return false;
  }

  async close(): Promise<void> {
    if (!this.db.closed) await this.db.close();
  }
}
