import { request } from "./api";
import { field, form, h, json, slot } from "./dom";

/** Every route of /openapi.json with its parameters and schemas, each tried with the signed-in token or a key given here. */
export function explorerPage(): HTMLElement {
  const list = slot();
  let doc: any = null;
  const render = (filter: string) => {
    const f = filter.toLowerCase();
    const routes: HTMLElement[] = [];
    for (const [path, ops] of Object.entries<any>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(ops)) {
        if (f && !`${method} ${path} ${op.summary ?? ""} ${(op.tags ?? []).join(" ")}`.toLowerCase().includes(f)) continue;
        routes.push(route(path, method, op));
      }
    }
    list.show(h("p", { class: "muted" }, `${routes.length} routes`), routes);
  };
  list
    .run(async () => {
      doc = await (await request("GET", "/openapi.json")).json();
      return null;
    })
    .then(() => doc && render(""));
  return h(
    "section",
    {},
    h("h1", {}, "API explorer"),
    form([field("Filter", "filter", { placeholder: "storage, POST, /projects…" })], "Filter", async (d) => render(d.filter ?? "")),
    list,
  );
}

function route(path: string, method: string, op: any): HTMLElement {
  const pathParams = (op.parameters ?? []).filter((p: any) => p.in === "path");
  const queryParams = (op.parameters ?? []).filter((p: any) => p.in === "query");
  const body = op.requestBody?.content?.["application/json"]?.schema;
  const el = h("details", { class: "route" }, h("summary", {}, h("span", { class: "method" }, method.toUpperCase()), h("code", {}, path), " ", h("span", { class: "muted" }, op.summary ?? "")));
  // Built when opened: a few hundred routes' schemas rendered up front would slow the page down.
  el.addEventListener("toggle", () => {
    if (el.open && el.childElementCount === 1) el.append(...routeBody(path, method, op, pathParams, queryParams, body).filter((x): x is HTMLElement => x !== null));
  });
  return el;
}

function routeBody(path: string, method: string, op: any, pathParams: any[], queryParams: any[], body: any): (HTMLElement | null)[] {
  const out = h("div", { "aria-live": "polite" });
  return [
    (op.parameters ?? []).length ? [h("h4", {}, "Parameters"), json((op.parameters ?? []).map((p: any) => ({ name: p.name, in: p.in, required: !!p.required, schema: p.schema })))] : null,
    body ? [h("h4", {}, "Request body"), json(body)] : op.requestBody ? h("p", {}, `Request body: ${Object.keys(op.requestBody.content ?? {}).join(", ")}`) : null,
    h("h4", {}, "Responses"),
    json(Object.fromEntries(Object.entries<any>(op.responses ?? {}).map(([s, r]) => [s, r.content?.["application/json"]?.schema ?? r.description ?? r]))),
    method === "options" || method === "head"
      ? null
      : form(
          [
            ...pathParams.map((p: any) => field(p.name, `path:${p.name}`, { required: true })),
            ...queryParams.map((p: any) => field(`${p.name} (query)`, `query:${p.name}`)),
            body ? h("label", {}, "JSON body", h("textarea", { name: "body" })) : null,
            field("Bearer (empty: the signed-in platform token)", "bearer", { type: "password", autocomplete: "off" }),
          ],
          `Try ${method.toUpperCase()} ${path}`,
          async (d) => {
            let url = path;
            for (const p of pathParams) url = url.replace(`{${p.name}}`, encodeURIComponent(d[`path:${p.name}`] ?? ""));
            const q = new URLSearchParams();
            for (const p of queryParams) if (d[`query:${p.name}`]) q.set(p.name, d[`query:${p.name}`]!);
            if ([...q].length) url += `?${q}`;
            const started = performance.now();
            let res: Response;
            try {
              res = await fetch(url, {
                method: method.toUpperCase(),
                headers: { ...(d.bearer || sessionStorage.getItem("kiln.console.token") ? { Authorization: `Bearer ${d.bearer || sessionStorage.getItem("kiln.console.token")}` } : {}), ...(body && d.body ? { "Content-Type": "application/json" } : {}) },
                body: body && d.body ? d.body : undefined,
              });
            } catch (err) {
              throw new Error(`the request failed: ${(err as Error).message}`);
            }
            const text = await res.text();
            let shown: unknown = text;
            try {
              shown = JSON.parse(text);
            } catch {}
            out.replaceChildren(h("p", {}, `${res.status} ${res.statusText} in ${Math.round(performance.now() - started)} ms`), json(shown));
          },
        ),
    out,
  ].flat() as (HTMLElement | null)[];
}
