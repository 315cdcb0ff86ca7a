import { isoTime, type ControlStore, type Sql } from "../../store/store";
import { migrate } from "../../store/migrations";
import { keysSql, type KeyCondition } from "./keys";
import { LOG_SCHEMA } from "./migrations";
import { toSql } from "../../logs/query";
import { fromRow, keyCondition, LINE_COLUMNS, levelsOf, newerFirst, segmentsOf, type BuildLogSummary, type Segment, type LineQuery, type LogImports, type LogStore, type LogStream, type ResourceType, type StoredLine } from "./log-store";

const SEGMENT_COLUMNS = ["seg", "project_id", "resource_type", "stream", "deployment_id", "min_at", "max_at", "lines", "keys"] as const;

const DELETE_SEGMENTS = 500;
const DELETE_BATCH = 20_000;
/** PGlite has no autovacuum: statistics are refreshed by the store itself, first after this many new lines, then after ANALYZE_EVERY. */
const ANALYZE_FIRST = 20_000;
const ANALYZE_EVERY = 500_000;
/** Batch numbers reserved from the sequence at a time. */
const BATCH_NUMBERS = 64;
/** Segment ids: a batch number from a sequence, times this, plus the segment's place in the batch. */
const SEGMENTS_PER_BATCH = 4096;
/** Segments read by the first step of a search; later steps read as many as the rate of matches so far asks, up to the last. */
const FIRST_STEP = 8;
const LAST_STEP = 256;
/** Newest segments whose keys a search checks one by one before it asks the GIN index. */
const PROBE = 48;

/** Levels that may appear in a literal (normalised levels are lower-case and at most 16 characters). */
const SAFE_LEVEL = /^[a-z0-9_.-]{1,16}$/;
function placeholders(params: unknown[], values: readonly string[]): string {
  return values.map((v) => (params.push(v), `$${params.length}`)).join(", ");
}

/** `seg = any(...)` for a list of segment ids, as one array parameter (an index condition, any number of ids). */
function segIn(params: unknown[], segs: readonly string[]): string {
  params.push(`{${segs.join(",")}}`);
  return `seg = any($${params.length}::bigint[])`;
}

const cols = LINE_COLUMNS.join(", ");
const iso = (ms: number) => new Date(ms).toISOString();

export type CopyText = (table: string, columns: readonly string[], text: string) => Promise<void>;

const COPY_SPECIAL = /[\\\n\r\t]/;
const COPY_SPECIALS = /[\\\n\r\t]/g;
const COPY_ESCAPES: Record<string, string> = { "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t" };
const copyField = (v: string): string => (COPY_SPECIAL.test(v) ? v.replace(COPY_SPECIALS, (c) => COPY_ESCAPES[c]!) : v);

/**
 * The COPY text of segments and their lines, built directly (no row arrays): values that repeat
 * from line to line (project, resource, deployment, invocation, region, level) are escaped once
 * per batch, times once per millisecond. Also the segments written, by project.
 */
export function copyTexts(segments: readonly Segment[]): { segments: string; lines: string; written: Map<string, string[]> } {
  const escaped = new Map<string, string>();
  const rep = (v: string | null): string => {
    if (v === null) return "\\N";
    let e = escaped.get(v);
    if (e === undefined) escaped.set(v, (e = copyField(v)));
    return e;
  };
  let lastMs = NaN;
  let lastIso = "";
  const isoOf = (ms: number) => (ms === lastMs ? lastIso : ((lastMs = ms), (lastIso = new Date(ms).toISOString())));
  let lines = "";
  let segs = "";
  const written = new Map<string, string[]>();
  for (const s of segments) {
    const first = s.lines[0]!;
    const last = s.lines[s.lines.length - 1]!;
    segs += `${s.seg}\t${rep(first.project_id)}\t${first.resource_type}\t${first.stream}\t${first.stream === "build" ? rep(first.deployment_id) : "\\N"}\t${isoOf(first.at)}\t${isoOf(last.at)}\t${s.lines.length}\t{${s.keys.join(",")}}\n`;
    for (const l of s.lines)
      lines += `${copyField(l.id)}\t${rep(l.project_id)}\t${l.resource_type}\t${rep(l.resource_id)}\t${rep(l.resource_name)}\t${l.stream}\t${rep(l.deployment_id)}\t${rep(l.invocation_id)}\t${rep(l.region)}\t${rep(l.level)}\t${l.structured ? "t" : "f"}\t${copyField(l.body)}\t${isoOf(l.at)}\t${s.seg}\n`;
    const w = written.get(first.project_id);
    if (w) w.push(s.seg);
    else written.set(first.project_id, [s.seg]);
  }
  return { segments: segs, lines, written };
}

