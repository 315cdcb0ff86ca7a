import type { Command } from "commander";
import type { Client } from "../client";
import { output, printObject, printTable } from "../output";
import { findFunction } from "./functions";
import { act, qs, requireProject, PROJECT_HELP } from "./shared";

const COLUMNS = ["id", "name", "enabled", "schedule", "region", "next_run_at", "last_run_at"];
const row = (s: any) => ({ ...s, schedule: s.schedule.cron_expression });

function parsePayload(v: string | undefined): Record<string, unknown> | undefined {
  if (v === undefined) return undefined;
  const p = JSON.parse(v);
  if (typeof p !== "object" || p === null || Array.isArray(p)) throw new Error("--payload must be a JSON object");
  return p;
}

export function schedulersCommand(program: Command): void {
  const cmd = program.command("schedulers").description("run functions on a cron schedule (5-field cron, UTC)");
  const base = async (c: Client, o: { project?: string; function: string }) => {
    const project = requireProject(o);
    const fn = await findFunction(c, project, o.function);
    return `/projects/${encodeURIComponent(project)}/functions/${encodeURIComponent(fn.id)}/schedulers`;
  };
  cmd
    .command("create <name>")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--function <name-or-id>")
    .requiredOption("--cron <expression>", "5 fields in UTC: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'")
    .option("--payload <json>", "JSON object delivered as the function's event", "{}")
    .option("--region <region>", "the one deployed region to run in (default: Kiln chooses)")
    .option("--disabled", "create it disabled")
    .action(
      act(async (c, g, name: string, o: { project: string; function: string; cron: string; payload: string; region?: string; disabled?: boolean }) => {
        const body = { name, enabled: !o.disabled, schedule: { kind: "cron", cron_expression: o.cron }, payload: parsePayload(o.payload), ...(o.region ? { regions: [o.region] } : {}) };
        const r = await c.request("POST", await base(c, o), body);
        output(g.json, r, () => printObject(row(r)));
      }),
    );
  cmd
    .command("list")
    .description("a function's schedulers, or with no --function every scheduler of the project")
    .option("--project <id>", PROJECT_HELP)
    .option("--function <name-or-id>")
    .option("--page <n>")
    .option("--limit <n>")
    .action(
      act(async (c, g, o: { project: string; function?: string; page?: string; limit?: string }) => {
        const path = o.function ? await base(c, { ...o, function: o.function }) : `/projects/${encodeURIComponent(requireProject(o))}/schedulers`;
        const r = await c.request("GET", path + qs({ page: o.page, limit: o.limit ?? 100 }));
        output(g.json, r, () => printTable(r.data.map(row), o.function ? COLUMNS : [...COLUMNS, "function_id", "function_kind"], "schedulers"));
      }),
    );
  cmd
    .command("get <id>")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--function <name-or-id>")
    .action(
      act(async (c, g, id: string, o: { project: string; function: string }) => {
        const r = await c.request("GET", `${await base(c, o)}/${encodeURIComponent(id)}`);
        output(g.json, r, () => printObject(row(r)));
      }),
    );
  cmd
    .command("update <id>")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--function <name-or-id>")
    .option("--name <name>")
    .option("--cron <expression>")
    .option("--payload <json>")
    .option("--region <region>", "the one deployed region to run in; 'auto' lets Kiln choose")
    .option("--enable")
    .option("--disable")
    .action(
      act(async (c, g, id: string, o: { project: string; function: string; name?: string; cron?: string; payload?: string; region?: string; enable?: boolean; disable?: boolean }) => {
        const body: Record<string, unknown> = {};
        if (o.name) body.name = o.name;
        if (o.cron) body.schedule = { kind: "cron", cron_expression: o.cron };
        if (o.payload !== undefined) body.payload = parsePayload(o.payload);
        if (o.region) body.regions = o.region === "auto" ? null : [o.region];
        if (o.enable) body.enabled = true;
        if (o.disable) body.enabled = false;
        const r = await c.request("PATCH", `${await base(c, o)}/${encodeURIComponent(id)}`, body);
        output(g.json, r, () => printObject(row(r)));
      }),
    );
  cmd
    .command("delete <id>")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--function <name-or-id>")
    .action(
      act(async (c, g, id: string, o: { project: string; function: string }) => {
        await c.request("DELETE", `${await base(c, o)}/${encodeURIComponent(id)}`);
        output(g.json, { deleted: id }, () => console.log(`Deleted scheduler ${id}`));
      }),
    );
  cmd
    .command("runs <id>")
    .description("a scheduler's runs, newest first")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--function <name-or-id>")
    .option("--page <n>")
    .option("--limit <n>")
    .action(
      act(async (c, g, id: string, o: { project: string; function: string; page?: string; limit?: string }) => {
        const r = await c.request("GET", `${await base(c, o)}/${encodeURIComponent(id)}/runs` + qs({ page: o.page, limit: o.limit ?? 20 }));
        output(g.json, r, () => printTable(r.data, ["id", "status", "scheduled_for", "duration_ms", "http_status", "invocation_id", "error"], "runs"));
      }),
    );
}
