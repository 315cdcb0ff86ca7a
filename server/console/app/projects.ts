import { api, enc } from "./api";
import { button, confirmDialog, field, form, h, select, slot, table, when } from "./dom";
import { go } from "./router";

const PAGE = 20;

export function projectsPage(params: URLSearchParams): HTMLElement {
  const page = Math.max(1, Number(params.get("page") ?? "1") || 1);
  const list = slot();
  const load = () =>
    list.run(async () => {
      const r = await api<{ data: any[]; has_more: boolean; total: number }>("GET", `/projects?page=${page}&limit=${PAGE}`);
      return [
        table(
          ["Name", "Id", "Status", "Created", ""],
          r.data.map((p) => [
            h("a", { href: `#/p/${p.id}` }, p.name),
            h("code", {}, p.id),
            p.status,
            when(p.created_at),
            button(`Delete ${p.name}`, async () => {
              if (await confirmDialog(`Delete project ${p.name} and everything in it (functions, databases, storage, end users, keys)?`, `Delete project ${p.name}`, () => api("DELETE", `/projects/${p.id}`))) await load();
            }),
          ]),
          "No projects yet: create one above.",
        ),
        pager(page, r.has_more, r.total, "#/"),
      ];
    });
  load();
  return h(
    "section",
    {},
    h("h1", {}, "Projects"),
    form([field("Name", "name", { required: true, placeholder: "demo" })], "Create project", async (d, _f, el) => {
      const p = await api("POST", "/projects", { body: { name: d.name } });
      el.reset();
      go(`#/p/${p.id}`);
    }),
    list,
  );
}

/**
 * Previous/next links of a paginated list (the API's page, has_more, total). `base` is the page's
 * address without this list's `param`; a page with two lists gives each a param of its own (and a
 * label, so their navs are told apart).
 */
export function pager(page: number, hasMore: boolean, total: number | undefined, base: string, param = "page", label = "pages"): HTMLElement {
  const sep = base.includes("?") ? "&" : "?";
  return h(
    "nav",
    { "aria-label": label, class: "muted" },
    page > 1 ? h("a", { href: `${base}${sep}${param}=${page - 1}` }, "← Previous") : null,
    ` page ${page}${total !== undefined ? ` (${total} in all)` : ""} `,
    hasMore ? h("a", { href: `${base}${sep}${param}=${page + 1}` }, "Next →") : null,
  );
}

/** The page number a list's `param` asks for (1 when absent or not a number). */
export const pageOf = (params: URLSearchParams, param = "page") => Math.max(1, Math.floor(Number(params.get(param) ?? "1")) || 1);

/** The address of the current page without one of its list's page params (the others kept). */
export function listBase(base: string, params: URLSearchParams, param: string): string {
  const rest = new URLSearchParams(params);
  rest.delete(param);
  return `${base}${[...rest].length ? `?${rest}` : ""}`;
}

/** Rows per page of a project's access tokens and variables. */
const SETTINGS_PAGE = 50;