/** COPY text back to rows (for a database that only takes rows; tests). */
function parseCopy(text: string): (string | null)[][] {
  const un: Record<string, string> = { "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t" };
  return text
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => l.split("\t").map((v) => (v === "\\N" ? null : v.replace(/\\[\\nrt]/g, (c) => un[c]!))));
}

/** A segment a search reads: its id (null keys: lines written before segments, read by time range). */
interface Candidate {
  seg: string;
  maxAt: number;
  legacy: { minAt: string; maxAt: string; deploymentId: string | null } | null;
}

/**
 * The log store over SQL. Lines are rows of `log_lines`, written in segments: each segment (up to
 * 64 lines of one project, resource type and stream, in time order) has a row in `log_segments`
 * with its time span and the keys of its lines (keys.ts) under a GIN index. A search walks the
 * segments that may hold a match, newest first, a few at a time, and reads their matching lines
 * with the query's own SQL; it stops once the lines found are newer than every segment left. See
 * docs/observability.md for what this costs and saves.
 */
export class SqlLogStore implements LogStore, LogImports {
  private sinceAnalyze = 0;
  private analyzed = false;
  /** Lines written since the GIN index's pending list was last merged (PGlite; see `search`). */
  private pendingKeys = false;
  private batchNumbers: bigint[] = [];
  /** The last batch being written here (batches are written one at a time). */
  private appending: Promise<unknown> = Promise.resolve();
  /** Lines written before segments existed remain (read through log_lines_legacy until retention removes them). */
  private legacy: boolean | null = null;

  constructor(
    private readonly db: ControlStore,
    private readonly o: {
      owned: boolean;
      warn: (m: string) => void;
      /** COPY text (text format) into a table; without it, rows go through the database's `copyRows`. */
      copy?: CopyText;
      /** Called at close (a connection of the store's own). */
      onClose?: () => Promise<void>;
    },
  ) {}

  /** The database under the store (imports write lines and their position in one transaction). */
  get database(): ControlStore {
    return this.db;
  }

  /** The production profile keeps lines in the control database: its schema there. */
  async prepare(): Promise<void> {
    await migrate(this.db, LOG_SCHEMA);
  }

  private async hasLegacy(db: Sql = this.db): Promise<boolean> {
    if (this.legacy === null) {
      const [r] = await db.query<{ any: boolean }>(`select exists (select 1 from log_segments where keys is null) as any`);
      this.legacy = !!r?.any;
    }
    return this.legacy;
  }

  /** Segment ids for `n` segments: a batch number from the shared sequence (reserved 64 at a time), times 4096, plus the place. */
  private async segmentIds(tx: Sql, n: number): Promise<(i: number) => string> {
    const bases: bigint[] = [];
    for (let b = 0; b < Math.max(1, Math.ceil(n / SEGMENTS_PER_BATCH)); b++) {
      if (!this.batchNumbers.length) {
        const rows = await tx.query<{ b: string }>(`select nextval('log_segment_batches')::text as b from generate_series(1, $1::integer)`, [BATCH_NUMBERS]);
        this.batchNumbers = rows.map((r) => BigInt(r.b));
      }
      bases.push(this.batchNumbers.shift()! * BigInt(SEGMENTS_PER_BATCH));
    }
    return (i) => (bases[Math.floor(i / SEGMENTS_PER_BATCH)]! + BigInt(i % SEGMENTS_PER_BATCH)).toString();
  }

