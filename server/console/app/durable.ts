import { api, enc } from "./api";
import { button, confirmDialog, errorBox, h, json, slot, table, when } from "./dom";
import { listBase, pageOf, pager, projectPath } from "./projects";
import { go } from "./router";

const STATUSES = ["", "queued", "running", "sleeping", "completed", "failed", "stopped"];

/** Steps in journal order, each a bar on one time axis (started → finished, or → wake_at for a sleep). */
function timeline(e: any, rerun?: (step: string) => void): HTMLElement {
  const steps: any[] = e.steps ?? [];
  const t = (s: string | null | undefined) => (s ? Date.parse(s) : NaN);
  const start = t(e.created_at);
  const ends = steps.flatMap((s) => [t(s.finished_at), t(s.wake_at), t(s.started_at)]).concat(t(e.finished_at), t(e.updated_at)).filter((x) => !Number.isNaN(x));
  const span = Math.max(1, Math.max(start, ...ends) - start);
  const pct = (x: number) => `${(((x - start) / span) * 100).toFixed(2)}%`;
  return h(
    "ol",
    { class: "timeline", "aria-label": "steps" },
    steps.map((s, i) => {
      const from = t(s.started_at);
      const to = t(s.finished_at) || t(s.wake_at) || from;
      let bar: HTMLElement | null = null;
      if (!Number.isNaN(from)) {
        // Through the CSSOM: the CSP refuses style attributes.
        bar = h("span", { class: `bar ${s.status}`, title: `${s.name}: ${s.status}` });
        bar.style.left = pct(from);
        bar.style.width = `max(2px, ${(((to - from) / span) * 100).toFixed(2)}%)`;
      }
      return h(
        "li",
        { class: "step" },
        h("div", { class: "axis" }, bar),
        h("strong", {}, `${i + 1}. ${s.name}`),
        ` · ${s.type} · ${s.status} · ${s.attempts} attempt${s.attempts === 1 ? "" : "s"} · started ${when(s.started_at)}`,
        s.finished_at ? ` · finished ${when(s.finished_at)}` : null,
        s.wake_at ? ` · wakes ${when(s.wake_at)}` : null,
        s.error ? h("div", { class: "error" }, s.error) : null,
        s.output !== undefined && s.output !== null ? h("details", {}, h("summary", {}, `Output of ${s.name}`), json(s.output)) : null,
        rerun ? h("div", {}, button(`Rerun from ${s.name}`, () => rerun(s.name))) : null,
      );
    }),
  );
}

/** Durable functions of the project; one's executions (newest first, by status); an execution's steps on a timeline. */
export function durablePage(projectId: string, params: URLSearchParams): HTMLElement {
  const fnId = params.get("function");
  const execId = params.get("execution");
  const status = params.get("status") ?? "";
  const page = Math.max(1, Number(params.get("page")) || 1);
  const here = (q: Record<string, string>) => `${projectPath(projectId, "/durable")}?${new URLSearchParams(q)}`;
  const fnsPage = pageOf(params, "functions_page");
  const fns = slot();
  fns.run(async () => {
    const r = await api("GET", `/projects/${projectId}/durable-functions?page=${fnsPage}&limit=50`);
    return [
      table(["Name", "Runtime", "Status", "Updated"], r.data.map((f: any) => [h("a", { href: here({ function: f.id }) }, f.name), f.runtime, f.status, when(f.updated_at)]), "No durable functions yet (kiln deploy --durable, or POST /projects/{id}/durable-functions)."),
      pager(fnsPage, r.has_more, r.total, listBase(projectPath(projectId, "/durable"), params, "functions_page"), "functions_page", "durable function pages"),
    ];
  });
  const execs = slot();
  const detail = slot();
  if (fnId) {
    const base = `/projects/${projectId}/durable-functions/${enc(fnId)}/executions`;
    execs.run(async () => {
      const r = await api("GET", `${base}?limit=50&page=${page}${status ? `&status=${enc(status)}` : ""}`);
      return [
        h("h2", {}, "Executions"),
        h(
          "nav",
          { "aria-label": "status" },
          STATUSES.map((s) => h("a", { href: here({ function: fnId, ...(s ? { status: s } : {}) }), "aria-current": s === status ? "page" : null }, s || "all")),
        ),
        table(
          ["Execution", "Status", "Created", "Finished", "Error"],
          r.data.map((e: any) => [h("a", { href: here({ function: fnId, execution: e.id }) }, e.id), e.status, when(e.created_at), when(e.finished_at), e.error ?? ""]),
          "No executions.",
        ),
        pager(page, r.has_more, r.total, here({ function: fnId, ...(status ? { status } : {}) })),
      ];
    });
    if (execId)
      detail.run(async () => {
        const e = await api("GET", `${base}/${enc(execId)}`);
        const actions = h("div", { "aria-live": "polite" });
        const finished = ["completed", "failed", "stopped"].includes(e.status);
        // Stop and rerun are the public API's: a rerun is a new execution with the same input that
        // reuses this one's journal before the step (its steps run again from there).
        const stop = async () => {
          if (await confirmDialog(`Stop execution ${e.id}? Its steps stop where they are.`, `Stop the execution ${e.id}`, () => api("POST", `${base}/${enc(e.id)}/stop`))) go(here({ function: fnId, execution: e.id }));
        };
        const rerun = async (step: string) => {
          try {
            const r = await api("POST", `${base}/${enc(e.id)}/rerun`, { body: { from_step: step } });
            go(here({ function: fnId, execution: r.id }));
          } catch (err) {
            actions.replaceChildren(errorBox(err));
          }
        };
        return [
          h("h2", {}, `Execution ${e.id}`),
          finished ? null : button(`Stop execution ${e.id}`, stop),
          actions,
          h("p", {}, `${e.status} · created ${when(e.created_at)}${e.finished_at ? ` · finished ${when(e.finished_at)}` : ""}${e.wake_at ? ` · wakes ${when(e.wake_at)}` : ""}${e.rerun_of ? ` · re-run of ${e.rerun_of}` : ""}`),
          e.error ? h("div", { class: "error" }, e.error) : null,
          h("h3", {}, "Input"),
          json(e.input),
          h("h3", {}, "Steps"),
          (e.steps ?? []).length ? timeline(e, rerun) : h("p", { class: "muted" }, "No steps yet."),
          h("h3", {}, "Output"),
          json(e.output),
        ];
      });
  }
  return h("section", {}, h("h1", {}, "Durable executions"), fns, execs, detail);
}
