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
}

export const PLANS: Record<PlanName, Plan> = {
  hobby: {
    name: "hobby",
    label: "HOBBY",
    maxProjects: 1000,
    restrictRegions: false,
    maxDatabases: 1,
    databaseBackups: false,
    topQueries: false,
  },
  superagent: {
    name: "superagent",
    label: "SUPERAGENT",
    maxProjects: 1000,
    restrictRegions: true,
    maxDatabases: 10_000,
    databaseBackups: true,
    topQueries: true,
  },
};

export function plan(name: PlanName): Plan {
  return PLANS[name];
}
