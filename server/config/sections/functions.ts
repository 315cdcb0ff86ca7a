import * as z from "zod";
import type { FunctionKind, FunctionRecord } from "../../functions/service";
import { patchFunctionBody } from "../../functions/schemas";
import { parseCron } from "../../schedulers/cron";
import { MAX_SCHEDULERS_PER_FUNCTION, type SchedulerRow } from "../../schedulers/service";
import { createSchedulerBody } from "../../schedulers/schemas";
import { byName, changeNotice, defineSection, duplicateIssues, same, sortKeys, type Issue, type Section, type SectionContext, type SectionPlan, type Step } from "../section";

const scheduler = z
  .object({
    name: createSchedulerBody.shape.name,
    enabled: z.boolean().optional().describe("default true"),
    schedule: createSchedulerBody.shape.schedule.strict(),
    payload: z.record(z.string(), z.unknown()).optional().describe("the function's event; default {}"),
    regions: z.array(z.string().min(1)).max(1, "regions holds exactly one deployed region, or none (Kiln chooses)").optional().describe("[] or absent: Kiln chooses a deployed region"),
  })
  .strict();
type SchedulerEntry = z.infer<typeof scheduler>;

const schedulers = z.array(scheduler).max(MAX_SCHEDULERS_PER_FUNCTION).optional().describe("the function's complete list of schedulers; absent: left as they are");

const standardEntry = z
  .object({ name: z.string().min(1).max(63), ...patchFunctionBody.shape, schedulers })
  .strict()
  .describe("settings of a deployed function (PATCH /functions/{id}); code is deployed, never part of a manifest");
const durableEntry = z.object({ name: z.string().min(1).max(63), schedulers }).strict();

type Entry = { name: string; schedulers?: SchedulerEntry[]; is_public?: boolean; invocation_mode?: "rpc" | "http"; http_auth_mode?: "service" | "none"; openapi_spec?: Record<string, unknown> | null };

async function allFunctions(ctx: SectionContext, kind: FunctionKind): Promise<FunctionRecord[]> {
  const out: FunctionRecord[] = [];
  for (let page = 1; ; page++) {
    const r = await ctx.deps.functions.list(ctx.project.id, page, 1000, kind);
    out.push(...r.data);
    if (page * 1000 >= r.total || r.data.length === 0) return out.sort(byName);
  }
}

/** Every scheduler of the project's functions of this kind, by function id: one listing, not one per function. */
async function schedulersByFunction(ctx: SectionContext, kind: FunctionKind): Promise<Map<string, SchedulerRow[]>> {
  const out = new Map<string, SchedulerRow[]>();
  for (let page = 1; ; page++) {
    const r = await ctx.deps.schedulers.listProject(ctx.project.id, page, 1000);
    for (const s of r.data) if (s.function_kind === kind) out.set(s.function_id, [...(out.get(s.function_id) ?? []), s]);
    if (page * 1000 >= r.total || r.data.length === 0) break;
  }
  for (const list of out.values()) list.sort(byName);
  return out;
}

function schedulerState(s: SchedulerRow) {
  return { name: s.name, enabled: s.enabled, schedule: { kind: "cron" as const, cron_expression: s.cron_expression }, payload: sortKeys(s.payload) as Record<string, unknown>, regions: s.regions ?? [] };
}

function settingsState(fn: FunctionRecord) {
  return { is_public: fn.is_public, invocation_mode: fn.invocation_mode, http_auth_mode: fn.http_auth_mode, openapi_spec: fn.openapi_spec === null ? null : (sortKeys(fn.openapi_spec) as Record<string, unknown>) };
}

/** The scheduler steps that make a function's schedulers the listed ones. */
function schedulerSteps(ctx: SectionContext, fn: FunctionRecord, kind: FunctionKind, want: SchedulerEntry[], have: SchedulerRow[]): Step[] {
  const { schedulers } = ctx.deps;
  const steps: Step[] = [];
  const byNameHave = new Map(have.map((s) => [s.name, s]));
  const listed = new Set<string>();
  for (const w of [...want].sort(byName)) {
    listed.add(w.name);
    const label = `${fn.name}/${w.name}`;
    const cur = byNameHave.get(w.name);
    const cron = parseCron(w.schedule.cron_expression);
    const expression = cron.ok ? cron.cron.expression : w.schedule.cron_expression;
    if (!cur) {
      steps.push({
        section: "schedulers",
        name: label,
        action: "created",
        run: () => schedulers.create(fn, kind, { name: w.name, enabled: w.enabled, schedule: { kind: "cron", cron_expression: expression }, payload: w.payload, regions: w.regions?.length ? w.regions : undefined }),
      });
      continue;
    }
    const now = schedulerState(cur);
    const next = {
      name: w.name,
      enabled: w.enabled ?? now.enabled,
      schedule: { kind: "cron" as const, cron_expression: expression },
      payload: w.payload === undefined ? now.payload : w.payload,
      regions: w.regions === undefined ? now.regions : w.regions,
    };
    if (same(next, now)) steps.push({ section: "schedulers", name: label, action: "unchanged" });
    else
      steps.push({
        section: "schedulers",
        name: label,
        action: "updated",
        notice: changeNotice(now, next),
        run: () => schedulers.update(fn, cur.id, { enabled: next.enabled, schedule: next.schedule, payload: next.payload, regions: next.regions.length ? next.regions : null }),
      });
  }
  for (const s of have.filter((s) => !listed.has(s.name)))
    steps.push({ section: "schedulers", name: `${fn.name}/${s.name}`, action: "deleted", run: () => schedulers.delete(fn.id, s.id) });
  return steps;
}

