import { api, ApiError, request, serviceKey } from "./api";
import { button, confirmDialog, errorBox, field, form, h, json, slot, table, when } from "./dom";
import { invocationPath, invocationTimeline, rememberCall } from "./invocation";
import { DEFAULT_KEEP, liveControls, logTable } from "./logs";

/** Log lines of a function (or of one deployment's build), newest last. */
async function logLines(projectId: string, resource: Record<string, unknown>, q?: string): Promise<HTMLElement> {
  const r = await api("POST", `/projects/${projectId}/logs/search`, { body: { resource, limit: 200, ...(q ? { q } : {}) } });
  const lines = [...r.data].reverse();
  if (lines.length === 0) return h("p", { class: "muted" }, "No log lines.");
  return h("pre", {}, lines.map((l: any) => `${l.timestamp} ${l.level.padEnd(5)} ${l.body}\n`).join(""));
}

export function functionsPage(projectId: string): HTMLElement {
  const list = slot();
  const detail = slot();
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/functions?limit=100`);
      return table(
        ["Name", "Status", "Runtime", "Updated", ""],
        r.data.map((f: any) => [h("a", { href: "#", onclick: (e: Event) => (e.preventDefault(), show(f.id)) }, f.name), f.status, f.runtime, when(f.updated_at), button(`Delete ${f.name}`, async () => {
            if (await confirmDialog(`Delete function ${f.name} and its deployments?`, `Delete function ${f.name}`)) await api("DELETE", `/projects/${projectId}/functions/${f.id}`).then(load);
          })]),
        "No functions yet: deploy one above.",
      );
    });

  // The shown function's live tail: closed when another function (or the same, refreshed) is shown.
  let stopLive = () => {};
  const show = (functionId: string): Promise<void> =>
    detail.run(async () => {
      stopLive();
      const [f, deployments] = await Promise.all([api("GET", `/projects/${projectId}/functions/${functionId}`), api("GET", `/projects/${projectId}/functions/${functionId}/deployments`)]);
      const buildLog = slot();
      const response = h("div", { "aria-live": "polite" });
      const logProblem = h("div", { "aria-live": "polite" });
      const logs = logTable(projectId, DEFAULT_KEEP, `log lines of ${f.name}`);
      const refreshLogs = async () => {
        logProblem.replaceChildren();
        try {
          logs.set((await api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "function", ids: [f.id] }, limit: 200 } })).data);
        } catch (err) {
          logProblem.replaceChildren(errorBox(err));
        }
      };
      const live = liveControls(projectId, logs, () => ({ type: "function", ids: f.id }), (err) => logProblem.replaceChildren(errorBox(err)));
      stopLive = live.stop;
      void refreshLogs();
      return h(
        "section",
        { "aria-label": `function ${f.name}` },
        h("h2", {}, `Function ${f.name}`, " ", button("Refresh", async () => void (await Promise.all([load(), show(functionId)])))),
        h("p", {}, `${f.status} · ${f.runtime} · handler ${f.handler} · `, h("code", {}, f.invoke_url)),
        h("h3", {}, "Invoke"),
        form(
          [h("label", {}, "JSON payload", h("textarea", { name: "payload" }, '{"name":"ada"}'))],
          "Invoke",
          async (d) => {
            response.replaceChildren();
            let payload: unknown;
            try {
              payload = d.payload?.trim() ? JSON.parse(d.payload) : null;
            } catch (err) {
              throw new Error(`the payload is not JSON: ${(err as Error).message}`);
            }
            const key = await serviceKey(projectId);
            const started = performance.now();
            let res: Response;
            try {
              res = await request("POST", `/functions/${f.id}/invoke`, { bearer: key, body: { payload } });
            } catch (err) {
              // A run that failed (timeout, crash) still has an invocation: its lines are on its timeline.
              const failedId = err instanceof ApiError ? err.headers?.get("x-service-invocation-id") : null;
              if (!failedId) throw err;
              const timeline = slot();
              response.replaceChildren(errorBox(err), h("p", {}, h("a", { href: invocationPath(projectId, failedId) }, `Invocation ${failedId}`)), timeline);
              await timeline.run(async () => [h("h4", {}, "Timeline"), await invocationTimeline(projectId, failedId)]);
              return;
            }
            const ms = Math.round(performance.now() - started);
            const text = await res.text();
            const timings = [...res.headers].filter(([k]) => k.toLowerCase().startsWith("x-service-")).map(([k, v]) => `${k}: ${v}`);
            let body: unknown = text;
            try {
              body = JSON.parse(text);
            } catch {}
            const invocationId = res.headers.get("x-service-invocation-id");
            const timeline = slot();
            response.replaceChildren(
              h("p", {}, `${res.status} in ${ms} ms`, invocationId ? [" · ", h("a", { href: invocationPath(projectId, invocationId) }, `Invocation ${invocationId}`)] : null),
              h("div", { class: "invoke-response" }, json(body)),
              timings.length ? h("pre", {}, timings.join("\n")) : "",
              timeline,
            );
            if (invocationId) {
              rememberCall({ id: invocationId, status: res.status, headers: [...res.headers], client_ms: ms });
              await timeline.run(async () => [h("h4", {}, "Timeline"), await invocationTimeline(projectId, invocationId)]);
            }
          },
        ),
        response,
        h("h3", {}, "Deployments"),
        table(
          ["Id", "Status", "Created", "Finished", "Error", "Build log"],
          deployments.data.map((d: any) => [h("code", {}, d.id), d.status, when(d.created_at), when(d.finished_at), d.error ?? "", button(`Build log (${d.build_log.lines} lines)`, () => buildLog.run(() => logLines(projectId, { type: "function", deployments: { ids: [d.id] } })))]),
        ),
        buildLog,
        h("h3", {}, "Logs"),
        h("div", {}, button("Refresh logs", refreshLogs), " ", live.el),
        logProblem,
        logs.el,
      );
    });

  load();
  return h(
    "section",
    {},
    h("h1", {}, "Functions"),
    h("p", { class: "muted" }, "Deploy a source archive (.zip or .tar.gz of the function's folder); deploying an existing name updates it."),
    form(
      [field("Name", "name", { required: true }), field("Runtime", "runtime", { value: "nodejs22.x", required: true }), field("Handler (optional)", "handler"), field("Source archive", "code", { type: "file", required: true })],
      "Deploy",
      async (d, files, el) => {
        const body = new FormData();
        body.set("name", d.name!);
        body.set("runtime", d.runtime!);
        if (d.handler) body.set("handler", d.handler);
        body.set("code", files.code!);
        const f = await api("POST", `/projects/${projectId}/functions`, { raw: body });
        el.reset();
        await load();
        await show(f.id);
      },
    ),
    list,
    detail,
  );
}
