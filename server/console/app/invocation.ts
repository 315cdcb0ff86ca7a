// One invocation on a timeline: arrival, the invoke endpoint's part, a worker started or reused, the
// handler, the response; its log lines placed on the same axis, and the X-Service-* timings beside.
// Public routes only: the lines come from log search (`invocation.id:`); the figures from the
// response headers when this console made the call, else from the line Kiln writes when an
// invocation finishes (no public route keeps a past response's headers).
import { api } from "./api";
import { field, form, h, slot, table } from "./dom";
import { projectPath } from "./projects";
import { go } from "./router";
import { bodyText, type LogEntry } from "./tail";

/** What the console saw of a call it made (functions page), kept for the session: the newest few. */
export interface SeenCall {
  id: string;
  status: number;
  headers: [string, string][];
  /** Round trip measured in the browser. */
  client_ms: number;
}
const SEEN = "kiln.console.invocations";

export function rememberCall(call: SeenCall): void {
  const all = seenCalls().filter((c) => c.id !== call.id);
  sessionStorage.setItem(SEEN, JSON.stringify([call, ...all].slice(0, 20)));
}

function seenCalls(): SeenCall[] {
  try {
    return JSON.parse(sessionStorage.getItem(SEEN) ?? "[]");
  } catch {
    return [];
  }
}

export const invocationPath = (projectId: string, id: string) => projectPath(projectId, `/invocation?id=${encodeURIComponent(id)}`);

/** Kiln's last line of an invocation: `invocation <id> finished with status S in T ms (proxy P ms, new worker started in I ms | worker reused, compute C ms)`. */
const FINISH = /^invocation \S+ finished with status (\d+) in ([\d.]+) ms(?: \(proxy ([\d.]+) ms(?:, (?:new worker started in ([\d.]+) ms|(worker reused)), compute ([\d.]+) ms)?\))?/;

export interface Phases {
  status: number;
  /** From arrival: the invoke endpoint's part (X-Service-Proxy-Ms). */
  proxy: number;
  /** A new worker's start-up; null when a warm one was reused; undefined when unknown (a failed run). */
  workerStart: number | null | undefined;
  /** The handler's time (X-Service-Compute-Ms); undefined when unknown. */
  compute: number | undefined;
  /** Arrival to response. */
  total: number;
}

function phasesOf(finish: LogEntry | undefined, seen: SeenCall | undefined): Phases | null {
  const m = finish ? FINISH.exec(bodyText(finish)) : null;
  if (!m) return null;
  const header = (name: string) => {
    const v = seen?.headers.find(([k]) => k.toLowerCase() === name)?.[1];
    return v === undefined ? undefined : Number(v);
  };
  // The headers are what the caller got (whole milliseconds); the line has the same figures to 0.1 ms.
  const proxy = Number(m[3] ?? header("x-service-proxy-ms") ?? 0);
  return {
    status: Number(m[1]),
    proxy,
    workerStart: m[5] ? null : m[4] !== undefined ? Number(m[4]) : undefined,
    compute: m[6] !== undefined ? Number(m[6]) : header("x-service-compute-ms"),
    total: proxy + Number(m[2]),
  };
}

const ms = (x: number) => `${x < 10 ? x.toFixed(1) : Math.round(x)} ms`;

/** A bar on the invocation's axis, placed through the CSSOM (the CSP refuses style attributes). */
function segment(cls: string, from: number, to: number, total: number, title: string): HTMLElement {
  const s = h("span", { class: cls, title });
  s.style.left = `${((from / total) * 100).toFixed(2)}%`;
  s.style.width = cls === "tick" ? "" : `max(2px, ${(((to - from) / total) * 100).toFixed(2)}%)`;
  return s;
}

