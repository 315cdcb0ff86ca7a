import type { PlanName } from "../config";

/**
 * What each plan allows, in one table. Areas ask `plan(name).feature` instead of comparing plan
 * names, so a new plan or a moved feature is a change here only.
 */
export interface Plan {
  name: PlanName;
  /** API spelling, as the spec writes plan names (HOBBY, SUPERAGENT). */
  label: string;
  maxProjects: number;
  /** `selected_regions` / `all_regions: false` on projects. */
  restrictRegions: boolean;
  maxDatabases: number;
  /** Branches per database, every state counted (`provisioning`, `active`, `failed`, `deleting`); 403 beyond. */
  maxBranchesPerDatabase: number;
  /** Backups, the schedule and restores (HOBBY: 403 on every such route, reads included). */
  databaseBackups: boolean;
  /** Manual backups per database (scheduled ones and pre-restore states are not counted); 403 beyond. */
  maxManualBackups: number;
  /**
   * How long scheduled backups are kept at most (the spec leaves the figure to the deployment): a
   * schedule entry's `retention_seconds` defaults to this and is clamped to it.
   */
  backupRetentionSeconds: number;
  /**
   * Pre-restore states held per database at most: each completed restore keeps the data it replaced
   * as a backup (`service-pre-restore-...`) for `preRestoreRetentionSeconds`; a restore that would
   * need one more is 409 until one is deleted or expires.
   */
  maxPreRestoreStates: number;
  preRestoreRetentionSeconds: number;
  topQueries: boolean;
  /**
   * Object storage (the spec leaves the figures to each deployment; these are Kiln's defaults, and
   * KILN_STORAGE_FILE_LIMIT_BYTES, KILN_STORAGE_QUOTA_BYTES and KILN_STORAGE_BANDWIDTH_BYTES set
   * them for every plan): the largest file, a project's stored bytes, and bytes served a month.
   */
  storageFileLimitBytes: number;
  storageQuotaBytes: number;
  storageBandwidthBytes: number;
}

const GB = 1_000_000_000;

export const PLANS: Record<PlanName, Plan> = {
  hobby: {
    name: "hobby",
    label: "HOBBY",
    maxProjects: 1000,
    restrictRegions: false,
    maxDatabases: 1,
    maxBranchesPerDatabase: 10,
    databaseBackups: false,
    maxManualBackups: 0,
    backupRetentionSeconds: 0,
    maxPreRestoreStates: 0,
    preRestoreRetentionSeconds: 0,
    topQueries: false,
    storageFileLimitBytes: 50_000_000,
    storageQuotaBytes: 1 * GB,
    storageBandwidthBytes: 5 * GB,
  },
  superagent: {
    name: "superagent",
    label: "SUPERAGENT",
    maxProjects: 1000,
    restrictRegions: true,
    maxDatabases: 10_000,
    maxBranchesPerDatabase: 25,
    databaseBackups: true,
    maxManualBackups: 50,
    backupRetentionSeconds: 30 * 86_400,
    maxPreRestoreStates: 3,
    preRestoreRetentionSeconds: 7 * 86_400,
    topQueries: true,
    storageFileLimitBytes: 50 * GB,
    storageQuotaBytes: 100 * GB,
    storageBandwidthBytes: 250 * GB,
  },
};

export function plan(name: PlanName): Plan {
  return PLANS[name];
}
