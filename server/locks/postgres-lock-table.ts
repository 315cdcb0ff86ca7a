import type { ControlStore, Row } from "../store/store";
import {
  assertLeaseInput,
  decideAcquire,
  LOCK_DEADLINE_MS,
  LOCK_GRACE_MS,
  LOCK_QUOTA_PER_MINUTE,
  LOCK_QUOTA_WINDOW_MS,
  LOCK_RENEW_MARGIN_MS,
  quotaRetryAfterSeconds,
  quotaWindowStart,
  readLease,
  type AcquireResult,
  type Counted,
  type CountedLockOperations,
  type Lease,
  type LockReadResult,
  type LockTable,
  type QuotaResult,
  type ReleaseResult,
  type RenewResult,
} from "./lock-table";

/** Lapsed leases a new lease row sweeps from its project: more than the one row it adds, so they cannot pile up. */
const LEASE_SWEEP_BATCH = 8;
/** Rounds of an acquire whose row changes between its statements before it answers lock_held. */
const ACQUIRE_ATTEMPTS = 5;
/** Old quota windows the first operation of a project in a minute deletes (any project's). */
const QUOTA_SWEEP_BATCH = 100;

/** What an uncounted operation reports for the quota. */
const UNCOUNTED: QuotaResult = { allowed: true, retryAfterSeconds: 0 };

const iso = (ms: number) => new Date(ms).toISOString();
const ms = (v: unknown) => new Date(v as string | Date).getTime();

// fencing_token is bigint, which PGlite and postgres.js return differently: always select it as text.
const LEASE_COLUMNS = `holder, fencing_token::text as fencing_token, deadline_at, expires_at`;

function toLease(row: Row): Lease {
  return { holder: row.holder, fencingToken: Number(row.fencing_token), deadlineMs: ms(row.deadline_at), expiresAtMs: ms(row.expires_at) };
}

// ---------------------------------------------------------------------------------------------
// The statements. Every text is fixed (made once, here), so the lock table's own connections keep
// each one prepared (PreparedPostgres). $1 is always the project.

/**
 * One operation's count as a CTE named `quota` (project $1, the window starting at $w): the new
 * count, or no row once the window is over the limit (the guard stops counting one past it).
 */
const quotaCte = (w: number) => `quota as (
  insert into lock_quota as q (project_id, window_start, count) values ($1, $${w}::timestamptz, 1)
  on conflict (project_id, window_start) do update set count = q.count + 1 where q.count <= ${LOCK_QUOTA_PER_MINUTE}
  returning count)`;
/** Holds when the `quota` CTE allowed this operation. */
const QUOTA_ALLOWS = `exists (select 1 from quota where count <= ${LOCK_QUOTA_PER_MINUTE})`;

/**
 * An operation's statement, plain and counted: `op(allowed)` is the statement with a condition that
 * holds when the quota allows it; counted, the quota's count is a CTE of the same statement (its
 * window start the parameter after the operation's `params`), and the operation's rows are those
 * marked `present`, beside `quota_count`.
 */
function statement(params: number, op: (allowed: string) => string): { plain: string; counted: string } {
  return {
    plain: op("true"),
    counted: `with ${quotaCte(params + 1)}, op as (${op(QUOTA_ALLOWS)})
      select (select count from quota) as quota_count, op.* from (select 1) as one left join op on true`,
  };
}

/** $1 project, $2 key, $3 lock token, $4 the new expiry, $5 renewals must come before expiry is after this. */
const RENEW = statement(
  5,
  (allowed) => `update lock_leases set expires_at = least($4::timestamptz, deadline_at)
    where project_id = $1 and lock_key = $2 and holder = $3 and expires_at > $5::timestamptz and ${allowed}
    returning expires_at, fencing_token::text as fencing_token, 1 as present`,
);

/** $1 project, $2 key, $3 lock token. */
const RELEASE = statement(
  3,
  (allowed) => `delete from lock_leases where project_id = $1 and lock_key = $2 and holder = $3 and ${allowed}
    returning expires_at, 1 as present`,
);

/** $1 project, $2 key. */
const FORCE_RELEASE = statement(2, (allowed) => `delete from lock_leases where project_id = $1 and lock_key = $2 and ${allowed} returning holder, expires_at, 1 as present`);

