import { workerScript } from "../../embedded/embedded";
import { compiledPglite } from "../../store/pglite-wasm";
import { copyText, type ControlStore, type Row, type Sql } from "../../store/store";
import { ThreadCalls } from "./thread-calls";

export type LogDbRequest =
  | { id: number; op: "open"; dataDir: string; module: WebAssembly.Module }
  | { id: number; op: "query"; sql: string; params: unknown[] }
  | { id: number; op: "copy"; table: string; columns: readonly string[]; text: string }
  | { id: number; op: "close" };

export type LogDbReply =
  | { id: number; ok: true; rows?: Record<string, unknown>[] }
  | { id: number; ok: false; message: string; code?: string };

type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

const WORKER_URL = workerScript(new URL("./log-db-worker.ts", import.meta.url), "server/backends/logs/log-db-worker.ts");

/** An error of the log database, with PostgreSQL's SQLSTATE like the other stores' errors. */
export class LogDbError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/**
 * The log store's database of earlier versions of the embedded profile: a PGlite of its own
 * (`<data-dir>/logs`) on its own thread. Kiln now opens it only to move its lines into the segment
 * files (import-pglite-store.ts); it speaks the control store's interface, so the SQL log store
 * (store.ts) reads it as the production profile's database.
 */
export class LogDbThread implements ControlStore {
  readonly kind = "pglite" as const;
  private readonly thread = new ThreadCalls<LogDbReply>(WORKER_URL, (message, code) => new LogDbError(message, code));
  private closed = false;
  /** A transaction in progress holds the (single) session; other calls wait behind it. */
  private held: Promise<void> = Promise.resolve();

  constructor(private readonly dataDir: string) {}

  /** Opens the thread (again, after a failure: PostgreSQL recovers the data dir as after a crash). */
  private open(): Promise<void> {
    if (this.closed) return Promise.reject(new LogDbError("the log store is closed"));
    return this.thread.open(async () => ({ op: "open", dataDir: this.dataDir, module: await compiledPglite() }));
  }

  private send(req: DistributiveOmit<LogDbRequest, "id">): Promise<LogDbReply & { ok: true }> {
    return this.thread.send(req);
  }

  private async call(req: DistributiveOmit<LogDbRequest, "id">): Promise<LogDbReply & { ok: true }> {
    await this.open();
    await this.held;
    return this.send(req);
  }

  async query<T extends Row = Row>(text: string, params: unknown[] = []): Promise<T[]> {
    const r = await this.call({ op: "query", sql: text, params: params.map((p) => (p === undefined ? null : p)) });
    return (r.rows ?? []) as T[];
  }

  async copyRows(table: string, columns: readonly string[], rows: ReadonlyArray<ReadonlyArray<string | null>>): Promise<void> {
    if (!rows.length) return;
    await this.call({ op: "copy", table, columns, text: copyText(rows) });
  }

  /** BEGIN … COMMIT on the thread's one session; every other call waits until it ends. */
  async transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    await this.open();
    let release = () => {};
    const previous = this.held;
    this.held = new Promise<void>((r) => (release = r));
    await previous;
    const tx: Sql = {
      query: async <R extends Row>(text: string, params: unknown[] = []) =>
        ((await this.send({ op: "query", sql: text, params: params.map((p) => (p === undefined ? null : p)) })).rows ?? []) as R[],
    };
    try {
      await tx.query("begin");
      const out = await fn(tx);
      await tx.query("commit");
      return out;
    } catch (err) {
      await tx.query("rollback").catch(() => {});
      throw err;
    } finally {
      release();
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // After the transaction in progress; a database that cannot close cleanly is recovered by PostgreSQL at the next open.
    await this.thread.close({ op: "close" }, new LogDbError("the log store is closed"), () => this.held);
  }
}
