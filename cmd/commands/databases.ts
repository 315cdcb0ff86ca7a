import { spawnSync } from "node:child_process";
import { createWriteStream, existsSync, openSync, readSync, closeSync, renameSync, rmSync, statSync } from "node:fs";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { ApiError, Client } from "../client";
import type { Command } from "commander";
import { formatBytes, output, printObject, printTable, tableLines } from "../output";
import { parseDuration } from "./clock";
import { act, appClient, csv, keyOption, requireProject, PROJECT_HELP, type KeyOptions } from "./shared";

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
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", base(o));
        output(g.json, r, () => printTable(r.data, ["database_name", "status", "region", "pg_version", "storage_bytes", "created_at"], "databases"));
      }),
    );
  db.command("create <name>")
    .option("--project <id>", PROJECT_HELP)
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
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("GET", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, r, () => printObject(r));
      }),
    );
  db.command("delete <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        await c.request("DELETE", `${base(o)}/${encodeURIComponent(name)}`);
        output(g.json, { deleted: name }, () => console.log(`Deleted ${name}`));
      }),
    );
  db.command("reset-password <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project: string }) => {
        const r = await c.request("POST", `${base(o)}/${encodeURIComponent(name)}/reset-password`);
        output(g.json, r, () => printObject(r));
      }),
    );
  db.command("lint <name>")
    .description("list tables without row-level security; flags those the anon key or end users can reach (exposed)")
    .option("--project <id>", PROJECT_HELP)
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
            "tables",
          );
          for (const t of r.exposed_tables as string[])
            console.log(`warning: ${t} has no row-level security, yet anonymous or authenticated may use it: every row is open to them (alter table ${t} enable row level security, or revoke)`);
        });
      }),
    );
  db.command("sql <name> <query>")
    .description("run one SQL statement through the SQL API (as the database's own role; read-only project tokens: a read-only transaction) and print its rows")
    .option("--project <id>", PROJECT_HELP)
    .option("--branch <branch>", "on this branch instead of the main database")
    .option("--param <value...>", "values of $1, $2 ... in order (text; PostgreSQL casts them)")
    .option("--max-rows <n>", "rows returned at most (default 1000, up to 10000)")
    .option("--timeout <duration>", "statement timeout, e.g. 5s (default 15s, at most 60s)")
    .action(
      act(async (c, g, name: string, query: string, o: { project: string; branch?: string; param?: string[]; maxRows?: string; timeout?: string }) => {
        const path = `${base(o)}/${encodeURIComponent(name)}${o.branch ? `/branches/${encodeURIComponent(o.branch)}` : ""}/sql`;
        let r;
        try {
          r = await c.request("POST", path, {
            query,
            ...(o.param ? { params: o.param } : {}),
            ...(o.maxRows ? { max_rows: Number(o.maxRows) } : {}),
            ...(o.timeout ? { timeout_ms: Math.round(parseDuration(o.timeout) * 1000) } : {}),
          });
        } catch (err) {
          throw sqlFailure(err, query);
        }
        output(g.json, r, () => {
          for (const n of r.notices as string[]) console.log(`NOTICE: ${n}`);
          if (r.columns.length) {
            const keys = r.columns.map((_: unknown, i: number) => `c${i}`);
            const rows = (r.rows as unknown[][]).map((row) => Object.fromEntries(row.map((v, i) => [keys[i], v])));
            if (rows.length) for (const l of tableLines(rows, keys, r.columns.map((col: { name: string }) => col.name))) console.log(l);
          }
          const count = `${r.row_count} row${r.row_count === 1 ? "" : "s"}`;
          console.log(`${r.command} (${count}${r.truncated ? "; truncated: more rows than --max-rows or 4 MiB" : ""}${r.read_only ? "; read-only, rolled back" : ""})`);
        });
      }),
    );
  db.command("psql <name>")
    .description("open psql on the database (extra arguments after -- go to psql)")
    .option("--project <id>", PROJECT_HELP)
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
        // What a user would otherwise find out by measuring: how many statements run at once.
        const v = await c.request("GET", "/databases/versions").catch(() => null);
        if (v?.engine?.kind) console.error(concurrencyBanner(name, v.engine.kind, v.runs));
        const res = spawnSync("psql", [url.toString(), ...extra], { stdio: "inherit" });
        if (res.error) throw new Error(`could not run psql (${res.error.message}); install the PostgreSQL client`);
        process.exitCode = res.status ?? 1;
      }),
    );
  dumpCommands(db, base);
  branchCommands(db, base);
  backupCommands(db, base);
  keyOption(
    db.command("query <name> <operation>").description("run the query API: select|insert|update|delete (--key: a service key or end-user access token)"),
    "service key (sk-...) or end-user access token (or KILN_SERVICE_KEY)",
  )
    .option("--branch <branch>", "run it on this branch of the database (service key or end-user token)")
    .requiredOption("--table <table>")
    .option("--select <columns>", "columns, comma-separated")
    .option("--filter <column=op:value...>", "filters (AND), e.g. qty=gte:5 name=ilike:a%")
    .option("--order <spec...>", "ordering: column[:desc][:nullsfirst|:nullslast]")
    .option("--limit <n>")
    .option("--offset <n>")
    .option("--values <json>", "insert/update values as a JSON object")
    .action(
      act(async (c, g, name: string, operation: string, o: KeyOptions & { branch?: string; table: string; select?: string; filter?: string[]; order?: string[]; limit?: string; offset?: string; values?: string }) => {
        const app = appClient(c, o, "the query API");
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
        const on = o.branch ? `${encodeURIComponent(name)}/branches/${encodeURIComponent(o.branch)}` : encodeURIComponent(name);
        const r = await app.request("POST", `/databases/${on}/query/${encodeURIComponent(operation)}`, body);
        output(g.json, r, () => {
          const cols = r.data.length ? Object.keys(r.data[0]) : [];
          if (r.data.length) printTable(r.data, cols, "rows");
          console.log(`(${r.count} row${r.count === 1 ? "" : "s"})`);
        });
      }),
    );
}

