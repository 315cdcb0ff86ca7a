import { api, enc, serviceKey } from "./api";
import { button, field, form, h, select, slot, table, when } from "./dom";

function parseJson(label: string, text: string | undefined, fallback: unknown): unknown {
  if (!text?.trim()) return fallback;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`${label} is not JSON: ${(err as Error).message}`);
  }
}

/** Rows as a grid: the union of their columns, in first-seen order. */
function grid(rows: Record<string, unknown>[]): HTMLElement {
  const cols: string[] = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
  return table(
    cols,
    rows.map((r) => cols.map((c) => (r[c] === null || r[c] === undefined ? h("span", { class: "muted" }, "null") : typeof r[c] === "object" ? JSON.stringify(r[c]) : String(r[c])))),
    "No rows.",
  );
}

export function databasesPage(projectId: string): HTMLElement {
  const list = slot();
  const detail = slot();
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/databases`);
      return table(
        ["Name", "Status", "Version", "Region", "Created", ""],
        r.data.map((d: any) => [h("a", { href: "#", onclick: (e: Event) => (e.preventDefault(), show(d.database_name)) }, d.database_name), d.status, d.pg_version, d.region, when(d.created_at), button(`Delete ${d.database_name}`, () => (confirm(`Delete database ${d.database_name}?`) ? api("DELETE", `/projects/${projectId}/databases/${enc(d.database_name)}`).then(load) : undefined))]),
        "No databases yet.",
      );
    });

  const show = (name: string) =>
    detail.run(async () => {
      const base = `/projects/${projectId}/databases/${enc(name)}`;
      const [db, lint] = await Promise.all([api("GET", base), api("GET", `${base}/lint`)]);
      const branches = slot();
      const loadBranches = () =>
        branches.run(async () => {
          const r = await api("GET", `${base}/branches`);
          return table(
            ["Branch", "Status", "Expires", "Created", ""],
            r.data.map((b: any) => [b.name, b.status, when(b.expires_at), when(b.created_at), b.name === "main" ? "" : button(`Delete branch ${b.name}`, () => api("DELETE", `${base}/branches/${enc(b.name)}`).then(loadBranches))]),
          );
        });
      loadBranches();
      const results = h("div", { "aria-live": "polite", class: "query-results" });
      return h(
        "section",
        { "aria-label": `database ${name}` },
        h("h2", {}, `Database ${name}`),
        h("p", {}, `${db.status} · PostgreSQL ${db.pg_version} · `, h("code", {}, db.connection_string ?? "")),
        h("h3", {}, "Tables row-level security does not guard"),
        lint.exposed_tables.length ? h("p", { class: "warn", role: "status" }, `Exposed to the anon key or end users with no row check: ${lint.exposed_tables.join(", ")}`) : h("p", { class: "muted" }, "No table is exposed without row-level security."),
        table(
          ["Table", "Kind", "Anon key may", "End users may", "Exposed"],
          lint.tables_without_rls.map((t: any) => [`${t.schema}.${t.name}`, t.kind, t.anonymous.join(", ") || "—", t.authenticated.join(", ") || "—", t.exposed ? h("span", { class: "warn" }, "exposed") : "no"]),
          "Every table has row-level security on.",
        ),
        h("h3", {}, "Query"),
        h("p", { class: "muted" }, "Runs through the query API with this console's service key (select, insert, update, delete on one table; DDL goes through psql: kiln db psql)."),
        form(
          [
            select("Operation", "operation", ["select", "insert", "update", "delete"]),
            field("Table", "table", { required: true }),
            field("Branch (empty: the main one)", "branch"),
            h("label", {}, 'Filters (JSON, e.g. [{"column":"qty","operator":"gte","value":5}])', h("textarea", { name: "filters" })),
            h("label", {}, "Values (JSON object or array, insert/update)", h("textarea", { name: "values" })),
          ],
          "Run",
          async (d) => {
            results.replaceChildren();
            const body: Record<string, unknown> = { table: d.table };
            const filters = parseJson("filters", d.filters, undefined);
            if (filters !== undefined) body.filters = filters;
            if (d.operation === "insert" || d.operation === "update") body.values = parseJson("values", d.values, {});
            if (d.operation === "select") body.limit = 1000;
            const path = d.branch && d.branch !== "main" ? `/databases/${enc(name)}/branches/${enc(d.branch)}/query/${d.operation}` : `/databases/${enc(name)}/query/${d.operation}`;
            const r = await api("POST", path, { bearer: await serviceKey(projectId), body });
            const rows = Array.isArray(r.data) ? r.data : Array.isArray(r.rows) ? r.rows : [];
            results.replaceChildren(h("p", {}, `${rows.length} row${rows.length === 1 ? "" : "s"}${r.count !== undefined ? ` (count ${r.count})` : ""}`), grid(rows));
          },
        ),
        results,
        h("h3", {}, "Branches"),
        form([field("Name", "name", { required: true })], "Create branch", async (d, _f, el) => {
          await api("POST", `${base}/branches`, { body: { name: d.name } });
          el.reset();
          await loadBranches();
        }),
        branches,
      );
    });

  load();
  return h(
    "section",
    {},
    h("h1", {}, "Databases"),
    form([field("Name", "name", { required: true })], "Create database", async (d, _f, el) => {
      await api("POST", `/projects/${projectId}/databases`, { body: { name: d.name } });
      el.reset();
      await load();
    }),
    list,
    detail,
  );
}