  async append(lines: readonly StoredLine[]): Promise<Map<string, string[]>> {
    if (!lines.length) return new Map();
    // One batch at a time (the ingest hands over the next before the last is written): COPYs share
    // the store's one connection, and a query sent behind a COPY would reach the server in COPY mode.
    // (Making the next batch's segments and COPY text while the last one's COPY runs measured no
    // faster: 41.2k against 41.3k lines/s.)
    const turn = this.appending.then(() => this.appendHere(lines));
    this.appending = turn.catch(() => {});
    const written = await turn;
    this.pendingKeys = true;
    return written;
  }

  private async appendHere(lines: readonly StoredLine[]): Promise<Map<string, string[]>> {
    const ids = await this.segmentIds(this.db, lines.length);
    const text = copyTexts(segmentsOf(lines, ids));
    // Segments first: a segment whose lines did not make it (a failed COPY, retried with new ids)
    // is only an empty place a search looks into, never a line a search cannot find.
    const copy = this.o.copy ?? ((table, columns, t) => this.db.copyRows(table, columns, parseCopy(t)));
    await copy("log_segments", SEGMENT_COLUMNS, text.segments);
    await copy("log_lines", [...LINE_COLUMNS, "seg"], text.lines);
    this.sinceAnalyze += lines.length;
    if (this.db.kind === "pglite" && this.sinceAnalyze >= (this.analyzed ? ANALYZE_EVERY : ANALYZE_FIRST)) {
      this.sinceAnalyze = 0;
      this.analyzed = true;
      await this.db.query(`analyze log_segments`);
      await this.db.query(`analyze log_lines`);
    }
    return text.written;
  }

  /** The project, resource type and stream (build lines of those deployments, or runtime lines): segments and lines alike. */
  private streamFilter(q: LineQuery, params: unknown[]): string[] {
    params.push(q.projectId, q.resourceType);
    const where = [`project_id = $${params.length - 1}`, `resource_type = $${params.length}`];
    // Literal streams, as the segments have them.
    if (q.deploymentIds?.length) where.push(`stream = 'build'`, `deployment_id in (${placeholders(params, q.deploymentIds)})`);
    else where.push(`stream = 'runtime'`);
    return where;
  }

  /** The segments a search may find matches in, newest first: conditions on segments, then on their keys. */
  private segmentFilter(q: LineQuery, params: unknown[]): string[] {
    const where = this.streamFilter(q, params);
    if (q.startMs !== undefined) where.push(`max_at >= $${params.push(iso(q.startMs))}`);
    if (q.endMs !== undefined) where.push(`min_at <= $${params.push(iso(q.endMs))}`);
    if (q.before) where.push(`min_at <= $${params.push(q.before.at)}`);
    return where;
  }

  /** Conditions on lines: every filter of the query (the keys only narrowed the segments). */
  private lineFilter(q: LineQuery, params: unknown[]): string[] {
    const where = this.streamFilter(q, params);
    if (q.resourceIds?.length) where.push(`resource_id in (${placeholders(params, q.resourceIds)})`);
    if (q.startMs !== undefined) where.push(`at >= $${params.push(iso(q.startMs))}`);
    if (q.endMs !== undefined) where.push(`at <= $${params.push(iso(q.endMs))}`);
    if (q.before) {
      params.push(q.before.at, q.before.id);
      where.push(`(at, id) < ($${params.length - 1}::timestamptz, $${params.length}::text)`);
    }
    if (q.where) where.push(toSql(q.where, params));
    return where;
  }

