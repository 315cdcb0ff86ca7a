/**
 * Segment keys: what the log store's text index holds. Lines are written in segments (up to
 * SEGMENT_LINES lines of one project, resource type and stream, in time order); each segment has
 * one row in `log_segments` with the set of keys of its lines, under a GIN index:
 *
 * - the case-folded ASCII trigrams of every body (`keys @> ...` narrows free text to the segments
 *   that may hold it), and
 * - one hashed key per field value (`level:error`, `invocation.id:...`, `region:...`, `resource.id:...`,
 *   `resource.name:...`, `deployment.id:...`).
 *
 * A query's tree gives a necessary condition over these keys (`requiredKeys`): a segment without
 * them cannot hold a matching line, so only the others are read, line by line, with the query's
 * exact SQL. An index entry per distinct key of a segment (about 5-10 a line) instead of one per
 * trigram of every line (about 50) is what makes writing cheap; the price is that a term whose
 * trigrams are all common (in most segments) narrows nothing, and those segments are read.
 *
 * Soundness: a trigram is taken only from three consecutive ASCII characters. For a query term,
 * windows are taken only inside its runs of ASCII characters; for a body, ASCII letters are
 * folded to lower case and the two non-ASCII characters whose lower case is an ASCII letter
 * (KELVIN SIGN, LATIN CAPITAL LETTER I WITH DOT ABOVE) count as that letter. So whenever
 * `body ILIKE '%term%'` holds under any PostgreSQL locale, every trigram of the term is among the
 * body's: the index never hides a match (it may let through segments that hold none).
 */
import { normalizeLevel } from "../../logs/levels";
import type { QueryField, QueryNode } from "../../logs/query";

/** Lines of a segment at most, and its distinct keys at most (a segment closes early beyond). */
export const SEGMENT_LINES = 64;
export const SEGMENT_KEYS = 1500;
/** Trigrams of one query term used at most (any subset of a term's trigrams is still necessary). */
const TERM_KEYS = 24;

/** The fields a line has a key for, with how the line gives its value. */
export interface KeyedLine {
  body: string;
  level: string;
  region: string;
  resource_id: string;
  resource_name: string;
  deployment_id: string | null;
  invocation_id: string | null;
}

const KELVIN = 0x212a;
const CAPITAL_I_DOT = 0x130;

/** A trigram of three ASCII characters (already folded), as a non-negative int below 2^21. */
function trigram(a: number, b: number, c: number): number {
  return (a << 14) | (b << 7) | c;
}

/** A field value's key: FNV-1a over "field:value", as a negative int (never equal to a trigram). */
export function fieldKey(field: QueryField, value: string): number {
  const s = `${field}:${value}`;
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h | 0x80000000;
}

/** Field keys of recent values, per field (lines of a batch repeat the same value strings), bounded. */
const recentKeys = new Map<QueryField, Map<string, number>>();
function cachedKey(field: QueryField, value: string): number {
  let m = recentKeys.get(field);
  if (!m) recentKeys.set(field, (m = new Map()));
  let k = m.get(value);
  if (k === undefined) {
    if (m.size >= 10_000) m.clear();
    m.set(value, (k = fieldKey(field, value)));
  }
  return k;
}

/**
 * Collects keys, each once: trigram keys in a table of 2^21 marks (one pass per segment,
 * reset by a new stamp), field keys in a set.
 */
export class KeySet {
  private static marks = new Uint32Array(1 << 21);
  private static stamps = 0;
  private stamp: number;
  private readonly fields = new Set<number>();
  private trigrams: number[] = [];

  constructor() {
    this.stamp = KeySet.next();
  }

  private static next(): number {
    if (++KeySet.stamps === 0xffffffff) {
      KeySet.marks.fill(0);
      KeySet.stamps = 1;
    }
    return KeySet.stamps;
  }

  get size(): number {
    return this.trigrams.length + this.fields.size;
  }

  /** Trigrams of a body: ASCII folded, KELVIN SIGN as k and I WITH DOT as i, anything else a break. */
  addBody(s: string): void {
    const marks = KeySet.marks;
    const stamp = this.stamp;
    let a = -1;
    let b = -1;
    for (let i = 0; i < s.length; i++) {
      let c = s.charCodeAt(i);
      if (c >= 128) {
        if (c === KELVIN) c = 107;
        else if (c === CAPITAL_I_DOT) c = 105;
        else {
          a = b = -1;
          continue;
        }
      } else if (c >= 65 && c <= 90) c += 32;
      if (a >= 0) {
        const k = trigram(a, b, c);
        if (marks[k] !== stamp) {
          marks[k] = stamp;
          this.trigrams.push(k);
        }
      }
      a = b;
      b = c;
    }
  }