/**
 * `functions` and `durable_functions`: settings and schedulers of functions that are deployed. A
 * manifest never deploys nor deletes a function: one listed but absent is `skipped` (with its
 * schedulers), one deployed but not listed is `missing` (and left as it is).
 */
function functionsSection(key: "functions" | "durable_functions", kind: FunctionKind): Section<Entry[]> {
  const type = kind === "durable" ? "durable_function" : "function";
  const entry = kind === "durable" ? durableEntry : standardEntry;
  return defineSection<Entry[]>({
    key,
    description: kind === "durable" ? "schedulers of deployed durable functions" : "settings and schedulers of deployed functions",
    schema: z.array(entry as z.ZodType<Entry>).max(10_000) as z.ZodType<Entry[]>,
    async export(ctx) {
      const out: Entry[] = [];
      const all = await schedulersByFunction(ctx, kind);
      for (const fn of await allFunctions(ctx, kind)) {
        const s = (all.get(fn.id) ?? []).map(schedulerState);
        out.push(kind === "durable" ? { name: fn.name, schedulers: s } : { name: fn.name, ...settingsState(fn), schedulers: s });
      }
      return out;
    },
    async validate(want, _ctx, path) {
      const issues: Issue[] = duplicateIssues(want, path, kind === "durable" ? "durable function" : "function");
      want.forEach((f, i) => {
        if (!f.schedulers) return;
        issues.push(...duplicateIssues(f.schedulers, `${path}.${i}.schedulers`, "scheduler"));
        f.schedulers.forEach((s, j) => {
          const r = parseCron(s.schedule.cron_expression);
          if (!r.ok) issues.push({ path: `${path}.${i}.schedulers.${j}.schedule.cron_expression`, message: r.error });
        });
        if (f.http_auth_mode === "none" && (f.is_public === false || f.invocation_mode === "rpc"))
          issues.push({ path: `${path}.${i}.http_auth_mode`, message: "http_auth_mode none requires a public function (is_public true) in http invocation mode" });
      });
      return issues;
    },
    async plan(want, ctx): Promise<SectionPlan> {
      const have = new Map((await allFunctions(ctx, kind)).map((f) => [f.name, f]));
      const existing = await schedulersByFunction(ctx, kind);
      const out: SectionPlan = { steps: [], skipped: [], missing: [] };
      const listed = new Set<string>();
      for (const w of [...want].sort(byName)) {
        listed.add(w.name);
        const fn = have.get(w.name);
        if (!fn) {
          out.skipped.push({
            type,
            name: w.name,
            reason: `${kind === "durable" ? "durable function" : "function"} '${w.name}' is not deployed in this project; a manifest never deploys functions (deploy it, then apply again)`,
          });
          continue;
        }
        if (kind === "standard") {
          const now = settingsState(fn);
          const patch = { is_public: w.is_public, invocation_mode: w.invocation_mode, http_auth_mode: w.http_auth_mode, openapi_spec: w.openapi_spec };
          const next = {
            is_public: patch.is_public ?? now.is_public,
            invocation_mode: patch.invocation_mode ?? now.invocation_mode,
            http_auth_mode: patch.http_auth_mode ?? now.http_auth_mode,
            openapi_spec: patch.openapi_spec === undefined ? now.openapi_spec : patch.openapi_spec,
          };
          const changed = !same(next, now);
          out.steps.push({ section: key, name: fn.name, action: changed ? "updated" : "unchanged", ...(changed ? { notice: changeNotice(now, next), run: () => ctx.deps.functions.update(fn, patch) } : {}) });
        }
        if (w.schedulers) out.steps.push(...schedulerSteps(ctx, fn, kind, w.schedulers, existing.get(fn.id) ?? []));
      }
      for (const name of [...have.keys()].filter((n) => !listed.has(n))) out.missing.push({ type, name });
      return out;
    },
  });
}

export const standardFunctionsSection = functionsSection("functions", "standard");
export const durableFunctionsSection = functionsSection("durable_functions", "durable");
