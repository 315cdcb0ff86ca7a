import * as z from "zod";
import { createVariableBody } from "../../variables/schemas";
import { byName, defineSection, duplicateIssues, type SectionContext, type Step } from "../section";

const entry = z
  .object({
    name: createVariableBody.shape.name,
    // YAML writes `PORT: 8080` and `DEBUG: true` unquoted: numbers and booleans are taken as their text.
    value: z
      .union([z.string(), z.number(), z.boolean()])
      .transform((v) => String(v))
      .pipe(createVariableBody.shape.value)
      .optional()
      .describe("a string (numbers and booleans are taken as their text); left out of exports for read-only tokens; without it an existing variable keeps its value"),
  })
  .strict();

async function all(ctx: SectionContext) {
  const out: { name: string; value: string }[] = [];
  for (let page = 1; ; page++) {
    const r = await ctx.deps.variables.list(ctx.project.id, page, 1000);
    out.push(...r.data.map((v) => ({ name: v.name, value: v.value })));
    if (page * 1000 >= r.total || r.data.length === 0) return out.sort(byName);
  }
}

/**
 * `variables`: the complete list when the section is given (a variable not listed is deleted).
 * Names always; values only for callers that may read credentials.
 */
export const variablesSection = defineSection({
  key: "variables",
  description: "project variables",
  schema: z.array(entry).max(10_000),
  async export(ctx) {
    return (await all(ctx)).map((v) => (ctx.credentials ? { name: v.name, value: v.value } : { name: v.name }));
  },
  async validate(want, _ctx, path) {
    return duplicateIssues(want, path, "variable");
  },
  async plan(want, ctx) {
    const { variables } = ctx.deps;
    const projectId = ctx.project.id;
    const cur = new Map((await all(ctx)).map((v) => [v.name, v.value]));
    const steps: Step[] = [];
    const listed = new Set<string>();
    for (const v of [...want].sort(byName)) {
      listed.add(v.name);
      const have = cur.get(v.name);
      const step: Step = { section: "variables", name: v.name, action: "unchanged" };
      if (have === undefined) {
        if (v.value === undefined) Object.assign(step, { action: "error", notice: `variable '${v.name}' does not exist and the manifest gives no value for it` });
        else Object.assign(step, { action: "created", run: () => variables.create(projectId, { name: v.name, value: v.value! }) });
      } else if (v.value !== undefined && v.value !== have) {
        // No notice: the value is all that can change, and it is a credential (never shown).
        Object.assign(step, { action: "updated", run: () => variables.update(projectId, v.name, { value: v.value }) });
      }
      steps.push(step);
    }
    for (const name of [...cur.keys()].filter((n) => !listed.has(n)))
      steps.push({ section: "variables", name, action: "deleted", run: () => variables.delete(projectId, name) });
    return { steps, skipped: [], missing: [] };
  },
});
