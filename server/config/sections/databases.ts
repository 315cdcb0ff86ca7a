import * as z from "zod";
import { plan as planOf } from "../../accounts/plans";
import { SCHEDULE_ENTRIES_MAX } from "../../databases/backups";
import { scheduleEntryInput } from "../../databases/schemas";
import type { DatabaseRecord } from "../../databases/service";
import { byName, changeNotice, defineSection, duplicateIssues, messageOf, same, type SectionContext, type SectionPlan } from "../section";

const entry = z
  .object({
    name: z.string().min(1).max(64),
    backup_schedule: z
      .array(scheduleEntryInput)
      .max(SCHEDULE_ENTRIES_MAX)
      .optional()
      .describe("the automated backups, replaced wholesale (SUPERAGENT plan); absent: left as it is; exported only where the plan has backups"),
  })
  .strict()
  .describe("settings of an existing database; a manifest never creates or deletes databases");
type Entry = z.infer<typeof entry>;
type ScheduleEntry = NonNullable<Entry["backup_schedule"]>[number];

async function scheduleOf(ctx: SectionContext, d: DatabaseRecord) {
  return (await ctx.deps.backups.schedule(d)).map((e) => ({ frequency: e.frequency, hour: e.hour, ...(e.day !== undefined ? { day: e.day } : {}), retention_seconds: e.retention_seconds }));
}

/** An entry as the backups service would store it: no day for daily entries, retention defaulted and clamped to the plan's. */
function normalized(e: ScheduleEntry, max: number) {
  return { frequency: e.frequency, hour: e.hour, ...(e.frequency !== "daily" ? { day: e.day } : {}), retention_seconds: Math.min(e.retention_seconds ?? max, max) };
}

/**
 * `databases`: settings of databases that exist (today their backup schedule). A database listed but
 * absent is `skipped`; one that exists but is not listed is `missing`.
 */
export const databasesSection = defineSection({
  key: "databases",
  description: "backup schedules of existing databases",
  schema: z.array(entry).max(10_000),
  async export(ctx) {
    const backups = planOf(ctx.plan).databaseBackups;
    const out: Entry[] = [];
    for (const d of (await ctx.deps.databases.list(ctx.project.id)).sort(byName)) {
      // Schedules are read where the backups routes would answer: SUPERAGENT, a database with storage.
      if (backups && d.status !== "provisioning") out.push({ name: d.name, backup_schedule: await scheduleOf(ctx, d) });
      else out.push({ name: d.name });
    }
    return out;
  },
  async validate(want, _ctx, path) {
    return duplicateIssues(want, path, "database");
  },
  async plan(want, ctx): Promise<SectionPlan> {
    const have = new Map((await ctx.deps.databases.list(ctx.project.id)).map((d) => [d.name, d]));
    const out: SectionPlan = { steps: [], skipped: [], missing: [] };
    const max = planOf(ctx.plan).backupRetentionSeconds;
    for (const w of [...want].sort(byName)) {
      const d = have.get(w.name);
      if (!d) {
        out.skipped.push({ type: "database", name: w.name, reason: `database '${w.name}' does not exist in this project; a manifest never creates databases (create it, then apply again)` });
        continue;
      }
      if (!w.backup_schedule) continue;
      const step = { section: "databases", name: w.name };
      try {
        ctx.deps.backups.requirePlan(ctx.plan);
        ctx.deps.backups.requireStorage(d);
      } catch (err) {
        out.steps.push({ ...step, action: "error", notice: messageOf(err) });
        continue;
      }
      const next = w.backup_schedule.map((e) => normalized(e, max));
      const entries = w.backup_schedule;
      const now = await scheduleOf(ctx, d);
      if (same(next, now)) out.steps.push({ ...step, action: "unchanged" });
      else out.steps.push({ ...step, action: "updated", notice: changeNotice({ backup_schedule: now }, { backup_schedule: next }), run: async () => ctx.deps.backups.replaceSchedule(await ctx.deps.databases.get(ctx.project.id, d.name), ctx.plan, entries) });
    }
    const listed = new Set(want.map((w) => w.name));
    for (const name of [...have.keys()].sort().filter((n) => !listed.has(n))) out.missing.push({ type: "database", name });
    return out;
  },
});