/** $1 project, $2 key. */
const READ = statement(
  2,
  (allowed) => `select ${LEASE_COLUMNS}, 1 as present from lock_leases where project_id = $1 and lock_key = $2 and holder is not null and ${allowed}`,
);

/** $1 project, $2 the window start. */
const COUNT = `with ${quotaCte(2)} select count from quota`;

/**
 * Acquire, first statement: a row to lock, a placeholder (holder null, which reads as free) when
 * the key has none. A new row also sweeps a few lapsed leases of the project (skip locked: it never
 * waits, so it cannot deadlock with another instance), more than the one it adds, so they cannot
 * pile up. $1 project, $2 key, $3 reclaimable when expired at or before this; counted: $4 the window.
 */
const ACQUIRE_ROW = {
  plain: acquireRow(false),
  counted: acquireRow(true),
};
function acquireRow(counted: boolean): string {
  return `with ${counted ? `${quotaCte(4)},` : ""}
    created as (
      insert into lock_leases (project_id, lock_key, holder, fencing_token)
      select $1, $2, null, 0 where ${counted ? QUOTA_ALLOWS : "true"}
      on conflict (project_id, lock_key) do nothing returning 1
    ), swept as (
      delete from lock_leases where ctid = any(array(
        select ctid from lock_leases where exists (select 1 from created)
          and project_id = $1 and lock_key <> $2 and expires_at <= $3::timestamptz
        limit ${LEASE_SWEEP_BATCH} for update skip locked))
    )
    select ${counted ? "(select count from quota)" : "null::integer"} as quota_count`;
}

/** A lease row anyone may take: a placeholder, or lapsed past its grace second ($5). */
const RECLAIMABLE = `(l.holder is null or l.expires_at <= $5::timestamptz)`;
/**
 * The project's next fencing token, drawn (its counter row locked until commit) only when the
 * statement's snapshot sees the lease reclaimable. A project's first token starts above the old
 * shared sequence, which is no longer drawn (tokens issued before per-project counters stay below).
 */
const DRAW_TOKEN = `insert into lock_project_tokens as t (project_id, last)
    select $1, (select case when is_called then last_value else 0 end from lock_fencing_tokens) + 1
    where exists (select 1 from lock_leases l where l.project_id = $1 and l.lock_key = $2 and ${RECLAIMABLE})
    on conflict (project_id) do update set last = t.last + 1
    returning last`;
/**
 * Acquire, second statement: decideAcquire as one update of the (locked) row. Take a reclaimable
 * lock with the project's next token (see DRAW_TOKEN), or extend the caller's own live lease (same
 * token and deadline); anything else updates nothing. Every expression reads the row as it was
 * before the update.
 *
 * Why a later holder of a key always draws higher: the counter row stays locked from a draw to its
 * statement's commit, so draws commit in their order; whoever takes a key after another saw that
 * one's take committed, so it drew after that draw. A take evaluates its new values (the draw)
 * before it locks the lease row, and nothing that holds a lease row waits for the counter, so the
 * two locks cannot deadlock. A draw whose take then fails (the row changed meanwhile) is a gap.
 * $1 project, $2 key, $3 lock token, $4 now, $5 reclaimable when expired at or before this,
 * $6 the deadline of a new lease, $7 the requested expiry.
 */
const ACQUIRE_UPDATE = `with token as (${DRAW_TOKEN})
  update lock_leases l set
    holder = $3,
    fencing_token = case when ${RECLAIMABLE} then (select last from token) else l.fencing_token end,
    acquired_at = case when ${RECLAIMABLE} then $4::timestamptz else l.acquired_at end,
    deadline_at = case when ${RECLAIMABLE} then $6::timestamptz else l.deadline_at end,
    expires_at = case when ${RECLAIMABLE} then $7::timestamptz else least($7::timestamptz, l.deadline_at) end
  where project_id = $1 and lock_key = $2
    and ((${RECLAIMABLE} and exists (select 1 from token)) or (l.holder = $3 and l.expires_at > $4::timestamptz))
  returning fencing_token::text as fencing_token, expires_at`;