  /**
   * The next candidate segments, newest first, after `after` (max_at, seg) in that order.
   *
   * With a key condition: first the newest PROBE segments after `after` are checked one by one
   * (their keys read from the newest-first index's order) — a common term is in most of them and
   * is done at once; only when they hold fewer than `n` does the GIN index pick the rest, as a
   * materialized set (so no plan reads every segment's keys array instead), sorted and cut. Once a
   * probe finds few, later steps of the same search go to the GIN index directly (`state`).
   * Without keys, the newest-first index is walked.
   */
  private async candidates(
    db: Sql,
    q: LineQuery,
    keys: KeyCondition | null,
    after: { at: string; seg: string } | null,
    n: number,
    state: { probe: boolean },
  ): Promise<Candidate[]> {
    const params: unknown[] = [];
    const where = this.segmentFilter(q, params);
    const position = (a: { at: string; seg: string } | null) => {
      if (!a) return;
      params.push(a.at, a.seg);
      where.push(`(max_at, seg) < ($${params.length - 1}::timestamptz, $${params.length}::bigint)`);
    };
    const toCandidate = (r: { seg: string; max_at: Date | string }): Candidate => ({ seg: r.seg, maxAt: new Date(r.max_at).getTime(), legacy: null });
    if (!keys) {
      position(after);
      where.push(`keys is not null`);
      params.push(n);
      const rows = await db.query<{ seg: string; max_at: Date | string }>(
        `select s.seg::text as seg, s.max_at from log_segments s where ${where.join(" and ")} order by s.max_at desc, s.seg desc limit $${params.length}`,
        params,
      );
      return rows.map(toCandidate);
    }
    let hits: Candidate[] = [];
    let from = after;
    if (state.probe) {
      const probeParams: unknown[] = [];
      const probeWhere = this.segmentFilter(q, probeParams);
      if (after) {
        probeParams.push(after.at, after.seg);
        probeWhere.push(`(max_at, seg) < ($${probeParams.length - 1}::timestamptz, $${probeParams.length}::bigint)`);
      }
      probeWhere.push(`keys is not null`);
      const hit = keysSql(keys, probeParams);
      probeParams.push(PROBE);
      const rows = await db.query<{ seg: string; max_at: Date | string; hit: boolean }>(
        `select s.seg::text as seg, s.max_at, (${hit}) as hit from log_segments s where ${probeWhere.join(" and ")} order by s.max_at desc, s.seg desc limit $${probeParams.length}`,
        probeParams,
      );
      hits = rows.filter((r) => r.hit).map(toCandidate);
      if (hits.length >= n) return hits.slice(0, n);
      if (rows.length < PROBE) return hits;
      // Few hits: the keys are rare here; the GIN index serves this search from now on.
      if (hits.length * 4 < rows.length) state.probe = false;
      const last = rows[rows.length - 1]!;
      from = { at: iso(new Date(last.max_at).getTime()), seg: last.seg };
    }
    position(from);
    const picked = keysSql(keys, params);
    params.push(n - hits.length);
    const rows = await db.query<{ seg: string; max_at: Date | string }>(
      `select s.seg::text as seg, s.max_at from (with k as materialized (select seg, project_id, resource_type, stream, deployment_id, min_at, max_at from log_segments where ${picked}) select * from k) s
        where ${where.join(" and ")} order by s.max_at desc, s.seg desc limit $${params.length}`,
      params,
    );
    return [...hits, ...rows.map(toCandidate)];
  }

