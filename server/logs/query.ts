/**
 * The log search grammar (`q` of POST /projects/{id}/logs/search and of the live tail): parsed by a
 * small recursive-descent parser into a tree, which becomes either a parameterized SQL condition
 * (search) or a predicate over one entry in memory (tail). Both read the same tree with the same
 * rules, so a line the tail shows is a line the search finds.
 *
 *   query   := or
 *   or      := and ("OR" and)*
 *   and     := unary (["AND"] unary)*            juxtaposition is AND
 *   unary   := ("NOT" | "-") unary | primary
 *   primary := "(" or ")" | field ":" value | term | "phrase"
 *   value   := term | "phrase" | "(" or ")"       inside the group every term is of that field
 *
 * Precedence: NOT/-, then AND, then OR. Keywords are upper case (`or` is a word to find). Terms and
 * phrases match the body as case-insensitive substrings; field values are compared exactly (levels
 * through the same normalisation as stored lines: `warning` is `warn`). A syntax error is a
 * `QueryError` naming the position (1-based, in characters) and the problem.
 */
import { normalizeLevel } from "./levels";

export const MAX_QUERY_LENGTH = 4096;
export const MAX_QUERY_DEPTH = 16;
export const MAX_QUERY_TERMS = 64;

/** Fields usable as `field:value`, with what each compares. */
export const QUERY_FIELDS = ["body", "invocation.id", "level", "region", "resource.id", "resource.name", "deployment.id"] as const;
export type QueryField = (typeof QUERY_FIELDS)[number];

export type QueryNode =
  | { kind: "and"; items: QueryNode[] }
  | { kind: "or"; items: QueryNode[] }
  | { kind: "not"; item: QueryNode }
  /** `field` "body" for free text and phrases. */
  | { kind: "match"; field: QueryField; value: string };

export class QueryError extends Error {
  constructor(
    /** 1-based character position of the problem. */
    readonly position: number,
    readonly problem: string,
  ) {
    super(`invalid query at position ${position}: ${problem}`);
  }
}

type Token =
  | { t: "word"; text: string; pos: number }
  | { t: "phrase"; text: string; pos: number }
  | { t: "lparen"; pos: number }
  | { t: "rparen"; pos: number }
  | { t: "minus"; pos: number }
  | { t: "and" | "or" | "not"; pos: number }
  | { t: "end"; pos: number };

const SPACE = /\s/u;
const FIELD_NAME = /^[A-Za-z_][A-Za-z0-9_.]*$/;

/** Text PostgreSQL can hold and compare as stored lines are: NUL as U+FFFD, no lone surrogates. */
function storable(s: string): string {
  const w = s.isWellFormed() ? s : s.toWellFormed();
  return w.includes("\0") ? w.replaceAll("\0", "\uFFFD") : w;
}

function tokenize(q: string): Token[] {
  // Code points, so positions count characters as people see them (an emoji is one).
  const cs = Array.from(q);
  const out: Token[] = [];
  let i = 0;
  while (i < cs.length) {
    const c = cs[i]!;
    const pos = i + 1;
    if (SPACE.test(c)) {
      i++;
    } else if (c === "(") {
      out.push({ t: "lparen", pos });
      i++;
    } else if (c === ")") {
      out.push({ t: "rparen", pos });
      i++;
    } else if (c === '"') {
      let text = "";
      i++;
      for (;;) {
        if (i >= cs.length) throw new QueryError(pos, "unclosed '\"' (a phrase needs its closing quote)");
        const d = cs[i]!;
        if (d === "\\" && i + 1 < cs.length) {
          text += cs[i + 1]!;
          i += 2;
        } else if (d === '"') {
          i++;
          break;
        } else {
          text += d;
          i++;
        }
      }
      out.push({ t: "phrase", text, pos });
    } else if (c === "-" && i + 1 < cs.length && !SPACE.test(cs[i + 1]!) && cs[i + 1] !== ")") {
      // A leading '-' negates what follows; inside a word (`a-b`) it is just a character.
      out.push({ t: "minus", pos });
      i++;
    } else {
      let text = "";
      while (i < cs.length && !SPACE.test(cs[i]!) && cs[i] !== "(" && cs[i] !== ")" && cs[i] !== '"') text += cs[i++]!;
      if (text === "AND") out.push({ t: "and", pos });
      else if (text === "OR") out.push({ t: "or", pos });
      else if (text === "NOT") out.push({ t: "not", pos });
      else out.push({ t: "word", text, pos });
    }
  }
  out.push({ t: "end", pos: cs.length + 1 });
  return out;
}

