import { isoTime, type ControlStore } from "../store/store";
import { migrate } from "../store/migrations";
import { LOG_SCHEMA, TEXT_INDEX_SQL } from "./migrations";
import { toSql, type QueryNode } from "./query";

export type ResourceType = "function" | "frontend";
/** `runtime`: what invocations (or frontend requests) print; `build`: a deployment's build. */
export type LogStream = "runtime" | "build";

/** One log line as stored. `at` is on the platform clock (epoch ms). */
export interface StoredLine {
  id: string;
  project_id: string;
  resource_type: ResourceType;
  resource_id: string;
  resource_name: string;
  stream: LogStream;
  deployment_id: string | null;
  invocation_id: string | null;
  region: string;
  level: string;
  /** The body is a JSON object's text (a structured line). */
  structured: boolean;
  body: string;
  at: number;
}

export const LINE_COLUMNS = [
  "id",
  "project_id",
  "resource_type",
  "resource_id",
  "resource_name",
  "stream",
  "deployment_id",
  "invocation_id",
  "region",
  "level",
  "structured",
  "body",
  "at",
] as const;

/** What one search asks of the store: every filter, already validated. */
export interface LineQuery {
  projectId: string;
  resourceType: ResourceType;
  resourceIds?: readonly string[];
  /** Build lines of these deployments; without them, runtime lines. */
  deploymentIds?: readonly string[];
  where: QueryNode | null;
  /** Inclusive bounds, epoch ms. */
  startMs?: number;
  endMs?: number;
  /** Keyset: lines strictly older than this (at, id), i.e. after it in newest-first order. */
  before?: { at: string; id: string };
  limit: number;
}

export interface BuildLogSummary {
  lines: number;
  first_at: string | null;
  last_at: string | null;
}

/** Where log lines live; one SQL text for both profiles (see docs/observability.md). */
export interface LogStore {
  append(lines: readonly StoredLine[]): Promise<void>;
  /** Newest first, (at, id) descending. */
  search(q: LineQuery): Promise<StoredLine[]>;
  buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>>;
  removeProject(projectId: string): Promise<void>;
  /** Lines older than the cutoff are deleted, in batches; returns how many. */
  removeOlderThan(cutoffMs: number): Promise<number>;
  close(): Promise<void>;
}

const DELETE_BATCH = 20_000;
/** PGlite has no autovacuum: statistics are refreshed by the store itself after this many new lines. */
const ANALYZE_EVERY = 100_000;

function fromRow(r: Record<string, unknown>): StoredLine {
  return {
    id: r.id as string,
    project_id: r.project_id as string,
    resource_type: r.resource_type as ResourceType,
    resource_id: r.resource_id as string,
    resource_name: r.resource_name as string,
    stream: r.stream as LogStream,
    deployment_id: (r.deployment_id as string | null) ?? null,
    invocation_id: (r.invocation_id as string | null) ?? null,
    region: r.region as string,
    level: r.level as string,
    structured: r.structured as boolean,
    body: r.body as string,
    at: new Date(r.at as string).getTime(),
  };
}

function placeholders(params: unknown[], values: readonly string[]): string {
  return values.map((v) => (params.push(v), `$${params.length}`)).join(", ");
}

/**
 * The log store over SQL: `log_lines` with a btree for newest-first reads per project, a partial
 * btree for the rarer levels, a partial btree for build lines and a pg_trgm GIN index for free
 * text. Writes are COPY batches from the ingest; nothing writes a line by itself.
 */
export class SqlLogStore implements LogStore {
  private sinceAnalyze = 0;

  constructor(
    private readonly db: ControlStore,
    private readonly o: { owned: boolean; warn: (m: string) => void },
  ) {}

  /** The database under the store (imports write lines and their position in one transaction). */
  get database(): ControlStore {
    return this.db;
  }

  /**
   * The production profile keeps lines in the control database: its schema there, and the trigram
   * index when the server has pg_trgm (without it searches still work, by scanning).
   */
  async prepare(): Promise<void> {
    await migrate(this.db, LOG_SCHEMA);
    try {
      for (const stmt of TEXT_INDEX_SQL) await this.db.query(stmt);
    } catch (err) {
      this.o.warn(`log search: no trigram index (${(err as Error).message}); free-text searches will scan. Install PostgreSQL's contrib package (pg_trgm) to index them.`);
    }
  }

