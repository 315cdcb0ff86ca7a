import type { Clock } from "../clock";
import { conflictCode, HttpError, tooManyRequests } from "../http/errors";
import type { Logger } from "../log";
import type { Counted, LockTable, QuotaResult } from "./lock-table";

const QUOTA_EXCEEDED = "lock operation quota exceeded: 600 per project per minute; retry after the minute ends";

function allowed(quota: QuotaResult): void {
  if (!quota.allowed) throw tooManyRequests(QUOTA_EXCEEDED, quota.retryAfterSeconds);
}

/** A counted operation's result, or the 429 that refused it (then nothing was done). */
function done<T>(c: Counted<T>): T {
  allowed(c.quota);
  return c.result!;
}

/** What acquire and renew answer. */
export interface LeaseView {
  expires_at: string;
  fencing_token: number;
}

export type LockStateView = { held: false } | { held: true; expires_at: string; fencing_token: number };

export const BACKEND_UNAVAILABLE = "lock backend unavailable";

export interface LocksServiceDeps {
  clock: Clock;
  log: Logger;
  /** Fault injection (`KILN_FAULTS=lock-backend:N`): true makes the next table call fail. */
  fault?: () => boolean;
  /** At stop, instead of the table's own close (the production profile closes its connections too). */
  close?: () => Promise<void>;
}

/**
 * Project locks over a LockTable: the spec's answers (409 codes, 429 with Retry-After, 503 when the
 * table fails) around the table's lease rules. Every operation counts against the project's quota
 * (one step with the operation: LockTable.counted), and so does every request refused as invalid
 * (`checked`). Every time is the platform clock's, read once per request by the caller (`now`) and
 * used for the quota and the operation alike.
 */
export class LocksService {
  constructor(
    readonly table: LockTable,
    private readonly d: LocksServiceDeps,
  ) {}

  now(): number {
    return this.d.clock.nowMs();
  }

  /**
   * Checks a request (`check` throws its 400s) so that a refused request still counts: the 400 is
   * counted as an operation (429 instead once the quota is spent). A request that passes is counted
   * by its operation, in the same step (LockTable.counted).
   */
  async checked<T>(projectId: string, nowMs: number, check: () => T): Promise<T> {
    try {
      return check();
    } catch (err) {
      if (err instanceof HttpError && err.status === 400) await this.countOperation(projectId, nowMs);
      throw err;
    }
  }

  /** Counts one lock operation of the project; 429 with Retry-After once the minute's 600 are spent. */
  async countOperation(projectId: string, nowMs: number): Promise<void> {
    allowed(await this.backend(() => this.table.countOperation(projectId, nowMs)));
  }

  async acquire(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<LeaseView> {
    const r = done(await this.backend(() => this.table.counted.acquire(projectId, key, lockToken, ttlSeconds, nowMs)));
    if (!r.ok) throw conflictCode(r.code);
    return { expires_at: new Date(r.expiresAtMs).toISOString(), fencing_token: r.fencingToken };
  }

  async renew(projectId: string, key: string, lockToken: string, ttlSeconds: number, nowMs: number): Promise<LeaseView> {
    const r = done(await this.backend(() => this.table.counted.renew(projectId, key, lockToken, ttlSeconds, nowMs)));
    if (!r.ok) throw conflictCode(r.code);
    return { expires_at: new Date(r.expiresAtMs).toISOString(), fencing_token: r.fencingToken };
  }

  /** The owner's release; anything else (absent, another holder's lease) succeeds without effect. */
  async release(projectId: string, key: string, lockToken: string, nowMs: number): Promise<void> {
    done(await this.backend(() => this.table.counted.release(projectId, key, lockToken, nowMs)));
  }

  async forceRelease(projectId: string, key: string, nowMs: number): Promise<void> {
    done(await this.backend(() => this.table.counted.forceRelease(projectId, key, nowMs)));
  }

  async read(projectId: string, key: string, nowMs: number): Promise<LockStateView> {
    const r = done(await this.backend(() => this.table.counted.read(projectId, key, nowMs)));
    return r.held ? { held: true, expires_at: new Date(r.expiresAtMs).toISOString(), fencing_token: r.fencingToken } : { held: false };
  }

  /** A project's deletion: its leases and counters go. */
  removeAll(projectId: string): Promise<void> {
    return this.table.deleteProject(projectId);
  }

  /** Kiln is stopping; no request is in flight. */
  close(): Promise<void> {
    return this.d.close ? this.d.close() : this.table.close();
  }

  /** A table that fails (the PostgreSQL store unreachable, say) is the spec's 503; the cause goes to the log. */
  private async backend<T>(op: () => Promise<T>): Promise<T> {
    try {
      if (this.d.fault?.()) throw new Error("injected fault: lock-backend");
      return await op();
    } catch (err) {
      if (err instanceof HttpError) throw err;
      this.d.log.error("lock table operation failed", err);
      throw new HttpError(503, { error: BACKEND_UNAVAILABLE });
    }
  }
}