class Parser {
  private i = 0;
  private terms = 0;

  constructor(private readonly tokens: Token[]) {}

  private peek(): Token {
    return this.tokens[this.i]!;
  }

  private next(): Token {
    return this.tokens[this.i++]!;
  }

  parse(): QueryNode | null {
    if (this.peek().t === "end") return null;
    const node = this.or(null, 0);
    const t = this.peek();
    if (t.t === "rparen") throw new QueryError(t.pos, "unexpected ')' with no '(' to close");
    if (t.t !== "end") throw new QueryError(t.pos, "unexpected input");
    return node;
  }

  private or(field: QueryField | null, depth: number): QueryNode {
    const items = [this.and(field, depth)];
    while (this.peek().t === "or") {
      const op = this.next();
      if (!this.startsOperand()) throw new QueryError(this.peek().pos, `expected a term after 'OR' (at position ${op.pos})`);
      items.push(this.and(field, depth));
    }
    return items.length === 1 ? items[0]! : { kind: "or", items };
  }

  private startsOperand(): boolean {
    const t = this.peek().t;
    return t === "word" || t === "phrase" || t === "lparen" || t === "minus" || t === "not";
  }

  private and(field: QueryField | null, depth: number): QueryNode {
    if (!this.startsOperand()) throw this.expectedTerm();
    const items = [this.unary(field, depth)];
    for (;;) {
      const t = this.peek();
      if (t.t === "and") {
        this.next();
        if (!this.startsOperand()) throw new QueryError(this.peek().pos, `expected a term after 'AND' (at position ${t.pos})`);
        items.push(this.unary(field, depth));
      } else if (this.startsOperand()) {
        items.push(this.unary(field, depth));
      } else break;
    }
    return items.length === 1 ? items[0]! : { kind: "and", items };
  }

  private expectedTerm(): QueryError {
    const t = this.peek();
    if (t.t === "rparen") return new QueryError(t.pos, "unexpected ')'");
    if (t.t === "and" || t.t === "or") return new QueryError(t.pos, `'${t.t.toUpperCase()}' needs a term before it`);
    return new QueryError(t.pos, "expected a term");
  }

  private unary(field: QueryField | null, depth: number): QueryNode {
    const t = this.peek();
    if (t.t === "not" || t.t === "minus") {
      this.next();
      if (depth + 1 > MAX_QUERY_DEPTH) throw new QueryError(t.pos, `the query nests deeper than ${MAX_QUERY_DEPTH} levels`);
      if (!this.startsOperand()) throw new QueryError(this.peek().pos, `expected a term after '${t.t === "not" ? "NOT" : "-"}' (at position ${t.pos})`);
      return { kind: "not", item: this.unary(field, depth + 1) };
    }
    return this.primary(field, depth);
  }

  private group(field: QueryField | null, depth: number): QueryNode {
    const open = this.next(); // '('
    if (depth + 1 > MAX_QUERY_DEPTH) throw new QueryError(open.pos, `the query nests deeper than ${MAX_QUERY_DEPTH} levels`);
    if (this.peek().t === "rparen") throw new QueryError(open.pos, "empty group '()'");
    if (this.peek().t === "end") throw new QueryError(open.pos, "unclosed '('");
    const inner = this.or(field, depth + 1);
    const close = this.peek();
    if (close.t !== "rparen") throw new QueryError(open.pos, close.t === "end" ? "unclosed '('" : `expected ')' to close the '(' (found something else at position ${close.pos})`);
    this.next();
    return inner;
  }

  private match(field: QueryField, value: string, pos: number): QueryNode {
    if (++this.terms > MAX_QUERY_TERMS) throw new QueryError(pos, `the query has more than ${MAX_QUERY_TERMS} terms`);
    if (value === "") throw new QueryError(pos, "empty phrase '\"\"'");
    return { kind: "match", field, value: storable(value) };
  }