  async append(lines: readonly StoredLine[]): Promise<void> {
    if (!lines.length) return;
    const rows = lines.map((l) => [
      l.id,
      l.project_id,
      l.resource_type,
      l.resource_id,
      l.resource_name,
      l.stream,
      l.deployment_id,
      l.invocation_id,
      l.region,
      l.level,
      l.structured ? "t" : "f",
      l.body,
      new Date(l.at).toISOString(),
    ]);
    await this.db.copyRows("log_lines", LINE_COLUMNS, rows);
    this.sinceAnalyze += lines.length;
    if (this.db.kind === "pglite" && this.sinceAnalyze >= ANALYZE_EVERY) {
      this.sinceAnalyze = 0;
      await this.db.query(`analyze log_lines`);
    }
  }

  async search(q: LineQuery): Promise<StoredLine[]> {
    const params: unknown[] = [q.projectId, q.resourceType];
    const where = [`project_id = $1`, `resource_type = $2`];
    // Literal streams: the planner matches the build lines' partial index only against a literal.
    if (q.deploymentIds?.length) where.push(`stream = 'build'`, `deployment_id in (${placeholders(params, q.deploymentIds)})`);
    else where.push(`stream = 'runtime'`);
    if (q.resourceIds?.length) where.push(`resource_id in (${placeholders(params, q.resourceIds)})`);
    if (q.startMs !== undefined) where.push(`at >= $${params.push(new Date(q.startMs).toISOString())}`);
    if (q.endMs !== undefined) where.push(`at <= $${params.push(new Date(q.endMs).toISOString())}`);
    if (q.before) {
      params.push(q.before.at, q.before.id);
      where.push(`(at, id) < ($${params.length - 1}::timestamptz, $${params.length}::text)`);
    }
    if (q.where) where.push(toSql(q.where, params));
    params.push(q.limit);
    const rows = await this.db.query(`select * from log_lines where ${where.join(" and ")} order by at desc, id desc limit $${params.length}`, params);
    return rows.map(fromRow);
  }

  async buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>> {
    const out = new Map<string, BuildLogSummary>();
    if (!deploymentIds.length) return out;
    const params: unknown[] = [];
    const rows = await this.db.query(
      `select deployment_id, count(*)::int as lines, min(at) as first_at, max(at) as last_at from log_lines
        where stream = 'build' and deployment_id in (${placeholders(params, deploymentIds)}) group by deployment_id`,
      params,
    );
    for (const r of rows) out.set(r.deployment_id as string, { lines: r.lines as number, first_at: isoTime(r.first_at), last_at: isoTime(r.last_at) });
    return out;
  }

  async removeProject(projectId: string): Promise<void> {
    for (;;) {
      const [{ n }] = (await this.db.query(
        `with d as (delete from log_lines where ctid in (select ctid from log_lines where project_id = $1 limit ${DELETE_BATCH}) returning 1) select count(*)::int as n from d`,
        [projectId],
      )) as [{ n: number }];
      if (n < DELETE_BATCH) break;
    }
    await this.tidy();
  }

  async removeOlderThan(cutoffMs: number): Promise<number> {
    const cutoff = new Date(cutoffMs).toISOString();
    // The projects with lines, by a skip scan of the newest-first index (no index on time alone).
    const projects = await this.db.query<{ id: string }>(
      `with recursive p as (
         (select project_id as id from log_lines order by project_id limit 1)
         union all
         select (select project_id from log_lines where project_id > p.id order by project_id limit 1) from p where p.id is not null
       ) select id from p where id is not null`,
    );
    let removed = 0;
    for (const { id } of projects) {
      for (;;) {
        const [{ n }] = (await this.db.query(
          `with d as (delete from log_lines where ctid in (select ctid from log_lines where project_id = $1 and at < $2 limit ${DELETE_BATCH}) returning 1) select count(*)::int as n from d`,
          [id, cutoff],
        )) as [{ n: number }];
        removed += n;
        if (n < DELETE_BATCH) break;
      }
    }
    if (removed) await this.tidy();
    return removed;
  }

  /** PGlite has no autovacuum: deleted lines' space is reclaimed (and statistics refreshed) here. */
  private async tidy(): Promise<void> {
    if (this.db.kind === "pglite") await this.db.query(`vacuum analyze log_lines`);
  }

  async close(): Promise<void> {
    if (this.o.owned) await this.db.close();
  }
}
