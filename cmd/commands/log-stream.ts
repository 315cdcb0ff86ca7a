import { Client } from "../client";
import { KILN_VERSION } from "../../server/version";
import { qs } from "./shared";

// The live log tail's client (GET /projects/{id}/logs/tail, Server-Sent Events): `kiln logs --follow`
// and `kiln functions deploy --wait` (a deployment's build lines as they are written).

/** A log entry as the API gives it. */
export interface Entry {
  id: string;
  timestamp: string;
  level: string;
  body: string | Record<string, unknown>;
  resource: { type: string; id: string; name: string };
  region: string;
}

/**
 * Reads a Server-Sent Events stream, calling `onEvent` per event (its name, data lines joined, and `id:`
 * when it has one), until it ends (or its request is aborted). Comment lines (`:`) are skipped.
 */
export async function readEvents(res: Response, onEvent: (name: string, data: string, id?: string) => void): Promise<void> {
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, i);
      buffer = buffer.slice(i + 2);
      let name = "message";
      let id: string | undefined;
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (data.length) onEvent(name, data.join("\n"), id);
    }
  }
}

export interface TailFilter {
  fn?: string;
  /** The resource type (function when absent). */
  type?: "function" | "frontend";
  q?: string;
  build?: string;
  since?: string;
  until?: string;
  backlog: number;
}

/** Opens the live tail (a 4xx/5xx is thrown as the API's error); the stream ends when `signal` aborts. */
export async function openTail(c: Client, project: string, o: TailFilter, signal: AbortSignal): Promise<Response> {
  const query = qs({ type: o.type ?? "function", ids: o.fn, deployment_ids: o.build, q: o.q, start_time: o.since, end_time: o.until, backlog: Math.min(o.backlog, 1000) });
  const headers: Record<string, string> = { "X-Service-CLI-Version": KILN_VERSION, Accept: "text/event-stream" };
  if (c.token) headers.Authorization = `Bearer ${c.token}`;
  let res: Response;
  try {
    res = await fetch(`${c.url}/projects/${encodeURIComponent(project)}/logs/tail${query}`, { headers, signal });
  } catch (err) {
    throw new Error(`cannot reach Kiln at ${c.url} (${(err as Error).message}); is \`kiln start\` running?`);
  }
  if (!res.ok) throw await Client.apiError(res);
  return res;
}