/** $1 project, $2 key. */
const ACQUIRE_LOOK = `select ${LEASE_COLUMNS} from lock_leases where project_id = $1 and lock_key = $2`;

/** $1 windows starting before this go. */
const QUOTA_SWEEP = `delete from lock_quota where ctid = any(array(
  select ctid from lock_quota where window_start < $1::timestamptz limit ${QUOTA_SWEEP_BATCH} for update skip locked))`;

// ---------------------------------------------------------------------------------------------

/** What the table runs its statements on: the control store, or its own prepared connections (PreparedPostgres). */
export type LockStore = Pick<ControlStore, "query" | "transaction">;

/**
 * Leases in the control store (tables of LOCKS_MIGRATIONS), correct with several Kiln instances on
 * one PostgreSQL: each operation is one statement (acquire: two, see there) that locks the lease
 * row it changes; `counted` operations count the quota in that statement too. Fencing tokens come
 * from one counter per project (`lock_project_tokens`, see ACQUIRE_UPDATE), so the next holder of a
 * key always draws a higher one; freed rows are deleted. Times are the callers' `nowMs`, never now().
 */
export class PostgresLockTable implements LockTable {
  constructor(private readonly store: LockStore) {}

  /** Each operation with the quota's count in its own statement (acquire: in its first). */
  readonly counted: CountedLockOperations = {
    acquire: (p, key, token, ttl, now) => this.doAcquire(p, key, token, ttl, now, true),
    renew: (p, key, token, ttl, now) => this.doRenew(p, key, token, ttl, now, true),
    release: (p, key, token, now) => this.doRelease(p, key, token, now, true),
    forceRelease: (p, key, now) => this.doForceRelease(p, key, now, true),
    read: (p, key, now) => this.doRead(p, key, now, true),
  };

  async acquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<AcquireResult> {
    return (await this.doAcquire(projectId, key, lockToken, ttlSeconds, nowMs, false)).result!;
  }

  async renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<RenewResult> {
    return (await this.doRenew(projectId, key, lockToken, ttlSeconds, nowMs, false)).result!;
  }

  async release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<ReleaseResult> {
    return (await this.doRelease(projectId, key, lockToken, nowMs, false)).result!;
  }

  async forceRelease(projectId: string, key: string, nowMs: number): Promise<ReleaseResult> {
    return (await this.doForceRelease(projectId, key, nowMs, false)).result!;
  }

  async read(projectId: string, key: string, nowMs: number): Promise<LockReadResult> {
    return (await this.doRead(projectId, key, nowMs, false)).result!;
  }

  async countOperation(projectId: string, nowMs: number): Promise<QuotaResult> {
    const [row] = await this.store.query(COUNT, [projectId, iso(quotaWindowStart(nowMs))]);
    return this.quotaResult(nowMs, row?.count ?? null);
  }

  async deleteProject(projectId: string): Promise<void> {
    await this.store.transaction(async (tx) => {
      await tx.query(`delete from lock_leases where project_id = $1`, [projectId]);
      await tx.query(`delete from lock_quota where project_id = $1`, [projectId]);
    });
  }

  /** The store belongs to the caller, who closes it. */
  async close(): Promise<void> {}

