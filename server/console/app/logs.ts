import { api } from "./api";
import { field, form, h, select, slot, table } from "./dom";

export function logsPage(projectId: string, params: URLSearchParams): HTMLElement {
  const results = slot();
  let cursor: string | null = null;
  let last: Record<string, string> = {};
  const search = async (d: Record<string, string>, more: boolean) => {
    last = d;
    const body: Record<string, unknown> = { resource: { type: d.type || "function" }, limit: 100 };
    if (d.q) body.q = d.q;
    if (more && cursor) body.cursor = cursor;
    const r = await api("POST", `/projects/${projectId}/logs/search`, { body });
    cursor = r.has_more ? r.next_cursor : null;
    results.show(
      table(
        ["Time", "Level", "Resource", "Message"],
        r.data.map((l: any) => [l.timestamp, l.level, l.resource?.name ?? l.resource?.id ?? "", h("code", {}, l.body)]),
        "No log lines match.",
      ),
      cursor ? h("button", { type: "button", onclick: () => search(last, true).catch((e) => results.show(String(e))) }, "Older lines →") : null,
    );
  };
  const q = params.get("q") ?? "";
  if (q) search({ q }, false).catch(() => {});
  return h(
    "section",
    {},
    h("h1", {}, "Logs"),
    h("p", { class: "muted" }, 'Query grammar: words, "phrases", level:(error OR warn), resource.name:hello, deployment.id:…, AND / OR / NOT, -negation, ( ).'),
    form([field("Query", "q", { value: q, size: 50 }), select("Resource", "type", ["function", "frontend"])], "Search", (d) => search(d, false)),
    results,
  );
}
