// Long lists without long pages: a virtualized table (only the rows in view are in the DOM) over a
// bounded buffer (past its cap the oldest rows go).
import { h } from "./dom";

type Cell = Node | string;

export interface VirtualTable<T> {
  el: HTMLElement;
  /** Replaces every row. */
  set(items: T[]): void;
  /** Adds rows at the top (newest first lists: a live tail's new lines). */
  prepend(items: T[]): void;
  /** Adds rows at the bottom (an older page). */
  append(items: T[]): void;
  readonly items: readonly T[];
  /** Rows dropped to stay within the cap since the last `set`. */
  readonly dropped: number;
  /** The most rows kept. */
  readonly cap: number;
}

/**
 * A table of fixed-height rows, scrolled inside a box of `height` px: the DOM holds the visible rows
 * plus a margin whatever the length, so 100k rows cost what 50 do. ARIA table roles (so rows and cells
 * are found as on a <table>), aria-rowcount/aria-rowindex for screen readers; the box takes focus,
 * so the arrow and page keys scroll it. `cap` bounds the rows kept: the ones at the far end of where
 * rows are added go first.
 */
export function virtualTable<T>(o: { label: string; headers: string[]; row: (item: T) => Cell[]; cap?: number; rowHeight?: number; height?: number; empty?: string; columns?: string }): VirtualTable<T> {
  const rowHeight = o.rowHeight ?? 28;
  const height = o.height ?? 480;
  const cap = o.cap ?? Infinity;
  let items: T[] = [];
  let dropped = 0;
  const head = h("div", { role: "row", class: "vrow vhead" }, o.headers.map((t) => h("div", { role: "columnheader" }, t)));
  const spacer = h("div", { role: "rowgroup", class: "vspacer" });
  const viewport = h("div", { class: "vbox", tabindex: "0", "aria-label": `${o.label} (scroll with the arrow and page keys)` }, spacer);
  const empty = h("p", { class: "muted" }, o.empty ?? "None.");
  const count = h("p", { class: "muted vcount", "aria-live": "polite" });
  const table = h("div", { role: "table", "aria-label": o.label, class: "vtable" }, h("div", { role: "rowgroup" }, head), viewport);
  const el = h("div", {}, count, table, empty);
  viewport.style.maxHeight = `${height}px`;
  if (o.columns) for (const r of [head]) r.style.gridTemplateColumns = o.columns;

  let frame = 0;
  const draw = () => {
    frame = 0;
    table.hidden = items.length === 0;
    empty.hidden = items.length > 0;
    count.textContent = items.length ? `${items.length} row${items.length === 1 ? "" : "s"}${dropped ? ` (${dropped} oldest dropped to keep at most ${cap})` : ""}` : "";
    table.setAttribute("aria-rowcount", String(items.length + 1));
    spacer.style.height = `${items.length * rowHeight}px`;
    const first = Math.max(0, Math.floor(viewport.scrollTop / rowHeight) - 10);
    const last = Math.min(items.length, Math.ceil((viewport.scrollTop + (viewport.clientHeight || height)) / rowHeight) + 10);
    const rows: HTMLElement[] = [];
    for (let i = first; i < last; i++) {
      const r = h("div", { role: "row", class: "vrow", "aria-rowindex": i + 2 }, o.row(items[i]!).map((c) => h("div", { role: "cell" }, c)));
      r.style.top = `${i * rowHeight}px`;
      r.style.height = `${rowHeight}px`;
      if (o.columns) r.style.gridTemplateColumns = o.columns;
      rows.push(r);
    }
    spacer.replaceChildren(...rows);
  };
  const redraw = () => {
    if (!frame) frame = requestAnimationFrame(draw);
  };
  viewport.addEventListener("scroll", redraw, { passive: true });
  const trim = (fromEnd: boolean) => {
    if (items.length <= cap) return;
    const extra = items.length - cap;
    dropped += extra;
    if (fromEnd) items.length = cap;
    else items.splice(0, extra);
  };
  draw();
  return {
    el,
    cap,
    get items() {
      return items;
    },
    get dropped() {
      return dropped;
    },
    set(next) {
      items = next.slice(0, cap === Infinity ? undefined : cap);
      dropped = 0;
      viewport.scrollTop = 0;
      draw();
    },
    prepend(next) {
      if (!next.length) return;
      // Keeps what the reader looks at in place when they scrolled down.
      const keep = viewport.scrollTop > 0 ? next.length * rowHeight : 0;
      items = next.concat(items);
      trim(true);
      if (keep) viewport.scrollTop += keep;
      redraw();
    },
    append(next) {
      if (!next.length) return;
      items = items.concat(next);
      trim(false);
      redraw();
    },
  };
}
