/** A reply from a thread: to the request with the same id. */
export type ThreadReply = { id: number; ok: true } | { id: number; ok: false; message: string; code?: string };

/**
 * Requests to a Bun Worker and their replies, matched by id. `open` starts the thread and sends its
 * first request once; a thread that fails (or reports an error event) is ended, every call waiting
 * on it fails, and the next `open` starts a new one.
 */
export class ThreadCalls<Reply extends ThreadReply> {
  private worker: Worker | null = null;
  private opening: Promise<void> | null = null;
  private readonly pending = new Map<number, { resolve: (r: Reply & { ok: true }) => void; reject: (e: Error) => void }>();
  private nextId = 1;

  constructor(
    private readonly url: string,
    /** The error a failed call rejects with (the thread's message and code). */
    private readonly error: (message: string, code?: string) => Error,
  ) {}

  /** Started, and its first request (made by `first`) answered: once, or again after the thread was lost. */
  open(first: () => Promise<object> | object): Promise<void> {
    this.opening ??= (async () => {
      const req = await first();
      this.start();
      try {
        await this.send(req);
      } catch (err) {
        this.lost(err as Error);
        throw err;
      }
    })();
    return this.opening;
  }

  /**
   * Ends a running thread: once an open under way and `before` (calls that must go first) have
   * settled, it gets its last request; whether that succeeds or not, the thread is ended and calls
   * still waiting fail with `closed`.
   */
  async close(last: object, closed: Error, before: () => Promise<unknown> = async () => {}): Promise<void> {
    if (!this.worker) return;
    try {
      await this.opening?.catch(() => {});
      await before();
      await this.send(last);
    } catch {
      // what the last request could not do is the owner's to recover at the next open
    } finally {
      this.end(closed);
    }
  }

  private start(): void {
    const w = new Worker(this.url);
    this.worker = w;
    w.onmessage = (e: MessageEvent<Reply>) => {
      const p = this.pending.get(e.data.id);
      if (!p) return;
      this.pending.delete(e.data.id);
      if (e.data.ok) p.resolve(e.data as Reply & { ok: true });
      else p.reject(this.error(e.data.message, e.data.code));
    };
    w.onerror = (e) => {
      if (this.worker === w) this.lost(this.error(`the thread failed: ${e.message}`));
    };
  }

  /** Sends a request (its id is added); its reply when ok, else the thread's error. */
  send(req: object): Promise<Reply & { ok: true }> {
    const w = this.worker;
    if (!w) return Promise.reject(this.error("the thread is not running"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      w.postMessage({ ...req, id });
    });
  }

  /** The thread failed: ended, its calls failed; the next `open` starts a new one. */
  lost(err: Error): void {
    this.end(err);
    this.opening = null;
  }

  /** Ends the thread; calls still waiting fail with `err`. */
  end(err: Error): void {
    this.worker?.terminate();
    this.worker = null;
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.reject(err);
  }
}
