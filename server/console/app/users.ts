import { api, enc } from "./api";
import { button, confirmDialog, errorBox, field, form, h, select, slot, table, when } from "./dom";
import { pager, projectPath } from "./projects";

const PAGE = 50;
const HOW = ["confirmed (admin)", "unconfirmed (admin)", "sign-up (the app's flow)"];

/** The project's first active anon key: what the app's own sign-up and reset requests carry. */
async function anonKey(projectId: string): Promise<string> {
  const slotKey = `kiln.console.anon.${projectId}`;
  const saved = sessionStorage.getItem(slotKey);
  if (saved) return saved;
  const r = await api("GET", `/projects/${projectId}/anon-keys`);
  const key = r.data.find((k: any) => k.key && k.status !== "revoked")?.key;
  if (!key) throw new Error("the project has no anon key: create one on the project's page");
  sessionStorage.setItem(slotKey, key);
  return key;
}

/** The mail catcher's messages to one address, newest first, with their links (reset, confirmation). */
async function mailFor(email: string): Promise<HTMLElement> {
  const r = await api("GET", `/_emulators/mail/messages?to=${enc(email)}&limit=20`);
  if (r.data.length === 0) return h("p", { class: "muted" }, `No mail to ${email} in the mail catcher.`);
  return h(
    "div",
    {},
    r.data.map((m: any) =>
      h(
        "article",
        { class: "mail", "aria-label": `mail: ${m.subject}` },
        h("strong", {}, m.subject),
        h("span", { class: "muted" }, ` · ${when(m.received_at)} · from ${m.from}`),
        h("ul", {}, m.links.map((l: string) => h("li", {}, h("a", { href: l, target: "_blank", rel: "noopener" }, l)))),
        h("details", {}, h("summary", {}, "Text"), h("pre", {}, m.text)),
      ),
    ),
  );
}

/**
 * End users: searched by email, paginated, created (confirmed or not by the admin API, or through
 * the app's sign-up, which mails a confirmation link when the project asks for one), deleted; a
 * password reset mailed to one, and the links of their mail in the mail catcher.
 */
export function usersPage(projectId: string, params: URLSearchParams): HTMLElement {
  const page = Math.max(1, Number(params.get("page") ?? "1") || 1);
  const search = params.get("search") ?? "";
  const list = slot();
  const mail = slot();
  const status = h("div", { "aria-live": "polite" });
  const showMail = (email: string): Promise<void> =>
    mail.run(async (): Promise<HTMLElement[]> => [h("h2", {}, `Mail to ${email}`), button("Refresh mail", () => showMail(email)), await mailFor(email)]);
  const sendReset = async (email: string) => {
    status.replaceChildren();
    try {
      const r = await api("POST", "/auth/forgot-password", { bearer: await anonKey(projectId), body: { email } });
      status.replaceChildren(h("div", { class: "notice" }, `${r.message} (${email})`));
      await showMail(email);
    } catch (err) {
      status.replaceChildren(errorBox(err));
    }
  };
  const load = () =>
    list.run(async () => {
      const q = new URLSearchParams({ page: String(page), limit: String(PAGE), ...(search ? { search } : {}) });
      const r = await api("GET", `/projects/${projectId}/users?${q}`);
      return [
        table(
          ["Email", "Confirmed", "Status", "Last sign-in", "Created", "", "", ""],
          r.data.map((u: any) => [
            u.email,
            u.email_confirmed ? "yes" : "no",
            u.status,
            when(u.last_sign_in_at),
            when(u.created_at),
            button(`Send reset link to ${u.email}`, () => sendReset(u.email)),
            button(`Mail to ${u.email}`, () => showMail(u.email)),
            button(`Delete ${u.email}`, () => confirmDialog(`Delete end user ${u.email}? Their sessions end and they cannot sign in again.`, `Delete end user ${u.email}`, () => api("DELETE", `/projects/${projectId}/users/${u.id}`)).then((yes) => void (yes && load()))),
          ]),
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
    h("p", { class: "muted" }, "Reset and confirmation links are in the ", h("a", { href: "/_emulators/mail", target: "_blank", rel: "noopener" }, "mail catcher"), "; a user's own are listed under Mail."),
    form([field("Search by email", "search", { value: search })], "Search", async (d) => {
      location.hash = projectPath(projectId, `/users${d.search ? `?search=${enc(d.search)}` : ""}`);
    }),
    form(
      [field("Email", "email", { type: "email", required: true }), field("Password", "password", { type: "password", autocomplete: "new-password" }), select("Create as", "how", HOW)],
      "Create end user",
      async (d, _f, el) => {
        if (d.how === HOW[2]) {
          if (!d.password) throw new Error("sign-up needs a password");
          const r = await api("POST", "/auth/signup", { bearer: await anonKey(projectId), body: { email: d.email, password: d.password } });
          status.replaceChildren(h("div", { class: "notice" }, r.access_token ? `Signed up ${d.email} (the project needs no confirmation).` : `Signed up ${d.email}: a confirmation link was mailed.`));
          await showMail(d.email!);
        } else {
          await api("POST", `/projects/${projectId}/users`, { body: { email: d.email, ...(d.password ? { password: d.password } : {}), email_confirmed: d.how === HOW[0] } });
        }
        el.reset();
        await load();
      },
    ),
    status,
    list,
    mail,
  );
}
