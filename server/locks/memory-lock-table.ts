import { emptyLockState, type LeaseLog, type LockState } from "./lease-journal";
import {
  assertLeaseInput,
  countFirst,
  decideAcquire,
  decideRenew,
  isReclaimable,
  LOCK_QUOTA_PER_MINUTE,
  quotaRetryAfterSeconds,
  quotaWindowStart,
  readLease,
  type AcquireResult,
  type CountedLockOperations,
  type Lease,
  type LockReadResult,
  type LockTable,
  type QuotaResult,
  type ReleaseResult,
  type RenewResult,
} from "./lock-table";

const MIN_SWEEP_AT = 1024;

/**
 * Leases of one Kiln process (embedded profile), in memory for speed, with every change recorded in
 * a `LeaseLog` (the LeaseJournal file) when one is given: written before memory changes, and
 * acquires and renewals answered only once it is on disk, so leases and fencing tokens survive a
 * restart, kill -9 included.
 *
 * Fencing tokens come from one counter per project (the first is `tokenFloor` + 1): they rise for
 * every key of the project (gaps allowed), a freed lock needs no entry, and memory is bounded by
 * live leases plus one number per project. Reclaimable entries are swept whenever the table has
 * doubled since the last sweep.
 */
export class MemoryLockTable implements LockTable {
  private projects: Map<string, Map<string, Lease>>;
  private counters: Map<string, number>;
  private entries = 0;
  private sweepAt = MIN_SWEEP_AT;
  private readonly floor: number;
  private log: LeaseLog | null;
  private quotaWindow = -Infinity;
  private readonly quota = new Map<string, number>();
  readonly counted: CountedLockOperations = countFirst(this);

  /**
   * `state`: what to start from (a replayed journal's), used and changed in place; `log`: where
   * changes are recorded; `tokenFloor`: no project's tokens start at or below it.
   */
  constructor(opts: { tokenFloor?: number; state?: LockState; log?: LeaseLog } = {}) {
    const floor = opts.tokenFloor ?? 0;
    if (!Number.isSafeInteger(floor) || floor < 0) throw new RangeError("tokenFloor must be a non-negative integer");
    this.floor = floor;
    const state = opts.state ?? emptyLockState();
    this.projects = state.projects;
    this.counters = state.counters;
    this.log = opts.log ?? null;
    for (const leases of this.projects.values()) this.entries += leases.size;
    this.sweepAt = Math.max(MIN_SWEEP_AT, this.entries * 2);
  }

  /** The highest fencing token the project has been issued (or the floor). */
  lastFencingToken(projectId: string): number {
    return Math.max(this.counters.get(projectId) ?? 0, this.floor);
  }

  /** Entries kept (live leases plus not yet swept lapsed ones). */
  get leaseCount(): number {
    return this.entries;
  }

  async acquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<AcquireResult> {
    assertLeaseInput(key, ttlSeconds);
    const current = this.get(projectId, key);
    const d = decideAcquire(current, lockToken, ttlSeconds, nowMs);
    if (d.kind === "refuse") return { ok: false, code: d.code };
    if (d.kind === "extend") {
      this.log?.put(projectId, key, { ...current!, expiresAtMs: d.expiresAtMs });
      current!.expiresAtMs = d.expiresAtMs;
      await this.log?.synced();
      return { ok: true, expiresAtMs: d.expiresAtMs, fencingToken: current!.fencingToken };
    }
    const lease: Lease = { holder: lockToken, fencingToken: this.lastFencingToken(projectId) + 1, deadlineMs: d.deadlineMs, expiresAtMs: d.expiresAtMs };
    // Recorded first: a failed write changes nothing.
    this.log?.put(projectId, key, lease);
    this.counters.set(projectId, lease.fencingToken);
    this.put(projectId, key, lease, nowMs);
    await this.log?.synced();
    return { ok: true, expiresAtMs: lease.expiresAtMs, fencingToken: lease.fencingToken };
  }

