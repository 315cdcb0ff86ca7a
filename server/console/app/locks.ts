import { api, enc, serviceKey } from "./api";
import { button, confirmDialog, field, form, h, slot, when } from "./dom";

/**
 * Inspect a lock by key (held or free, until when, its fencing token) and force-release it. The API
 * has no route that lists locks, so the page asks for the key.
 */
export function locksPage(projectId: string, params: URLSearchParams): HTMLElement {
  const out = slot();
  // Lock routes want a request id on every call (the API's idempotency and log correlation).
  const call = async (method: string, key: string) =>
    api(method, `/locks/${enc(key)}`, { bearer: await serviceKey(projectId), headers: { "X-Service-Request-Id": crypto.randomUUID() } });
  const inspect = (key: string): Promise<void> =>
    out.run(async () => {
      const s = await call("GET", key);
      return h(
        "div",
        { class: "lock" },
        h("h2", {}, `Lock ${key}`),
        s.held
          ? [
              h("p", {}, `held · expires ${when(s.expires_at)} · fencing token ${s.fencing_token}`),
              button(`Force release ${key}`, async () => {
                if (await confirmDialog(`Free ${key} whoever holds it? Its holder learns at its next renewal.`, `Release the lock ${key}`, () => call("DELETE", key))) await inspect(key);
              }),
            ]
          : h("p", {}, "free: an acquire would succeed now"),
        button("Refresh lock", () => inspect(key)),
      );
    });
  const initial = params.get("key");
  if (initial) inspect(initial);
  return h(
    "section",
    {},
    h("h1", {}, "Locks"),
    h("p", { class: "muted" }, "The API does not list locks: inspect one by its key."),
    form([field("Lock key", "key", { required: true, value: initial ?? "" })], "Inspect", async (d) => void (await inspect(d.key))),
    out,
  );
}
