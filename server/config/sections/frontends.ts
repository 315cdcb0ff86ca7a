import * as z from "zod";
import type { FrontendRecord } from "../../frontends/records";
import { deployFields } from "../../frontends/schemas";
import { byName, changeNotice, defineSection, duplicateIssues, same, type SectionContext, type SectionPlan } from "../section";

const customDomain = z
  .object({
    domain: z.string().min(1).max(253).describe("the host name, as `kiln frontends domain set` stored it (lowercase)"),
    tls: z.object({ mode: z.literal("byoc", { error: "must be 'byoc' (bring your own certificate)" }) }).strict().describe("the certificate and its key are never part of a manifest"),
  })
  .strict();

const entry = z
  .object({
    name: deployFields.shape.name,
    framework: z.enum(["nextjs", "static"]).nullable().optional().describe("what the frontend's deployment built (set by a deploy)"),
    app_root: deployFields.shape.app_root.unwrap().nullable().optional().describe("the app's folder in the archive, for the next redeploy (a deploy gives its own)"),
    variable_scope: deployFields.shape.variable_scope,
    variables: deployFields.shape.variables.optional(),
    custom_domain: customDomain.nullable().optional().describe("null: no custom domain (an attached one is detached); absent: left as it is"),
  })
  .strict()
  .describe("settings and custom domain of an existing frontend; settings apply at its next deployment; a manifest never creates, deploys or deletes frontends");
type Entry = z.infer<typeof entry>;

async function allFrontends(ctx: SectionContext): Promise<FrontendRecord[]> {
  const out: FrontendRecord[] = [];
  for (let page = 1; ; page++) {
    const r = await ctx.deps.frontends.list(ctx.project.id, page, 1000);
    out.push(...r.data);
    if (page * 1000 >= r.total || r.data.length === 0) return out.sort(byName);
  }
}

function settings(f: FrontendRecord) {
  return { framework: f.framework, app_root: f.app_root, variable_scope: f.variable_scope, variables: f.variables };
}

async function domainOf(ctx: SectionContext, f: FrontendRecord) {
  const d = await ctx.deps.domains.record(f.id);
  // A detaching domain is on its way out: the frontend has none as far as its configuration goes.
  return d && d.status !== "detaching" ? { domain: d.domain, tls: { mode: "byoc" as const } } : null;
}

/**
 * `frontends`: per frontend, the settings its deployments build with and its custom domain.
 * `app_root`, `variable_scope` and `variables` are applied (stored for the next deployment; a
 * manifest never deploys); what takes things a manifest does not hold is checked rather than
 * changed: a different `framework` (an archive to build) or a new or changed custom domain (its
 * certificate and key) is an `error` entry saying which command makes the change; detaching a
 * domain (null) is applied. Frontends absent from the project are `skipped`, unlisted ones `missing`.
 */
export const frontendsSection = defineSection<Entry[]>({
  key: "frontends",
  description: "frontends' settings and custom domains (no certificates or keys)",
  schema: z.array(entry).max(10_000),
  async export(ctx) {
    const out: Entry[] = [];
    for (const f of await allFrontends(ctx)) out.push({ name: f.name, ...settings(f), custom_domain: await domainOf(ctx, f) });
    return out;
  },
  async validate(want, _ctx, path) {
    return duplicateIssues(want, path, "frontend");
  },
  async plan(want, ctx): Promise<SectionPlan> {
    const have = new Map((await allFrontends(ctx)).map((f) => [f.name, f]));
    const out: SectionPlan = { steps: [], skipped: [], missing: [] };
    const listed = new Set<string>();
    for (const w of [...want].sort(byName)) {
      listed.add(w.name);
      const f = have.get(w.name);
      if (!f) {
        out.skipped.push({ type: "frontend", name: w.name, reason: `frontend '${w.name}' does not exist in this project; a manifest never creates frontends (deploy it, then apply again)` });
        continue;
      }
      const now = settings(f) as Record<string, unknown>;
      const next: Record<string, unknown> = { ...now };
      for (const k of Object.keys(now)) if ((w as Record<string, unknown>)[k] !== undefined) next[k] = (w as Record<string, unknown>)[k];
      if (next.app_root === "") next.app_root = null; // the archive's root either way
      // What the last build was is not a setting: a different framework takes a deployment of an archive.
      const { framework: haveFramework, ...haveSettings } = now;
      const { framework: wantFramework, ...wantSettings } = next;
      if (same(haveSettings, wantSettings)) out.steps.push({ section: "frontends", name: f.name, action: "unchanged" });
      else if (f.status === "deleting")
        out.steps.push({ section: "frontends", name: f.name, action: "error", notice: `${changeNotice(haveSettings, wantSettings)}: frontend '${f.name}' is being deleted` });
      else
        out.steps.push({
          section: "frontends",
          name: f.name,
          action: "updated",
          notice: `${changeNotice(haveSettings, wantSettings)}: applies at the frontend's next deployment (kiln frontends redeploy ${f.name}); the serving deployment keeps what it was built with`,
          run: () => ctx.deps.frontends.updateSettings(ctx.project.id, f.id, { app_root: wantSettings.app_root as string | null, variable_scope: wantSettings.variable_scope as "scoped" | "all", variables: wantSettings.variables as string[] }),
        });
      if (!same(haveFramework, wantFramework))
        out.steps.push({
          section: "frontend_framework",
          name: f.name,
          action: "error",
          notice: `framework: ${JSON.stringify(haveFramework)} → ${JSON.stringify(wantFramework)}: the framework is what a deployment's build found in its archive, which a manifest never holds (kiln frontends deploy ${f.name} ... [--framework nextjs])`,
        });
      if (w.custom_domain === undefined) continue;
      const cur = await domainOf(ctx, f);
      if (w.custom_domain === null) {
        if (cur) out.steps.push({ section: "frontend_domains", name: f.name, action: "deleted", run: () => ctx.deps.domains.detach(f) });
        continue;
      }
      if (cur && same(cur, w.custom_domain)) out.steps.push({ section: "frontend_domains", name: f.name, action: "unchanged" });
      else
        out.steps.push({
          section: "frontend_domains",
          name: f.name,
          action: "error",
          notice: `custom domain ${cur ? `${cur.domain} → ${w.custom_domain.domain}` : w.custom_domain.domain}: a custom domain needs its certificate and key, which a manifest never holds; set it with \`kiln frontends domain set ${f.name} ${w.custom_domain.domain} --cert ... --key ...\` (POST /projects/{id}/frontends/{frontend}/domain)`,
        });
    }
    for (const name of [...have.keys()].filter((n) => !listed.has(n))) out.missing.push({ type: "frontend", name });
    return out;
  },
});
