/**
 * LISTEN / UNLISTEN as the session mux sees them. PGlite has one backend session, so PostgreSQL's
 * own bookkeeping of who listens to what covers all clients together: Kiln reads each client's
 * LISTEN, UNLISTEN, UNLISTEN * and DISCARD ALL from its SQL (to know the channel; the command tags in
 * the answer say which of them ran) and routes each NotificationResponse itself.
 */

/** One LISTEN-changing statement; `channel` null: every channel (UNLISTEN *, DISCARD ALL). */
export interface ListenOp {
  listen: boolean;
  channel: string | null;
}

/** Command tags of the statements that change what a session listens to. */
export const LISTEN_TAGS = new Set(["LISTEN", "UNLISTEN", "DISCARD ALL"]);

const IDENT = String.raw`"(?:[^"]|"")+"|[A-Za-z_\u0080-\uffff][\w$\u0080-\uffff]*`;
const LISTEN = new RegExp(String.raw`^(listen|unlisten)\s+(\*|${IDENT})$`, "i");
const DISCARD_ALL = /^discard\s+all$/i;
/** PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes. */
const MAX_IDENT_BYTES = 63;

/** Whether the C string from `from` may hold a LISTEN-changing statement (cheap: no decoding). */
export function mayChangeListens(m: Uint8Array, from: number): boolean {
  for (let i = from; i + 6 < m.length && m[i] !== 0; i++) {
    const c = m[i]! | 0x20;
    // "listen" (also inside "unlisten") or "discard"
    if (c === 0x6c && (m[i + 1]! | 0x20) === 0x69 && (m[i + 2]! | 0x20) === 0x73 && (m[i + 3]! | 0x20) === 0x74 && (m[i + 4]! | 0x20) === 0x65 && (m[i + 5]! | 0x20) === 0x6e)
      return true;
    if (c === 0x64 && (m[i + 1]! | 0x20) === 0x69 && (m[i + 2]! | 0x20) === 0x73 && (m[i + 3]! | 0x20) === 0x63 && (m[i + 4]! | 0x20) === 0x61 && (m[i + 5]! | 0x20) === 0x72)
      return true;
  }
  return false;
}

/** The LISTEN, UNLISTEN and DISCARD ALL statements of `sql` (one or several statements), in order. */
export function listenOps(sql: string): ListenOp[] {
  const ops: ListenOp[] = [];
  for (const statement of statements(sql)) {
    if (DISCARD_ALL.test(statement)) {
      ops.push({ listen: false, channel: null });
      continue;
    }
    const m = LISTEN.exec(statement);
    if (!m) continue;
    const listen = m[1]!.toLowerCase() === "listen";
    if (m[2] === "*") {
      if (!listen) ops.push({ listen, channel: null });
    } else ops.push({ listen, channel: identifier(m[2]!) });
  }
  return ops;
}

/** A channel name as PostgreSQL reads the identifier: quoted as written, unquoted folded to lower case; cut to 63 bytes. */
export function identifier(word: string): string {
  const name = word.startsWith('"') ? word.slice(1, -1).replace(/""/g, '"') : word.replace(/[A-Z]+/g, (s) => s.toLowerCase());
  const bytes = new TextEncoder().encode(name);
  if (bytes.length <= MAX_IDENT_BYTES) return name;
  let end = MAX_IDENT_BYTES;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--; // never cut inside a character
  return new TextDecoder().decode(bytes.subarray(0, end));
}

/**
 * The statements of a query string, comments removed and trimmed: split at semicolons outside
 * string literals ('...', E'...'), quoted identifiers, dollar quotes and comments (nested /* *\/).
 */
export function statements(sql: string): string[] {
  const out: string[] = [];
  let cur = "";
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i]!;
    if (c === "-" && sql[i + 1] === "-") {
      const end = sql.indexOf("\n", i);
      i = end < 0 ? n : end + 1;
      cur += " ";
    } else if (c === "/" && sql[i + 1] === "*") {
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === "/" && sql[i + 1] === "*") (depth++, (i += 2));
        else if (sql[i] === "*" && sql[i + 1] === "/") (depth--, (i += 2));
        else i++;
      }
      cur += " ";
    } else if (c === "'" || c === '"') {
      const escapes = c === "'" && /[eE]$/.test(cur) && !/[\w$]$/.test(cur.slice(0, -1));
      let j = i + 1;
      for (; j < n; j++) {
        if (escapes && sql[j] === "\\") j++;
        else if (sql[j] === c) {
          if (sql[j + 1] === c) j++;
          else break;
        }
      }
      cur += sql.slice(i, j + 1);
      i = j + 1;
    } else if (c === "$" && !/[\w$]$/.test(cur)) {
      const tag = /^\$(?:[A-Za-z_\u0080-\uffff][\w\u0080-\uffff]*)?\$/.exec(sql.slice(i, i + 64))?.[0];
      if (!tag) {
        cur += c;
        i++;
        continue;
      }
      const end = sql.indexOf(tag, i + tag.length);
      const stop = end < 0 ? n : end + tag.length;
      cur += sql.slice(i, stop);
      i = stop;
    } else if (c === ";") {
      if (cur.trim()) out.push(cur.trim());
      cur = "";
      i++;
    } else {
      cur += c;
      i++;
    }
  }
  if (cur.trim()) out.push(cur.trim());
  return out;
}
