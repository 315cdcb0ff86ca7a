import { api, session } from "./api";
import { clockPage } from "./clock";
import { databasesPage } from "./databases";
import { durablePage } from "./durable";
import { errorBox, field, form, h } from "./dom";
import { explorerPage } from "./explorer";
import { functionsPage } from "./functions";
import { invocationPage } from "./invocation";
import { locksPage } from "./locks";
import { logsPage } from "./logs";
import { metricsPage } from "./metrics";
import { projectPage, projectPath, projectsPage } from "./projects";
import { current, go } from "./router";
import { schedulersPage } from "./schedulers";
import { storagePage } from "./storage";
import { usersPage } from "./users";

const app = document.getElementById("app")!;

/** The sign-in code of the start line's link, traded once for a platform token; the URL loses it at once. */
async function redeemLinkCode(): Promise<string | null> {
  const m = /(?:^#|&)code=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (!m) return null;
  history.replaceState(null, "", location.pathname + "#/");
  try {
    const r = await api<{ platform_token: string }>("POST", "/_console/sign-in", { body: { code: m[1] }, bearer: "" });
    session.signIn(r.platform_token);
    return null;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
}

function signInPage(problem: string | null): HTMLElement {
  return h(
    "main",
    {},
    h("h1", {}, "Kiln console"),
    problem ? errorBox(problem) : null,
    h("p", {}, "Sign in with the platform token (printed at Kiln's first start, kept in .kiln/credentials.json), or open the one-time link Kiln printed at start."),
    form([field("Platform token", "token", { type: "password", required: true, autocomplete: "off", placeholder: "pk-…" })], "Sign in", async (d) => {
      // Checked against the API before it is kept: a wrong token is refused here, with the API's message.
      await api("GET", "/projects?limit=1", { bearer: d.token });
      session.signIn(d.token);
      go("#/");
    }),
  );
}

const PROJECT_TABS: [string, string][] = [
  ["", "Settings & keys"],
  ["/functions", "Functions"],
  ["/databases", "Databases"],
  ["/storage", "Storage"],
  ["/logs", "Logs"],
  ["/users", "End users"],
  ["/schedulers", "Schedulers"],
  ["/durable", "Durable executions"],
  ["/metrics", "Metrics"],
  ["/locks", "Locks"],
];

function layout(content: HTMLElement, projectId?: string, tab?: string): HTMLElement {
  const nav = h(
    "nav",
    { "aria-label": "console" },
    h("a", { href: "#/" }, "Projects"),
    h("a", { href: "#/clock" }, "Clock"),
    h("a", { href: "#/api" }, "API explorer"),
    h("a", { href: "/_emulators/mail", target: "_blank", rel: "noopener" }, "Mail catcher"),
    h("button", { type: "button", onclick: () => (session.signOut(), go("#/")) }, "Sign out"),
  );
  const tabs = projectId
    ? h(
        "nav",
        { class: "tabs", "aria-label": "project" },
        h("strong", {}, `Project ${projectId}`),
        PROJECT_TABS.map(([t, label]) => h("a", { href: projectPath(projectId, t), "aria-current": t === tab ? "page" : null }, label)),
      )
    : null;
  return h("div", {}, h("header", {}, h("strong", {}, "Kiln console"), nav), h("main", {}, tabs, content));
}

function render(problem: string | null = null): void {
  if (!session.token()) {
    app.replaceChildren(signInPage(problem));
    return;
  }
  const { parts, params } = current();
  let page: HTMLElement;
  if (parts[0] === "p" && parts[1]) {
    const id = parts[1];
    const tab = parts[2] ? `/${parts[2]}` : "";
    const body =
      tab === "/functions" ? functionsPage(id, params) : tab === "/databases" ? databasesPage(id) : tab === "/storage" ? storagePage(id, params) : tab === "/logs"
                ? logsPage(id, params)
                : tab === "/users"
                  ? usersPage(id, params)
                  : tab === "/schedulers"
                    ? schedulersPage(id, params)
                    : tab === "/durable"
                      ? durablePage(id, params)
                      : tab === "/metrics"
                        ? metricsPage(id)
                        : tab === "/locks"
                          ? locksPage(id, params)
                          : tab === "/invocation"
                            ? invocationPage(id, params)
                            : projectPage(id, params);
    page = layout(body, id, tab);
  } else if (parts[0] === "clock") page = layout(clockPage());
  else if (parts[0] === "api") page = layout(explorerPage());
  else page = layout(projectsPage(params));
  app.replaceChildren(page);
  document.title = `Kiln console${parts.length ? ` · ${parts.filter((p, i) => i !== 1 || parts[0] !== "p").join(" · ")}` : ""}`;
}

// A sign-in link opened in a tab already showing the console changes only the fragment.
window.addEventListener("hashchange", () => (/(?:^#|&)code=/.test(location.hash) ? redeemLinkCode().then(render) : render()));
redeemLinkCode().then(render);
