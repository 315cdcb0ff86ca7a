import { api } from "./api";
import { listBase, pageOf, pager, projectPath } from "./projects";
import { button, confirmDialog, field, form, h, select, slot, table, when } from "./dom";

/** Schedulers per page of the list. */
const PAGE = 50;

/** Schedulers of every function of the project (paginated): next and last runs, a run history, create and delete. */
export function schedulersPage(projectId: string, params: URLSearchParams = new URLSearchParams()): HTMLElement {
  const page = pageOf(params);
  const list = slot();
  const runs = slot();
  const functions = slot();
  const base = (s: any) => `/projects/${projectId}/${s.function_kind === "durable" ? "durable-functions" : "functions"}/${s.function_id}/schedulers/${s.id}`;
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/schedulers?page=${page}&limit=${PAGE}`);
      return [
        table(
          ["Name", "Schedule", "Enabled", "Next run", "Last run", "", ""],
          r.data.map((s: any) => [
            s.name,
            h("code", {}, s.schedule?.cron_expression ?? JSON.stringify(s.schedule)),
            s.enabled ? "yes" : "no",
            when(s.next_run_at),
            when(s.last_run_at),
            button(`Runs of ${s.name}`, () =>
              runs.run(async () => {
                const rr = await api("GET", `${base(s)}/runs?limit=50`);
                return [h("h2", {}, `Runs of ${s.name}`), table(["Scheduled for", "Status", "HTTP", "Duration", "Error"], rr.data.map((x: any) => [when(x.scheduled_for), x.status, x.http_status ?? "—", x.duration_ms ?? "—", x.error ?? ""]), "No runs yet.")];
              }),
            ),
            button(`Delete ${s.name}`, () => confirmDialog(`Delete scheduler ${s.name}? Its runs stop.`, `Delete the scheduler ${s.name}`, () => api("DELETE", base(s))).then((yes) => void (yes && load()))),
          ]),
          "No schedulers yet.",
        ),
        pager(page, r.has_more, r.total, listBase(projectPath(projectId, "/schedulers"), params, "page")),
      ];
    });
  functions.run(async () => {
    const r = await api("GET", `/projects/${projectId}/functions?limit=100`);
    if (r.data.length === 0) return h("p", { class: "muted" }, "Deploy a function first to schedule it.");
    return form(
      [
        field("Name", "name", { required: true }),
        select("Function", "function", r.data.map((f: any) => f.name)),
        field("Cron schedule", "schedule", { required: true, placeholder: "0 3 * * *" }),
        h("label", {}, "Payload (JSON, optional)", h("textarea", { name: "payload" })),
      ],
      "Create scheduler",
      async (d, _f, el) => {
        const fn = r.data.find((f: any) => f.name === d.function);
        let payload: unknown;
        if (d.payload?.trim())
          try {
            payload = JSON.parse(d.payload);
          } catch (err) {
            throw new Error(`the payload is not JSON: ${(err as Error).message}`);
          }
        await api("POST", `/projects/${projectId}/functions/${fn.id}/schedulers`, { body: { name: d.name, schedule: { kind: "cron", cron_expression: d.schedule }, ...(payload !== undefined ? { payload } : {}) } });
        el.reset();
        await load();
      },
    );
  });
  load();
  return h("section", {}, h("h1", {}, "Schedulers"), functions, list, runs);
}
