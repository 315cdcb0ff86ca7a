import { createHash } from "node:crypto";
import { join } from "node:path";
import type { Clock, TimerHandle } from "../clock";
import { badRequest, HttpError, tooManyRequests } from "../http/errors";
import type { Logger } from "../log";
import type { ControlStore } from "../store/store";
import { entryView, type LogEntryView } from "./entries";
import { LogIngest } from "./ingest";
import { LogFanout } from "./fanout";
import { FileLogStoreThread } from "../backends/logs/file-store-thread";
import { importPgliteLogStore } from "../backends/logs/import-pglite-store";
import { pgCopyWriter } from "../backends/logs/pg-copy";
import { parseQuery, QueryError, toPredicate, type QueryNode } from "./query";
import { type BuildLogSummary, type LineQuery, type LogImports, type LogStore, type ResourceType, type StoredLine } from "../backends/logs/log-store";
import { SqlLogStore } from "../backends/logs/sql-store";
import { TailHub, tailStream } from "./tail";

export const DEFAULT_SEARCH_LIMIT = 100;
export const MAX_SEARCH_LIMIT = 1000;
/** Live tails one project may hold open at once (429 beyond). */
export const MAX_TAILS_PER_PROJECT = 20;
const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

/** What a search or a tail filters on (the search body's fields, the tail's query parameters). */
export interface LogFilter {
  resourceType: ResourceType;
  resourceIds?: string[];
  deploymentIds?: string[];
  q?: string;
  startTime?: string;
  endTime?: string;
}

export interface SearchResult {
  data: LogEntryView[];
  limit: number;
  has_more: boolean;
  next_cursor?: string;
}

interface Cursor {
  at: string;
  id: string;
  /** The search it continues: a cursor is refused with other filters. */
  f: string;
}

function fingerprint(f: LogFilter): string {
  const key = JSON.stringify([f.resourceType, [...(f.resourceIds ?? [])].sort(), [...(f.deploymentIds ?? [])].sort(), f.q ?? "", f.startTime ?? "", f.endTime ?? ""]);
  return createHash("sha256").update(key).digest("base64url").slice(0, 16);
}

function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify({ v: 1, t: c.at, i: c.id, f: c.f })).toString("base64url");
}

const CURSOR_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

function decodeCursor(token: string): Cursor {
  try {
    const o = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
    if (o?.v === 1 && typeof o.t === "string" && CURSOR_TIME.test(o.t) && Number.isFinite(Date.parse(o.t)) && typeof o.i === "string" && /^[a-z0-9]{1,40}$/.test(o.i) && typeof o.f === "string")
      return { at: o.t, id: o.i, f: o.f };
  } catch {
    // fall through
  }
  throw badRequest("invalid request: body field 'cursor': pass back a next_cursor the API returned");
}

function parseQ(q: string | undefined, where: string): QueryNode | null {
  try {
    return parseQuery(q ?? "");
  } catch (e) {
    if (e instanceof QueryError) throw badRequest(`invalid request: ${where} 'q': ${e.message}`);
    throw e;
  }
}

function timeBounds(f: LogFilter, where: string): { startMs?: number; endMs?: number } {
  const startMs = f.startTime === undefined ? undefined : Date.parse(f.startTime);
  const endMs = f.endTime === undefined ? undefined : Date.parse(f.endTime);
  if (startMs !== undefined && endMs !== undefined && startMs > endMs) throw badRequest(`invalid request: ${where} 'start_time' is after 'end_time'`);
  return { startMs, endMs };
}

/**
 * Log search, live tail and the log store's upkeep (retention, lines of a deleted project, the
 * move of logs kept by earlier versions). The store is opened at first use.
 */
export class LogsService {
  readonly tail: TailHub;
  readonly ingest: LogIngest;
  /** Production profile: lines other instances write reach this instance's tails (fanout.ts). */
  private readonly fanout: LogFanout | null;
  private opening: Promise<LogStore & LogImports> | null = null;
  private retention: TimerHandle | null = null;

