import { workerScript } from "../../embedded/embedded";

export type Md5Request =
  | { op: "update"; seq: number; hash: number; buffer: SharedArrayBuffer; offset: number; length: number }
  | { op: "digest"; seq: number; hash: number }
  | { op: "drop"; hash: number };

export type Md5Reply = { seq: number; hex?: string };

const WORKER_URL = workerScript(new URL("./md5-worker.ts", import.meta.url), "server/backends/blobs/md5-worker.ts");

/**
 * MD5 of upload bytes on a thread of its own. Hashing is the largest cost on the event loop while a
 * file upload streams in (profiled: 25-45% of the main thread's time; MD5 runs at 0.6 GB/s on one
 * core at best, every byte): here the filled write buffers (shared memory, so nothing is copied)
 * are hashed while they are written, in parallel with the next bytes' arrival. One running hash per
 * upload, updated in order. The thread starts at the first use and stays (unref'd: it never keeps
 * the process alive; a Bun worker costs about 11 MB of RSS, given back to no one when ended). When
 * the thread cannot start or fails, every pending and later call fails, and callers hash themselves.
 */
export class Md5Thread {
  private worker: Worker | null = null;
  private broken: Error | null = null;
  private seq = 0;
  private hashes = 0;
  private readonly pending = new Map<number, { resolve: (r: Md5Reply) => void; reject: (e: Error) => void }>();

  /** Whether the thread can be used (it has not failed). */
  get usable(): boolean {
    return this.broken === null;
  }

  private thread(): Worker {
    if (this.broken) throw this.broken;
    if (this.worker) return this.worker;
    try {
      const w = new Worker(WORKER_URL);
      w.onmessage = (e: MessageEvent<Md5Reply>) => {
        const p = this.pending.get(e.data.seq);
        if (!p) return;
        this.pending.delete(e.data.seq);
        p.resolve(e.data);
      };
      w.onerror = (e) => this.fail(new Error(`the MD5 thread failed: ${e.message}`));
      (w as Worker & { unref?(): void }).unref?.();
      this.worker = w;
      return w;
    } catch (err) {
      this.fail(err as Error);
      throw err;
    }
  }

  private fail(err: Error): void {
    this.broken = err;
    this.worker?.terminate();
    this.worker = null;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }

  private call(req: Md5Request & { seq: number }): Promise<Md5Reply> {
    const w = this.thread();
    return new Promise<Md5Reply>((resolve, reject) => {
      this.pending.set(req.seq, { resolve, reject });
      w.postMessage(req);
    });
  }

  /** A new running hash. */
  begin(): number {
    return ++this.hashes;
  }

  /** Adds `length` bytes of `buf` (a view of a SharedArrayBuffer) to the hash; resolves once read. */
  async update(hash: number, buf: Uint8Array, length: number): Promise<void> {
    await this.call({ op: "update", seq: ++this.seq, hash, buffer: buf.buffer as SharedArrayBuffer, offset: buf.byteOffset, length });
  }

  /** The hex digest; the hash is gone after it. */
  async digest(hash: number): Promise<string> {
    return (await this.call({ op: "digest", seq: ++this.seq, hash })).hex!;
  }

  /** Forgets a hash that will not be finished. */
  drop(hash: number): void {
    if (this.worker) this.worker.postMessage({ op: "drop", hash } satisfies Md5Request);
  }

  close(): void {
    this.worker?.terminate();
    this.worker = null;
  }
}

/** The process's MD5 thread. */
export const md5Thread = new Md5Thread();
