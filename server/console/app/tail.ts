// The logs API's live tail (GET /projects/{id}/logs/tail, Server-Sent Events) read with fetch: an
// EventSource cannot send the Authorization header. The CLI reads it the same way (server/logs/sse-reader.ts).
import { readEvents } from "../../logs/sse-reader";
import { request } from "./api";

export interface LogEntry {
  id: string;
  timestamp: string;
  level: string;
  body: string | Record<string, unknown>;
  resource: { type: string; id: string; name: string };
  region: string;
  invocation_id: string | null;
  deployment_id: string | null;
}

export interface TailHandlers {
  /** Lines as they arrive, a batch per chunk read (oldest first). */
  lines(batch: LogEntry[]): void;
  /** Kiln dropped `count` lines this reader was too slow for. */
  dropped(count: number): void;
  /** The stream ended (Kiln stopping, the project gone) or failed; not called after `stop`. */
  ended(err?: unknown): void;
}

/**
 * Opens a live tail with the search filters as query parameters; `stop` closes it. Kiln allows a
 * few tails per project at once, so a page closes its tail when it is left (see `whileHere`).
 */
export function followLogs(projectId: string, filter: Record<string, string | undefined>, on: TailHandlers): { stop(): void } {
  const abort = new AbortController();
  const q = new URLSearchParams(Object.entries(filter).filter((e): e is [string, string] => !!e[1]));
  (async () => {
    const res = await request("GET", `/projects/${encodeURIComponent(projectId)}/logs/tail?${q}`, { headers: { Accept: "text/event-stream" }, signal: abort.signal });
    let batch: LogEntry[] = [];
    await readEvents(
      res,
      (name, data) => {
        if (name === "log") batch.push(JSON.parse(data));
        else if (name === "dropped") on.dropped(JSON.parse(data).count ?? 0);
        else if (name === "error") throw new Error(JSON.parse(data).error ?? "the tail failed");
      },
      () => {
        // The lines of one chunk read go out together.
        if (batch.length) on.lines(batch);
        batch = [];
      },
    );
  })().then(
    () => abort.signal.aborted || on.ended(),
    (err) => abort.signal.aborted || on.ended(err),
  );
  return { stop: () => abort.abort() };
}

/** Runs `stop` when the console shows another page (or the tab goes away). */
export function whileHere(stop: () => void): void {
  const leave = () => {
    window.removeEventListener("hashchange", leave);
    window.removeEventListener("pagehide", leave);
    stop();
  };
  window.addEventListener("hashchange", leave);
  window.addEventListener("pagehide", leave);
}

/** A line's text: a structured line's object as JSON. */
export const bodyText = (l: Pick<LogEntry, "body">) => (typeof l.body === "string" ? l.body : JSON.stringify(l.body));
