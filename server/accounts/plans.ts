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
  databaseBackups: boolean;
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
    databaseBackups: false,
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
    databaseBackups: true,
    topQueries: true,
    storageFileLimitBytes: 50 * GB,
    storageQuotaBytes: 100 * GB,
    storageBandwidthBytes: 250 * GB,
  },
};

export function plan(name: PlanName): Plan {
  return PLANS[name];
}
