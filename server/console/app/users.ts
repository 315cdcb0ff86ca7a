import { api, enc } from "./api";
import { button, field, form, h, slot, table, when } from "./dom";
import { pager, projectPath } from "./projects";

const PAGE = 50;

/** End users: searched by email, paginated, created with a password, deleted. */
export function usersPage(projectId: string, params: URLSearchParams): HTMLElement {
  const page = Math.max(1, Number(params.get("page") ?? "1") || 1);
  const search = params.get("search") ?? "";
  const list = slot();
  const load = () =>
    list.run(async () => {
      const q = new URLSearchParams({ page: String(page), limit: String(PAGE), ...(search ? { search } : {}) });
      const r = await api("GET", `/projects/${projectId}/users?${q}`);
      return [
        table(
          ["Email", "Confirmed", "Status", "Last sign-in", "Created", ""],
          r.data.map((u: any) => [u.email, u.email_confirmed ? "yes" : "no", u.status, when(u.last_sign_in_at), when(u.created_at), button(`Delete ${u.email}`, () => (confirm(`Delete ${u.email}?`) ? api("DELETE", `/projects/${projectId}/users/${u.id}`).then(load) : undefined))]),
          search ? "No end user matches." : "No end users yet.",
        ),
        pager(page, r.has_more, r.total, projectPath(projectId, `/users${search ? `?search=${enc(search)}` : ""}`)),
      ];
    });
  load();
  return h(
    "section",
    {},
    h("h1", {}, "End users"),
    h("p", { class: "muted" }, "Reset and confirmation links are in the ", h("a", { href: "/_emulators/mail", target: "_blank", rel: "noopener" }, "mail catcher"), "."),
    form([field("Search by email", "search", { value: search })], "Search", async (d) => {
      location.hash = projectPath(projectId, `/users${d.search ? `?search=${enc(d.search)}` : ""}`);
    }),
    form([field("Email", "email", { type: "email", required: true }), field("Password", "password", { type: "password", autocomplete: "new-password" })], "Create end user", async (d, _f, el) => {
      await api("POST", `/projects/${projectId}/users`, { body: { email: d.email, ...(d.password ? { password: d.password } : {}) } });
      el.reset();
      await load();
    }),
    list,
  );
}
