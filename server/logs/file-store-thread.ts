import type { BuildLogSummary, LineQuery, LogImports, LogStore, StoredLine } from "./store";

export type FileStoreOp = "open" | "append" | "search" | "buildSummaries" | "removeProject" | "removeOlderThan" | "importPosition" | "importBatch" | "lineCount" | "close";
export interface FileStoreRequest {
  id: number;
  op: FileStoreOp;
  args: unknown[];
}
export type FileStoreReply = { id: number; ok: true; value: unknown } | { id: number; ok: false; message: string; code?: string };

const WORKER_URL = new URL("./file-store-worker.ts", import.meta.url).href;

/** An error of the log store's thread, with the file system's code when it has one. */
export class LogStoreError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/**
 * The embedded log store (file-store.ts) on a thread of its own, so that writing lines and
 * searching never hold Kiln's main thread, which serves every request. Opened at first use; a
 * thread that fails is ended and the next call opens a new one (which reads the index again).
 */
export class FileLogStoreThread implements LogStore, LogImports {
  private worker: Worker | null = null;
  private opening: Promise<void> | null = null;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private nextId = 1;
  private closed = false;

  constructor(private readonly dir: string) {}

  private open(): Promise<void> {
    this.opening ??= (async () => {
      if (this.closed) throw new LogStoreError("the log store is closed");
      const w = new Worker(WORKER_URL);
      this.worker = w;
      w.onmessage = (e: MessageEvent<FileStoreReply>) => {
        const p = this.pending.get(e.data.id);
        if (!p) return;
        this.pending.delete(e.data.id);
        if (e.data.ok) p.resolve(e.data.value);
        else p.reject(new LogStoreError(e.data.message, e.data.code));
      };
      w.onerror = (e) => this.lost(w, new LogStoreError(`the log store's thread failed: ${e.message}`));
      try {
        await this.send("open", [this.dir]);
      } catch (err) {
        this.lost(w, err as Error);
        throw err;
      }
    })();
    return this.opening;
  }

  private lost(w: Worker, err: Error): void {
    if (this.worker !== w) return;
    w.terminate();
    this.worker = null;
    this.opening = null;
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.reject(err);
  }

  private send(op: FileStoreOp, args: unknown[]): Promise<unknown> {
    const w = this.worker;
    if (!w) return Promise.reject(new LogStoreError("the log store is not open"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      w.postMessage({ id, op, args } satisfies FileStoreRequest);
    });
  }

  private async call<T>(op: FileStoreOp, ...args: unknown[]): Promise<T> {
    await this.open();
    return (await this.send(op, args)) as T;
  }

  async append(lines: readonly StoredLine[]): Promise<Map<string, string[]>> {
    if (!lines.length) return new Map();
    return new Map(await this.call<Array<[string, string[]]>>("append", JSON.stringify(lines)));
  }

  search(q: LineQuery): Promise<StoredLine[]> {
    return this.call("search", q);
  }

  async buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>> {
    if (!deploymentIds.length) return new Map();
    return new Map(await this.call<Array<[string, BuildLogSummary]>>("buildSummaries", [...deploymentIds]));
  }

  async removeProject(projectId: string): Promise<void> {
    await this.call("removeProject", projectId);
  }

  removeOlderThan(cutoffMs: number): Promise<number> {
    return this.call("removeOlderThan", cutoffMs);
  }

  importPosition(source: string): Promise<string | null> {
    return this.call("importPosition", source);
  }

  async importBatch(source: string, lines: readonly StoredLine[], position: string): Promise<void> {
    await this.call("importBatch", source, JSON.stringify(lines), position);
  }

  /** Lines kept of a project. */
  lineCount(projectId: string): Promise<number> {
    return this.call("lineCount", projectId);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const w = this.worker;
    if (!w) return;
    try {
      await this.opening;
      await this.send("close", []);
    } catch {
      // nothing is lost: every batch was committed or is cut at the next open
    } finally {
      w.terminate();
      this.worker = null;
    }
  }
}
