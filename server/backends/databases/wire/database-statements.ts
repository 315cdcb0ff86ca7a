/**
 * Recognizes `CREATE DATABASE` and `DROP DATABASE` sent as a simple Query over the wire: Kiln answers
 * them itself (a managed database of the project, see wire-database-commands.ts), on both engines,
 * since neither engine can (PGlite has no template1; a tenant role has no CREATEDB). Only a Query
 * whose whole text is one such statement is taken; anything it does not fully understand is left to
 * the engine, which answers with its own error.
 */

export type DatabaseStatement =
  | { kind: "create"; name: string; template: string | null; options: { name: string; value: string }[] }
  | { kind: "drop"; name: string; ifExists: boolean; force: boolean };

const Q = 0x51;

/**
 * The statement of a Query message (type byte, length, C string), or null: a cheap look at the first
 * word first, so the usual Query costs a few byte compares. What a proxy calls on each Query.
 */
export function databaseStatementOf(message: Uint8Array): DatabaseStatement | null {
  if (message[0] !== Q || message.length < 20) return null;
  let i = 5;
  while (i < message.length && (message[i] === 0x20 || message[i] === 0x0a || message[i] === 0x0d || message[i] === 0x09)) i++;
  const c = message[i]! | 0x20; // lower case
  // c(reate), d(rop), or a comment before it ('-' or '/')
  if (c !== 0x63 && c !== 0x64 && message[i] !== 0x2d && message[i] !== 0x2f) return null;
  const end = message.indexOf(0, 5);
  return parseDatabaseStatement(new TextDecoder().decode(message.subarray(5, end < 0 ? message.length : end)));
}

type Token = { kind: "word"; text: string; quoted: boolean } | { kind: "string"; text: string } | { kind: "number"; text: string } | { kind: "punct"; text: string };

/** SQL tokens of the text, or null for anything outside the small grammar (dollar quotes, a second statement...). */
function tokenize(sql: string): Token[] | null {
  const out: Token[] = [];
  let i = 0;
  let ended = false; // after a ';': only blanks and comments may follow
  while (i < sql.length) {
    const ch = sql[i]!;
    if (/\s/.test(ch)) i++;
    else if (sql.startsWith("--", i)) {
      const nl = sql.indexOf("\n", i);
      i = nl < 0 ? sql.length : nl + 1;
    } else if (sql.startsWith("/*", i)) {
      const close = sql.indexOf("*/", i + 2);
      if (close < 0) return null;
      i = close + 2;
    } else if (ended) return null;
    else if (ch === ";") (ended = true), i++;
    else if (ch === '"') {
      let text = "";
      let j = i + 1;
      for (;;) {
        const q = sql.indexOf('"', j);
        if (q < 0) return null;
        text += sql.slice(j, q);
        if (sql[q + 1] === '"') (text += '"'), (j = q + 2);
        else {
          j = q + 1;
          break;
        }
      }
      if (!text) return null; // zero-length delimited identifier
      out.push({ kind: "word", text, quoted: true });
      i = j;
    } else if (ch === "'" || ((ch === "E" || ch === "e") && sql[i + 1] === "'")) {
      if (ch !== "'") return null; // escape strings: not worth it here
      let text = "";
      let j = i + 1;
      for (;;) {
        const q = sql.indexOf("'", j);
        if (q < 0) return null;
        text += sql.slice(j, q);
        if (sql[q + 1] === "'") (text += "'"), (j = q + 2);
        else {
          j = q + 1;
          break;
        }
      }
      out.push({ kind: "string", text });
      i = j;
    } else if (/[A-Za-z_\u0080-\uffff]/.test(ch)) {
      const m = /^[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*/.exec(sql.slice(i))!;
      out.push({ kind: "word", text: m[0].toLowerCase(), quoted: false });
      i += m[0].length;
    } else if (/[-0-9]/.test(ch)) {
      const m = /^-?[0-9]+/.exec(sql.slice(i));
      if (!m) return null;
      out.push({ kind: "number", text: m[0] });
      i += m[0].length;
    } else if (ch === "(" || ch === ")" || ch === "," || ch === "=") out.push({ kind: "punct", text: ch }), i++;
    else return null;
  }
  return out;
}

const isWord = (t: Token | undefined, w: string) => t?.kind === "word" && !t.quoted && t.text === w;

/** CREATE DATABASE options PostgreSQL knows (two-word ones joined by a blank). */
const CREATE_OPTIONS = new Set([
  "owner", "template", "encoding", "strategy", "locale", "lc_collate", "lc_ctype", "builtin_locale", "icu_locale", "icu_rules",
  "locale_provider", "collation_version", "tablespace", "allow_connections", "connection limit", "is_template", "oid",
]);

/** The statement, or null when the text is not exactly one CREATE/DROP DATABASE this grammar reads. */
export function parseDatabaseStatement(sql: string): DatabaseStatement | null {
  const t = tokenize(sql);
  if (!t || t.length < 3) return null;
  if (isWord(t[0], "create") && isWord(t[1], "database")) {
    const name = t[2]!;
    if (name.kind !== "word") return null;
    let i = 3;
    if (isWord(t[i], "with")) i++;
    const options: { name: string; value: string }[] = [];
    let template: string | null = null;
    while (i < t.length) {
      const opt = t[i]!;
      if (opt.kind !== "word" || opt.quoted) return null;
      let key = opt.text;
      i++;
      if (key === "connection" && isWord(t[i], "limit")) (key = "connection limit"), i++;
      if (!CREATE_OPTIONS.has(key)) return null;
      if (t[i]?.kind === "punct" && t[i]!.text === "=") i++;
      const value = t[i];
      if (!value || value.kind === "punct") return null;
      i++;
      if (key === "template") template = value.text;
      else options.push({ name: key, value: value.text });
    }
    return { kind: "create", name: name.text, template, options };
  }
  if (isWord(t[0], "drop") && isWord(t[1], "database")) {
    let i = 2;
    let ifExists = false;
    if (isWord(t[i], "if") && isWord(t[i + 1], "exists")) (ifExists = true), (i += 2);
    const name = t[i];
    if (!name || name.kind !== "word") return null;
    i++;
    let force = false;
    if (i < t.length) {
      if (isWord(t[i], "with")) i++;
      if (t[i]?.kind !== "punct" || t[i]!.text !== "(") return null;
      i++;
      for (;;) {
        if (!isWord(t[i], "force")) return null;
        force = true;
        i++;
        if (t[i]?.kind === "punct" && t[i]!.text === ",") i++;
        else break;
      }
      if (t[i]?.kind !== "punct" || t[i]!.text !== ")") return null;
      i++;
    }
    return i === t.length ? { kind: "drop", name: name.text, ifExists, force } : null;
  }
  return null;
}
