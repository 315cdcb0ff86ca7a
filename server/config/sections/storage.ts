import * as z from "zod";
import { bucketView, type BucketRow } from "../../storage/buckets";
import { checkPolicyDefinition } from "../../storage/policy-expression";
import { createBucketBody, createPolicyBody } from "../../storage/schemas";
import { byName, changeNotice, defineSection, duplicateIssues, same, type Issue, type SectionContext, type SectionPlan, type Step } from "../section";

const policy = createPolicyBody.strict();
const bucket = z
  .object({
    name: z.string().min(1).max(64),
    file_size_limit: createBucketBody.shape.file_size_limit,
    allowed_mime_types: createBucketBody.shape.allowed_mime_types,
    policies: z.array(policy).max(1000).optional().describe("the bucket's complete list of policies; absent: left as they are"),
  })
  .strict()
  .describe("settings and policies of an existing bucket; a manifest never creates or deletes buckets or their objects");
const schema = z.object({ buckets: z.array(bucket).max(10_000).optional() }).strict();
type Storage = z.infer<typeof schema>;
type PolicyEntry = z.infer<typeof policy>;

async function policiesOf(ctx: SectionContext, b: BucketRow) {
  return (await ctx.deps.storagePolicies.list(b.id)).map((p) => ({ name: p.name, operation: p.operation, definition: p.definition })).sort(byName);
}

function policySteps(ctx: SectionContext, b: BucketRow, want: PolicyEntry[], have: Awaited<ReturnType<typeof policiesOf>>, ids: Map<string, string>): Step[] {
  const { storagePolicies } = ctx.deps;
  const projectId = ctx.project.id;
  const steps: Step[] = [];
  const cur = new Map(have.map((p) => [p.name, p]));
  const listed = new Set<string>();
  for (const w of [...want].sort(byName)) {
    listed.add(w.name);
    const label = `${b.name}/${w.name}`;
    const p = cur.get(w.name);
    const next = { name: w.name, operation: w.operation, definition: w.definition.trim() };
    if (!p) steps.push({ section: "storage_policies", name: label, action: "created", run: () => storagePolicies.create(projectId, b.id, next) });
    else if (same(p, next)) steps.push({ section: "storage_policies", name: label, action: "unchanged" });
    else
      // Policies have no update: the old one goes and the new one is made (a failure leaves it gone, and says so).
      steps.push({
        section: "storage_policies",
        name: label,
        action: "updated",
        notice: changeNotice(p, next),
        run: async () => {
          await storagePolicies.delete(b.id, ids.get(w.name)!);
          await storagePolicies.create(projectId, b.id, next);
        },
      });
  }
  for (const p of have.filter((p) => !listed.has(p.name)))
    steps.push({ section: "storage_policies", name: `${b.name}/${p.name}`, action: "deleted", run: () => storagePolicies.delete(b.id, ids.get(p.name)!) });
  return steps;
}

/**
 * `storage`: settings and policies of the buckets that exist. A bucket listed but absent is
 * `skipped`, one that exists but is not listed is `missing`; objects are never touched.
 */
export const storageSection = defineSection<Storage>({
  key: "storage",
  description: "storage buckets' settings and policies",
  schema,
  async export(ctx) {
    const buckets = [];
    for (const b of (await ctx.deps.buckets.list(ctx.project.id)).sort(byName)) {
      const v = bucketView(b);
      buckets.push({ name: b.name, file_size_limit: v.file_size_limit, allowed_mime_types: v.allowed_mime_types, policies: await policiesOf(ctx, b) });
    }
    return { buckets };
  },
  async validate(want, _ctx, path) {
    const issues: Issue[] = duplicateIssues(want.buckets ?? [], `${path}.buckets`, "bucket");
    for (const [i, b] of (want.buckets ?? []).entries()) {
      if (!b.policies) continue;
      issues.push(...duplicateIssues(b.policies, `${path}.buckets.${i}.policies`, "policy"));
      for (const [j, p] of b.policies.entries()) {
        const r = await checkPolicyDefinition(p.definition);
        if (!r.ok) issues.push({ path: `${path}.buckets.${i}.policies.${j}.definition`, message: r.error });
      }
    }
    return issues;
  },
  async plan(want, ctx): Promise<SectionPlan> {
    const out: SectionPlan = { steps: [], skipped: [], missing: [] };
    if (!want.buckets) return out;
    const have = new Map((await ctx.deps.buckets.list(ctx.project.id)).map((b) => [b.name, b]));
    for (const w of [...want.buckets].sort(byName)) {
      const b = have.get(w.name);
      if (!b) {
        out.skipped.push({ type: "bucket", name: w.name, reason: `bucket '${w.name}' does not exist in this project; a manifest never creates buckets (create it, then apply again)` });
        continue;
      }
      const v = bucketView(b);
      const now = { file_size_limit: v.file_size_limit, allowed_mime_types: v.allowed_mime_types };
      const next = { file_size_limit: w.file_size_limit === undefined ? now.file_size_limit : w.file_size_limit, allowed_mime_types: w.allowed_mime_types ?? now.allowed_mime_types };
      const changed = !same(now, next);
      out.steps.push({
        section: "storage_buckets",
        name: b.name,
        action: changed ? "updated" : "unchanged",
        ...(changed ? { notice: changeNotice(now, next), run: () => ctx.deps.buckets.update(ctx.project.id, b.name, next) } : {}),
      });
      if (w.policies) {
        const rows = await ctx.deps.storagePolicies.list(b.id);
        const ids = new Map(rows.map((p) => [p.name, p.id]));
        out.steps.push(...policySteps(ctx, b, w.policies, await policiesOf(ctx, b), ids));
      }
    }
    const listed = new Set(want.buckets.map((b) => b.name));
    for (const name of [...have.keys()].sort().filter((n) => !listed.has(n))) out.missing.push({ type: "bucket", name });
    return out;
  },
});
