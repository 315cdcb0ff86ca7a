import type { Command } from "commander";
import type { Client } from "../client";
import { emptyLine, formatBytes, formatDuration, output, printTable } from "../output";
import { findFunction } from "./functions";
import { openTail, type Entry } from "./log-stream";
import { readEvents } from "../../server/logs/sse-reader";
import { act, csv, currentProject, qs, requireProject, stopOnSignals, PROJECT_HELP } from "./shared";

/** One line per entry, as `tail` shows files: time, level, function, message. */
function printEntry(e: Entry): void {
  const body = typeof e.body === "string" ? e.body : JSON.stringify(e.body);
  console.log(`${e.timestamp}  ${e.level.padEnd(5)}  ${e.resource.name}  ${body}`);
}

export function logsCommand(program: Command): void {
  program
    .command("logs")
    .description("search a project's function logs (newest last), or follow them live with --follow")
    .option("--project <id>", PROJECT_HELP)
    .option("--function <name-or-id>", "only this function's lines")
    .option("-q, --query <q>", 'query: words, "phrases", level:(error OR warn), invocation.id:..., region:..., -negation')
    .option("--build <deployment-id>", "the build lines of this deployment (with --function)")
    .option("--since <time>", "RFC 3339: lines at or after")
    .option("--until <time>", "RFC 3339: lines at or before")
    .option("--limit <n>", "lines to show (with --follow: stored lines first)", "100")
    .option("-f, --follow", "keep printing new lines as they are logged (Ctrl-C stops)")
    .action(
      act(async (c, g, o: { project: string; function?: string; query?: string; build?: string; since?: string; until?: string; limit: string; follow?: boolean }) => {
        const project = requireProject(o);
        const fn = o.function ? await findFunction(c, project, o.function) : null;
        const limit = Number(o.limit);
        if (o.follow) return follow(c, g.json, project, { fn: fn?.id, q: o.query, build: o.build, since: o.since, until: o.until, backlog: limit });
        const r = await c.request("POST", `/projects/${encodeURIComponent(project)}/logs/search`, {
          resource: { type: "function", ...(fn ? { ids: [fn.id] } : {}), ...(o.build ? { deployments: { ids: [o.build] } } : {}) },
          ...(o.query ? { q: o.query } : {}),
          ...(o.since ? { start_time: o.since } : {}),
          ...(o.until ? { end_time: o.until } : {}),
          limit,
        });
        output(g.json, r, () => {
          if (!r.data.length) console.log(emptyLine("log lines"));
          for (const e of [...(r.data as Entry[])].reverse()) printEntry(e);
          if (r.has_more) console.error(`kiln: older lines exist (raise --limit, or narrow with -q / --since)`);
        });
      }),
    );
}

async function follow(c: Client, json: boolean | undefined, project: string, o: { fn?: string; q?: string; build?: string; since?: string; until?: string; backlog: number }): Promise<void> {
  const ctl = new AbortController();
  stopOnSignals(async () => ctl.abort());
  const res = await openTail(c, project, o, ctl.signal);
  try {
    await readEvents(res, (name, data) => {
      if (name === "log") {
        if (json) console.log(data);
        else printEntry(JSON.parse(data) as Entry);
      } else if (name === "dropped") console.error(`kiln: ${(JSON.parse(data) as { count: number }).count} lines were skipped (the terminal read slower than they came)`);
      else if (name === "error") console.error(`kiln: ${(JSON.parse(data) as { error: string }).error}`);
    });
  } catch (err) {
    if (!ctl.signal.aborted) throw err;
  }
}

/** A metric's value as people read it: 401 ms, 1.0 GiB, 99.5 %, 12 (a count). */
function withUnit(v: number | null, unit: string): string {
  if (v === null || v === undefined) return "-";
  if (unit === "ms" || unit === "milliseconds") return formatDuration(v);
  if (unit === "bytes") return formatBytes(v);
  if (unit === "percent" || unit === "%") return `${Number(v.toFixed(2))} %`;
  if (unit === "ratio") return `${Number((v * 100).toFixed(2))} %`;
  return `${Number.isInteger(v) ? v : Number(v.toFixed(3))}${unit && unit !== "count" ? ` ${unit}` : ""}`;
}

