import { api } from "./api";
import { button, errorBox, field, form, h, select } from "./dom";
import { invocationPath } from "./invocation";
import { virtualTable, type VirtualTable } from "./list";
import { bodyText, followLogs, whileHere, type LogEntry } from "./tail";

/** Lines a live view keeps by default; past it the oldest go (memory stays bounded however long it runs). */
export const DEFAULT_KEEP = 5000;
const MAX_KEEP = 100_000;

/** Log lines, newest first, in a virtualized table: a search's pages and a live tail's lines alike. */
export function logTable(projectId: string, cap: number, label = "log lines"): VirtualTable<LogEntry> {
  return virtualTable<LogEntry>({
    label,
    headers: ["Time", "Level", "Resource", "Message", "Invocation"],
    cap,
    empty: "No log lines match.",
    row: (l) => [
      l.timestamp,
      l.level,
      l.resource?.name ?? l.resource?.id ?? "",
      h("code", { title: bodyText(l) }, bodyText(l)),
      l.invocation_id ? h("a", { href: invocationPath(projectId, l.invocation_id), title: `timeline of invocation ${l.invocation_id}` }, "timeline") : "",
    ],
  });
}

/**
 * A live tail's controls over a log table: follow (backlog first, then new lines at the top), pause
 * (lines that arrive meanwhile are held, within the same cap) and resume, stop. Closed when the page is left.
 */
export function liveControls(projectId: string, lines: VirtualTable<LogEntry>, filter: () => Record<string, string | undefined>, onError: (err: unknown) => void): { el: HTMLElement; stop(): void; starts(): number } {
  let tail: { stop(): void } | null = null;
  /** Tails started so far: a search that was sent before the latest start must not overwrite its lines. */
  let starts = 0;
  let paused = false;
  let held: LogEntry[] = [];
  let heldDropped = 0;
  let serverDropped = 0;
  const dot = h("span", { class: "live paused", "aria-hidden": "true" });
  const state = h("span", { role: "status" }, "Not following.");
  const follow = button("Follow live", () => start());
  const pause = button("Pause", () => togglePause(), { disabled: true });
  const stop = button("Stop", () => end("Stopped."), { disabled: true });
  const show = () => {
    const parts = [tail ? (paused ? `Paused: ${held.length} new line${held.length === 1 ? "" : "s"} held` : "Following live") : state.textContent];
    if (tail && heldDropped) parts.push(`${heldDropped} dropped while paused`);
    if (tail && serverDropped) parts.push(`${serverDropped} missed (Kiln dropped them: this page read too slowly)`);
    state.textContent = parts.join(" · ") + (tail ? "." : "");
    dot.className = `live${tail && !paused ? "" : " paused"}`;
    follow.disabled = !!tail;
    pause.disabled = !tail;
    stop.disabled = !tail;
    pause.textContent = paused ? "Resume" : "Pause";
  };
  const end = (why: string) => {
    tail?.stop();
    tail = null;
    paused = false;
    held = [];
    state.textContent = why;
    const hadFocus = document.activeElement === stop || document.activeElement === pause;
    show();
    // A disabled button loses focus to the page's start: hand it to the one that works now.
    if (hadFocus) follow.focus();
  };
  const togglePause = () => {
    paused = !paused;
    if (!paused) {
      lines.prepend(held.reverse());
      held = [];
      heldDropped = 0;
    }
    show();
  };
  const start = () => {
    starts++;
    serverDropped = heldDropped = 0;
    lines.set([]);
    tail = followLogs(projectId, { ...filter(), backlog: "100" }, {
      lines(batch) {
        if (paused) {
          held.push(...batch);
          const extra = held.length - lines.cap;
          if (extra > 0) {
            held.splice(0, extra);
            heldDropped += extra;
          }
        } else lines.prepend(batch.reverse());
        show();
      },
      dropped(n) {
        serverDropped += n;
        show();
      },
      ended(err) {
        if (err) onError(err);
        end(err ? "The tail failed." : "The tail ended (Kiln stopped or the project is gone).");
      },
    });
    const hadFocus = document.activeElement === follow;
    show();
    if (hadFocus) pause.focus();
  };
  whileHere(() => tail?.stop());
  return { el: h("div", { class: "live-controls" }, dot, state, " ", follow, " ", pause, " ", stop), stop: () => tail && end("Stopped."), starts: () => starts };
}

export function logsPage(projectId: string, params: URLSearchParams): HTMLElement {
  const keep = Math.min(MAX_KEEP, Math.max(10, Number(params.get("keep") ?? DEFAULT_KEEP) || DEFAULT_KEEP));
  const q = params.get("q") ?? "";
  const problem = h("div", { "aria-live": "polite" });
  let current: Record<string, string> = { q, type: params.get("type") ?? "function" };
  let cursor: string | null = null;
  const lines = logTable(projectId, keep);
  const older = button("Older lines →", () => search(current, true), { hidden: true });
  const search = async (d: Record<string, string>, more: boolean) => {
    current = d;
    problem.replaceChildren();
    // A search shows stored lines: a tail over the table would mix in new ones.
    if (!more) live.stop();
    const tailsBefore = live.starts();
    const body: Record<string, unknown> = { resource: { type: d.type || "function" }, limit: 200 };
    if (d.q) body.q = d.q;
    if (more && cursor) body.cursor = cursor;
    problem.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    try {
      const r = await api("POST", `/projects/${projectId}/logs/search`, { body });
      // Follow live was clicked while the search was on its way: the tail's lines stay.
      if (live.starts() !== tailsBefore) return problem.replaceChildren();
      cursor = r.has_more ? r.next_cursor : null;
      problem.replaceChildren();
      if (more) lines.append(r.data);
      else lines.set(r.data);
      older.hidden = !cursor;
    } catch (err) {
      problem.replaceChildren(errorBox(err));
    }
  };
  const searchForm = form([field("Query", "q", { value: q, size: 50 }), select("Resource", "type", ["function", "frontend"])], "Search", (d) => search(d, false));
  (searchForm.elements.namedItem("type") as HTMLSelectElement).value = current.type === "frontend" ? "frontend" : "function";
  // The tail follows what the form says now (searched or not).
  const typed = () => Object.fromEntries([...new FormData(searchForm)].map(([k, v]) => [k, String(v) || undefined]));
  const live = liveControls(projectId, lines, typed, (err) => problem.replaceChildren(errorBox(err)));
  if (q) void search(current, false);
  return h(
    "section",
    {},
    h("h1", {}, "Logs"),
    h("p", { class: "muted" }, 'Query grammar: words, "phrases", level:(error OR warn), resource.name:hello, invocation.id:…, deployment.id:…, AND / OR / NOT, -negation, ( ). "Follow live" tails the same query; a line\'s "timeline" link shows its invocation.'),
    searchForm,
    live.el,
    h("p", { class: "muted" }, `Newest first; a live view keeps the newest ${keep} lines (`, h("code", {}, "?keep=N"), " in the address to change it)."),
    problem,
    lines.el,
    older,
  );
}
