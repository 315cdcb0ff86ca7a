import { api, apiAnswer, enc } from "./api";
import { backupsSection } from "./database-backups";
import { button, confirmDialog, field, form, h, slot, table, when } from "./dom";

/** What the SQL API answers (POST .../sql, a Kiln extension: docs/databases.md). */
interface SqlResult {
  command: string;
  row_count: number;
  columns: { name: string; type: string }[];
  rows: unknown[][];
  truncated: boolean;
  notices: string[];
  read_only: boolean;
}

const cell = (v: unknown) => (v === null || v === undefined ? h("span", { class: "muted" }, "null") : typeof v === "object" ? JSON.stringify(v) : String(v));

/** The result grid: one column per result column (duplicates kept apart), its type under its name. */
function resultGrid(r: SqlResult): HTMLElement {
  if (r.columns.length === 0) return h("p", { class: "muted" }, "The statement returns no rows.");
  if (r.rows.length === 0) return h("p", { class: "muted" }, "No rows.");
  return h(
    "div",
    { class: "grid-scroll" },
    h(
      "table",
      { class: "sql-grid" },
      h("thead", {}, h("tr", {}, r.columns.map((c) => h("th", { scope: "col", title: c.type }, c.name, h("div", { class: "muted type" }, c.type))))),
      h("tbody", {}, r.rows.map((row) => h("tr", {}, row.map((v) => h("td", {}, cell(v)))))),
    ),
  );
}

/** PostgreSQL's error as the API words it, with its SQLSTATE and a caret under the position. */
function sqlError(status: number, body: any, query: string): HTMLElement {
  const message = `${status}: ${body?.error ?? body?.code ?? String(body)}`;
  const parts: (HTMLElement | string)[] = [message];
  if (body?.code) parts.push(h("div", {}, `SQLSTATE ${body.code}${body.position ? ` at character ${body.position}` : ""}`));
  if (body?.position) {
    const before = query.slice(0, body.position - 1);
    const lineNo = before.split("\n").length;
    const line = query.split("\n")[lineNo - 1] ?? "";
    const col = before.length - before.lastIndexOf("\n") - 1;
    parts.push(h("pre", { class: "caret" }, `LINE ${lineNo}: ${line}\n${" ".repeat(`LINE ${lineNo}: `.length + col)}^`));
  }
  if (body?.detail) parts.push(h("div", {}, `DETAIL: ${body.detail}`));
  if (body?.hint) parts.push(h("div", {}, `HINT: ${body.hint}`));
  return h("div", { class: "error", role: "alert" }, parts);
}

/** The SQL editor: one statement on the database or a branch, through the SQL API, rows in a grid. */
function sqlEditor(base: string, branches: () => string[]): HTMLElement & { refreshTargets: () => void } {
  const results = h("div", { "aria-live": "polite", class: "query-results" });
  const target = h("select", { name: "target" }, h("option", { value: "" }, "main"));
  const refreshTargets = () => {
    const current = target.value;
    target.replaceChildren(h("option", { value: "" }, "main"), ...branches().map((b) => h("option", { value: b }, b)));
    target.value = branches().includes(current) ? current : "";
  };
  const query = h("textarea", { name: "query", required: true, spellcheck: false, class: "sql", placeholder: "select * from items where qty >= $1" });
  const el = form(
    [
      h("label", { class: "wide" }, "SQL (one statement; Ctrl+Enter runs it)", query),
      h("label", {}, "Run on", target),
      h("label", {}, "Parameters ($1, $2 … as a JSON array)", h("input", { name: "params", placeholder: '["5"]' })),
      field("Max rows", "max_rows", { type: "number", min: 1, max: 10000, value: "1000" }),
    ],
    "Run SQL",
    async (d) => {
      results.replaceChildren(h("p", { class: "muted" }, "Running…"));
      let params: unknown;
      if (d.params?.trim()) {
        try {
          params = JSON.parse(d.params);
        } catch (err) {
          throw new Error(`the parameters are not JSON: ${(err as Error).message}`);
        }
        if (!Array.isArray(params)) throw new Error("the parameters must be a JSON array");
      }
      const path = d.target ? `${base}/branches/${enc(d.target)}/sql` : `${base}/sql`;
      const started = performance.now();
      const r = await apiAnswer<SqlResult>("POST", path, { body: { query: d.query, ...(params ? { params } : {}), ...(d.max_rows ? { max_rows: Number(d.max_rows) } : {}) } });
      const ms = Math.round(performance.now() - started);
      if (!r.ok) return void results.replaceChildren(sqlError(r.status, r.body, d.query ?? ""));
      const x = r.body;
      results.replaceChildren(
        h(
          "div",
          {},
          h("p", { class: "sql-status" }, `${x.command} · ${x.row_count} row${x.row_count === 1 ? "" : "s"} · ${ms} ms${x.read_only ? " · read-only, rolled back" : ""}`),
          x.truncated ? h("p", { class: "warn", role: "status" }, `Truncated: only the first ${x.rows.length} rows are shown (max rows, or 4 MiB of rows).`) : null,
          x.notices.map((n) => h("p", { class: "muted" }, `NOTICE: ${n}`)),
          resultGrid(x),
        ),
      );
    },
    { class: "sql-editor" },
  );
  query.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      el.requestSubmit();
    }
  });
  return Object.assign(h("div", {}, el, results), { refreshTargets });
}

