import { spawnSync } from "node:child_process";
import type { Command } from "commander";
import { output, printObject, printTable } from "../output";
import { act, csv, requireProject } from "./shared";

/** `col=op:value`, e.g. `qty=gte:5`, `tag=is:null`, `name=in:a,b`. Numbers and null/true/false are typed. */
export function parseFilter(spec: string): { column: string; operator: string; value: unknown } {
  const m = /^([^=]+)=([a-z]+):(.*)$/s.exec(spec);
  if (!m) throw new Error(`--filter takes column=operator:value (e.g. qty=gte:5), got '${spec}'`);
  const [, column, operator, raw] = m as unknown as [string, string, string, string];
  const typed = (v: string): unknown => (v === "null" ? null : v === "true" ? true : v === "false" ? false : v !== "" && !Number.isNaN(Number(v)) ? Number(v) : v);
  return { column, operator, value: operator === "in" ? csv(raw).map(typed) : typed(raw) };
}

export function databasesCommand(program: Command): void {
  const db = program.command("db").description("managed PostgreSQL databases");
  const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/databases`;
  db.command("list")
    .requiredOption("--project <id>")
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", base(o));
        output(g.json, r, () => printTable(r.data, ["database_name", "status", "region", "pg_version", "storage_bytes", "created_at"]));
      }),
    );
  db.command("create <name>")
    .requiredOption("--project <id>")
    .option("--region <region>")
    .option("--pg-version <v>")
    .option("--wait", "wait until the database is active")
    .action(
      act(async (c, g, name: string, o: { project: string; region?: string; pgVersion?: string; wait?: boolean }) => {
        let r = await c.request("POST", base(o), { name, ...(o.region ? { region: o.region } : {}), ...(o.pgVersion ? { pg_version: Number(o.pgVersion) } : {}) });
        if (o.wait) {
          for (let i = 0; i < 600 && r.status === "provisioning"; i++) {
            await new Promise((res) => setTimeout(res, 100));
            r = { ...r, ...(await c.request("GET", `${base(o)}/${encodeURIComponent(r.database_name)}`)) };
          }
        }
        output(g.json, r, () => printObject(r));
      }),
    );
  db.command("get <name>")
    .requiredOption("--project <id>")
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, r, () => printObject(r));
      }),
    );
  db.command("delete <name>")
    .requiredOption("--project <id>")
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        await c.request("DELETE", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, { deleted: name }, () => console.log(`Deleted ${name}`));
      }),
    );
  db.command("reset-password <name>")
    .requiredOption("--project <id>")
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("POST", `${base(o)}/${encodeURIComponent(name)}/reset-password`);
        output(g.json, r, () => printObject(r));
      }),
    );
  db.command("lint <name>")
    .description("list tables without row-level security; flags those the anon key or end users can reach (exposed)")
    .requiredOption("--project <id>")
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(name)}/lint`);
        output(g.json, r, () => {
          if (r.tables_without_rls.length === 0) return console.log("Every table has row-level security enabled.");
          printTable(
            r.tables_without_rls.map((t: { schema: string; name: string; kind: string; anonymous: string[]; authenticated: string[]; exposed: boolean }) => ({
              ...t,
              table: `${t.schema}.${t.name}`,
              exposed: t.exposed ? "EXPOSED" : "no",
            })),
            ["table", "kind", "anonymous", "authenticated", "exposed"],
          );
          for (const t of r.exposed_tables as string[])
            console.log(`warning: ${t} has no row-level security, yet anonymous or authenticated may use it: every row is open to them (alter table ${t} enable row level security, or revoke)`);
        });
      }),
    );
  db.command("psql <name>")
    .description("open psql on the database (extra arguments after -- go to psql)")
    .requiredOption("--project <id>")
    .option("--as-user <userId>", "run under row-level security as this end user")
    .allowUnknownOption()
    .allowExcessArguments()
    .action(
      act(async (c, _g, name: string, o: { project: string; asUser?: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(name)}`);
        if (!r.connection_string) throw new Error(`the database is ${r.status}; wait until it is active`);
        const url = new URL(r.connection_string);
        if (o.asUser) url.searchParams.set("application_name", `service_user_access:${o.asUser}`);
        const dd = process.argv.indexOf("--");
        const extra = dd >= 0 ? process.argv.slice(dd + 1) : [];
        const res = spawnSync("psql", [url.toString(), ...extra], { stdio: "inherit" });
        if (res.error) throw new Error(`could not run psql (${res.error.message}); install the PostgreSQL client`);
        process.exitCode = res.status ?? 1;
      }),
    );
  db.command("query <name> <operation>")
    .description("run the query API: select|insert|update|delete")
    .option("--key <key>", "service key (sk-...) or end-user access token (or KILN_SERVICE_KEY)")
    .requiredOption("--table <table>")
    .option("--select <columns>", "columns, comma-separated")
    .option("--filter <column=op:value...>", "filters (AND), e.g. qty=gte:5 name=ilike:a%")
    .option("--order <spec...>", "ordering: column[:desc][:nullsfirst|:nullslast]")
    .option("--limit <n>")
    .option("--offset <n>")
    .option("--values <json>", "insert/update values as a JSON object")
    .action(
      act(async (c, g, name: string, operation: string, o: { key?: string; table: string; select?: string; filter?: string[]; order?: string[]; limit?: string; offset?: string; values?: string }) => {
        const key = o.key ?? process.env.KILN_SERVICE_KEY;
        if (!key) throw new Error("the query API needs --key <service key or end-user token> (or KILN_SERVICE_KEY); platform tokens are not accepted");
        const body: Record<string, unknown> = { table: o.table };
        if (o.select) body.select = csv(o.select);
        if (o.filter) body.filters = o.filter.map(parseFilter);
        if (o.order)
          body.order = o.order.map((s) => {
            const [column, ...flags] = s.split(":");
            return { column, ascending: !flags.includes("desc"), ...(flags.includes("nullsfirst") ? { nulls_first: true } : flags.includes("nullslast") ? { nulls_first: false } : {}) };
          });
        if (o.limit) body.limit = Number(o.limit);
        if (o.offset) body.offset = Number(o.offset);
        if (o.values) {
          try {
            body.values = JSON.parse(o.values);
          } catch {
            throw new Error("--values must be a JSON object");
          }
        }
        const { Client } = await import("../client");
        const r = await new Client(c.url, key).request("POST", `/databases/${encodeURIComponent(name)}/query/${encodeURIComponent(operation)}`, body);
        output(g.json, r, () => {
          const cols = r.data.length ? Object.keys(r.data[0]) : [];
          printTable(r.data, cols);
          console.log(`(${r.count} row${r.count === 1 ? "" : "s"})`);
        });
      }),
    );
}
