/**
 * The door every HTTP request passes through, closed while Kiln's state is swapped under it (a
 * snapshot or a restore, server/snapshots). Closing waits for the requests already inside to finish;
 * a request arriving while it is closed waits until it opens again (then sees the new state), or gets
 * 503 with Retry-After if that takes longer than HOLD_MS. Open, it costs a counter.
 */
const PASS_HEADER = "x-kiln-internal-pass";

export class RequestGate {
  private inside = 0;
  private closed: { opened: Promise<void>; open: () => void } | null = null;
  private idle: (() => void) | null = null;

  /** Requests Kiln sends itself while the door is closed (applying a seed at start). */
  private passes = new Set<string>();

  /**
   * A start's deferred work (server/main.ts: the areas' resume) under way: until it settles every
   * request but the health check waits for it, with no time limit (true: go on; false: it failed).
   */
  starting: Promise<boolean> | null = null;

  constructor(private readonly holdMs = 10_000) {}

  /** Requests (but /healthz) wait until `work` settles. */
  holdUntil(work: Promise<unknown>): void {
    const starting = work.then(
      () => true,
      () => false,
    );
    this.starting = starting;
    void starting.then(() => {
      if (this.starting === starting) this.starting = null;
    });
  }

  /** A header value that lets a request in while the door is closed; `done` withdraws it. */
  pass(): { header: string; value: string; done(): void } {
    const value = crypto.randomUUID();
    this.passes.add(value);
    return { header: PASS_HEADER, value, done: () => this.passes.delete(value) };
  }

  /** null: go in now. Otherwise a promise: true once in, false when the hold ran out (answer 503). */
  enter(request?: Request): Promise<boolean> | null {
    if (!this.closed || (this.passes.size && this.passes.has(request?.headers.get(PASS_HEADER) ?? ""))) {
      this.inside++;
      return null;
    }
    const opened = this.closed.opened;
    return new Promise<boolean>((resolve) => {
      let gaveUp = false;
      const timer = setTimeout(() => {
        gaveUp = true;
        resolve(false);
      }, this.holdMs);
      void opened.then(() => {
        // Answered 503 already: it never comes in (and must not be counted inside).
        if (gaveUp) return;
        clearTimeout(timer);
        // Closed again meanwhile (a second restore): wait for that one too.
        const again = this.enter(request);
        if (again === null) resolve(true);
        else void again.then(resolve);
      });
    });
  }

  leave(): void {
    this.inside--;
    if (this.idle && this.inside <= 0) this.idle();
  }

  get isClosed(): boolean {
    return this.closed !== null;
  }

  /**
   * Closes the door and waits until at most `own` requests are inside (the request asking for the
   * close counts itself), or `timeoutMs` passed (false: the door is open again, nothing was done). `onClosed` runs once no
   * request can come in: it ends responses that never end by themselves (live log tails).
   */
  async close(own: number, timeoutMs: number, onClosed?: () => void): Promise<boolean> {
    let open!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    this.closed = { opened, open };
    onClosed?.();
    const deadline = Date.now() + timeoutMs;
    while (this.inside > own) {
      const left = deadline - Date.now();
      if (left <= 0) {
        this.open();
        return false;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 100));
        this.idle = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.idle = null;
    }
    return true;
  }

  /** Closed at once, with nothing inside to wait for (Kiln is about to listen). */
  closeNow(): void {
    let open!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    this.closed = { opened, open };
  }

  open(): void {
    const c = this.closed;
    this.closed = null;
    c?.open();
  }
}
