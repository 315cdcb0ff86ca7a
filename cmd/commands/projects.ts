import type { Command } from "commander";
import { output, printObject, printTable } from "../output";
import { act, csv, qs } from "./shared";

const COLUMNS = ["id", "name", "status", "all_regions", "selected_regions", "created_at"];

function regionBody(o: { regions?: string; allRegions?: boolean }) {
  if (o.regions) return { all_regions: false, selected_regions: csv(o.regions) };
  if (o.allRegions) return { all_regions: true };
  return {};
}

export function projectsCommand(program: Command): void {
  const projects = program.command("projects").description("manage projects");
  projects
    .command("list")
    .option("--search <text>", "case-insensitive name search")
    .option("--page <n>", "page number")
    .option("--limit <n>", "items per page (max 100)")
    .action(
      act(async (c, g, o: { search?: string; page?: string; limit?: string }) => {
        const r = await c.request("GET", `/projects${qs({ search: o.search, page: o.page ?? 1, limit: o.limit })}`);
        output(g.json, r, () => {
          printTable(r.data, COLUMNS, "projects");
          if (r.has_more) console.log(`(${r.total} in all; next: --page ${r.page + 1})`);
        });
      }),
    );
  projects
    .command("create <name>")
    .option("--regions <list>", "restrict to these regions (comma-separated)")
    .action(
      act(async (c, g, name: string, o: { regions?: string }) => {
        const r = await c.request("POST", "/projects", { name, ...regionBody(o) });
        output(g.json, r, () => printObject(r));
      }),
    );
  projects.command("get <id>").action(
    act(async (c, g, id: string) => {
      const r = await c.request("GET", `/projects/${encodeURIComponent(id)}`);
      output(g.json, r, () => printObject(r));
    }),
  );
  projects
    .command("update <id>")
    .option("--name <name>")
    .option("--regions <list>", "restrict to these regions")
    .option("--all-regions", "deploy to every region")
    .action(
      act(async (c, g, id: string, o: { name?: string; regions?: string; allRegions?: boolean }) => {
        const r = await c.request("PATCH", `/projects/${encodeURIComponent(id)}`, { ...(o.name ? { name: o.name } : {}), ...regionBody(o) });
        output(g.json, r, () => printObject(r));
      }),
    );
  projects.command("delete <id>").action(
    act(async (c, g, id: string) => {
      const r = await c.request("DELETE", `/projects/${encodeURIComponent(id)}`);
      output(g.json, r, () => console.log(`Deleting project ${r.id} (status ${r.status})`));
    }),
  );
}
