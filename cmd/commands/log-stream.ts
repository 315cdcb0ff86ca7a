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