  async renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<RenewResult> {
    assertLeaseInput(key, ttlSeconds);
    const lease = this.get(projectId, key);
    const expiresAtMs = decideRenew(lease, lockToken, ttlSeconds, nowMs);
    if (expiresAtMs === null) return { ok: false, code: "lock_ownership_lost" };
    this.log?.put(projectId, key, { ...lease!, expiresAtMs });
    lease!.expiresAtMs = expiresAtMs;
    await this.log?.synced();
    return { ok: true, expiresAtMs, fencingToken: lease!.fencingToken };
  }

  /** Releases are recorded but not waited for: losing one to a power cut only keeps the lock held until its expiry. */
  async release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<ReleaseResult> {
    assertLeaseInput(key);
    const lease = this.get(projectId, key);
    if (!lease || lease.holder !== lockToken) return { released: false };
    this.log?.free(projectId, key);
    this.remove(projectId, key);
    return { released: !isReclaimable(lease, nowMs) };
  }

  async forceRelease(projectId: string, key: string, nowMs: number): Promise<ReleaseResult> {
    assertLeaseInput(key);
    const lease = this.get(projectId, key);
    if (!lease) return { released: false };
    this.log?.free(projectId, key);
    this.remove(projectId, key);
    return { released: !isReclaimable(lease, nowMs) };
  }

  async read(projectId: string, key: string, nowMs: number): Promise<LockReadResult> {
    assertLeaseInput(key);
    return readLease(this.get(projectId, key), nowMs);
  }

  async countOperation(projectId: string, nowMs: number): Promise<QuotaResult> {
    const start = quotaWindowStart(nowMs);
    // One window at a time: a new minute drops every count of the last (a late caller counts in the newest).
    if (start > this.quotaWindow) {
      this.quotaWindow = start;
      this.quota.clear();
    }
    const count = (this.quota.get(projectId) ?? 0) + 1;
    if (count <= LOCK_QUOTA_PER_MINUTE + 1) this.quota.set(projectId, count);
    return { allowed: count <= LOCK_QUOTA_PER_MINUTE, retryAfterSeconds: quotaRetryAfterSeconds(this.quotaWindow, nowMs) };
  }

  /** The project's leases go; its counter stays (tokens never go down). */
  async deleteProject(projectId: string): Promise<void> {
    this.log?.dropProject(projectId);
    const leases = this.projects.get(projectId);
    if (leases) this.entries -= leases.size;
    this.projects.delete(projectId);
    this.quota.delete(projectId);
  }

  /**
   * After `close`, a snapshot restore in place put back the journal: the state replayed from it and
   * the reopened log take the place of the old ones.
   */
  reopen(state: LockState, log: LeaseLog): void {
    this.projects = state.projects;
    this.counters = state.counters;
    this.log = log;
    this.quota.clear();
    this.quotaWindow = -Infinity;
    this.entries = 0;
    for (const leases of this.projects.values()) this.entries += leases.size;
    this.sweepAt = Math.max(MIN_SWEEP_AT, this.entries * 2);
  }

  /** Kiln is stopping (no request in flight): the log is closed; memory is let go. */
  async close(): Promise<void> {
    try {
      await this.log?.close();
    } finally {
      this.projects.clear();
      this.quota.clear();
      this.entries = 0;
    }
  }

  private get(projectId: string, key: string): Lease | undefined {
    return this.projects.get(projectId)?.get(key);
  }

  private put(projectId: string, key: string, lease: Lease, nowMs: number): void {
    let leases = this.projects.get(projectId);
    if (!leases) this.projects.set(projectId, (leases = new Map()));
    if (!leases.has(key)) this.entries++;
    leases.set(key, lease);
    if (this.entries >= this.sweepAt) this.sweep(nowMs);
  }

  private remove(projectId: string, key: string): void {
    const leases = this.projects.get(projectId);
    if (!leases?.delete(key)) return;
    this.entries--;
    if (!leases.size) this.projects.delete(projectId);
  }

  /** Drops reclaimable leases; amortized O(1) per acquire since the next sweep waits for the table to double. */
  private sweep(nowMs: number): void {
    for (const [projectId, leases] of this.projects) {
      for (const [key, lease] of leases) if (isReclaimable(lease, nowMs)) leases.delete(key), this.entries--;
      if (!leases.size) this.projects.delete(projectId);
    }
    this.sweepAt = Math.max(MIN_SWEEP_AT, this.entries * 2);
  }
}
