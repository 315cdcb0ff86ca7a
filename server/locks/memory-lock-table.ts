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
 * Leases of one Kiln process (embedded profile). Fencing tokens come from one counter for all keys:
 * they still rise per key (gaps allowed), and a freed lock needs no entry, so memory is bounded by
 * live leases. Reclaimable entries are swept whenever the table has doubled since the last sweep.
 */
export class MemoryLockTable implements LockTable {
  private readonly projects = new Map<string, Map<string, Lease>>();
  private entries = 0;
  private sweepAt = MIN_SWEEP_AT;
  private lastToken: number;
  private quotaWindow = -Infinity;
  private readonly quota = new Map<string, number>();
  readonly counted: CountedLockOperations = countFirst(this);

  constructor(opts: { tokenFloor?: number } = {}) {
    const floor = opts.tokenFloor ?? 0;
    if (!Number.isSafeInteger(floor) || floor < 0) throw new RangeError("tokenFloor must be a non-negative integer");
    this.lastToken = floor;
  }

  /** The highest fencing token issued (or the floor): persist it and pass it back as `tokenFloor` after a restart. */
  get lastFencingToken(): number {
    return this.lastToken;
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
      current!.expiresAtMs = d.expiresAtMs;
      return { ok: true, expiresAtMs: d.expiresAtMs, fencingToken: current!.fencingToken };
    }
    const lease: Lease = { holder: lockToken, fencingToken: ++this.lastToken, deadlineMs: d.deadlineMs, expiresAtMs: d.expiresAtMs };
    this.put(projectId, key, lease, nowMs);
    return { ok: true, expiresAtMs: lease.expiresAtMs, fencingToken: lease.fencingToken };
  }

  async renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<RenewResult> {
    assertLeaseInput(key, ttlSeconds);
    const lease = this.get(projectId, key);
    const expiresAtMs = decideRenew(lease, lockToken, ttlSeconds, nowMs);
    if (expiresAtMs === null) return { ok: false, code: "lock_ownership_lost" };
    lease!.expiresAtMs = expiresAtMs;
    return { ok: true, expiresAtMs, fencingToken: lease!.fencingToken };
  }

  async release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<ReleaseResult> {
    assertLeaseInput(key);
    const lease = this.get(projectId, key);
    if (!lease || lease.holder !== lockToken) return { released: false };
    this.remove(projectId, key);
    return { released: !isReclaimable(lease, nowMs) };
  }

  async forceRelease(projectId: string, key: string, nowMs: number): Promise<ReleaseResult> {
    assertLeaseInput(key);
    const lease = this.get(projectId, key);
    if (!lease) return { released: false };
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

  async deleteProject(projectId: string): Promise<void> {
    const leases = this.projects.get(projectId);
    if (leases) this.entries -= leases.size;
    this.projects.delete(projectId);
    this.quota.delete(projectId);
  }

  async close(): Promise<void> {
    this.projects.clear();
    this.quota.clear();
    this.entries = 0;
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