export function databasesPage(projectId: string): HTMLElement {
  const list = slot();
  const detail = slot();
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/databases`);
      return table(
        ["Name", "Status", "Version", "Region", "Created", ""],
        r.data.map((d: any) => [h("a", { href: "#", onclick: (e: Event) => (e.preventDefault(), show(d.database_name)) }, d.database_name), d.status, d.pg_version, d.region, when(d.created_at), button(`Delete ${d.database_name}`, () => confirmDialog(`Delete database ${d.database_name} and its data, branches and backups?`, `Delete database ${d.database_name}`, () => api("DELETE", `/projects/${projectId}/databases/${enc(d.database_name)}`)).then((yes) => void (yes && load())))]),
        "No databases yet.",
      );
    });

  const show = (name: string) =>
    detail.run(async () => {
      const base = `/projects/${projectId}/databases/${enc(name)}`;
      const [db, lint] = await Promise.all([api("GET", base), api("GET", `${base}/lint`)]);
      const branches = slot();
      let active: string[] = [];
      const editor = sqlEditor(base, () => active);
      const loadBranches = () =>
        branches.run(async () => {
          const r = await api("GET", `${base}/branches`);
          active = r.data.filter((b: any) => b.status === "active" && b.name !== "main").map((b: any) => b.name);
          editor.refreshTargets();
          return table(
            ["Branch", "Status", "Expires", "Created", ""],
            r.data.map((b: any) => [b.name, b.status, when(b.expires_at), when(b.created_at), b.name === "main" ? "" : button(`Delete branch ${b.name}`, () => confirmDialog(`Delete branch ${b.name} and what was written to it?`, `Delete the branch ${b.name}`, () => api("DELETE", `${base}/branches/${enc(b.name)}`)).then((yes) => void (yes && loadBranches())))]),
          );
        });
      const top = slot();
      const loadTop = () =>
        top.run(async () => {
          const r = await api("GET", `${base}/queries?limit=20`);
          const secs = (x: number) => (x < 1 ? `${(x * 1000).toFixed(1)} ms` : `${x.toFixed(2)} s`);
          return table(
            ["Query", "Calls", "Total", "Mean", "Max", "Rows", "Role"],
            r.data.map((q: any) => [h("code", {}, q.query), q.calls, secs(q.total_exec_time_seconds), secs(q.mean_exec_time_seconds), secs(q.max_exec_time_seconds), q.rows_processed, q.role]),
            "No statements yet.",
          );
        });
      loadBranches();
      loadTop();
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
        h("h3", {}, "SQL editor"),
        h("p", { class: "muted" }, "Runs one statement as the database's own role (full access, like its connection string) through the SQL API; 15 s statement timeout; read-only project tokens run it read-only and rolled back."),
        editor,
        h("h3", {}, "Branches"),
        form([field("Name", "name", { required: true })], "Create branch", async (d, _f, el) => {
          await api("POST", `${base}/branches`, { body: { name: d.name } });
          el.reset();
          await loadBranches();
        }),
        button("Refresh branches", () => loadBranches()),
        branches,
        h("h3", {}, "Top queries"),
        h("p", { class: "muted" }, "Statements by total execution time, from every path: wire clients, the query API and this SQL editor."),
        button("Refresh top queries", () => loadTop()),
        top,
        backupsSection(base),
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
