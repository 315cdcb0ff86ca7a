import { createHash } from "node:crypto";
import { FlushLoop } from "../store/flush-loop";
import type { ControlStore } from "../store/store";

interface QueryAgg {
  databaseId: string;
  queryId: string;
  query: string;
  role: string;
  calls: number;
  totalMs: number;
  minMs: number;
  maxMs: number;
  rows: number;
}

interface UsageAgg {
  written: number;
  transfer: number;
  computeMs: number;
  activeMs: number;
}

/** Statements that differ only in spacing or case of keywords count as one query. */
export function normalizeQuery(text: string): string {
  return text.replace(/\s+/g, " ").trim();
}

export function queryIdOf(normalized: string): string {
  return createHash("sha256").update(normalized).digest("hex").slice(0, 16);
}

/**
 * What databases do, from every path (HTTP query API and wire clients): per-statement calls and
 * times (top queries) and hourly usage (stats). Counted in memory, written to the control store
 * every second; reads flush first.
 */
/** Statement texts whose normalized form and id are remembered (drivers repeat the same few). */
const KNOWN_TEXTS = 5000;
const HOUR_MS = 3_600_000;

/** One statement's calls in one wire session since the last flush: the session adds in place. */
export class StatementTally {
  calls = 0;
  totalMs = 0;
  minMs = Infinity;
  maxMs = 0;
  rows = 0;
  constructor(readonly text: string) {}

  add(ms: number, rows: number): void {
    this.calls++;
    this.totalMs += ms;
    if (ms < this.minMs) this.minMs = ms;
    if (ms > this.maxMs) this.maxMs = ms;
    this.rows += rows;
  }
}

/**
 * A wire session's counters (top queries and usage), added to in place by the session, so a proxied
 * statement costs a few additions instead of map lookups and a Date; the flush drains every open
 * tally first, so reads (which flush) see everything answered so far.
 */
export class SessionTally {
  written = 0;
  transfer = 0;
  computeMs = 0;
  activeMs = 0;
  /** Statement tallies by text (a prepared statement keeps its own; see `statement`). */
  private readonly statements = new Map<string, StatementTally>();
  /** Tallies with calls since the last drain. */
  private readonly used = new Set<StatementTally>();
  closed = false;

  constructor(
    readonly databaseId: string,
    readonly role: string,
  ) {}

  /** The tally of a statement text (the same object for the same text: callers may keep it). */
  statement(text: string): StatementTally {
    let t = this.statements.get(text);
    if (!t) {
      // A session preparing endless distinct texts does not keep them all.
      if (this.statements.size >= KNOWN_TEXTS) this.statements.clear();
      t = new StatementTally(text);
      this.statements.set(text, t);
    }
    return t;
  }

  /** Adds a statement's run (its time and rows). */
  ran(t: StatementTally, ms: number, rows: number): void {
    if (t.calls === 0) this.used.add(t);
    t.add(ms, rows);
    this.computeMs += ms;
  }

  /** Moves the counters out (the tally keeps counting from zero). */
  drain(into: DatabaseActivity): void {
    for (const t of this.used) {
      into.recordQueryTotals(this.databaseId, t.text, this.role, t);
      t.calls = t.totalMs = t.maxMs = t.rows = 0;
      t.minMs = Infinity;
    }
    this.used.clear();
    if (this.written || this.transfer || this.computeMs || this.activeMs) {
      into.recordUsage(this.databaseId, { written: this.written, transfer: this.transfer, computeMs: this.computeMs, activeMs: this.activeMs });
      this.written = this.transfer = this.computeMs = this.activeMs = 0;
    }
  }
}

