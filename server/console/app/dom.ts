// A few DOM helpers instead of a framework: the console is forms, tables and links.

type Child = Node | string | number | null | undefined | false | Child[];
type Attrs = Record<string, string | number | boolean | null | undefined | ((e: any) => void)>;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else if (k in el && k !== "list" && typeof v !== "string") (el as any)[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
}

export function errorBox(err: unknown): HTMLElement {
  return h("div", { class: "error", role: "alert" }, err instanceof Error ? err.message : String(err));
}

/** A slot whose content a call replaces: loading text, then the result or the API's error. */
export function slot(): HTMLElement & { show(...c: Child[]): void; run(f: () => Promise<Child>): Promise<void> } {
  const el = h("div") as any;
  el.show = (...c: Child[]) => {
    el.replaceChildren();
    append(el, c);
  };
  el.run = async (f: () => Promise<Child>) => {
    el.show(h("p", { class: "muted" }, "Loading…"));
    try {
      el.show(await f());
    } catch (err) {
      el.show(errorBox(err));
    }
  };
  return el;
}

/**
 * A form whose submit runs `action` with its fields; the API's error appears above it and the
 * button is disabled while it runs.
 */
export function form(fields: Child[], label: string, action: (data: Record<string, string>, files: Record<string, File | undefined>, el: HTMLFormElement) => Promise<void>, attrs: Attrs = {}): HTMLFormElement {
  const status = h("div", { "aria-live": "polite" });
  const button = h("button", { type: "submit" }, label);
  const el = h("form", { ...attrs }, fields, button, status);
  el.addEventListener("submit", async (e) => {
    e.preventDefault();
    const data: Record<string, string> = {};
    const files: Record<string, File | undefined> = {};
    for (const [k, v] of new FormData(el)) {
      if (typeof v === "string") data[k] = v;
      else files[k] = v.size || v.name ? v : undefined;
    }
    button.disabled = true;
    status.replaceChildren();
    try {
      await action(data, files, el);
    } catch (err) {
      status.replaceChildren(errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  return el;
}

export function field(label: string, name: string, attrs: Attrs = {}): HTMLLabelElement {
  return h("label", {}, label, h("input", { name, ...attrs }));
}

export function select(label: string, name: string, options: string[], attrs: Attrs = {}): HTMLLabelElement {
  return h("label", {}, label, h("select", { name, ...attrs }, options.map((o) => h("option", { value: o }, o))));
}

export function table(headers: string[], rows: Child[][], empty = "None yet."): HTMLElement {
  if (rows.length === 0) return h("p", { class: "muted" }, empty);
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

export function button(label: string, onclick: () => void | Promise<void>, attrs: Attrs = {}): HTMLButtonElement {
  return h("button", { type: "button", onclick, ...attrs }, label);
}

export function json(value: unknown): HTMLElement {
  return h("pre", {}, JSON.stringify(value, null, 2));
}

export const when = (iso: string | null | undefined) => (iso ? iso.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC") : "—");

/**
 * Asks before something that cannot be undone, in a modal <dialog> (unlike confirm(), it is styled,
 * testable and can say what went wrong): focus starts on Cancel and stays in the dialog (Tab and
 * Shift+Tab cycle its buttons), Escape or Cancel answers no, Enter on the confirming button yes;
 * focus goes back to where it was. With `action`, the dialog stays open while it runs (its buttons
 * disabled) and closes when it succeeds; when it fails, the API's message is shown in the dialog and
 * focus goes to the confirming button (try again, or Escape). Resolves true once confirmed (and done).
 */
export function confirmDialog(message: string, confirmLabel: string, action?: () => Promise<unknown>): Promise<boolean> {
  return new Promise((resolve) => {
    const back = document.activeElement as HTMLElement | null;
    const cancel = h("button", { type: "button", value: "no" }, "Cancel");
    const yes = h("button", { type: "button", value: "yes", class: "danger" }, confirmLabel);
    const problem = h("div", { "aria-live": "assertive" });
    const text = h("p", {}, message);
    const dialog = h("dialog", { "aria-label": confirmLabel }, text, problem, h("div", { class: "actions" }, cancel, " ", yes));
    let answer = false;
    let busy = false;
    cancel.addEventListener("click", () => dialog.close());
    yes.addEventListener("click", async () => {
      if (busy) return;
      if (!action) return (answer = true), dialog.close();
      busy = cancel.disabled = yes.disabled = true;
      problem.replaceChildren();
      try {
        await action();
        answer = true;
        dialog.close();
      } catch (err) {
        problem.replaceChildren(errorBox(err));
        busy = cancel.disabled = yes.disabled = false;
        yes.focus();
      }
    });
    // Escape while the action runs would hide its outcome: it waits.
    dialog.addEventListener("cancel", (e) => busy && e.preventDefault());
    dialog.addEventListener("keydown", (e) => {
      if (e.key !== "Tab") return;
      const order = [cancel, yes].filter((b) => !b.disabled);
      const at = order.indexOf(document.activeElement as HTMLButtonElement);
      e.preventDefault();
      if (order.length) order[(at + (e.shiftKey ? order.length - 1 : 1)) % order.length]!.focus();
    });
    dialog.addEventListener("close", () => {
      dialog.remove();
      if (back?.isConnected) back.focus();
      resolve(answer);
    });
    document.body.appendChild(dialog);
    dialog.showModal();
    cancel.focus();
  });
}
