import { api } from "./api";
import { h, slot, table, when } from "./dom";

const WINDOWS = ["30m", "1h", "24h", "7d"] as const;
const METRICS = ["request_count", "server_error_count", "availability", "p95_latency"] as const;
const SVG = "http://www.w3.org/2000/svg";

function svg(tag: string, attrs: Record<string, string | number>, text?: string): SVGElement {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

const fmt = (v: number | null, unit: string) => (v === null ? "no data" : unit === "ratio" ? `${(v * 100).toFixed(2)}%` : unit === "ms" ? `${v.toFixed(1)} ms` : String(v));

/** A bar per window for one metric: an inline SVG, no library (the values are four numbers). */
function barChart(title: string, unit: string, values: (number | null)[]): SVGElement {
  const W = 420, H = 200, top = 44, bottom = 28, left = 10;
  const max = Math.max(unit === "ratio" ? 1 : 0, ...values.map((v) => v ?? 0)) || 1;
  const el = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": `${title}: ${values.map((v, i) => `${WINDOWS[i]} ${fmt(v, unit)}`).join(", ")}` });
  el.appendChild(svg("text", { x: left, y: 16, "font-size": 13, "font-weight": 700 }, title));
  const slotW = (W - left * 2) / WINDOWS.length;
  values.forEach((v, i) => {
    const hgt = v === null ? 0 : ((H - top - bottom) * v) / max;
    const x = left + i * slotW + slotW * 0.2;
    el.appendChild(svg("rect", { x, y: H - bottom - hgt, width: slotW * 0.6, height: Math.max(hgt, v === null ? 0 : 1), fill: "#9a3b0c" }));
    el.appendChild(svg("text", { x: x + slotW * 0.3, y: H - bottom - hgt - 4, "font-size": 11, "text-anchor": "middle" }, fmt(v, unit)));
    el.appendChild(svg("text", { x: x + slotW * 0.3, y: H - 10, "font-size": 11, "text-anchor": "middle" }, WINDOWS[i]!));
  });
  return el;
}

/** Requests, server errors, availability and p95 latency of the project over each query window. */
export function metricsPage(projectId: string): HTMLElement {
  const out = slot();
  const load = () =>
    out.run(async () => {
      // One query per window: the API answers a window with one value per metric (and group).
      const answers = await Promise.all(
        WINDOWS.map((window) => api("POST", `/projects/${projectId}/metrics/query`, { body: { time_range: { window }, queries: METRICS.map((metric) => ({ id: metric, metric })) } })),
      );
      const value = (a: any, metric: string): number | null => {
        const r = a.results.find((x: any) => x.id === metric);
        return r && r.data_status !== "no_data" && r.values.length ? r.values.reduce((s: number, v: any) => s + v.value, 0) : null;
      };
      const unit = (metric: string) => answers[0].results.find((x: any) => x.id === metric)?.unit ?? "count";
      return [
        h("p", { class: "muted" }, `Observed ${when(answers[0].observed_at)}; complete through ${when(answers[0].fresh_through)}.`),
        h("div", { class: "charts" }, METRICS.map((m) => barChart(m, unit(m), answers.map((a) => value(a, m))))),
        table(
          ["Metric", ...WINDOWS],
          METRICS.map((m) => [m, ...answers.map((a) => fmt(value(a, m), unit(m)))]),
        ),
      ];
    });
  load();
  return h("section", {}, h("h1", {}, "Metrics"), h("button", { type: "button", onclick: load }, "Refresh metrics"), out);
}
