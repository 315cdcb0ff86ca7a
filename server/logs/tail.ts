import { entryView, type LogEntryView } from "./entries";
import type { StoredLine } from "../backends/logs/log-store";

export interface TailSubscription {
  projectId: string;
  accept(line: StoredLine): boolean;
  deliver(line: StoredLine): void;
  /** Kiln is stopping: end the stream. */
  end(): void;
}

/** Live tails per project; each ingested line is offered to its project's tails, nothing else. */
export class TailHub {
  private readonly byProject = new Map<string, Set<TailSubscription>>();

  /** `onEmpty`: the last tail of a project ended. */
  constructor(private readonly onEmpty: (projectId: string) => void = () => {}) {}

  subscribe(s: TailSubscription): () => void {
    let set = this.byProject.get(s.projectId);
    if (!set) this.byProject.set(s.projectId, (set = new Set()));
    set.add(s);
    return () => {
      if (!set.delete(s)) return;
      if (!set.size && this.byProject.get(s.projectId) === set) {
        this.byProject.delete(s.projectId);
        this.onEmpty(s.projectId);
      }
    };
  }

  count(projectId: string): number {
    return this.byProject.get(projectId)?.size ?? 0;
  }

  publish(lines: readonly StoredLine[]): void {
    if (!this.byProject.size) return;
    for (const l of lines) {
      const set = this.byProject.get(l.project_id);
      if (!set) continue;
      for (const s of set) if (s.accept(l)) s.deliver(l);
    }
  }

  /** The project is gone: its tails end. */
  endProject(projectId: string): void {
    const set = this.byProject.get(projectId);
    if (!set) return;
    for (const s of [...set]) s.end();
    if (this.byProject.delete(projectId)) this.onEmpty(projectId);
  }

  endAll(): void {
    for (const set of this.byProject.values()) for (const s of [...set]) s.end();
    this.byProject.clear();
  }
}

/** SSE events queued for one client at most; a client that reads slower loses lines, counted. */
export const TAIL_QUEUE_BYTES = 4 * 1024 * 1024;
const HEARTBEAT_MS = 15_000;
const MAX_HELD = 10_000;

function event(name: string, data: unknown, id?: string): string {
  return `${id ? `id: ${id}\n` : ""}event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
}

/**
 * A live tail as Server-Sent Events: first `backlog` (the newest stored lines matching, oldest
 * first), then every new matching line as it is ingested, each as `event: log` with the entry as
 * data and its id as the event id. A client too slow to keep up gets `event: dropped` with how
 * many lines it missed instead of Kiln holding them; a comment line every 15 s keeps proxies from
 * closing an idle stream.
 */
export function tailStream(
  hub: TailHub,
  o: {
    projectId: string;
    accept: (l: StoredLine) => boolean;
    /** The stored lines shown before live ones, newest first (as search returns them). */
    backlog: () => Promise<StoredLine[]>;
    signal: AbortSignal;
  },
): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  let unsubscribe = () => {};
  let heartbeat: ReturnType<typeof setInterval> | null = null;
  let closed = false;
  /** Live lines held while the backlog is read; null once it was sent. */
  let live: StoredLine[] | null = null;
  /** Lines this client missed and has not yet been told of. */
  let dropped = 0;
  let send: (chunk: string) => boolean = () => false;
  return new ReadableStream<Uint8Array>(
    {
      start(controller) {
        live = [];
        const close = () => {
          if (closed) return;
          closed = true;
          unsubscribe();
          if (heartbeat) clearInterval(heartbeat);
          try {
            controller.close();
          } catch {
            // already closed by the client
          }
        };
        send = (chunk: string): boolean => {
          if (closed) return false;
          if ((controller.desiredSize ?? 0) <= 0) return false;
          controller.enqueue(enc.encode(chunk));
          return true;
        };
        // Ids sent from the backlog: a line another instance announces after it was read from the
        // store is not sent twice.
        const seen = new Set<string>();
        const deliver = (l: StoredLine) => {
          if (seen.size && seen.has(l.id)) return;
          if (live) {
            // The backlog is still being read: hold a bounded number of live lines till then.
            if (live.length < MAX_HELD) live.push(l);
            else dropped++;
            return;
          }
          if (dropped && send(event("dropped", { count: dropped }))) dropped = 0;
          if (dropped || !send(event("log", entryView(l) satisfies LogEntryView, l.id))) dropped++;
        };
        // Subscribed before the backlog is read, so no line falls between the two.
        unsubscribe = hub.subscribe({ projectId: o.projectId, accept: o.accept, deliver, end: close });
        o.signal.addEventListener("abort", close);
        heartbeat = setInterval(() => send(": keep-alive\n\n"), HEARTBEAT_MS);
        heartbeat.unref?.();
        send(": tail started\n\n");
        void o
          .backlog()
          .then((stored) => {
            for (const l of stored.reverse()) {
              seen.add(l.id);
              if (!send(event("log", entryView(l), l.id))) dropped++;
            }
            const waiting = live ?? [];
            live = null;
            for (const l of waiting) deliver(l);
          })
          .catch((err) => {
            send(event("error", { error: `the backlog could not be read: ${(err as Error).message}` }));
            const waiting = live ?? [];
            live = null;
            for (const l of waiting) deliver(l);
          });
      },
      // The client read enough for the queue to take more: tell it at once what it missed, rather
      // than at the next matching line (which may be long in coming).
      pull() {
        if (!live && dropped && send(event("dropped", { count: dropped }))) dropped = 0;
      },
      cancel() {
        closed = true;
        unsubscribe();
        if (heartbeat) clearInterval(heartbeat);
      },
    },
    { highWaterMark: TAIL_QUEUE_BYTES, size: (chunk) => chunk?.byteLength ?? 0 },
  );
}