  /** Segments of lines written before segments existed (no keys: always read), newest first. */
  private async legacyCandidates(db: Sql, q: LineQuery): Promise<Candidate[]> {
    if (!(await this.hasLegacy(db))) return [];
    const params: unknown[] = [];
    const where = this.segmentFilter(q, params);
    where.push(`keys is null`);
    const rows = await db.query<{ seg: string; min_at: Date | string; max_at: Date | string; deployment_id: string | null }>(
      `select s.seg::text as seg, s.min_at, s.max_at, s.deployment_id from log_segments s where ${where.join(" and ")} order by s.max_at desc, s.seg desc`,
      params,
    );
    return rows.map((r) => ({ seg: r.seg, maxAt: new Date(r.max_at).getTime(), legacy: { minAt: new Date(r.min_at).toISOString(), maxAt: new Date(r.max_at).toISOString(), deploymentId: r.deployment_id } }));
  }

  /** The matching lines of some segments, newest first, at most `limit`. */
  private async matching(db: Sql, q: LineQuery, segs: Candidate[], limit: number): Promise<StoredLine[]> {
    const out: StoredLine[] = [];
    const keyed = segs.filter((s) => !s.legacy).map((s) => s.seg);
    if (keyed.length) {
      const params: unknown[] = [];
      const where = [segIn(params, keyed), ...this.lineFilter(q, params)];
      params.push(limit);
      const rows = await db.query(`select ${cols} from log_lines where ${where.join(" and ")} order by at desc, id desc limit $${params.length}`, params);
      for (const r of rows) out.push(fromRow(r));
    }
    for (const s of segs) {
      if (!s.legacy) continue;
      const params: unknown[] = [];
      const where = [`seg is null`, ...this.lineFilter(q, params), `at >= $${params.push(s.legacy.minAt)}`, `at <= $${params.push(s.legacy.maxAt)}`];
      if (s.legacy.deploymentId !== null) where.push(`deployment_id = $${params.push(s.legacy.deploymentId)}`);
      params.push(limit);
      const rows = await db.query(`select ${cols} from log_lines where ${where.join(" and ")} order by at desc, id desc limit $${params.length}`, params);
      for (const r of rows) out.push(fromRow(r));
    }
    return out;
  }

  /**
   * One transaction, with sequential scans priced out: the planner's estimates for segments (keys
   * arrays stored out of line, statistics refreshed now and then) can make a scan that reads every
   * segment's keys look cheaper than the GIN index, and it is not.
   */
  search(q: LineQuery): Promise<StoredLine[]> {
    return this.db.transaction(async (tx) => {
      // PGlite has no autovacuum: the GIN index's pending list (up to 4 MB of keys, which every
      // search would scan) is merged here, once after writes, rather than by a search each time.
      if (this.db.kind === "pglite" && this.pendingKeys) {
        this.pendingKeys = false;
        await tx.query(`select gin_clean_pending_list('log_segments_keys')`);
      }
      await tx.query(`set local enable_seqscan = off`);
      // A search reads a few thousand lines at most: parallel workers cost more to start than they save
      // (and the planner asked for them on statistics not yet refreshed after a burst: 78 instead of 25 ms).
      await tx.query(`set local max_parallel_workers_per_gather = 0`);
      const levels = q.where ? levelsOf(q.where) : null;
      if (levels && !levels.has("info") && [...levels].every((l) => SAFE_LEVEL.test(l))) return this.byLevel(tx, q, [...levels]);
      return this.walk(tx, q);
    });
  }

  /**
   * A query only lines of rarer levels can match (`level:error`, `level:(error OR warn) ...`):
   * the partial index of those levels (newest first per project and level) reads them directly.
   */
  private async byLevel(db: Sql, q: LineQuery, levels: string[]): Promise<StoredLine[]> {
    if (!levels.length) return [];
    const params: unknown[] = [];
    const where = this.lineFilter(q, params);
    params.push(q.limit);
    // One newest-first walk of the index per level (bitmap scans off: they read every line of the
    // level and sort them), merged: the plan no longer depends on statistics
    // (fresh ones are not there right after a burst: the planner then expected a handful of rows and
    // read and sorted every error line, 60-220 ms at 300k lines in the production profile). Literal
    // levels (checked: lower-case letters, digits, '_', '.', '-'), so the planner matches the partial
    // index's `level <> 'info'`.
    await db.query(`set local enable_bitmapscan = off`);
    const per = levels.map((l) => `(select ${cols} from log_lines where ${where.join(" and ")} and level = '${l}' order by at desc, id desc limit $${params.length})`);
    const rows = await db.query(
      per.length === 1 ? per[0]!.slice(1, -1) : `select * from (${per.join(" union all ")}) x order by at desc, id desc limit $${params.length}`,
      params,
    );
    return rows.map(fromRow);
  }

