// The log store's interface, the line and query types both engines share, and the helpers both use
// (segments, key conditions, order). Engines: file-store.ts (embedded), sql-store.ts (production).
import { fieldKey, KeySet, requiredKeys, SEGMENT_KEYS, SEGMENT_LINES, type KeyCondition } from "./keys";
import { normalizeLevel } from "../../logs/levels";
import type { QueryNode } from "../../logs/query";

export type ResourceType = "function" | "frontend";
/** `runtime`: what invocations (or frontend requests) print; `build`: a deployment's build. */
export type LogStream = "runtime" | "build";

/** One log line as stored. `at` is on the platform clock (epoch ms). */
export interface StoredLine {
  id: string;
  project_id: string;
  resource_type: ResourceType;
  resource_id: string;
  resource_name: string;
  stream: LogStream;
  deployment_id: string | null;
  invocation_id: string | null;
  region: string;
  level: string;
  /** The body is a JSON object's text (a structured line). */
  structured: boolean;
  body: string;
  at: number;
}

export const LINE_COLUMNS = [
  "id",
  "project_id",
  "resource_type",
  "resource_id",
  "resource_name",
  "stream",
  "deployment_id",
  "invocation_id",
  "region",
  "level",
  "structured",
  "body",
  "at",
] as const;


/** What one search asks of the store: every filter, already validated. */
export interface LineQuery {
  projectId: string;
  resourceType: ResourceType;
  resourceIds?: readonly string[];
  /** Build lines of these deployments; without them, runtime lines. */
  deploymentIds?: readonly string[];
  where: QueryNode | null;
  /** Inclusive bounds, epoch ms. */
  startMs?: number;
  endMs?: number;
  /** Keyset: lines strictly older than this (at, id), i.e. after it in newest-first order. */
  before?: { at: string; id: string };
  limit: number;
}

export interface BuildLogSummary {
  lines: number;
  first_at: string | null;
  last_at: string | null;
}

/** Where log lines live; one SQL text for both profiles (see docs/observability.md). */
export interface LogStore {
  /** Writes lines; returns the segments written, by project (other instances' tails read them by these). */
  append(lines: readonly StoredLine[]): Promise<Map<string, string[]>>;
  /** Newest first, (at, id) descending. */
  search(q: LineQuery): Promise<StoredLine[]>;
  buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>>;
  removeProject(projectId: string): Promise<void>;
  /** Lines older than the cutoff are deleted, in batches; returns how many. */
  removeOlderThan(cutoffMs: number): Promise<number>;
  close(): Promise<void>;
}

/** Moves of lines kept elsewhere (by earlier versions) into the store, resumable by a position. */
export interface LogImports {
  /** How far a move from `source` has come; null before it started. */
  importPosition(source: string): Promise<string | null>;
  /** Lines moved in, with the position they reach, in one step: a move cut short resumes without duplicates. */
  importBatch(source: string, lines: readonly StoredLine[], position: string): Promise<void>;
}

/** A `log_lines` row as a line. */
export function fromRow(r: Record<string, unknown>): StoredLine {
  return {
    id: r.id as string,
    project_id: r.project_id as string,
    resource_type: r.resource_type as ResourceType,
    resource_id: r.resource_id as string,
    resource_name: r.resource_name as string,
    stream: r.stream as LogStream,
    deployment_id: (r.deployment_id as string | null) ?? null,
    invocation_id: (r.invocation_id as string | null) ?? null,
    region: r.region as string,
    level: r.level as string,
    structured: r.structured as boolean,
    body: r.body as string,
    at: new Date(r.at as string).getTime(),
  };
}


/** The levels a line must have to match the tree; null when any level may match. */
export function levelsOf(node: QueryNode): Set<string> | null {
  switch (node.kind) {
    case "match":
      return node.field === "level" ? new Set([normalizeLevel(node.value)]) : null;
    case "not":
      return null;
    case "and": {
      let out: Set<string> | null = null;
      for (const it of node.items) {
        const s = levelsOf(it);
        if (s) out = out ? new Set<string>([...out].filter((x: string) => s.has(x))) : s;
      }
      return out;
    }
    case "or": {
      const out = new Set<string>();
      for (const it of node.items) {
        const s = levelsOf(it);
        if (!s) return null;
        for (const x of s) out.add(x);
      }
      return out;
    }
  }
}

/** Newest first by (at, id). */
export function newerFirst(a: StoredLine, b: StoredLine): number {
  return b.at - a.at || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

/** The key condition of a search: its query's, and one of the resource ids asked for. */
export function keyCondition(q: LineQuery): KeyCondition | null {
  const parts: KeyCondition[] = [];
  const fromQuery = q.where ? requiredKeys(q.where) : null;
  if (fromQuery) parts.push(fromQuery);
  if (q.resourceIds?.length) {
    const ids = [...new Set(q.resourceIds)];
    parts.push({ kind: "or", items: ids.map((id) => ({ kind: "all", keys: [fieldKey("resource.id", id)] })) });
  }
  if (!parts.length) return null;
  return parts.length === 1 ? parts[0]! : { kind: "and", items: parts };
}

/** A segment of lines being written: one project, resource type and stream (and deployment, for build lines). */
export interface Segment {
  seg: string;
  lines: StoredLine[];
  keys: number[];
}

/**
 * Cuts a batch of lines into segments: grouped by project, resource type and stream (build lines
 * also by deployment), in (at, id) order, up to SEGMENT_LINES lines and SEGMENT_KEYS keys each.
 */
export function segmentsOf(lines: readonly StoredLine[], segId: (i: number) => string): Segment[] {
  const groups = new Map<string, StoredLine[]>();
  for (const l of lines) {
    const k = `${l.project_id}\u0000${l.resource_type}\u0000${l.stream}\u0000${l.stream === "build" ? (l.deployment_id ?? "") : ""}`;
    const g = groups.get(k);
    if (g) g.push(l);
    else groups.set(k, [l]);
  }
  const out: Segment[] = [];
  const keys = new KeySet();
  for (const g of groups.values()) {
    g.sort((a, b) => -newerFirst(a, b));
    let current: StoredLine[] = [];
    const close = () => {
      out.push({ seg: segId(out.length), lines: current, keys: keys.toArray() });
      current = [];
      keys.reset();
    };
    for (const l of g) {
      current.push(l);
      keys.addLine(l);
      if (current.length >= SEGMENT_LINES || keys.size >= SEGMENT_KEYS) close();
    }
    if (current.length) close();
  }
  return out;
}

/** COPY (text format) of prepared text into a table's columns. */