/** A lifetime in seconds from `3600`, `1h`, `7d`, `1w`. */
function ttlOf(v: string): number {
  const s = parseDuration(v);
  if (!Number.isInteger(s)) throw new Error(`--ttl must be a whole number of seconds, got ${s}`);
  return s;
}

/** Polls a branch until it is no longer provisioning. */
async function waitBranch(c: { request(m: string, p: string, b?: unknown): Promise<any> }, path: string, r: any): Promise<any> {
  for (let i = 0; i < 3000 && r.status === "provisioning"; i++) {
    await new Promise((res) => setTimeout(res, 100));
    r = await c.request("GET", path);
  }
  return r;
}

function branchCommands(db: Command, base: (o: { project?: string }) => string): void {
  const branch = db.command("branch").description("branches: copies of a database with their own connection string and a lifetime");
  const path = (o: { project?: string }, database: string, name?: string) =>
    `${base(o)}/${encodeURIComponent(database)}/branches${name ? `/${encodeURIComponent(name)}` : ""}`;
  branch
    .command("create <database> <name>")
    .description("fork the database as it is now (it keeps serving meanwhile)")
    .option("--project <id>", PROJECT_HELP)
    .option("--ttl <duration>", "lifetime: 3600 to 2592000 seconds, or 1h to 30d (default 7d)")
    .option("--wait", "wait until the branch is active")
    .action(
      act(async (c, g, database: string, name: string, o: { project: string; ttl?: string; wait?: boolean }) => {
        let r = await c.request("POST", path(o, database), { name, ...(o.ttl ? { ttl_seconds: ttlOf(o.ttl) } : {}) });
        if (o.wait) r = await waitBranch(c, path(o, database, name), r);
        output(g.json, r, () => printObject(r));
      }),
    );
  branch
    .command("list <database>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, o: { project: string }) => {
        const r = await c.request("GET", path(o, database));
        output(g.json, r, () => printTable(r.data, ["name", "status", "storage_bytes", "expires_at", "created_at"], "branches"));
      }),
    );
  branch
    .command("get <database> <name>")
    .description("the branch, with its connection string while active")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, name: string, o: { project: string }) => {
        const r = await c.request("GET", path(o, database, name));
        output(g.json, r, () => printObject(r));
      }),
    );
  branch
    .command("reset <database> <name>")
    .description("discard the branch's writes and fork it again from the database as it is now")
    .option("--project <id>", PROJECT_HELP)
    .option("--wait", "wait until the branch is active again")
    .action(
      act(async (c, g, database: string, name: string, o: { project: string; wait?: boolean }) => {
        let r = await c.request("POST", `${path(o, database, name)}/reset`);
        if (o.wait) r = await waitBranch(c, path(o, database, name), r);
        output(g.json, r, () => printObject(r));
      }),
    );
  branch
    .command("extend <database> <name>")
    .description("replace the branch's lifetime, counted from now (later resets use it too)")
    .option("--project <id>", PROJECT_HELP)
    .requiredOption("--ttl <duration>", "3600 to 2592000 seconds, or 1h to 30d")
    .action(
      act(async (c, g, database: string, name: string, o: { project: string; ttl: string }) => {
        const r = await c.request("PATCH", path(o, database, name), { ttl_seconds: ttlOf(o.ttl) });
        output(g.json, r, () => printObject(r));
      }),
    );
  branch
    .command("reset-password <database> <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, name: string, o: { project: string }) => {
        const r = await c.request("POST", `${path(o, database, name)}/reset-password`);
        output(g.json, r, () => printObject(r));
      }),
    );
  branch
    .command("delete <database> <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, name: string, o: { project: string }) => {
        const r = await c.request("DELETE", path(o, database, name));
        output(g.json, r, () => console.log(r.message));
      }),
    );
}

