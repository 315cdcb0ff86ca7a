import type { StoredLine } from "../backends/logs/log-store";

/** A log entry as the API shows it (spec: "Log entry and log search result"). */
export interface LogEntryView {
  id: string;
  timestamp: string;
  level: string;
  body: string | Record<string, unknown>;
  resource: { type: "function" | "frontend"; id: string; name: string };
  region: string;
  invocation_id: string | null;
  deployment_id: string | null;
}

/** A structured line's body is its JSON object; anything else its text. */
export function entryView(l: StoredLine): LogEntryView {
  let body: LogEntryView["body"] = l.body;
  if (l.structured) {
    try {
      const o = JSON.parse(l.body);
      if (o && typeof o === "object" && !Array.isArray(o)) body = o;
    } catch {
      // stored as structured, yet not JSON (cannot happen through the ingest): show the text
    }
  }
  return {
    id: l.id,
    timestamp: new Date(l.at).toISOString(),
    level: l.level,
    body,
    resource: { type: l.resource_type, id: l.resource_id, name: l.resource_name },
    region: l.region,
    invocation_id: l.invocation_id,
    deployment_id: l.deployment_id,
  };
}