  private async walk(db: Sql, q: LineQuery): Promise<StoredLine[]> {
    const keys = keyCondition(q);
    let found: StoredLine[] = [];
    const legacy = await this.legacyCandidates(db, q);
    let li = 0;
    // Candidates not read yet, newest first, and where the next fetch of them starts.
    const buffer: Candidate[] = [];
    let after: { at: string; seg: string } | null = null;
    let exhausted = false;
    const state = { probe: true };
    /** At least `k + 1` candidates in the buffer (the one past a step says whether lines found are final), or all there are. */
    const fill = async (k: number) => {
      while (!exhausted && buffer.length < k + 1) {
        // Keys found rare (the probe gave up): fetch them in large pages, the GIN index's work is per query.
        const want = Math.max(k + 1 - buffer.length, state.probe ? 0 : LAST_STEP + 1);
        const got = await this.candidates(db, q, keys, after, want, state);
        if (got.length < want) exhausted = true;
        const last = got[got.length - 1];
        if (last) {
          buffer.push(...got);
          after = { at: iso(last.maxAt), seg: last.seg };
        }
      }
    };
    let step = FIRST_STEP;
    let read = 0;
    for (;;) {
      await fill(step);
      const page = buffer.splice(0, step);
      const next = buffer[0] ?? null;
      // Legacy segments ending later than the next keyed one join this step (all are merged by time).
      const floor = next ? next.maxAt : -Infinity;
      while (li < legacy.length && legacy[li]!.maxAt > floor) page.push(legacy[li++]!);
      if (page.length) {
        read += page.length;
        const lines = await this.matching(db, q, page, q.limit);
        if (lines.length) found = found.concat(lines).sort(newerFirst).slice(0, q.limit);
      }
      const upcoming = Math.max(next?.maxAt ?? -Infinity, li < legacy.length ? legacy[li]!.maxAt : -Infinity);
      if (upcoming === -Infinity) break;
      // Every segment left ends no later than `upcoming`: lines newer than that are final.
      if (found.length >= q.limit && found[q.limit - 1]!.at > upcoming) break;
      // The next step reads about as many segments as the lines still wanted need at the rate so far.
      const wanted = q.limit - Math.min(found.length, q.limit - 1);
      const perSegment = found.length / read;
      step = Math.max(FIRST_STEP, Math.min(LAST_STEP, perSegment > 0 ? Math.ceil((wanted / perSegment) * 1.25) : step * 4));
    }
    return found;
  }

  /** The lines of segments (another instance wrote them and said so), oldest first. */
  async linesOfSegments(projectId: string, segs: readonly string[]): Promise<StoredLine[]> {
    if (!segs.length) return [];
    const params: unknown[] = [projectId];
    const rows = await this.db.query(`select ${cols} from log_lines where project_id = $1 and ${segIn(params, segs)} order by at, id`, params);
    return rows.map(fromRow);
  }

  async buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>> {
    const out = new Map<string, BuildLogSummary>();
    if (!deploymentIds.length) return out;
    const params: unknown[] = [];
    const rows = await this.db.query(
      `select deployment_id, sum(lines)::int as lines, min(min_at) as first_at, max(max_at) as last_at from log_segments
        where stream = 'build' and deployment_id in (${placeholders(params, deploymentIds)}) and lines > 0 group by deployment_id`,
      params,
    );
    for (const r of rows) out.set(r.deployment_id as string, { lines: r.lines as number, first_at: isoTime(r.first_at), last_at: isoTime(r.last_at) });
    return out;
  }

