/**
 * Project locks: the lease rules of the spec ("Lock lease" states, "Project locks" rules, limits),
 * independent of HTTP and of where leases are kept. Two tables implement `LockTable`: in memory
 * (embedded profile) and in PostgreSQL (shared by several Kiln instances).
 *
 * Every method takes `nowMs`, the platform clock's time: lease logic never reads the wall clock, so
 * a controllable test clock moves lock expiry too.
 */

export const LOCK_KEY_MAX_LENGTH = 128;
export const LOCK_TTL_MIN_SECONDS = 5;
export const LOCK_TTL_MAX_SECONDS = 7_776_000;
/** A lapsed lease stays unavailable (to everyone, its owner included) this long after expiry. */
export const LOCK_GRACE_MS = 1_000;
/** Renewals must come more than this long before expiry. */
export const LOCK_RENEW_MARGIN_MS = 1_000;
/** No lease outlives its acquisition by more than this, whatever renewals and retries ask. */
export const LOCK_DEADLINE_MS = 90 * 24 * 3600 * 1000;
export const LOCK_QUOTA_PER_MINUTE = 600;
export const LOCK_QUOTA_WINDOW_MS = 60_000;

export type LockConflictCode = "lock_held" | "lock_ownership_lost";

export type AcquireResult =
  | { ok: true; expiresAtMs: number; fencingToken: number }
  | { ok: false; code: LockConflictCode };

export type RenewResult =
  | { ok: true; expiresAtMs: number; fencingToken: number }
  | { ok: false; code: "lock_ownership_lost" };

/** `held: false` means an acquire would succeed now (so a lapsed lease in its grace second is still held). */
export type LockReadResult = { held: false } | { held: true; expiresAtMs: number; fencingToken: number };

/** `released` tells whether a lease (live or in its grace second) was ended; the API answers 204 either way. */
export interface ReleaseResult {
  released: boolean;
}

export interface QuotaResult {
  allowed: boolean;
  /** Seconds until the current fixed minute ends (at least 1); meaningful when refused. */
  retryAfterSeconds: number;
}

/**
 * An operation counted against the project's quota in the same step. `result` is null when the
 * quota refused it: then nothing was done.
 */
export interface Counted<T> {
  quota: QuotaResult;
  result: T | null;
}

/** The lease operations, each counted against the project's quota first (LockTable.counted). */
export interface CountedLockOperations {
  acquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<Counted<AcquireResult>>;
  renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<Counted<RenewResult>>;
  release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<Counted<ReleaseResult>>;
  forceRelease(projectId: string, key: string, nowMs: number): Promise<Counted<ReleaseResult>>;
  read(projectId: string, key: string, nowMs: number): Promise<Counted<LockReadResult>>;
}

export interface LockTable {
  /** Takes a free (or reclaimable) lock, or resets the expiry of the caller's own live lease. */
  acquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<AcquireResult>;
  /** Extends the caller's live lease to now + TTL, if asked more than one second before expiry. */
  renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<RenewResult>;
  /** Frees the lock if `lockToken` holds it; anything else (absent, another holder) is a successful no-op. */
  release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<ReleaseResult>;
  /** Frees the lock whoever holds it; a successful no-op when absent. */
  forceRelease(projectId: string, key: string, nowMs: number): Promise<ReleaseResult>;
  read(projectId: string, key: string, nowMs: number): Promise<LockReadResult>;
  /** Counts one lock operation of the project in the current fixed UTC minute (refused ones count too). */
  countOperation(projectId: string, nowMs: number): Promise<QuotaResult>;
  /**
   * The same operations, each counted first (as countOperation) and done only if the quota allows
   * it, in one step where the table can: the PostgreSQL table counts in the operation's statement.
   */
  readonly counted: CountedLockOperations;
  /** Drops every lease and counter of a project (its deletion cleanup); fencing tokens still never go down. */
  deleteProject(projectId: string): Promise<void>;
  close(): Promise<void>;
}

/** `counted` for a table whose counting costs nothing extra (in memory): countOperation, then the operation. */
export function countFirst(table: Omit<LockTable, "counted">): CountedLockOperations {
  const counted = async <T>(projectId: string, nowMs: number, op: () => Promise<T>): Promise<Counted<T>> => {
    const quota = await table.countOperation(projectId, nowMs);
    return { quota, result: quota.allowed ? await op() : null };
  };
  return {
    acquire: (p, key, token, ttl, now) => counted(p, now, () => table.acquire(p, key, token, ttl, now)),
    renew: (p, key, token, ttl, now) => counted(p, now, () => table.renew(p, key, token, ttl, now)),
    release: (p, key, token, now) => counted(p, now, () => table.release(p, key, token, now)),
    forceRelease: (p, key, now) => counted(p, now, () => table.forceRelease(p, key, now)),
    read: (p, key, now) => counted(p, now, () => table.read(p, key, now)),
  };
}

