import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { Client } from "../client";
import { CliError, printError } from "../errors";
import { act, PROJECT_HELP, qs, requireProject } from "./shared";

interface Report {
  results: Array<{ section: string; name?: string; action: string; notice?: string }>;
  skipped: Array<{ type: string; name: string; reason: string }>;
  missing: Array<{ type: string; name: string }>;
  summary: Record<"created" | "updated" | "deleted" | "unchanged" | "errors" | "skipped" | "missing", number>;
}

const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/config`;

/** The manifest file (or standard input for `-`) and the content type its name says. */
function readManifest(file: string): { text: string; type: string } {
  let text: string;
  try {
    text = readFileSync(file === "-" ? 0 : file, "utf8");
  } catch (err) {
    throw new CliError(`cannot read ${file}: ${(err as Error).message}`, "give the path of a manifest made by `kiln config export`, or - for standard input");
  }
  const type = /\.json$/i.test(file) ? "application/json" : /\.ya?ml$/i.test(file) ? "application/yaml" : text.trimStart().startsWith("{") ? "application/json" : "application/yaml";
  return { text, type };
}

async function put(c: Client, o: { project?: string }, file: string, dryRun: boolean): Promise<Report> {
  const path = base(o);
  const { text, type } = readManifest(file);
  const res = await c.send("PUT", path + qs({ dry_run: dryRun || undefined }), { headers: { "Content-Type": type }, body: text });
  if (!res.ok) {
    const err = await Client.apiError(res);
    const errors = (err.body as { errors?: Array<{ path: string; message: string }> } | undefined)?.errors;
    // A 422 lists every problem: all of them, one a line, rather than the first three in the message.
    if (errors?.length) throw new CliError(`${file} is not a valid manifest:\n${errors.map((e) => `  ${e.path || "(top level)"}: ${e.message}`).join("\n")}`, "fix these and run the command again (nothing was applied)");
    throw err;
  }
  return (await res.json()) as Report;
}

const MARK: Record<string, string> = { created: "+", updated: "~", deleted: "-", error: "!", unchanged: " " };

/** The report as a diff: one line per change (+ create, ~ update, - delete, ! error), then warnings and totals. */
function printReport(r: Report, o: { verbose?: boolean; dryRun: boolean }): void {
  for (const e of r.results) {
    if (e.action === "unchanged" && !o.verbose) continue;
    const what = `${e.section}${e.name !== undefined ? ` ${e.name}` : ""}`;
    const notice = e.action === "error" ? `: ${e.notice ?? "failed"}` : e.notice ? ` (${e.notice})` : "";
    console.log(`${MARK[e.action] ?? "?"} ${what}${notice}`);
  }
  for (const s of r.skipped) console.log(`  skipped ${s.type} ${s.name}: ${s.reason}`);
  for (const m of r.missing) console.log(`  not in the manifest: ${m.type} ${m.name} (left as it is)`);
  const s = r.summary;
  const verb = o.dryRun ? ["to create", "to update", "to delete"] : ["created", "updated", "deleted"];
  const parts = [[s.created, verb[0]], [s.updated, verb[1]], [s.deleted, verb[2]]].filter(([n]) => n).map(([n, v]) => `${n} ${v}`);
  const extra = [`${s.unchanged} unchanged`, ...(s.errors ? [`${s.errors} error${s.errors === 1 ? "" : "s"}`] : []), ...(s.skipped ? [`${s.skipped} skipped`] : []), ...(s.missing ? [`${s.missing} not in the manifest`] : [])].join("; ");
  if (parts.length === 0 && !s.errors) console.log(`No changes${o.dryRun ? ": the project matches the manifest" : ""} (${extra}).`);
  else console.log(`${parts.length ? parts.join(", ") : "Nothing changed"}; ${extra}.`);
}

export function configCommand(program: Command): void {
  const config = program.command("config").description("the project's configuration as code: export it, diff a manifest against it, apply one");
  config
    .command("export")
    .description("print the project's configuration manifest (JSON, or YAML with --yaml): kiln config export --yaml > kiln.yaml")
    .option("--project <id>", PROJECT_HELP)
    .option("--yaml", "YAML instead of JSON")
    .action(
      act(async (c, _g, o: { project?: string; yaml?: boolean }) => {
        const res = await c.send("GET", base(o) + qs({ format: o.yaml ? "yaml" : undefined }));
        if (!res.ok) throw await Client.apiError(res);
        process.stdout.write(await res.text());
      }),
    );
  config
    .command("diff <file>")
    .description("what applying the manifest would change (a dry run); exit 0 when nothing would, 1 when something would, 2 when the check failed")
    .option("--project <id>", PROJECT_HELP)
    .option("--verbose", "list unchanged entries too")
    // Its own usage errors (no file given, an unknown option) are "could not check" too: 2, never the 1 of a drift.
    .exitOverride((err) => {
      if (err.exitCode !== 0) Object.assign(err, { exitCode: 2 });
      throw err;
    })
    .action(async (file: string, o: { project?: string; verbose?: boolean }, cmd: Command) => {
      const g = cmd.optsWithGlobals() as { json?: boolean };
      let report: Report;
      try {
        await act(async (c) => void (report = await put(c, o, file, true)))(cmd);
      } catch (err) {
        printError(err, !!g.json);
        process.exit(2);
      }
      if (g.json) console.log(JSON.stringify(report!));
      else printReport(report!, { verbose: o.verbose, dryRun: true });
      const s = report!.summary;
      process.exitCode = s.created + s.updated + s.deleted + s.errors > 0 ? 1 : 0;
    });
  config
    .command("apply <file>")
    .description("apply the manifest (--dry-run: only report what would change); exit 1 when an entry failed")
    .option("--project <id>", PROJECT_HELP)
    .option("--dry-run", "report what would change; change nothing")
    .option("--verbose", "list unchanged entries too")
    .action(
      act(async (c, g, file: string, o: { project?: string; dryRun?: boolean; verbose?: boolean }) => {
        const report = await put(c, o, file, !!o.dryRun);
        if (g.json) console.log(JSON.stringify(report));
        else printReport(report, { verbose: o.verbose, dryRun: !!o.dryRun });
        if (report.summary.errors > 0) process.exitCode = 1;
      }),
    );
}