  /** Deletes segments (and their lines) chosen by a condition, a few hundred at a time. */
  private async deleteSegments(where: string, params: unknown[]): Promise<number> {
    let removed = 0;
    for (;;) {
      const segs = (await this.db.query<{ seg: string }>(`select seg::text as seg from log_segments where ${where} and keys is not null limit ${DELETE_SEGMENTS}`, params)).map((r) => r.seg);
      if (!segs.length) return removed;
      const p: unknown[] = [];
      const [{ n }] = (await this.db.query(`with d as (delete from log_lines where ${segIn(p, segs)} returning 1) select count(*)::int as n from d`, p)) as [{ n: number }];
      removed += n;
      const q: unknown[] = [];
      await this.db.query(`delete from log_segments where ${segIn(q, segs)}`, q);
    }
  }

  async removeProject(projectId: string): Promise<void> {
    await this.deleteSegments(`project_id = $1`, [projectId]);
    if (await this.hasLegacy()) {
      for (;;) {
        const [{ n }] = (await this.db.query(
          `with d as (delete from log_lines where ctid in (select ctid from log_lines where seg is null and project_id = $1 limit ${DELETE_BATCH}) returning 1) select count(*)::int as n from d`,
          [projectId],
        )) as [{ n: number }];
        if (n < DELETE_BATCH) break;
      }
      await this.db.query(`delete from log_segments where project_id = $1`, [projectId]);
      this.legacy = null;
    }
    await this.tidy();
  }

  async removeOlderThan(cutoffMs: number): Promise<number> {
    const cutoff = iso(cutoffMs);
    // Segments wholly older than the cutoff go with their lines.
    let removed = await this.deleteSegments(`max_at < $1`, [cutoff]);
    // Segments across it lose their older lines, and their span and count follow.
    for (;;) {
      const segs = (
        await this.db.query<{ seg: string }>(`select seg::text as seg from log_segments where min_at < $1 and max_at >= $1 and keys is not null limit ${DELETE_SEGMENTS}`, [cutoff])
      ).map((r) => r.seg);
      if (!segs.length) break;
      const p: unknown[] = [cutoff];
      const [{ n }] = (await this.db.query(`with d as (delete from log_lines where at < $1 and ${segIn(p, segs)} returning 1) select count(*)::int as n from d`, p)) as [{ n: number }];
      removed += n;
      const q: unknown[] = [cutoff];
      await this.db.query(
        `update log_segments s set min_at = greatest(s.min_at, x.min_at), lines = x.lines
           from (select seg, min(at) as min_at, count(*)::int as lines from log_lines where ${segIn(q, segs)} group by seg) x
          where s.seg = x.seg`,
        q,
      );
      const r: unknown[] = [cutoff];
      // A segment left without lines, or whose lines all were older (min_at still before the cutoff), goes.
      await this.db.query(`delete from log_segments where ${segIn(r, segs)} and (min_at < $1 or not exists (select 1 from log_lines l where l.seg = log_segments.seg))`, r);
    }
    if (await this.hasLegacy()) {
      const projects = await this.db.query<{ id: string }>(`select distinct project_id as id from log_segments where keys is null and min_at < $1`, [cutoff]);
      for (const { id } of projects) {
        for (;;) {
          const [{ n }] = (await this.db.query(
            `with d as (delete from log_lines where ctid in (select ctid from log_lines where seg is null and project_id = $1 and at < $2 limit ${DELETE_BATCH}) returning 1) select count(*)::int as n from d`,
            [id, cutoff],
          )) as [{ n: number }];
          removed += n;
          if (n < DELETE_BATCH) break;
        }
      }
      await this.db.query(`delete from log_segments where keys is null and max_at < $1`, [cutoff]);
      await this.db.query(
        `update log_segments s set min_at = $1, lines = (select count(*)::int from log_lines l where l.seg is null and l.project_id = s.project_id
            and l.resource_type = s.resource_type and l.stream = s.stream and (s.deployment_id is null or l.deployment_id = s.deployment_id) and l.at >= $1 and l.at <= s.max_at)
          where keys is null and min_at < $1`,
        [cutoff],
      );
      this.legacy = null;
    }
    if (removed) await this.tidy();
    return removed;
  }

