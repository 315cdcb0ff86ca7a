import type { Command } from "commander";
import { archiveOf } from "./functions";
import { ApiError, type Client } from "../client";
import { emptyLine, formatDuration, output, printObject, printTable, tableLines } from "../output";
import { act, qs, requireProject, stopOnSignals, PROJECT_HELP } from "./shared";

// `kiln durable`: durable functions (docs/durable-functions.md) and their executions. Everything goes
// through the management API with the CLI's own credential (platform or full project token), so
// executions are started on the project route: POST /projects/{pid}/durable-functions/{fid}/executions.

interface DurableFunction {
  id: string;
  name: string;
  status: string;
  runtime: string;
  handler: string;
  pending_deployment_id?: string;
}

interface Step {
  name: string;
  type: "run" | "sleep";
  status: "completed" | "failed" | "retrying" | "sleeping";
  attempts: number;
  started_at: string | null;
  finished_at: string | null;
  output: unknown;
  error: string | null;
  wake_at: string | null;
}

interface Execution {
  id: string;
  durable_function_id: string;
  status: "queued" | "running" | "sleeping" | "completed" | "failed" | "stopped";
  input: unknown;
  output: unknown;
  error: string | null;
  steps: Step[];
  rerun_of: string | null;
  wake_at: string | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

const FINISHED = new Set(["completed", "failed", "stopped"]);
const STATUSES = ["queued", "running", "sleeping", "completed", "failed", "stopped"];

const collection = (project: string) => `/projects/${encodeURIComponent(project)}/durable-functions`;

/** A durable function of the project by name or id (every page of the list is looked at). */
export async function findDurable(c: Client, project: string, nameOrId: string): Promise<DurableFunction> {
  for (let page = 1; ; page++) {
    const list = await c.request<{ data: DurableFunction[]; total: number }>("GET", `${collection(project)}?page=${page}&limit=100`);
    const fn = list.data.find((f) => f.name === nameOrId || f.id === nameOrId);
    if (fn) return fn;
    if (list.data.length < 100 || page * 100 >= list.total) throw new ApiError(404, { error: "durable function not found" });
  }
}

function parseInput(v: string | undefined): { input?: unknown } {
  if (v === undefined) return {};
  try {
    return { input: JSON.parse(v) };
  } catch {
    throw new Error("--input must be JSON, e.g. --input '{\"order\": 42}'");
  }
}

function interval(v: string | undefined): number {
  const n = Number(v ?? 500);
  if (!Number.isFinite(n) || n < 50) throw new Error("--interval must be a number of milliseconds, at least 50");
  return n;
}

// --- rendering -----------------------------------------------------------------------------------

const cellOf = (v: unknown) => (v === null || v === undefined ? "-" : String(v));

function short(v: unknown, max = 60): string {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

function stepRows(steps: Step[]) {
  return steps.map((s, i) => ({
    n: i + 1,
    name: s.name,
    type: s.type,
    status: s.status,
    attempts: s.type === "sleep" ? "-" : s.attempts,
    started_at: s.started_at,
    finished_at: s.finished_at,
    took: s.started_at && s.finished_at ? formatDuration(Date.parse(s.finished_at) - Date.parse(s.started_at)) : null,
    output:
      s.status === "completed"
        ? s.type === "sleep"
          ? null
          : short(s.output ?? null)
        : s.status === "sleeping"
          ? `until ${s.wake_at}`
          : s.status === "retrying"
            ? short(`${s.error}; next attempt at ${s.wake_at}`, 100)
            : short(s.error ?? "", 100),
  }));
}

/** The execution as people read it: its fields, then its steps as a table. */
export function executionLines(e: Execution, fn?: { name: string }): string[] {
  const status = e.wake_at && (e.status === "sleeping" || e.status === "queued") ? `${e.status} (until ${e.wake_at})` : e.status;
  const fields: [string, unknown][] = [
    ["execution", e.id],
    ["function", fn ? `${fn.name} (${e.durable_function_id})` : e.durable_function_id],
    ["status", status],
    ["input", short(e.input ?? null, 200)],
    ["output", e.status === "completed" ? short(e.output ?? null, 200) : null],
    ["error", e.error],
    ["rerun_of", e.rerun_of],
    ["created_at", e.created_at],
    ["finished_at", e.finished_at],
  ];
  const width = Math.max(...fields.map(([k]) => k.length));
  const lines = fields.map(([k, v]) => `${k.padEnd(width)}  ${cellOf(v)}`);
  lines.push("");
  if (!e.steps.length) lines.push(emptyLine("steps yet"));
  else lines.push(...tableLines(stepRows(e.steps), ["n", "name", "type", "status", "attempts", "started_at", "finished_at", "took", "output"], ["#", "STEP", "TYPE", "STATUS", "ATTEMPTS", "STARTED", "FINISHED", "TOOK", "OUTPUT / ERROR"]));
  return lines;
}

const LIST_COLUMNS = ["id", "status", "created_at", "finished_at", "wake_at", "error"];

function listLines(r: { data: Record<string, unknown>[]; total: number; page?: number }, shown: number): string[] {
  if (!r.data.length) return [emptyLine("executions")];
  const rows = r.data.map((x) => ({ ...x, error: x.error ? short(x.error, 80) : null }));
  const lines = tableLines(rows, LIST_COLUMNS);
  if (r.total > shown) lines.push(`(${r.data.length} of ${r.total}; see more with --page / --limit)`);
  return lines;
}

/**
 * Shows `render()`'s lines again whenever they change: in place on a terminal (the previous drawing
 * is erased), as a new block separated by a blank line when the output is a pipe or a file.
 */
class LiveView {
  private drawn = 0;
  private last: string | null = null;
  private readonly tty = Boolean(process.stdout.isTTY);

  draw(lines: string[]): void {
    const text = lines.join("\n");
    if (text === this.last) return;
    if (this.tty) {
      const cols = process.stdout.columns || 200;
      const rows = process.stdout.rows || 50;
      const fitted = lines.map((l) => (l.length > cols ? `${l.slice(0, cols - 1)}…` : l));
      // Up to the first line drawn and clear what follows (the whole screen if it scrolled away).
      const erase = this.drawn === 0 ? "" : this.drawn >= rows ? "\x1b[H\x1b[2J" : `\x1b[${this.drawn}F\x1b[J`;
      process.stdout.write(`${erase}${fitted.join("\n")}\n`);
      this.drawn = fitted.length;
    } else {
      process.stdout.write(`${this.last === null ? "" : "\n"}${text}\n`);
    }
    this.last = text;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Follows an execution until it finishes: a live table of its steps, or with --json one JSON line per
 * change (the last one is the finished execution). Exit status 1 when it failed or was stopped.
 */
async function watchExecution(c: Client, path: string, o: { json?: boolean; intervalMs: number; fn?: { name: string } }): Promise<Execution> {
  stopOnSignals(async () => {});
  const view = new LiveView();
  let lastJson = "";
  for (;;) {
    const e = await c.request<Execution>("GET", path);
    if (o.json) {
      const line = JSON.stringify(e);
      if (line !== lastJson) console.log(line);
      lastJson = line;
    } else view.draw(executionLines(e, o.fn));
    if (FINISHED.has(e.status)) {
      if (e.status !== "completed") process.exitCode = 1;
      return e;
    }
    await sleep(o.intervalMs);
  }
}

/** Waits for the end quietly; prints the finished execution as `get` does. */
async function waitExecution(c: Client, path: string, o: { json?: boolean; intervalMs: number; fn?: { name: string } }): Promise<void> {
  let e = await c.request<Execution>("GET", path);
  while (!FINISHED.has(e.status)) {
    await sleep(o.intervalMs);
    e = await c.request<Execution>("GET", path);
  }
  if (e.status !== "completed") process.exitCode = 1;
  output(o.json, e, () => console.log(executionLines(e, o.fn).join("\n")));
}

// --- commands ------------------------------------------------------------------------------------

export function durableCommand(program: Command): void {
  const cmd = program.command("durable").description("durable functions: deploy, start executions, follow their steps, stop and re-run them");
  const projectOption = (c: Command) => c.option("--project <id>", PROJECT_HELP);
  const fnPath = async (c: Client, o: { project?: string }, nameOrId: string) => {
    const project = requireProject(o);
    const fn = await findDurable(c, project, nameOrId);
    return { fn, path: `${collection(project)}/${encodeURIComponent(fn.id)}` };
  };

  projectOption(
    cmd
      .command("deploy <path>")
      .description("deploy a folder or a ZIP/tar.gz archive as a durable function (201 new, 200 a new deployment of an existing one)")
      .requiredOption("--name <name>")
      .requiredOption("--runtime <runtime>", "nodejs22.x, nodejs24.x, python3.10 … python3.14 …")
      .option("--handler <name>", "exported handler name (default handler)")
      .option("--wait", "wait until the deployment finishes"),
  ).action(
    act(async (c, g, path: string, o: { project?: string; name: string; runtime: string; handler?: string; wait?: boolean }) => {
      const base = collection(requireProject(o));
      const form = new FormData();
      form.set("name", o.name);
      form.set("runtime", o.runtime);
      if (o.handler) form.set("handler", o.handler);
      form.set("code", new Blob([new Uint8Array(await archiveOf(path))]), "code.tar.gz");
      let fn = await c.requestForm<DurableFunction>("POST", base, form);
      if (o.wait) {
        for (let i = 0; i < 3000 && (fn.status === "provisioning" || fn.pending_deployment_id); i++) {
          await sleep(200);
          fn = await c.request("GET", `${base}/${fn.id}`);
        }
        if (fn.status === "failed") {
          const deps = await c.request("GET", `${base}/${fn.id}/deployments`);
          throw new Error(`deployment failed: ${deps.data[0]?.error ?? "see kiln durable deployments"}`);
        }
      }
      output(g.json, fn, () => printObject(fn as unknown as Record<string, unknown>));
    }),
  );

  projectOption(cmd.command("list").description("the project's durable functions").option("--page <n>").option("--limit <n>")).action(
    act(async (c, g, o: { project?: string; page?: string; limit?: string }) => {
      const r = await c.request("GET", `${collection(requireProject(o))}${qs({ page: o.page ?? 1, limit: o.limit ?? 100 })}`);
      output(g.json, r, () => printTable(r.data, ["id", "name", "status", "runtime", "handler", "updated_at"], "durable functions"));
    }),
  );

  projectOption(cmd.command("get <name-or-id>").description("a durable function")).action(
    act(async (c, g, name: string, o: { project?: string }) => {
      const { path } = await fnPath(c, o, name);
      const r = await c.request("GET", path);
      output(g.json, r, () => printObject(r));
    }),
  );

  projectOption(cmd.command("deployments <name-or-id>").description("a durable function's deployments, newest first")).action(
    act(async (c, g, name: string, o: { project?: string }) => {
      const { path } = await fnPath(c, o, name);
      const r = await c.request("GET", `${path}/deployments`);
      output(g.json, r, () => printTable(r.data, ["id", "kind", "status", "runtime", "error", "created_at", "finished_at"], "deployments"));
    }),
  );

  projectOption(cmd.command("delete <name-or-id>").description("delete a durable function (its unfinished executions are stopped)")).action(
    act(async (c, g, name: string, o: { project?: string }) => {
      const { fn, path } = await fnPath(c, o, name);
      const r = await c.request("DELETE", path);
      output(g.json, r, () => console.log(`Deleting ${fn.name} (${r.status})`));
    }),
  );

  const follow = (c: Command) =>
    c
      .option("--wait", "wait until the execution finishes, then print it (exit status 1 if it failed or was stopped)")
      .option("--watch", "follow the execution's steps live until it finishes (exit status 1 if it failed or was stopped)")
      .option("--interval <ms>", "with --wait / --watch: how often to look, in milliseconds", "500");
  const started = async (c: Client, g: { json?: boolean }, fn: DurableFunction, path: string, r: { id: string }, o: { wait?: boolean; watch?: boolean; interval?: string }) => {
    const at = `${path}/executions/${encodeURIComponent(r.id)}`;
    if (o.watch) await watchExecution(c, at, { json: g.json, intervalMs: interval(o.interval), fn });
    else if (o.wait) await waitExecution(c, at, { json: g.json, intervalMs: interval(o.interval), fn });
    else output(g.json, r, () => printObject(r));
  };

  projectOption(
    follow(cmd.command("start <name-or-id>").description("start an execution (the project route, with the CLI's credential)").option("--input <json>", "the execution's input (any JSON), the handler's event")),
  ).action(
    act(async (c, g, name: string, o: { project?: string; input?: string; wait?: boolean; watch?: boolean; interval?: string }) => {
      const body = parseInput(o.input);
      const { fn, path } = await fnPath(c, o, name);
      const r = await c.request("POST", `${path}/executions`, body);
      await started(c, g, fn, path, r, o);
    }),
  );

  /** One execution with its steps (--watch: live until it finishes). */
  const showExecution = async (c: Client, g: { json?: boolean }, name: string, executionId: string, o: { project?: string; watch?: boolean; interval?: string }) => {
    const { fn, path } = await fnPath(c, o, name);
    const at = `${path}/executions/${encodeURIComponent(executionId)}`;
    if (o.watch) return void (await watchExecution(c, at, { json: g.json, intervalMs: interval(o.interval), fn }));
    const e = await c.request<Execution>("GET", at);
    output(g.json, e, () => console.log(executionLines(e, fn).join("\n")));
  };

  projectOption(
    cmd
      .command("executions <name-or-id> [execution-id]")
      .description("a durable function's executions, newest first; with an execution id, that execution and its steps")
      .option("--status <status>", `only executions in this status: ${STATUSES.join(", ")}`)
      .option("--page <n>")
      .option("--limit <n>", "executions per page", "20")
      .option("--watch", "keep the view live: the list until Ctrl-C, an execution until it finishes")
      .option("--interval <ms>", "with --watch: how often to look, in milliseconds", "500"),
  ).action(
    act(async (c, g, name: string, executionId: string | undefined, o: { project?: string; status?: string; page?: string; limit: string; watch?: boolean; interval?: string }) => {
      if (executionId) return showExecution(c, g, name, executionId, o);
      if (o.status && !STATUSES.includes(o.status)) throw new Error(`--status must be one of ${STATUSES.join(", ")}`);
      const { path } = await fnPath(c, o, name);
      const at = `${path}/executions${qs({ status: o.status, page: o.page, limit: o.limit })}`;
      const limit = Number(o.limit);
      if (!o.watch) {
        const r = await c.request("GET", at);
        return output(g.json, r, () => console.log(listLines(r, limit).join("\n")));
      }
      const every = interval(o.interval);
      stopOnSignals(async () => {});
      const view = new LiveView();
      let lastJson = "";
      for (;;) {
        const r = await c.request("GET", at);
        if (g.json) {
          const line = JSON.stringify(r);
          if (line !== lastJson) console.log(line);
          lastJson = line;
        } else view.draw(listLines(r, limit));
        await sleep(every);
      }
    }),
  );

  projectOption(
    cmd
      .command("execution <name-or-id> <execution-id>")
      .description("an execution and its steps: status, attempts, times, output")
      .option("--watch", "redraw it live until the execution finishes (exit status 1 if it failed or was stopped)")
      .option("--interval <ms>", "with --watch: how often to look, in milliseconds", "500"),
  ).action(act(async (c, g, name: string, executionId: string, o: { project?: string; watch?: boolean; interval?: string }) => showExecution(c, g, name, executionId, o)));

  projectOption(cmd.command("stop <name-or-id> <execution-id>").description("stop a queued, running or sleeping execution (409 once it has finished)")).action(
    act(async (c, g, name: string, executionId: string, o: { project?: string }) => {
      const { fn, path } = await fnPath(c, o, name);
      const e = await c.request<Execution>("POST", `${path}/executions/${encodeURIComponent(executionId)}/stop`);
      output(g.json, e, () => console.log(executionLines(e, fn).join("\n")));
    }),
  );

  projectOption(
    follow(
      cmd
        .command("rerun <name-or-id> <execution-id>")
        .description("start a new execution with the same input that reuses this one's journal before a step, and runs that step and the rest again")
        .requiredOption("--from-step <name>", "the first step to run again"),
    ),
  ).action(
    act(async (c, g, name: string, executionId: string, o: { project?: string; fromStep: string; wait?: boolean; watch?: boolean; interval?: string }) => {
      const { fn, path } = await fnPath(c, o, name);
      const r = await c.request("POST", `${path}/executions/${encodeURIComponent(executionId)}/rerun`, { from_step: o.fromStep });
      await started(c, g, fn, path, r, o);
    }),
  );
}
