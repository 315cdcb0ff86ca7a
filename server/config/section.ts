import type * as z from "zod";
import type { AccountsService } from "../accounts/service";
import type { ManagementPrincipal } from "../auth/principal";
import type { PlanName } from "../config";
import type { BackupsService } from "../databases/backups";
import type { DatabasesService } from "../databases/service";
import type { AuthConfigService } from "../end-users/config";
import type { DomainsService } from "../frontends/domains";
import type { FrontendsService } from "../frontends/service";
import type { FunctionsService } from "../functions/service";
import type { OAuthConfigsService } from "../oauth/configs";
import type { ProjectRecord } from "../projects/record";
import type { ProjectsService } from "../projects/service";
import type { SchedulersService } from "../schedulers/service";
import type { BucketsService } from "../storage/buckets";
import type { PoliciesService } from "../storage/policies";
import type { VariablesService } from "../variables/service";

/** The services of the other areas a manifest reads and writes through (their rules apply). */
export interface ConfigDeps {
  accounts: AccountsService;
  projects: ProjectsService;
  variables: VariablesService;
  authConfig: AuthConfigService;
  databases: DatabasesService;
  backups: BackupsService;
  functions: FunctionsService;
  schedulers: SchedulersService;
  buckets: BucketsService;
  storagePolicies: PoliciesService;
  oauthConfigs: OAuthConfigsService;
  frontends: FrontendsService;
  domains: DomainsService;
}

/** What a section sees of one export or apply. */
export interface SectionContext {
  deps: ConfigDeps;
  project: ProjectRecord;
  principal: ManagementPrincipal;
  /** The plan of the project's owner (plan-gated settings are read and written only on it). */
  plan: PlanName;
  /** Whether the caller may read credentials (variable values): platform tokens and full-scope project tokens. */
  credentials: boolean;
}

export type Action = "created" | "updated" | "deleted" | "unchanged" | "error";

/** One entry of the report, with the change that makes it (absent for unchanged entries and errors found ahead). */
export interface Step {
  section: string;
  name?: string;
  action: Action;
  notice?: string;
  run?: () => Promise<unknown>;
}

/** A manifest entry for something a manifest never creates (functions, databases, buckets), absent from the project. */
export interface Skipped {
  type: string;
  name: string;
  reason: string;
}

/** Something of the project a manifest never deletes, absent from the manifest. */
export interface Missing {
  type: string;
  name: string;
}

export interface SectionPlan {
  steps: Step[];
  skipped: Skipped[];
  missing: Missing[];
}

/** A problem found before anything is applied: the apply answers 422 with every one of them. */
export interface Issue {
  path: string;
  message: string;
}

/**
 * One top-level key of the manifest (`variables`, `storage`, ...): its schema, how the project's
 * state is exported into it, what it finds wrong before applying (beyond the schema), and the steps
 * that bring the project to it. A new section is one module listed in `sections/index.ts`.
 */
export interface Section<T> {
  key: string;
  /** What the OpenAPI description says of the section. */
  description: string;
  schema: z.ZodType<T>;
  /** The section as the project holds it; undefined leaves it out of the export. */
  export(ctx: SectionContext): Promise<T | undefined>;
  /** Checks that need more than the schema (cron expressions, policy definitions), each issue named by its path. */
  validate?(value: T, ctx: SectionContext, path: string): Promise<Issue[]>;
  plan(value: T, ctx: SectionContext): Promise<SectionPlan>;
}

export function defineSection<T>(s: Section<T>): Section<T> {
  return s;
}

/** JSON text with every object's keys sorted: equal values give equal text, whatever the key order. */
export function canonical(v: unknown): string {
  return JSON.stringify(sortKeys(v));
}

export function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) out[k] = sortKeys((v as Record<string, unknown>)[k]);
    return out;
  }
  return v;
}

export const same = (a: unknown, b: unknown) => canonical(a) === canonical(b);

/** The message of a failure, as the API would have answered it. */
export function messageOf(err: unknown): string {
  const e = err as { body?: { error?: string; code?: string }; message?: string };
  return e?.body?.error ?? e?.body?.code ?? e?.message ?? String(err);
}

/** The names of a list, with issues for the ones given twice. */
export function duplicateIssues(items: readonly { name: string }[], path: string, what: string): Issue[] {
  const seen = new Set<string>();
  const out: Issue[] = [];
  items.forEach((it, i) => {
    if (seen.has(it.name)) out.push({ path: `${path}.${i}.name`, message: `${what} '${it.name}' is listed twice` });
    seen.add(it.name);
  });
  return out;
}

export const byName = <T extends { name: string }>(a: T, b: T) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/** A value in a change's notice: JSON, cut to a readable length. */
function shown(v: unknown): string {
  const s = v === undefined ? "(none)" : JSON.stringify(v);
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/**
 * What an update changes, for the report's notice (`access_token_ttl_seconds: 3600 → 900`), field by
 * field; `hidden` fields (credentials) are named without their values.
 */
export function changeNotice(now: Record<string, unknown>, next: Record<string, unknown>, hidden: readonly string[] = []): string {
  return Object.keys(next)
    .filter((k) => !same(now[k], next[k]))
    .map((k) => (hidden.includes(k) ? `${k} changes` : `${k}: ${shown(now[k])} → ${shown(next[k])}`))
    .join("; ");
}
