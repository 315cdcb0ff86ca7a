import * as z from "zod";
import { changeNotice, defineSection, type Step } from "../section";

const schema = z
  .object({
    all_regions: z.boolean().describe("true deploys functions to every region this Kiln serves"),
    selected_regions: z.array(z.string().min(1)).max(64).describe("the regions used when all_regions is false (SUPERAGENT plan)"),
  })
  .partial()
  .strict()
  .describe("The project's region policy (its name and id are not part of a manifest: a manifest may be applied to any project)");

/** `project`: the region policy, through the projects service (its plan and region rules). */
export const projectSection = defineSection({
  key: "project",
  description: "region policy",
  schema,
  async export({ project }) {
    return { all_regions: project.all_regions, selected_regions: [...project.selected_regions].sort() };
  },
  async plan(want, { deps, project, plan }) {
    const cur = { all_regions: project.all_regions, selected_regions: [...project.selected_regions].sort() };
    const next = {
      all_regions: want.all_regions ?? (want.selected_regions?.length ? false : cur.all_regions),
      selected_regions: want.selected_regions ? [...new Set(want.selected_regions)].sort() : want.all_regions === true ? [] : cur.selected_regions,
    };
    const changed = next.all_regions !== cur.all_regions || next.selected_regions.join("\n") !== cur.selected_regions.join("\n");
    const step: Step = { section: "project", name: "regions", action: changed ? "updated" : "unchanged" };
    if (changed) Object.assign(step, { notice: changeNotice(cur, next), run: () => deps.projects.update(project, plan, next) });
    return { steps: [step], skipped: [], missing: [] };
  },
});
