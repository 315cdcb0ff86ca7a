import type { Command } from "commander";
import { ApiError } from "../client";
import { output, printObject, printTable } from "../output";
import { act, qs, requireProject, PROJECT_HELP } from "./shared";

export function varsCommand(program: Command): void {
  const vars = program.command("vars").description("manage project variables");
  const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/variables`;
  vars
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .option("--page <n>")
    .option("--limit <n>")
    .action(
      act(async (c, g, o: { project: string; page?: string; limit?: string }) => {
        const r = await c.request("GET", base(o) + qs({ page: o.page, limit: o.limit ?? 100 }));
        output(g.json, r, () => printTable(r.data, ["name", "value", "status", "updated_at"], "variables"));
      }),
    );
  vars
    .command("get <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, r, () => console.log(r.value));
      }),
    );
  vars
    .command("set <name> <value>")
    .description("create the variable, or change its value")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, value: string, o: { project: string }) => {
        let r;
        try {
          r = await c.request("POST", base(o), { name, value });
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 409)) throw err;
          r = await c.request("PATCH", `${base(o)}/${encodeURIComponent(name)}`, { value });
        }
        output(g.json, r, () => printObject(r));
      }),
    );
  vars
    .command("unset <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        await c.request("DELETE", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, { deleted: name }, () => console.log(`Deleted ${name}`));
      }),
    );
}