/** A project's credentials and settings: service and anon keys, access tokens and variables (each paginated). */
export function projectPage(projectId: string, params: URLSearchParams = new URLSearchParams()): HTMLElement {
  const tokensPage = pageOf(params, "tokens_page");
  const varsPage = pageOf(params, "vars_page");
  const here = projectPath(projectId);
  const head = slot();
  head.run(async () => {
    const p = await api("GET", `/projects/${projectId}`);
    return h("p", {}, "Id ", h("code", {}, p.id), ` · ${p.status} · created ${when(p.created_at)}`);
  });
  const shown = h("div", { "aria-live": "polite" });
  const once = (what: string, secret: string) => shown.replaceChildren(h("div", { class: "notice" }, `${what} (shown once, copy it now): `, h("code", {}, secret)));

  const serviceKeys = slot();
  const loadServiceKeys = () =>
    serviceKeys.run(async () => {
      const r = await api("GET", `/projects/${projectId}/service-keys`);
      return table(
        ["Name", "Prefix", "Created", ""],
        r.data.map((k: any) => [k.name, h("code", {}, k.key_prefix), when(k.created_at), button(`Revoke ${k.name}`, () => confirmDialog(`Revoke service key ${k.name}? Whatever uses it stops working.`, `Revoke service key ${k.name}`, () => api("DELETE", `/projects/${projectId}/service-keys/${k.id}`)).then((yes) => void (yes && loadServiceKeys())))]),
      );
    });
  const anonKeys = slot();
  const loadAnonKeys = () =>
    anonKeys.run(async () => {
      const r = await api("GET", `/projects/${projectId}/anon-keys`);
      return table(
        ["Name", "Key", "Created", ""],
        r.data.map((k: any) => [k.name, h("code", {}, k.key), when(k.created_at), button(`Revoke ${k.name}`, () => confirmDialog(`Revoke anon key ${k.name}? Apps that use it stop working.`, `Revoke anon key ${k.name}`, () => api("DELETE", `/projects/${projectId}/anon-keys/${k.id}`)).then((yes) => void (yes && loadAnonKeys())))]),
      );
    });
  const tokens = slot();
  const loadTokens = () =>
    tokens.run(async () => {
      const r = await api("GET", `/projects/${projectId}/access-tokens?page=${tokensPage}&limit=${SETTINGS_PAGE}`);
      return [
        table(
          ["Name", "Prefix", "Scope", "Status", "Expires", "Last used", ""],
          r.data.map((t: any) => [t.name, h("code", {}, t.token_prefix), t.scope, t.status, when(t.expires_at), when(t.last_used_at), button(`Revoke ${t.name}`, () => confirmDialog(`Revoke access token ${t.name}?`, `Revoke access token ${t.name}`, () => api("DELETE", `/projects/${projectId}/access-tokens/${t.id}`)).then((yes) => void (yes && loadTokens())))]),
        ),
        pager(tokensPage, r.has_more, r.total, listBase(here, params, "tokens_page"), "tokens_page", "access token pages"),
      ];
    });
  const vars = slot();
  const loadVars = () =>
    vars.run(async () => {
      const r = await api("GET", `/projects/${projectId}/variables?page=${varsPage}&limit=${SETTINGS_PAGE}`);
      return [
        table(
          ["Name", "Value", "Status", "Updated", ""],
          r.data.map((v: any) => [h("code", {}, v.name), h("code", {}, v.value), v.status, when(v.updated_at), button(`Delete ${v.name}`, () => confirmDialog(`Delete variable ${v.name}?`, `Delete variable ${v.name}`, () => api("DELETE", `/projects/${projectId}/variables/${v.id}`)).then((yes) => void (yes && loadVars())))]),
        ),
        pager(varsPage, r.has_more, r.total, listBase(here, params, "vars_page"), "vars_page", "variable pages"),
      ];
    });
  loadServiceKeys();
  loadAnonKeys();
  loadTokens();
  loadVars();
  return h(
    "section",
    {},
    head,
    shown,
    h("h2", {}, "Service keys"),
    form([field("Name", "name", { required: true })], "Create service key", async (d, _f, el) => {
      const k = await api("POST", `/projects/${projectId}/service-keys`, { body: { name: d.name } });
      once(`Service key ${k.name}`, k.key);
      el.reset();
      await loadServiceKeys();
    }),
    serviceKeys,
    h("h2", {}, "Anon keys"),
    form([field("Name", "name", { required: true })], "Create anon key", async (d, _f, el) => {
      await api("POST", `/projects/${projectId}/anon-keys`, { body: { name: d.name } });
      el.reset();
      await loadAnonKeys();
    }),
    anonKeys,
    h("h2", {}, "Access tokens"),
    form([field("Name", "name", { required: true }), select("Scope", "scope", ["read_only", "full"])], "Create access token", async (d, _f, el) => {
      const t = await api("POST", `/projects/${projectId}/access-tokens`, { body: { name: d.name, scope: d.scope } });
      once(`Access token ${t.name}`, t.token);
      el.reset();
      await loadTokens();
    }),
    tokens,
    h("h2", {}, "Variables"),
    form([field("Name", "name", { required: true }), field("Value", "value", { required: true })], "Set variable", async (d, _f, el) => {
      await api("POST", `/projects/${projectId}/variables`, { body: { name: d.name, value: d.value } });
      el.reset();
      await loadVars();
    }),
    vars,
  );
}

export const projectPath = (projectId: string, tail = "") => `#/p/${enc(projectId)}${tail}`;