  /**
   * Lines moved in from elsewhere (logs kept by earlier versions), written in segments with the
   * position they reach in one transaction: a move cut short resumes where it stopped. Another
   * instance moving the same batch (its first or last line is here already) changes nothing.
   */
  async importBatch(source: string, lines: readonly StoredLine[], position: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      await tx.query(`select pg_advisory_xact_lock(hashtext('kiln_log_imports'))`);
      if (lines.length && (await this.hasLine(tx, lines[0]!)) && (await this.hasLine(tx, lines[lines.length - 1]!))) return;
      if (lines.length) {
        const ids = await this.segmentIds(tx, lines.length);
        const segments = segmentsOf(lines, ids);
        const segJson = segments.map((s) => {
          const f = s.lines[0]!;
          return { seg: s.seg, project_id: f.project_id, resource_type: f.resource_type, stream: f.stream, deployment_id: f.stream === "build" ? f.deployment_id : null, min_at: iso(f.at), max_at: iso(s.lines[s.lines.length - 1]!.at), lines: s.lines.length, keys: s.keys };
        });
        await tx.query(
          `insert into log_segments (${SEGMENT_COLUMNS.join(", ")})
             select seg::bigint, project_id, resource_type, stream, deployment_id, min_at, max_at, lines, array(select jsonb_array_elements_text(keys)::integer)
               from jsonb_to_recordset($1::text::jsonb) as x(seg text, project_id text, resource_type text, stream text, deployment_id text, min_at timestamptz, max_at timestamptz, lines integer, keys jsonb)`,
          [JSON.stringify(segJson)],
        );
        const lineJson = segments.flatMap((s) => s.lines.map((l) => ({ ...l, at: iso(l.at), seg: s.seg })));
        await tx.query(
          `insert into log_lines (${cols}, seg)
             select ${cols}, seg::bigint from jsonb_to_recordset($1::text::jsonb) as x(id text, project_id text, resource_type text, resource_id text,
               resource_name text, stream text, deployment_id text, invocation_id text, region text, level text, structured boolean, body text, at timestamptz, seg text)`,
          [JSON.stringify(lineJson)],
        );
      }
      await tx.query(`insert into log_imports (source, position) values ($1, $2) on conflict (source) do update set position = excluded.position`, [source, position]);
    });
  }

  async importPosition(source: string): Promise<string | null> {
    const [r] = await this.db.query<{ position: string }>(`select position from log_imports where source = $1`, [source]);
    return r?.position ?? null;
  }

  /** Whether a line (by project, time and id) is in the store already. */
  private async hasLine(tx: Sql, l: StoredLine): Promise<boolean> {
    const at = iso(l.at);
    const [r] = await tx.query<{ here: boolean }>(
      `select exists (select 1 from log_lines where id = $1 and at = $2
          and seg in (select seg from log_segments where project_id = $3 and min_at <= $2 and max_at >= $2 and keys is not null)) as here`,
      [l.id, at, l.project_id],
    );
    return !!r?.here;
  }

  /** PGlite has no autovacuum: deleted lines' space is reclaimed (and statistics refreshed) here. */
  private async tidy(): Promise<void> {
    if (this.db.kind === "pglite") {
      await this.db.query(`vacuum analyze log_lines`);
      await this.db.query(`vacuum analyze log_segments`);
    }
  }

  async close(): Promise<void> {
    await this.o.onClose?.();
    if (this.o.owned) await this.db.close();
  }
}