  private primary(field: QueryField | null, depth: number): QueryNode {
    const t = this.peek();
    if (t.t === "lparen") return this.group(field, depth);
    if (t.t === "phrase") {
      this.next();
      return this.match(field ?? "body", t.text, t.pos);
    }
    if (t.t !== "word") throw this.expectedTerm();
    this.next();
    const colon = t.text.indexOf(":");
    const name = colon > 0 ? t.text.slice(0, colon) : "";
    if (colon <= 0 || !FIELD_NAME.test(name)) return this.match(field ?? "body", t.text, t.pos);
    const known = QUERY_FIELDS.find((f) => f === name.toLowerCase());
    if (!known) throw new QueryError(t.pos, `unknown field '${name}' (fields: ${QUERY_FIELDS.join(", ")}); put text with a colon in quotes: "${name}:..."`);
    if (field !== null) throw new QueryError(t.pos, `field '${name}:' inside the group of field '${field}:'`);
    const rest = t.text.slice(colon + 1);
    if (rest !== "") return this.match(known, rest, t.pos);
    // `field:` then a phrase or a group, with nothing in between.
    const v = this.peek();
    const adjacent = v.pos === t.pos + Array.from(t.text).length;
    if (adjacent && v.t === "phrase") {
      this.next();
      return this.match(known, v.text, v.pos);
    }
    if (adjacent && v.t === "lparen") return this.group(known, depth);
    throw new QueryError(t.pos, `'${name}:' needs a value (${name}:value, ${name}:"a phrase" or ${name}:(a OR b))`);
  }
}

/** The tree of `q`; null for a blank query (structured filters only). Throws QueryError. */
export function parseQuery(q: string): QueryNode | null {
  if (q.length > MAX_QUERY_LENGTH) throw new QueryError(MAX_QUERY_LENGTH + 1, `the query is longer than ${MAX_QUERY_LENGTH} characters`);
  return new Parser(tokenize(q)).parse();
}

/** Columns of the log store each field compares; `nullable` ones are never null inside a NOT. */
const COLUMN: Record<QueryField, { column: string; nullable: boolean }> = {
  body: { column: "body", nullable: false },
  "invocation.id": { column: "invocation_id", nullable: true },
  level: { column: "level", nullable: false },
  region: { column: "region", nullable: false },
  "resource.id": { column: "resource_id", nullable: false },
  "resource.name": { column: "resource_name", nullable: false },
  "deployment.id": { column: "deployment_id", nullable: true },
};

/** Escapes LIKE wildcards so a term matches literally, as a substring. */
function containsPattern(s: string): string {
  return `%${s.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}

function fieldValue(field: QueryField, value: string): string {
  return field === "level" ? normalizeLevel(value) : value;
}

/**
 * The tree as a SQL condition whose values are all parameters: `params` receives them, numbered
 * after whatever it already holds. Never null (a NOT over a missing invocation id is true).
 */
export function toSql(node: QueryNode, params: unknown[]): string {
  switch (node.kind) {
    case "and":
      return `(${node.items.map((n) => toSql(n, params)).join(" and ")})`;
    case "or":
      return `(${node.items.map((n) => toSql(n, params)).join(" or ")})`;
    case "not":
      return `(not ${toSql(node.item, params)})`;
    case "match": {
      const { column, nullable } = COLUMN[node.field];
      if (node.field === "body") {
        params.push(containsPattern(node.value));
        return `(${column} ilike $${params.length})`;
      }
      params.push(fieldValue(node.field, node.value));
      return nullable ? `coalesce(${column} = $${params.length}, false)` : `(${column} = $${params.length})`;
    }
  }
}

/** What the in-memory predicate reads of an entry (the columns of the store, by field). */
export interface MatchableLine {
  body: string;
  invocation_id: string | null;
  level: string;
  region: string;
  resource_id: string;
  resource_name: string;
  deployment_id: string | null;
}

const VALUE: Record<QueryField, (l: MatchableLine) => string | null> = {
  body: (l) => l.body,
  "invocation.id": (l) => l.invocation_id,
  level: (l) => l.level,
  region: (l) => l.region,
  "resource.id": (l) => l.resource_id,
  "resource.name": (l) => l.resource_name,
  "deployment.id": (l) => l.deployment_id,
};

/** The same tree as a predicate over a line in memory (the live tail), with toSql's semantics. */
export function toPredicate(node: QueryNode): (l: MatchableLine) => boolean {
  switch (node.kind) {
    case "and": {
      const ps = node.items.map(toPredicate);
      return (l) => ps.every((p) => p(l));
    }
    case "or": {
      const ps = node.items.map(toPredicate);
      return (l) => ps.some((p) => p(l));
    }
    case "not": {
      const p = toPredicate(node.item);
      return (l) => !p(l);
    }
    case "match": {
      const get = VALUE[node.field];
      if (node.field === "body") {
        const needle = node.value.toLowerCase();
        return (l) => l.body.toLowerCase().includes(needle);
      }
      const want = fieldValue(node.field, node.value);
      return (l) => get(l) === want;
    }
  }
}