  private async doAcquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number, count: boolean): Promise<Counted<AcquireResult>> {
    assertLeaseInput(key, ttlSeconds);
    const reclaimableBefore = iso(nowMs - LOCK_GRACE_MS);
    const deadlineMs = nowMs + LOCK_DEADLINE_MS;
    const update = [projectId, key, lockToken, iso(nowMs), reclaimableBefore, iso(deadlineMs), iso(Math.min(nowMs + ttlSeconds * 1000, deadlineMs))];
    let quota: QuotaResult = UNCOUNTED;
    for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS; attempt++) {
      // The quota is counted in the first statement of the first round only.
      if (count && attempt === 0) {
        const [first] = await this.store.query(ACQUIRE_ROW.counted, [projectId, key, reclaimableBefore, iso(quotaWindowStart(nowMs))]);
        quota = await this.quotaResult(nowMs, first?.quota_count ?? null);
        if (!quota.allowed) return { quota, result: null };
      } else {
        await this.store.query(ACQUIRE_ROW.plain, [projectId, key, reclaimableBefore]);
      }
      const [row] = await this.store.query(ACQUIRE_UPDATE, update);
      if (row) return { quota, result: { ok: true, expiresAtMs: ms(row.expires_at), fencingToken: Number(row.fencing_token) } };
      // Refused, or the row went (a release, a force release or a sweep) between the two statements.
      const [current] = await this.store.query(ACQUIRE_LOOK, [projectId, key]);
      if (current && current.holder !== null) {
        const d = decideAcquire(toLease(current), lockToken, ttlSeconds, nowMs);
        if (d.kind === "refuse") return { quota, result: { ok: false, code: d.code } };
      }
      // The lock changed between the statements: look again.
    }
    // It keeps changing hands faster than we can look: it is held.
    return { quota, result: { ok: false, code: "lock_held" } };
  }

  private async doRenew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number, count: boolean): Promise<Counted<RenewResult>> {
    assertLeaseInput(key, ttlSeconds);
    // The same rule as decideRenew, as one guarded update.
    const { quota, rows } = await this.run(RENEW, [projectId, key, lockToken, iso(nowMs + ttlSeconds * 1000), iso(nowMs + LOCK_RENEW_MARGIN_MS)], count, nowMs);
    if (!quota.allowed) return { quota, result: null };
    const [row] = rows;
    return { quota, result: row ? { ok: true, expiresAtMs: ms(row.expires_at), fencingToken: Number(row.fencing_token) } : { ok: false, code: "lock_ownership_lost" } };
  }

  private async doRelease(projectId: string, key: string, lockToken: string, nowMs: number, count: boolean): Promise<Counted<ReleaseResult>> {
    assertLeaseInput(key);
    const { quota, rows } = await this.run(RELEASE, [projectId, key, lockToken], count, nowMs);
    if (!quota.allowed) return { quota, result: null };
    return { quota, result: { released: rows.some((r) => ms(r.expires_at) + LOCK_GRACE_MS > nowMs) } };
  }

  private async doForceRelease(projectId: string, key: string, nowMs: number, count: boolean): Promise<Counted<ReleaseResult>> {
    assertLeaseInput(key);
    const { quota, rows } = await this.run(FORCE_RELEASE, [projectId, key], count, nowMs);
    if (!quota.allowed) return { quota, result: null };
    return { quota, result: { released: rows.some((r) => r.holder !== null && ms(r.expires_at) + LOCK_GRACE_MS > nowMs) } };
  }

  private async doRead(projectId: string, key: string, nowMs: number, count: boolean): Promise<Counted<LockReadResult>> {
    assertLeaseInput(key);
    const { quota, rows } = await this.run(READ, [projectId, key], count, nowMs);
    if (!quota.allowed) return { quota, result: null };
    const [row] = rows;
    return { quota, result: readLease(row ? toLease(row) : null, nowMs) };
  }

  /** One operation's statement, counted or not; counted, its rows are those the operation returned. */
  private async run(s: { plain: string; counted: string }, params: unknown[], count: boolean, nowMs: number): Promise<{ quota: QuotaResult; rows: Row[] }> {
    if (!count) return { quota: UNCOUNTED, rows: await this.store.query(s.plain, params) };
    const rows = await this.store.query(s.counted, [...params, iso(quotaWindowStart(nowMs))]);
    const quota = await this.quotaResult(nowMs, rows[0]?.quota_count ?? null);
    return { quota, rows: rows.filter((r) => r.present != null) };
  }

  private async quotaResult(nowMs: number, count: number | null): Promise<QuotaResult> {
    const start = quotaWindowStart(nowMs);
    // First operation of this project in the minute: delete windows older than the previous one
    // (kept, so instances whose clocks differ slightly do not wipe each other's counts).
    if (count === 1) await this.store.query(QUOTA_SWEEP, [iso(start - LOCK_QUOTA_WINDOW_MS)]);
    return { allowed: count !== null && count <= LOCK_QUOTA_PER_MINUTE, retryAfterSeconds: quotaRetryAfterSeconds(start, nowMs) };
  }
}
