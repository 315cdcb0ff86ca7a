import { api, ApiError, request, serviceKey } from "./api";
import { button, confirmDialog, errorBox, field, form, h, json, slot, table, when } from "./dom";
import { invocationPath, invocationTimeline, rememberCall } from "./invocation";
import { DEFAULT_KEEP, liveControls, logTable } from "./logs";
import { listBase, pageOf, pager, projectPath } from "./projects";
import { bodyText, followLogs, whileHere, type LogEntry } from "./tail";

/** Deployment states after which its build writes no more lines. */
const FINISHED = new Set(["succeeded", "failed", "superseded"]);
/** Deployments shown at first (and added per "Show older deployments"). */
const DEPLOYMENTS_SHOWN = 20;
/** Lines a live build log keeps (an install can print many): the oldest go past it. */
const BUILD_KEEP = 5000;

/** Log lines of a function (or of one deployment's build), newest last. */
async function logLines(projectId: string, resource: Record<string, unknown>, q?: string): Promise<HTMLElement> {
  const r = await api("POST", `/projects/${projectId}/logs/search`, { body: { resource, limit: 200, ...(q ? { q } : {}) } });
  const lines = [...r.data].reverse();
  if (lines.length === 0) return h("p", { class: "muted" }, "No log lines.");
  return h("pre", {}, lines.map((l: any) => `${l.timestamp} ${l.level.padEnd(5)} ${l.body}\n`).join(""));
}

/**
 * A building deployment's log as it is written: its stored lines, then each new one as the logs tail
 * brings it, until the deployment finishes (its status is polled through the deployment history;
 * the build writes its last line, "build succeeded" or its error, before the status changes, so the
 * tail is given a moment to bring that line before it is closed). `finished` runs then, once.
 */
function liveBuildLog(projectId: string, functionId: string, deploymentId: string, finished: (d: any) => void): { el: HTMLElement; stop(): void } {
  const state = h("p", { role: "status" }, "Building: following the build log live…");
  const out = h("pre", { class: "build-log", "aria-label": `build log of ${deploymentId}`, tabindex: "0" });
  const el = h("section", { "aria-label": `live build log of ${deploymentId}` }, h("h4", {}, `Build log of ${deploymentId}`), state, out);
  const seen: string[] = [];
  let kept = 0;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let done = false;
  const show = (batch: LogEntry[]) => {
    for (const l of batch) {
      const text = bodyText(l);
      seen.push(text);
      out.append(`${l.timestamp} ${l.level.padEnd(5)} ${text}\n`);
      if (++kept > BUILD_KEEP) {
        out.firstChild?.remove();
        kept--;
      }
    }
  };
  const tail = followLogs(projectId, { type: "function", ids: functionId, deployment_ids: deploymentId, backlog: "1000" }, {
    lines: show,
    dropped: (n) => out.append(`… ${n} lines missed (this page read too slowly)\n`),
    ended: (err) => {
      if (!done) state.textContent = err ? `The build log could not be followed: ${(err as Error).message ?? err}` : "The build log ended (Kiln stopped?).";
    },
  });
  const stop = () => {
    done = true;
    if (timer) clearTimeout(timer);
    tail.stop();
  };
  const poll = async () => {
    timer = null;
    if (done) return;
    try {
      const r = await api("GET", `/projects/${projectId}/functions/${functionId}/deployments`);
      const d = r.data.find((x: any) => x.id === deploymentId);
      if (!d || FINISHED.has(d.status)) {
        const last = d?.status === "failed" ? d.error : d?.status === "succeeded" ? "build succeeded" : null;
        for (let i = 0; i < 30 && last && !seen.includes(last) && !done; i++) await new Promise((w) => setTimeout(w, 100));
        if (done) return; // the page was left meanwhile
        stop();
        state.textContent = !d ? "The deployment is gone." : d.status === "succeeded" ? "Build succeeded: the deployment is active." : d.status === "failed" ? `Build failed: ${d.error ?? "see the log"}` : "Superseded by a newer deployment.";
        finished(d);
        return;
      }
      state.textContent = `${d.status === "queued" ? "Queued" : "Building"}: following the build log live…`;
    } catch (err) {
      state.textContent = `Checking the deployment failed (${(err as Error).message}); still following its log.`;
    }
    if (!done) timer = setTimeout(poll, 1000);
  };
  void poll();
  whileHere(stop);
  return { el, stop };
}

/** Functions per page of the list (a project may have thousands). */
const PAGE = 50;