  constructor(
    private readonly d: {
      control: ControlStore;
      clock: Clock;
      log: Logger;
      dataDir: string;
      retentionDays: () => number;
      /** The production profile's control database (several instances may share it). */
      databaseUrl?: string;
      /** Test fault (`log-store`): the next read of the store fails as a broken store would. */
      fault?: () => boolean;
    },
  ) {
    const fanout =
      d.control.kind === "postgres" && d.databaseUrl
        ? new LogFanout({
            url: d.databaseUrl,
            db: async () => (await this.sqlStore()).database,
            read: async (projectId, segs) => (await this.sqlStore()).linesOfSegments(projectId, segs),
            tails: (projectId) => this.tail.count(projectId),
            publish: (lines) => this.tail.publish(lines),
            warn: (m) => d.log.warn(m),
          })
        : null;
    this.fanout = fanout;
    this.tail = new TailHub((projectId) => fanout?.tailsEnded(projectId));
    this.ingest = new LogIngest({ store: () => this.store(), clock: d.clock, tail: this.tail, log: d.log, written: fanout ? (segs) => fanout.written(segs) : undefined });
  }

  /** The production profile's store (the fanout reads other instances' segments from it). */
  private async sqlStore(): Promise<SqlLogStore> {
    const s = await this.store();
    if (!(s instanceof SqlLogStore)) throw new Error("the log fanout needs the production profile's SQL log store");
    return s;
  }

  /**
   * The embedded profile's segment files on their own thread (file-store.ts; a log store kept in
   * PGlite by earlier versions is moved in first); the production profile's control database.
   */
  store(): Promise<LogStore & LogImports> {
    if (this.opening) return this.opening;
    const opening = (async () => {
      const warn = (m: string) => this.d.log.warn(m);
      if (this.d.control.kind === "postgres") {
        const writer = this.d.databaseUrl ? pgCopyWriter(this.d.databaseUrl) : null;
        const s = new SqlLogStore(this.d.control, { owned: false, warn, copy: writer?.copy, onClose: writer?.close });
        await s.prepare();
        return s;
      }
      const files = new FileLogStoreThread(join(this.d.dataDir, "log-segments"));
      try {
        await importPgliteLogStore(join(this.d.dataDir, "logs"), files, this.d.log);
      } catch (err) {
        await files.close();
        throw err;
      }
      return files;
    })();
    this.opening = opening;
    // A store that could not be prepared is tried again at the next use.
    opening.catch(() => {
      if (this.opening === opening) this.opening = null;
    });
    return opening;
  }

  /**
   * A read of the store, after everything recorded before it is written (read-your-writes). A store
   * that cannot serve (its thread lost, a disk error, the production database down) is a 503 the
   * client may retry, not a 500: the request was fine.
   */
  private async read<T>(fn: (store: LogStore) => Promise<T>): Promise<T> {
    try {
      await this.ingest.flush();
      if (this.d.fault?.()) throw new Error("injected fault: log-store");
      return await fn(await this.store());
    } catch (err) {
      if (err instanceof HttpError) throw err;
      this.d.log.error("log store read failed", err);
      throw new HttpError(503, { error: "the log store is unavailable; retry shortly" }, { "Retry-After": "1" });
    }
  }

  private lineQuery(projectId: string, f: LogFilter, where: string): Omit<LineQuery, "limit"> {
    return {
      projectId,
      resourceType: f.resourceType,
      resourceIds: f.resourceIds,
      deploymentIds: f.deploymentIds,
      where: parseQ(f.q, where),
      ...timeBounds(f, where),
    };
  }

  async search(projectId: string, f: LogFilter & { limit?: number; cursor?: string }): Promise<SearchResult> {
    const base = this.lineQuery(projectId, f, "body field");
    const limit = f.limit ?? DEFAULT_SEARCH_LIMIT;
    const print = fingerprint(f);
    let before: LineQuery["before"];
    if (f.cursor !== undefined) {
      const c = decodeCursor(f.cursor);
      if (c.f !== print) throw badRequest("invalid request: body field 'cursor': it belongs to a search with other filters; send the same resource, q, start_time and end_time");
      before = { at: c.at, id: c.id };
    }
    const rows = await this.read(async (store) => store.search({ ...base, before, limit: limit + 1 }));
    const page = rows.slice(0, limit);
    const out: SearchResult = { data: page.map(entryView), limit, has_more: rows.length > limit };
    const last = page[page.length - 1];
    if (out.has_more && last) out.next_cursor = encodeCursor({ at: new Date(last.at).toISOString(), id: last.id, f: print });
    return out;
  }