/** Polls a restore until it has ended. */
async function waitRestore(c: { request(m: string, p: string, b?: unknown): Promise<any> }, path: string, r: any): Promise<any> {
  for (let i = 0; i < 36_000 && (r.status === "pending" || r.status === "running"); i++) {
    await new Promise((res) => setTimeout(res, 100));
    r = await c.request("GET", path);
  }
  return r;
}

/** `--day` for weekly entries: 1-7 or a weekday's name. */
const WEEKDAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
function dayOf(v: string): number {
  const i = WEEKDAYS.indexOf(v.slice(0, 3).toLowerCase());
  return i >= 0 ? i + 1 : Number(v);
}

function backupCommands(db: Command, base: (o: { project?: string }) => string): void {
  const backup = db.command("backup").description("backups of a database (SUPERAGENT): manual, and scheduled by the backup schedule");
  const path = (o: { project?: string }, database: string, rest = "") => `${base(o)}/${encodeURIComponent(database)}${rest}`;
  backup
    .command("create <database> <name>")
    .description("take a backup now (names: lowercase letters, digits, _ and -; 'service-' is reserved)")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, name: string, o: { project: string }) => {
        const r = await c.request("POST", path(o, database, "/backups"), { name });
        output(g.json, r, () => printObject(r));
      }),
    );
  backup
    .command("list <database>")
    .description("backups, newest first, and the point-in-time restore window")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, o: { project: string }) => {
        const r = await c.request("GET", path(o, database, "/backups"));
        output(g.json, r, () => {
          printTable(r.data, ["name", "source", "size_bytes", "created_at", "expires_at"], "backups");
          if (r.restore_window) console.log(`restore window: ${r.restore_window.earliest_restore_at} to ${r.restore_window.latest_restore_at}`);
        });
      }),
    );
  backup
    .command("delete <database> <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, name: string, o: { project: string }) => {
        const r = await c.request("DELETE", path(o, database, `/backups/${encodeURIComponent(name)}`));
        output(g.json, r, () => console.log(r.message));
      }),
    );
  backup
    .command("schedule <database>")
    .description("show the backup schedule; with --entry (repeatable) or --clear, replace it")
    .option("--project <id>", PROJECT_HELP)
    .option(
      "--entry <spec...>",
      "frequency@hour[:day][/retention]: daily@3, weekly@0:sun/7d, monthly@23:28 (hours UTC; retention defaults to the plan's)",
    )
    .option("--clear", "no automated backups")
    .action(
      act(async (c, g, database: string, o: { project: string; entry?: string[]; clear?: boolean }) => {
        let r;
        if (o.entry || o.clear) {
          const entries = (o.entry ?? []).map((spec) => {
            const m = /^(daily|weekly|monthly)@(\d{1,2})(?::([a-z0-9]+))?(?:\/(.+))?$/i.exec(spec);
            if (!m) throw new Error(`--entry takes frequency@hour[:day][/retention] (e.g. weekly@3:mon/14d), got '${spec}'`);
            return {
              frequency: m[1]!.toLowerCase(),
              hour: Number(m[2]),
              ...(m[3] ? { day: dayOf(m[3]) } : {}),
              ...(m[4] ? { retention_seconds: ttlOf(m[4]) } : {}),
            };
          });
          r = await c.request("PUT", path(o, database, "/backup-schedule"), { entries });
        } else r = await c.request("GET", path(o, database, "/backup-schedule"));
        output(g.json, r, () => printTable(r.entries, ["frequency", "hour", "day", "retention_seconds", "next_run_at"], "automated backups"));
      }),
    );
  db.command("restore <database> [file]")
    .description(
      "with <file>: load a dump (kiln db dump) into the database with your psql (plain SQL) or pg_restore (custom format), through its connection string; " +
        "with --backup or --to: restore the database in place (destructive: what was written after the backup or instant is gone); its connection string stays",
    )
    .option("--project <id>", PROJECT_HELP)
    .option("--backup <name>", "from this backup")
    .option("--to <instant>", "to this RFC 3339 instant, inside the restore window")
    .option("--no-wait", "return once the restore is accepted")
    .option("--pg-bin <dir>", "with <file>: folder of the psql and pg_restore to use (default: PATH)")
    .action(
      act(async (c, g, database: string, file: string | undefined, o: { project: string; backup?: string; to?: string; wait: boolean; pgBin?: string }) => {
        if (file !== undefined) {
          if (o.backup || o.to) throw new Error("give a dump file or --backup/--to, not both");
          return loadDump(c, g, `/projects/${encodeURIComponent(requireProject(o))}/databases/${encodeURIComponent(database)}`, database, file, o.pgBin);
        }
        if (!o.backup === !o.to) throw new Error("give exactly one of --backup <name> or --to <instant>, or a dump file");
        let r = await c.request("POST", path(o, database, "/restores"), o.backup ? { backup_name: o.backup } : { restore_to: o.to });
        if (o.wait) r = await waitRestore(c, path(o, database, `/restores/${encodeURIComponent(r.id)}`), r);
        output(g.json, r, () => printObject(r));
        if (o.wait && r.status !== "completed") process.exitCode = 1;
      }),
    );
  db.command("restores <database>")
    .description("restore history, newest first")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, database: string, o: { project: string }) => {
        const r = await c.request("GET", path(o, database, "/restores"));
        output(g.json, r, () => printTable(r.data, ["id", "kind", "status", "backup_name", "restore_to", "completed_at", "error"], "restores"));
      }),
    );
}