export class DatabaseActivity {
  private queries = new Map<string, QueryAgg>();
  /** Open wire sessions' tallies, drained at every flush. */
  private readonly tallies = new Set<SessionTally>();
  private usage = new Map<string, UsageAgg>();
  /** Per text: its normalized form and id, and the last aggregation key made for it (the wire proxy repeats one per statement). */
  private known = new Map<string, { query: string; queryId: string; key?: { databaseId: string; role: string; key: string } }>();
  private hour = { number: -1, iso: "" };
  /** The last usage key (database and hour): one string, not one per call. */
  private usageKey = { databaseId: "", hour: -1, key: "" };
  private readonly loop: FlushLoop;

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    log: { error: (m: string, e?: unknown) => void },
  ) {
    this.loop = new FlushLoop(() => this.write(), (e) => log.error("database activity flush failed", e));
  }

  start(): void {
    this.loop.start(1000);
  }

  /** A wire session's tally; `closeSession` drains it for the last time. */
  openSession(databaseId: string, role: string): SessionTally {
    const t = new SessionTally(databaseId, role);
    this.tallies.add(t);
    return t;
  }

  closeSession(t: SessionTally): void {
    if (t.closed) return;
    t.closed = true;
    this.tallies.delete(t);
    t.drain(this);
  }

  recordQuery(databaseId: string, text: string, role: string, ms: number, rows: number): void {
    this.recordQueryTotals(databaseId, text, role, { calls: 1, totalMs: ms, minMs: ms, maxMs: ms, rows });
  }

  /** Several calls of one statement at once (a session's tally). */
  recordQueryTotals(databaseId: string, text: string, role: string, c: { calls: number; totalMs: number; minMs: number; maxMs: number; rows: number }): void {
    let known = this.known.get(text);
    if (!known) {
      const query = normalizeQuery(text);
      known = { query, queryId: query ? queryIdOf(query) : "" };
      if (this.known.size >= KNOWN_TEXTS) this.known.clear();
      this.known.set(text, known);
    }
    const { query, queryId } = known;
    if (!query) return;
    if (known.key?.databaseId !== databaseId || known.key.role !== role) known.key = { databaseId, role, key: `${databaseId}|${queryId}|${role}` };
    const key = known.key.key;
    const q = this.queries.get(key);
    if (!q) this.queries.set(key, { databaseId, queryId, query, role, calls: c.calls, totalMs: c.totalMs, minMs: c.minMs, maxMs: c.maxMs, rows: c.rows });
    else {
      q.calls += c.calls;
      q.totalMs += c.totalMs;
      q.minMs = Math.min(q.minMs, c.minMs);
      q.maxMs = Math.max(q.maxMs, c.maxMs);
      q.rows += c.rows;
    }
  }

  recordUsage(databaseId: string, u: Partial<UsageAgg>): void {
    const hour = Math.floor(this.now().getTime() / HOUR_MS);
    if (hour !== this.hour.number) this.hour = { number: hour, iso: new Date(hour * HOUR_MS).toISOString() };
    if (this.usageKey.databaseId !== databaseId || this.usageKey.hour !== hour) this.usageKey = { databaseId, hour, key: `${databaseId}|${this.hour.iso}` };
    const key = this.usageKey.key;
    const cur = this.usage.get(key) ?? { written: 0, transfer: 0, computeMs: 0, activeMs: 0 };
    cur.written += u.written ?? 0;
    cur.transfer += u.transfer ?? 0;
    cur.computeMs += u.computeMs ?? 0;
    cur.activeMs += u.activeMs ?? 0;
    this.usage.set(key, cur);
  }

  flush(): Promise<void> {
    return this.loop.flush();
  }

  private async write(): Promise<void> {
    for (const t of this.tallies) t.drain(this);
    if (this.queries.size === 0 && this.usage.size === 0) return;
    const queries = this.queries;
    const usage = this.usage;
    this.queries = new Map();
    this.usage = new Map();
    await this.store.transaction(async (tx) => {
      for (const q of queries.values())
        await tx.query(
          `insert into database_query_stats (database_id, query_id, query, role, calls, total_ms, min_ms, max_ms, rows_processed)
           values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           on conflict (database_id, query_id, role) do update set
             calls = database_query_stats.calls + excluded.calls,
             total_ms = database_query_stats.total_ms + excluded.total_ms,
             min_ms = least(database_query_stats.min_ms, excluded.min_ms),
             max_ms = greatest(database_query_stats.max_ms, excluded.max_ms),
             rows_processed = database_query_stats.rows_processed + excluded.rows_processed`,
          [q.databaseId, q.queryId, q.query.slice(0, 4000), q.role, q.calls, q.totalMs, q.minMs, q.maxMs, q.rows],
        );
      for (const [key, u] of usage) {
        const [databaseId, hour] = key.split("|");
        await tx.query(
          `insert into database_usage (database_id, hour, data_written_bytes, data_transfer_bytes, compute_ms, active_ms)
           values ($1, $2::timestamptz, $3, $4, $5, $6)
           on conflict (database_id, hour) do update set
             data_written_bytes = database_usage.data_written_bytes + excluded.data_written_bytes,
             data_transfer_bytes = database_usage.data_transfer_bytes + excluded.data_transfer_bytes,
             compute_ms = database_usage.compute_ms + excluded.compute_ms,
             active_ms = database_usage.active_ms + excluded.active_ms`,
          [databaseId, hour, Math.round(u.written), Math.round(u.transfer), u.computeMs, u.activeMs],
        );
      }
    });
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }
}
