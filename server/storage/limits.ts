import { plan as planOf } from "../accounts/plans";
import type { Clock } from "../clock";
import type { PlanName } from "../config";
import { HttpError } from "../http/errors";
import type { ControlStore, Sql } from "../store/store";
import type { BucketRow } from "./buckets";

/** Decimal units, as storage is billed: 50000000 -> "50 MB". */
export function formatSize(bytes: number): string {
  const units: Array<[number, string]> = [
    [1e12, "TB"],
    [1e9, "GB"],
    [1e6, "MB"],
    [1e3, "KB"],
  ];
  for (const [n, u] of units) if (bytes >= n) return `${Number((bytes / n).toFixed(2))} ${u}`;
  return `${bytes} B`;
}

/** The most one upload may hold, and the 413 (in the spec's three forms) for going past it. */
export interface UploadLimit {
  bytes: number;
  error: () => HttpError;
}

export interface StorageSettings {
  /** Overrides of the plan figures for every plan (KILN_STORAGE_*), when set. */
  fileLimitBytes?: number;
  quotaBytes?: number;
  bandwidthBytes?: number;
}

/** A UTC calendar month of the platform clock, `2026-11`. */
export function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

/**
 * The size limits an upload meets (bucket `file_size_limit`, the plan's file limit, the project's
 * storage quota) and the month's download allowance.
 */
/** Adds `delta` bytes to a project's running total, in the transaction that changed its objects. */
export function addUsage(tx: Sql, projectId: string, delta: number): Promise<unknown> {
  return tx.query(
    `insert into storage_project_usage (project_id, bytes) values ($1, $2) on conflict (project_id) do update set bytes = storage_project_usage.bytes + excluded.bytes`,
    [projectId, delta],
  );
}

export class StorageLimits {
  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly settings: StorageSettings,
  ) {}

  private async planOfProject(projectId: string): Promise<PlanName> {
    const [r] = await this.store.query<{ plan: PlanName }>(`select a.plan from projects p join accounts a on a.id = p.account_id where p.id = $1`, [projectId]);
    return r?.plan ?? "hobby";
  }

  async usedBytes(projectId: string): Promise<number> {
    const [r] = await this.store.query<{ used: string }>(`select bytes::text as used from storage_project_usage where project_id = $1`, [projectId]);
    return Number(r?.used ?? 0);
  }

  /** The smallest of the three limits for a new object of `bucket` (replacing `replacing` bytes). */
  async forUpload(bucket: BucketRow, replacing = 0): Promise<UploadLimit> {
    const p = planOf(await this.planOfProject(bucket.project_id));
    const planLimit = this.settings.fileLimitBytes ?? p.storageFileLimitBytes;
    const quota = this.settings.quotaBytes ?? p.storageQuotaBytes;
    const used = (await this.usedBytes(bucket.project_id)) - replacing;
    const candidates: UploadLimit[] = [
      { bytes: planLimit, error: () => new HttpError(413, { error: `file size exceeds plan limit of ${formatSize(planLimit)}` }) },
      { bytes: Math.max(0, quota - used), error: () => new HttpError(413, { error: `storage limit exceeded (used: ${formatSize(used)}, limit: ${formatSize(quota)})` }) },
    ];
    if (bucket.file_size_limit !== null) {
      const b = Number(bucket.file_size_limit);
      candidates.unshift({ bytes: b, error: () => new HttpError(413, { error: `file size exceeds bucket limit of ${b} bytes` }) });
    }
    return candidates.reduce((a, c) => (c.bytes < a.bytes ? c : a));
  }

  /** Counts `bytes` served against the project's allowance for this month; 429 once it is spent. */
  async chargeDownload(projectId: string, bytes: number): Promise<void> {
    const allowance = this.settings.bandwidthBytes ?? planOf(await this.planOfProject(projectId)).storageBandwidthBytes;
    const now = this.clock.nowMs();
    const month = monthOf(now);
    const [r] = await this.store.query<{ bytes: string }>(`select bytes::text from storage_bandwidth where project_id = $1 and month = $2`, [projectId, month]);
    const spent = Number(r?.bytes ?? 0);
    if (spent >= allowance) {
      const d = new Date(now);
      const reset = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1));
      throw new HttpError(
        429,
        { error: `storage bandwidth allowance for ${month} is spent (${formatSize(spent)} of ${formatSize(allowance)}); it resets at ${reset.toISOString()}` },
        { "Retry-After": String(Math.max(1, Math.ceil((reset.getTime() - now) / 1000))) },
      );
    }
    await this.store.query(
      `insert into storage_bandwidth (project_id, month, bytes) values ($1, $2, $3) on conflict (project_id, month) do update set bytes = storage_bandwidth.bytes + excluded.bytes`,
      [projectId, month, bytes],
    );
  }
}
