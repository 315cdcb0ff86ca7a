import type { Command } from "commander";
import { output, printObject, printTable } from "../output";
import { act, csv, requireProject, PROJECT_HELP } from "./shared";

export function keysCommand(program: Command): void {
  const keys = program.command("keys").description("manage service keys and anon keys");
  const path = (o: { project?: string }, kind: string) => `/projects/${encodeURIComponent(requireProject(o))}/${kind}`;

  const service = keys.command("service").description("service keys (sk-...)");
  service
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", path(o, "service-keys"));
        output(g.json, r, () => printTable(r.data, ["id", "name", "key_prefix", "permissions", "created_at"], "service keys"));
      }),
    );
  service
    .command("create <name>")
    .option("--project <id>", PROJECT_HELP)
    .option("--permissions <list>", "scope the key (e.g. locks.manage,functions.invoke); omit for the full service role")
    .action(
      act(async (c, g, name: string, o: { project: string; permissions?: string }) => {
        const r = await c.request("POST", path(o, "service-keys"), { name, ...(o.permissions ? { permissions: csv(o.permissions) } : {}) });
        output(g.json, r, () => {
          printObject(r);
          console.error("Store the key now: it is not shown again.");
        });
      }),
    );
  service
    .command("update <keyId>")
    .option("--project <id>", PROJECT_HELP)
    .option("--name <name>")
    .option("--permissions <list>", "new permissions; 'full' restores the full service role")
    .action(
      act(async (c, g, id: string, o: { project: string; name?: string; permissions?: string }) => {
        const body: Record<string, unknown> = {};
        if (o.name) body.name = o.name;
        if (o.permissions) body.permissions = o.permissions === "full" ? null : csv(o.permissions);
        const r = await c.request("PATCH", `${path(o, "service-keys")}/${encodeURIComponent(id)}`, body);
        output(g.json, r, () => printObject(r));
      }),
    );
  service
    .command("delete <keyId>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, id: string, o: { project: string }) => {
        await c.request("DELETE", `${path(o, "service-keys")}/${encodeURIComponent(id)}`);
        output(g.json, { deleted: id }, () => console.log(`Deleted ${id}`));
      }),
    );

  const anon = keys.command("anon").description("anon keys (ak-...)");
  anon
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", path(o, "anon-keys"));
        output(g.json, r, () => printTable(r.data, ["id", "name", "key", "permissions", "created_at"], "anon keys"));
      }),
    );
  anon
    .command("create <name>")
    .option("--project <id>", PROJECT_HELP)
    .option("--permissions <list>", "e.g. functions.invoke")
    .action(
      act(async (c, g, name: string, o: { project: string; permissions?: string }) => {
        const r = await c.request("POST", path(o, "anon-keys"), { name, ...(o.permissions ? { permissions: csv(o.permissions) } : {}) });
        output(g.json, r, () => printObject(r));
      }),
    );
  anon
    .command("delete <keyId>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, id: string, o: { project: string }) => {
        await c.request("DELETE", `${path(o, "anon-keys")}/${encodeURIComponent(id)}`);
        output(g.json, { deleted: id }, () => console.log(`Deleted ${id}`));
      }),
    );
}