/** The timeline of one invocation (a section the functions page also shows under an invoke). */
export async function invocationTimeline(projectId: string, invocationId: string): Promise<HTMLElement> {
  const r = await api<{ data: LogEntry[] }>("POST", `/projects/${encodeURIComponent(projectId)}/logs/search`, {
    body: { resource: { type: "function" }, q: `invocation.id:"${invocationId.replaceAll('"', "")}"`, limit: 1000 },
  });
  const lines = [...r.data].reverse();
  if (!lines.length) return h("p", { class: "muted" }, `No log lines of invocation ${invocationId} (yet): Kiln writes an invocation's lines when it finishes.`);
  const seen = seenCalls().find((c) => c.id === invocationId);
  const finish = lines.findLast((l) => FINISH.test(bodyText(l)));
  const p = phasesOf(finish, seen);
  const fn = lines[0]!.resource;
  if (!p) {
    // A durable execution's lines (its replays share the execution id) or an older Kiln's: lines only.
    return h(
      "section",
      { "aria-label": `invocation ${invocationId}` },
      h("p", {}, `${fn.name} · no finish line with timings for this id (a durable execution's, or one still running): its lines only.`),
      linesTable(lines, Date.parse(lines[0]!.timestamp)),
    );
  }
  const arrival = Date.parse(finish!.timestamp) - p.total;
  const total = Math.max(p.total, 1);
  const handlerEnd = p.total;
  const handlerStart = p.compute !== undefined ? handlerEnd - p.compute : undefined;
  const workerFrom = p.proxy;
  const phases: [string, string, HTMLElement | null][] = [
    ["Arrival", `+0 ms · ${new Date(arrival).toISOString()}`, segment("tick", 0, 0, total, "arrival")],
    ["Invoke endpoint", `${ms(p.proxy)} (X-Service-Proxy-Ms: arrival until the function was handed over)`, segment("segment proxy", 0, p.proxy, total, "invoke endpoint")],
    [
      "Worker",
      (p.workerStart === null ? "warm worker reused" : p.workerStart === undefined ? "not reported (the run failed)" : `new worker started in ${ms(p.workerStart)}`) +
        // Hand-over to the handler: a worker's lease (its start when new), the sandbox's round trip.
        (handlerStart !== undefined ? `; ${ms(Math.max(0, handlerStart - workerFrom))} from hand-over to the handler` : ""),
      handlerStart !== undefined ? segment("segment worker", workerFrom, Math.max(workerFrom, handlerStart), total, "worker") : null,
    ],
    ["Handler", p.compute !== undefined ? `${ms(p.compute)} (X-Service-Compute-Ms)` : "not reported", handlerStart !== undefined ? segment("segment handler", handlerStart, handlerEnd, total, "handler") : null],
    ["Response", `status ${p.status} at +${ms(p.total)}`, segment("tick", p.total, p.total, total, "response")],
  ];
  const timings: [string, string, string][] = seen
    ? seen.headers.filter(([k]) => k.toLowerCase().startsWith("x-service-")).map(([k, v]) => [k, v, "response header"])
    : [
        ["X-Service-Proxy-Ms", String(Math.round(p.proxy)), "finish line"],
        ...(p.compute !== undefined ? [["X-Service-Compute-Ms", String(Math.round(p.compute)), "finish line"] as [string, string, string]] : []),
        ["X-Service-Invocation-Id", invocationId, "log search"],
      ];
  return h(
    "section",
    { "aria-label": `invocation ${invocationId}`, class: "invocation" },
    h("p", {}, `${fn.name} · status ${p.status} · ${ms(p.total)} from arrival to response${seen ? ` · ${ms(seen.client_ms)} round trip seen by this browser` : ""}`),
    h(
      "div",
      { class: "split" },
      h(
        "div",
        {},
        h(
          "ol",
          { class: "timeline", "aria-label": "phases" },
          phases.map(([name, text, bar]) => h("li", { class: "step" }, h("div", { class: "axis big" }, bar), h("strong", {}, name), ` · ${text}`)),
        ),
        h("h3", {}, `Log lines (${lines.length})`),
        linesTable(lines, arrival),
      ),
      h(
        "aside",
        { "aria-label": "timings" },
        h("h3", {}, "X-Service-* timings"),
        table(["Header", "Value", "From"], timings),
        seen ? null : h("p", { class: "muted" }, "No public route keeps a past response's headers: these figures are the ones Kiln wrote in the invocation's finish line."),
      ),
    ),
  );
}

function linesTable(lines: LogEntry[], from: number): HTMLElement {
  return h(
    "table",
    { class: "invocation-lines" },
    h("thead", {}, h("tr", {}, ["Offset", "Time", "Level", "Line"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      lines.map((l) => h("tr", {}, h("td", {}, `+${ms(Math.max(0, Date.parse(l.timestamp) - from))}`), h("td", {}, l.timestamp), h("td", {}, l.level), h("td", {}, h("code", {}, bodyText(l))))),
    ),
  );
}

/** `#/p/<id>/invocation?id=<invocation id>`: the timeline of an invocation found by its id (a log line's, X-Service-Invocation-Id). */
export function invocationPage(projectId: string, params: URLSearchParams): HTMLElement {
  const id = params.get("id") ?? "";
  const result = slot();
  if (id) void result.run(() => invocationTimeline(projectId, id));
  return h(
    "section",
    {},
    h("h1", {}, id ? `Invocation ${id}` : "Invocation timeline"),
    form([field("Invocation id", "id", { value: id, required: true, size: 40 })], "Show timeline", async (d) => go(invocationPath(projectId, d.id!.trim()))),
    result,
  );
}
