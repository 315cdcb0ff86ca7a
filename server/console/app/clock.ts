import { api } from "./api";
import { field, form, h, slot } from "./dom";

export function clockPage(): HTMLElement {
  const now = slot();
  let controllable = false;
  const load = () =>
    now.run(async () => {
      try {
        const c = await api("GET", "/_kiln/clock");
        controllable = true;
        return h("p", { class: "clock-now" }, `Kiln's time: ${c.now} (moved forward ${Math.round(c.offset_ms / 1000)} s)`);
      } catch (err: any) {
        if (err?.status !== 404) throw err;
        return h("p", {}, "This Kiln runs on the real clock (start it with --controllable-clock to move time forward from here).");
      }
    });
  load();
  return h(
    "section",
    {},
    h("h1", {}, "Platform clock"),
    now,
    h("p", { class: "muted" }, "Advancing fires every scheduler tick, durable sleep and expiry due on the way, in order."),
    form([field("Seconds", "seconds", { type: "number", min: "1", value: "3600", required: true })], "Advance", async (d) => {
      if (!controllable) throw new Error("the controllable clock is off; start Kiln with --controllable-clock");
      await api("POST", "/_kiln/clock/advance", { body: { seconds: Number(d.seconds) } });
      await load();
    }),
  );
}