export function functionsPage(projectId: string, params: URLSearchParams = new URLSearchParams()): HTMLElement {
  const page = pageOf(params);
  const list = slot();
  const detail = slot();
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/functions?page=${page}&limit=${PAGE}`);
      return [
        table(
          ["Name", "Status", "Runtime", "Updated", ""],
          r.data.map((f: any) => [h("a", { href: "#", onclick: (e: Event) => (e.preventDefault(), show(f.id)) }, f.name), f.status, f.runtime, when(f.updated_at), button(`Delete ${f.name}`, async () => {
              if (await confirmDialog(`Delete function ${f.name} and its deployments?`, `Delete function ${f.name}`, () => api("DELETE", `/projects/${projectId}/functions/${f.id}`))) await load();
            })]),
          "No functions yet: deploy one above.",
        ),
        pager(page, r.has_more, r.total, listBase(projectPath(projectId, "/functions"), params, "page")),
      ];
    });

  // The shown function's live tail: closed when another function (or the same, refreshed) is shown.
  let stopLive = () => {};
  // The live build log of the shown function's deployment being built: kept across refreshes of the
  // same function (its end refreshes the page around it), closed when another function is shown.
  let building: { functionId: string; deploymentId: string; el: HTMLElement; stop(): void } | null = null;
  // Refreshes the shown function's status line and deployments in place (not its invoke form or logs,
  // which may be in use): what a finished build calls.
  let refreshShown: (functionId: string) => Promise<void> = async () => {};
  const show = (functionId: string): Promise<void> =>
    detail.run(async () => {
      stopLive();
      if (building && building.functionId !== functionId) {
        building.stop();
        building = null;
      }
      const [f, deployments] = await Promise.all([api("GET", `/projects/${projectId}/functions/${functionId}`), api("GET", `/projects/${projectId}/functions/${functionId}/deployments`)]);
      const pending = deployments.data.find((d: any) => d.kind === "deploy" && !FINISHED.has(d.status));
      if (pending && building?.deploymentId !== pending.id) {
        building?.stop();
        building = { functionId, deploymentId: pending.id, ...liveBuildLog(projectId, functionId, pending.id, () => void Promise.all([load(), refreshShown(functionId)])) };
      }
      const buildLog = slot();
      const summary = h("p", {});
      const history = h("div", {});
      const problem = h("div", { "aria-live": "polite" });
      // The history comes whole from the API (no pagination there): the newest DEPLOYMENTS_SHOWN
      // first, older ones on request, so a function deployed a thousand times stays a short page.
      let shown = DEPLOYMENTS_SHOWN;
      const render = (f: any, deployments: any) => {
        summary.replaceChildren(`${f.status} · ${f.runtime} · handler ${f.handler} · `, h("code", {}, f.invoke_url));
        const all: any[] = deployments.data;
        const more =
          all.length > shown
            ? button(
                `Show older deployments (${all.length - shown} more)`,
                () => {
                  shown += DEPLOYMENTS_SHOWN;
                  render(f, deployments);
                  // The button was replaced: focus goes to the new one (or the table's end).
                  (history.querySelector<HTMLElement>("button.more") ?? history.querySelector<HTMLElement>("tbody tr:last-child button"))?.focus();
                },
                { class: "more" },
              )
            : null;
        history.replaceChildren(
          table(
            ["Id", "Status", "Created", "Finished", "Error", "Build log"],
            all.slice(0, shown).map((d: any) => [h("code", {}, d.id), d.status, when(d.created_at), when(d.finished_at), d.error ?? "", button(`Build log (${d.build_log.lines} lines)`, () => buildLog.run(() => logLines(projectId, { type: "function", deployments: { ids: [d.id] } })))]),
          ),
          ...(more ? [more] : []),
        );
      };
      render(f, deployments);
      refreshShown = async (id) => {
        if (id !== functionId || !summary.isConnected) return;
        try {
          const [f2, d2] = await Promise.all([api("GET", `/projects/${projectId}/functions/${functionId}`), api("GET", `/projects/${projectId}/functions/${functionId}/deployments`)]);
          render(f2, d2);
        } catch (err) {
          problem.replaceChildren(errorBox(err));
        }
      };
      const response = h("div", { "aria-live": "polite" });
      const logProblem = h("div", { "aria-live": "polite" });
      const logs = logTable(projectId, DEFAULT_KEEP, `log lines of ${f.name}`);
      const refreshLogs = async () => {
        logProblem.replaceChildren();
        // Stored lines replace the table: a tail over it would mix in new ones (as on the logs page).
        live.stop();
        const tailsBefore = live.starts();
        try {
          const found = await api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "function", ids: [f.id] }, limit: 200 } });
          // Follow live was clicked while the search was on its way (the page's first load): the tail's lines stay.
          if (live.starts() === tailsBefore) logs.set(found.data);
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
        summary,
        problem,
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
        history,
        building?.functionId === functionId ? building.el : null,
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