const LOCK_KEY = /^[A-Za-z0-9._:-]+$/;

/** Null when `key` is a valid lock key, else a message naming the problem. */
export function validateLockKey(key: string): string | null {
  if (typeof key !== "string" || key.length === 0) return "lock key must not be empty";
  if (key.length > LOCK_KEY_MAX_LENGTH) return `lock key must be at most ${LOCK_KEY_MAX_LENGTH} characters`;
  if (!LOCK_KEY.test(key)) return "lock key may contain only letters, digits, '.', '_', ':' and '-'";
  return null;
}

/** Null when `ttl` is a valid lease TTL in seconds, else a message naming the problem. */
export function validateTtlSeconds(ttl: number): string | null {
  if (typeof ttl !== "number" || !Number.isInteger(ttl)) return "ttl_seconds must be an integer";
  if (ttl < LOCK_TTL_MIN_SECONDS || ttl > LOCK_TTL_MAX_SECONDS) {
    return `ttl_seconds must be between ${LOCK_TTL_MIN_SECONDS} and ${LOCK_TTL_MAX_SECONDS}`;
  }
  return null;
}

/** Callers validate first (400s); a table refuses bad input outright rather than store it. */
export function assertLeaseInput(key: string, ttlSeconds?: number): void {
  const problem = validateLockKey(key) ?? (ttlSeconds === undefined ? null : validateTtlSeconds(ttlSeconds));
  if (problem) throw new RangeError(problem);
}

/** A lease as both tables keep it. */
export interface Lease {
  holder: string;
  fencingToken: number;
  /** acquisition instant + LOCK_DEADLINE_MS; same-token re-acquires and renewals keep it. */
  deadlineMs: number;
  expiresAtMs: number;
}

/** Whether anyone may take the lock now: no lease, or its expiry plus the grace second has passed. */
export function isReclaimable(lease: Lease | null | undefined, nowMs: number): boolean {
  return !lease || nowMs >= lease.expiresAtMs + LOCK_GRACE_MS;
}

export type AcquireDecision =
  /** A change of hands: the caller takes a new fencing token. */
  | { kind: "take"; expiresAtMs: number; deadlineMs: number }
  /** The caller's own live lease: new absolute expiry, same token and deadline. */
  | { kind: "extend"; expiresAtMs: number }
  | { kind: "refuse"; code: LockConflictCode };

export function decideAcquire(lease: Lease | null | undefined, lockToken: string, ttlSeconds: number, nowMs: number): AcquireDecision {
  if (isReclaimable(lease, nowMs)) {
    const deadlineMs = nowMs + LOCK_DEADLINE_MS;
    return { kind: "take", expiresAtMs: Math.min(nowMs + ttlSeconds * 1000, deadlineMs), deadlineMs };
  }
  const own = lease!.holder === lockToken;
  if (nowMs >= lease!.expiresAtMs) return { kind: "refuse", code: own ? "lock_ownership_lost" : "lock_held" };
  if (!own) return { kind: "refuse", code: "lock_held" };
  return { kind: "extend", expiresAtMs: Math.min(nowMs + ttlSeconds * 1000, lease!.deadlineMs) };
}

/** The new expiry of a renewal, or null when it is refused (lock_ownership_lost). */
export function decideRenew(lease: Lease | null | undefined, lockToken: string, ttlSeconds: number, nowMs: number): number | null {
  if (!lease || lease.holder !== lockToken) return null;
  if (lease.expiresAtMs - nowMs <= LOCK_RENEW_MARGIN_MS) return null;
  return Math.min(nowMs + ttlSeconds * 1000, lease.deadlineMs);
}

export function readLease(lease: Lease | null | undefined, nowMs: number): LockReadResult {
  if (isReclaimable(lease, nowMs)) return { held: false };
  return { held: true, expiresAtMs: lease!.expiresAtMs, fencingToken: lease!.fencingToken };
}

export function quotaWindowStart(nowMs: number): number {
  return nowMs - (((nowMs % LOCK_QUOTA_WINDOW_MS) + LOCK_QUOTA_WINDOW_MS) % LOCK_QUOTA_WINDOW_MS);
}

export function quotaRetryAfterSeconds(windowStartMs: number, nowMs: number): number {
  return Math.max(1, Math.ceil((windowStartMs + LOCK_QUOTA_WINDOW_MS - nowMs) / 1000));
}