  addLine(l: KeyedLine): void {
    this.addBody(l.body);
    this.fields.add(cachedKey("level", l.level));
    this.fields.add(cachedKey("region", l.region));
    this.fields.add(cachedKey("resource.id", l.resource_id));
    this.fields.add(cachedKey("resource.name", l.resource_name));
    if (l.deployment_id !== null) this.fields.add(cachedKey("deployment.id", l.deployment_id));
    if (l.invocation_id !== null) this.fields.add(cachedKey("invocation.id", l.invocation_id));
  }

  /** The keys, sorted (PostgreSQL's array literal). */
  toArray(): number[] {
    const out = this.trigrams.concat([...this.fields]);
    out.sort((x, y) => x - y);
    return out;
  }

  /** Starts over (a new segment). */
  reset(): void {
    this.stamp = KeySet.next();
    this.fields.clear();
    this.trigrams = [];
  }
}

/**
 * The trigrams every body containing `term` (case-insensitively) has: windows inside the term's
 * ASCII runs only. Empty when the term has no three consecutive ASCII characters.
 */
export function termKeys(term: string): number[] {
  const out = new Set<number>();
  let a = -1;
  let b = -1;
  for (let i = 0; i < term.length; i++) {
    let c = term.charCodeAt(i);
    if (c >= 128) {
      a = b = -1;
      continue;
    }
    if (c >= 65 && c <= 90) c += 32;
    if (a >= 0) out.add(trigram(a, b, c));
    a = b;
    b = c;
  }
  const all = [...out];
  if (all.length <= TERM_KEYS) return all;
  // Spread over the term: its start, middle and end all narrow.
  const picked: number[] = [];
  for (let i = 0; i < TERM_KEYS; i++) picked.push(all[Math.floor((i * all.length) / TERM_KEYS)]!);
  return picked;
}

/** A necessary condition over a segment's keys: all of `all`, and for each of `any`, one of its alternatives. */
export type KeyCondition = { kind: "all"; keys: number[] } | { kind: "and"; items: KeyCondition[] } | { kind: "or"; items: KeyCondition[] };

function fieldValue(field: QueryField, value: string): string {
  return field === "level" ? normalizeLevel(value) : value;
}

/**
 * What a segment must hold for a line of it to match the tree; null when nothing can be required
 * (a negation, a term shorter than three characters, an OR with such a branch).
 */
export function requiredKeys(node: QueryNode): KeyCondition | null {
  switch (node.kind) {
    case "match": {
      if (node.field === "body") {
        const keys = termKeys(node.value);
        return keys.length ? { kind: "all", keys } : null;
      }
      return { kind: "all", keys: [fieldKey(node.field, fieldValue(node.field, node.value))] };
    }
    case "not":
      return null;
    case "and": {
      const items = node.items.map(requiredKeys).filter((x): x is KeyCondition => x !== null);
      if (!items.length) return null;
      // Plain key sets merge into one `@>`.
      const all = new Set<number>();
      const rest: KeyCondition[] = [];
      for (const it of items) {
        if (it.kind === "all") for (const k of it.keys) all.add(k);
        else rest.push(it);
      }
      const merged: KeyCondition[] = all.size ? [{ kind: "all", keys: [...all] }, ...rest] : rest;
      return merged.length === 1 ? merged[0]! : { kind: "and", items: merged };
    }
    case "or": {
      const items = node.items.map(requiredKeys);
      if (items.some((x) => x === null)) return null;
      return { kind: "or", items: items as KeyCondition[] };
    }
  }
}

/** The condition as SQL over the `keys` column; every key set is a parameter (an int array literal). */
export function keysSql(c: KeyCondition, params: unknown[]): string {
  switch (c.kind) {
    case "all":
      params.push(`{${c.keys.join(",")}}`);
      return `keys @> $${params.length}::integer[]`;
    case "and":
      return `(${c.items.map((x) => keysSql(x, params)).join(" and ")})`;
    case "or":
      return `(${c.items.map((x) => keysSql(x, params)).join(" or ")})`;
  }
}

/** Whether a set of keys satisfies the condition (tests, and the store's own checks). */
export function keysSatisfy(c: KeyCondition, has: (k: number) => boolean): boolean {
  switch (c.kind) {
    case "all":
      return c.keys.every(has);
    case "and":
      return c.items.every((x) => keysSatisfy(x, has));
    case "or":
      return c.items.some((x) => keysSatisfy(x, has));
  }
}