/**
 * `kiln db dump`: Kiln runs a pg_dump of the database's own version (GET .../dump) and the CLI writes
 * the stream to a file (or stdout). `kiln db restore`: the user's own psql (plain) or pg_restore
 * (custom) loads a dump through the database's connection string, so nothing is uploaded to Kiln.
 */
function dumpCommands(db: Command, base: (o: { project?: string }) => string): void {
  db.command("dump <name>")
    .description("dump the database with a pg_dump of its own PostgreSQL version (custom: for pg_restore; plain: SQL for psql)")
    .option("--project <id>", PROJECT_HELP)
    .option("--format <format>", "custom or plain", "custom")
    .option("-o, --output <file>", "where to write it (default <name>.dump or <name>.sql; - for stdout)")
    .action(
      act(async (c, g, name: string, o: { project: string; format: string; output?: string }) => {
        if (o.format !== "custom" && o.format !== "plain") throw new Error(`--format takes custom or plain, got '${o.format}'`);
        const res = await c.send("GET", `${base(o)}/${encodeURIComponent(name)}/dump?format=${o.format}`);
        if (!res.ok || !res.body) throw await Client.apiError(res);
        const file = o.output ?? `${name}.${o.format === "custom" ? "dump" : "sql"}`;
        if (file === "-") {
          await pipeline(Readable.fromWeb(res.body as unknown as import("node:stream/web").ReadableStream), process.stdout);
          return;
        }
        // Written beside the target and renamed at the end: a cut-off download never passes for a dump.
        const part = `${file}.part`;
        try {
          await pipeline(Readable.fromWeb(res.body as unknown as import("node:stream/web").ReadableStream), createWriteStream(part));
        } catch (err) {
          rmSync(part, { force: true });
          throw new Error(`the dump was cut off: ${(err as Error).message}`);
        }
        const size = statSync(part).size;
        const expected = Number(res.headers.get("x-kiln-dump-bytes") ?? Number.NaN);
        if (Number.isFinite(expected) && expected !== size) {
          rmSync(part, { force: true });
          throw new Error(`the dump was cut off: ${size} of ${expected} bytes arrived`);
        }
        renameSync(part, file);
        const version = res.headers.get("x-kiln-pg-version");
        output(g.json, { file, format: o.format, size_bytes: size, pg_version: Number(version) }, () =>
          console.log(`Wrote ${file} (${o.format}, ${formatBytes(size)}, PostgreSQL ${version}); restore it with: kiln db restore <database> ${file}`),
        );
      }),
    );
}

