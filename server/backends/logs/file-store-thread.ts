import { workerScript } from "../../embedded/embedded";
import type { BuildLogSummary, LineQuery, LogImports, LogStore, StoredLine } from "./log-store";
import { ThreadCalls } from "./thread-calls";

export type FileStoreOp = "open" | "append" | "search" | "buildSummaries" | "removeProject" | "removeOlderThan" | "importPosition" | "importBatch" | "close";
export interface FileStoreRequest {
  id: number;
  op: FileStoreOp;
  args: unknown[];
}
export type FileStoreReply = { id: number; ok: true; value: unknown } | { id: number; ok: false; message: string; code?: string };

const WORKER_URL = workerScript(new URL("./file-store-worker.ts", import.meta.url), "server/backends/logs/file-store-worker.ts");

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
  private readonly thread = new ThreadCalls<FileStoreReply>(WORKER_URL, (message, code) => new LogStoreError(message, code));
  private closed = false;

  constructor(private readonly dir: string) {}

  private async call<T>(op: FileStoreOp, ...args: unknown[]): Promise<T> {
    if (this.closed) throw new LogStoreError("the log store is closed");
    await this.thread.open(() => ({ op: "open", args: [this.dir] }));
    return (await this.thread.send({ op, args })).value as T;
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

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Nothing is lost if the close fails: every batch was committed or is cut at the next open.
    await this.thread.close({ op: "close", args: [] }, new LogStoreError("the log store is closed"));
  }
}