  /**
   * A live tail of the project's lines matching the filter (SSE); see `tailStream`. In the
   * production profile it also gets the lines other instances write (registered before it starts).
   */
  async tailStream(projectId: string, f: LogFilter & { backlog: number }, signal: AbortSignal): Promise<ReadableStream<Uint8Array>> {
    const base = this.lineQuery(projectId, f, "query field");
    if (this.tail.count(projectId) >= MAX_TAILS_PER_PROJECT) throw tooManyRequests(`at most ${MAX_TAILS_PER_PROJECT} live tails per project are open at once`, 5);
    if (this.fanout) {
      await this.fanout.tailOpened(projectId);
      // Others may have opened meanwhile.
      if (this.tail.count(projectId) >= MAX_TAILS_PER_PROJECT) throw tooManyRequests(`at most ${MAX_TAILS_PER_PROJECT} live tails per project are open at once`, 5);
    }
    const match = base.where ? toPredicate(base.where) : () => true;
    const ids = base.resourceIds?.length ? new Set(base.resourceIds) : null;
    const deployments = base.deploymentIds?.length ? new Set(base.deploymentIds) : null;
    const stream = deployments ? "build" : "runtime";
    const accept = (l: StoredLine) =>
      l.resource_type === base.resourceType &&
      l.stream === stream &&
      (!ids || ids.has(l.resource_id)) &&
      (!deployments || (l.deployment_id !== null && deployments.has(l.deployment_id))) &&
      (base.startMs === undefined || l.at >= base.startMs) &&
      (base.endMs === undefined || l.at <= base.endMs) &&
      match(l);
    const backlog = async () => (f.backlog ? this.read((store) => store.search({ ...base, limit: f.backlog })) : []);
    return tailStream(this.tail, { projectId, accept, backlog, signal });
  }

  /** Line counts and times of deployments' builds (the deployment history's `build_log`). */
  async buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>> {
    if (!deploymentIds.length) return new Map();
    return (await this.store()).buildSummaries(deploymentIds);
  }

  async removeProject(projectId: string): Promise<void> {
    this.tail.endProject(projectId);
    await this.ingest.flush();
    await (await this.store()).removeProject(projectId);
  }

  /**
   * Retention on the platform clock: every hour, lines older than KILN_LOG_RETENTION_DAYS go. The
   * sweep opens the store only when it is open already or has lines to keep in check.
   */
  startRetention(): void {
    this.retention = this.d.clock.every(HOUR_MS, () => this.sweep(), "log retention");
  }

  async sweep(): Promise<number> {
    if (!this.opening) return 0;
    const store = await this.opening;
    const cutoff = this.d.clock.nowMs() - this.d.retentionDays() * DAY_MS;
    return store.removeOlderThan(cutoff);
  }

  /** How far a move of lines from elsewhere (`source`) has come; null before it started. */
  async importPosition(source: string): Promise<string | null> {
    return (await this.store()).importPosition(source);
  }

  /**
   * Lines moved in from elsewhere (logs kept by earlier versions), written with the position they
   * reach in one transaction of the log store: a move cut short resumes where it stopped.
   */
  async importBatch(source: string, lines: readonly StoredLine[], position: string): Promise<void> {
    await (await this.store()).importBatch(source, lines, position);
  }

  /**
   * A snapshot restore in place is about to put back the store's files: what was recorded is
   * written, and the store closed; it opens again, on the files put back, at its next use.
   */
  async release(): Promise<void> {
    await this.ingest.flush();
    const opening = this.opening;
    this.opening = null;
    if (opening) await (await opening.catch(() => null))?.close();
  }

  async stop(): Promise<void> {
    this.retention?.cancel();
    this.tail.endAll();
    await this.ingest.stop();
    await this.fanout?.stop();
    if (this.opening) await (await this.opening).close();
  }
}