const METRIC_NAMES = ["request_count", "server_error_count", "availability", "p95_latency"];

export function metricsCommand(program: Command): void {
  program
    .command("metrics")
    .description("a project's runtime metrics over a window ending at the last completed minute")
    .option("--project <id>", PROJECT_HELP)
    .option("--window <w>", "30m, 1h, 24h or 7d", "1h")
    .option("--metric <names>", `comma-separated: ${METRIC_NAMES.join(", ")}`, METRIC_NAMES.join(","))
    .option("--group-by <dimension>", "region or resource_type")
    .action(
      act(async (c, g, o: { project: string; window: string; metric: string; groupBy?: string }) => {
        const queries = csv(o.metric).map((metric) => ({ id: metric, metric, ...(o.groupBy ? { group_by: o.groupBy } : {}) }));
        const r = await c.request("POST", `/projects/${encodeURIComponent(requireProject(o))}/metrics/query`, { time_range: { window: o.window }, queries });
        output(g.json, r, () => {
          console.log(`window ${r.window.from} to ${r.window.to} (fresh through ${r.fresh_through})`);
          const rows = r.results.flatMap((x: any) =>
            x.values.length
              ? x.values.map((v: any) => ({ metric: x.metric, status: x.data_status, dimensions: Object.entries(v.dimensions).map(([k, d]) => `${k}=${d}`).join(",") || "-", value: withUnit(v.value, x.unit) }))
              : [{ metric: x.metric, status: x.data_status, dimensions: "-", value: "-" }],
          );
          printTable(rows, ["metric", "status", "dimensions", "value"], "metrics");
        });
      }),
    );
}

export function usageCommand(program: Command): void {
  program
    .command("usage")
    .description("a project's usage in a month (default the current one)")
    .option("--project <id>", PROJECT_HELP)
    .option("--month <yyyy-mm>")
    .option("--daily", "also print each day's figures")
    .action(
      act(async (c, g, o: { project: string; month?: string; daily?: boolean }) => {
        const r = await c.request("GET", `/projects/${encodeURIComponent(requireProject(o))}/usage${qs({ month: o.month })}`);
        output(g.json, r, () => {
          console.log(`usage of ${r.month}`);
          printTable(r.metrics, ["metric", "total", "all_time"], "usage metrics");
          printTable(r.frontends, ["frontend_name", "frontend_id", "requests"], "frontend requests");
          if (o.daily) {
            const days = r.metrics[0].daily.map((d: any, i: number) => Object.fromEntries([["day", d.timestamp.slice(0, 10)], ...r.metrics.map((m: any) => [m.metric, m.daily[i].value])]));
            printTable(days, ["day", ...r.metrics.map((m: any) => m.metric)], "days");
          }
        });
      }),
    );
}

export function deploymentsCommand(program: Command): void {
  program
    .command("deployments")
    .description("deployments across your projects, newest first")
    .option("--project <id>", "only this project's (default: KILN_PROJECT, else the one `kiln use` remembers)")
    .option("--all-projects", "every project's, even with a current project")
    .option("--page <n>")
    .option("--limit <n>", "per page (at most 100)", "20")
    .action(
      act(async (c, g, o: { project?: string; allProjects?: boolean; page?: string; limit: string }) => {
        const project = o.allProjects ? undefined : currentProject(o)?.id;
        const r = await c.request("GET", `/deployments${qs({ project_id: project, page: o.page, limit: o.limit })}`);
        output(g.json, r, () => {
          printTable(
            r.data.map((d: any) => ({ ...d, function: d.resource.name })),
            ["id", "project_id", "function", "kind", "status", "created_at", "finished_at", "error"],
            "deployments",
          );
          if (r.has_more) console.error(`kiln: more on the next page (--page ${r.page + 1})`);
        });
      }),
    );
}