/** Loads a dump through the database's connection string with the user's own psql or pg_restore: nothing is uploaded to Kiln. */
async function loadDump(c: Client, g: { json?: boolean }, path: string, name: string, file: string, pgBin?: string): Promise<void> {
  if (!existsSync(file)) throw new Error(`no such file: ${file}`);
  const r = await c.request("GET", path);
  if (!r.connection_string) throw new Error(`the database is ${r.status}; wait until it is active`);
  const custom = isCustomDump(file);
  const tool = (t: string) => (pgBin ? `${pgBin}/${t}` : t);
  // Objects get the database's role as owner; one transaction, stopped at the first error: all or nothing.
  const cmd = custom
    ? [tool("pg_restore"), "--no-owner", "--exit-on-error", "--single-transaction", "--dbname", r.connection_string, file]
    : [tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-f", file, r.connection_string];
  const res = spawnSync(cmd[0]!, cmd.slice(1), { stdio: ["ignore", g.json ? "ignore" : "inherit", "inherit"] });
  if (res.error) throw new Error(`could not run ${cmd[0]} (${res.error.message}); install the PostgreSQL client or pass --pg-bin`);
  if (res.status !== 0)
    throw new Error(
      `${cmd[0]!.split("/").pop()} failed (exit ${res.status}); nothing was loaded${custom ? "; a custom-format dump needs a pg_restore as new as the pg_dump that made it (see GET /databases/versions)" : ""}`,
    );
  output(g.json, { restored: file, database: name, format: custom ? "custom" : "plain" }, () => console.log(`Restored ${file} into ${name}`));
}

/** pg_dump's custom format starts with PGDMP; anything else is taken for SQL. */
function isCustomDump(file: string): boolean {
  const fd = openSync(file, "r");
  try {
    const head = Buffer.alloc(5);
    readSync(fd, head, 0, 5, 0);
    return head.toString("latin1") === "PGDMP";
  } finally {
    closeSync(fd);
  }
}

/** The line `kiln db psql` prints first (stderr): what runs the database, and how many statements at once. */
export function concurrencyBanner(name: string, engine: string, runs: number | null): string {
  return engine === "embedded"
    ? `kiln: ${name} runs on the embedded engine (PGlite, PostgreSQL ${runs ?? "?"}): one statement at a time per database; other connections wait their turn, and a transaction holds the database until it ends. For a server with real concurrency, start Kiln with --postgres-url.`
    : `kiln: ${name} runs on PostgreSQL ${runs ?? "?"} (--postgres-url): each connection has its own server session; statements run concurrently.`;
}

/** PostgreSQL's error with its SQLSTATE, and a caret under the position it points at (as psql shows it). */
function sqlFailure(err: unknown, query: string): unknown {
  if (!(err instanceof ApiError) || err.status !== 400) return err;
  const b = err.body as { error?: string; code?: string; position?: number; hint?: string; detail?: string };
  if (!b?.code) return err;
  const lines = [`${b.error} (SQLSTATE ${b.code})`];
  if (b.position) {
    const before = query.slice(0, b.position - 1);
    const lineNo = before.split("\n").length;
    const line = query.split("\n")[lineNo - 1] ?? "";
    const col = before.length - before.lastIndexOf("\n") - 1;
    lines.push(`LINE ${lineNo}: ${line}`, `${" ".repeat(`LINE ${lineNo}: `.length + col)}^`);
  }
  if (b.detail) lines.push(`DETAIL: ${b.detail}`);
  if (b.hint) lines.push(`HINT: ${b.hint}`);
  return new ApiError(err.status, { ...b, error: lines.join("\n") });
}
