import type { DatabaseEngine } from "../backends/databases/engine";
import type { WireBackend } from "../backends/databases/wire/listener";
import { B, concatBytes, copyFail, errorFields, fromUtf8, MessageBuilder, readInt16, readInt32, simpleQuery, sync, utf8 } from "../backends/databases/wire/protocol";
import { badRequest, HttpError, type ErrorBody } from "../http/errors";

/**
 * The SQL API (a Kiln extension: the spec has no route that runs arbitrary SQL; the console's SQL
 * editor and `kiln db sql` use it). One statement runs on a wire session of the database, opened
 * exactly as a client of its connection string with full access is: the database's own role (the
 * production engine's tenant login role, never a superuser of the server; the embedded engine's own
 * PGlite instance). Going through the wire session, not the query API's one-shot `run`, gives both
 * engines a real statement timeout (the embedded mux enforces it by restarting the instance's
 * thread) and a row cap PostgreSQL itself applies (Execute with a row limit).
 */

export const SQL_LIMITS = {
  maxRowsDefault: 1000,
  maxRows: 10_000,
  timeoutMsDefault: 15_000,
  timeoutMs: 60_000,
  /** The rows' JSON in the answer; rows past it are dropped and `truncated` is set. */
  maxResponseBytes: 4 * 1024 * 1024,
  maxQueryChars: 100_000,
};

export interface SqlOptions {
  readOnly: boolean;
  maxRows: number;
  timeoutMs: number;
}

export interface SqlResult {
  command: string;
  row_count: number;
  columns: { name: string; type: string }[];
  rows: unknown[][];
  truncated: boolean;
  notices: string[];
  computeMs: number;
  transferBytes: number;
}

/** A PostgreSQL error, in the spec's error shape plus where and what: `{error, code, position?, detail?, hint?}`. */
export class SqlError extends HttpError {
  constructor(fields: Record<string, string>) {
    const body: ErrorBody & Record<string, unknown> = { error: fields.M ?? "query failed", code: fields.C ?? "XX000" };
    if (fields.P) body.position = Number(fields.P);
    if (fields.D) body.detail = fields.D;
    if (fields.H) body.hint = fields.H;
    super(400, body);
  }
}

const ROW_DESCRIPTION = 0x54; // T
const NOTICE = 0x4e; // N
const COPY_IN = 0x47; // G
const PORTAL_SUSPENDED = 0x73; // s
const m = () => new MessageBuilder();

/** A wire session driven by Kiln: messages in, whole backend messages out, waiting for ReadyForQuery. */
class Session {
  private pending = new Uint8Array(0);
  private messages: { type: number; body: Uint8Array }[] = [];
  private wake: (() => void) | null = null;
  private ended: string | null = null;
  status = "I";

  constructor(readonly backend: WireBackend) {}

  readonly control = {
    terminate: (message: string) => {
      this.ended = message;
      this.wake?.();
    },
  };

  private readonly receive = (data: Uint8Array) => {
    let buf = this.pending.length ? concatBytes([this.pending, data]) : data;
    let at = 0;
    while (at + 5 <= buf.length) {
      const end = at + 1 + readInt32(buf, at + 1);
      if (end > buf.length) break;
      // Copied: a proxy may reuse the memory of what it hands over.
      this.messages.push({ type: buf[at]!, body: buf.slice(at + 5, end) });
      at = end;
    }
    this.pending = buf.slice(at);
    this.wake?.();
  };

  /** Sends frontend messages (each whole), one `handle` at a time. */
  async send(...msgs: Uint8Array[]): Promise<void> {
    for (const msg of msgs) await this.backend.handle(msg, this.receive);
  }

  /** Every backend message up to and including the next ReadyForQuery; `onMessage` may send more. */
  async untilReady(onMessage?: (type: number, body: Uint8Array) => Promise<void> | void): Promise<{ type: number; body: Uint8Array }[]> {
    const out: { type: number; body: Uint8Array }[] = [];
    for (;;) {
      while (this.messages.length) {
        const msg = this.messages.shift()!;
        out.push(msg);
        if (msg.type === B.readyForQuery) {
          this.status = String.fromCharCode(msg.body[0]!);
          return out;
        }
        await onMessage?.(msg.type, msg.body);
      }
      // Ended under the statement: the database is being deleted, restored or reset (409, like a database that is not active).
      if (this.ended !== null) throw new HttpError(409, { error: `the database session ended: ${this.ended}` });
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = null;
    }
  }

  /** A simple query of Kiln's own; its first error is thrown (as a SqlError: the caller's SQL set it up). */
  async simple(sql: string): Promise<{ type: number; body: Uint8Array }[]> {
    await this.send(simpleQuery(sql));
    const out = await this.untilReady();
    const err = out.find((x) => x.type === B.error);
    if (err) throw new SqlError(errorFields(err.body));
    return out;
  }
}

/** Runs one statement on database or branch `id` (the engine's name for it). */
export async function runSql(engine: DatabaseEngine, id: string, text: string, params: (string | number | boolean | null)[], o: SqlOptions): Promise<SqlResult> {
  if (!text.trim()) throw badRequest("invalid request: body field 'query': must not be empty");
  if (o.readOnly) await checkReadOnly(text);
  const holder: { s: Session | null } = { s: null };
  const backend = await engine.openWire(
    id,
    { kind: "admin" },
    { user: "kiln_sql_api", database: id, applicationName: "kiln sql api", params: {}, remoteAddress: "127.0.0.1" },
    { terminate: (message) => holder.s?.control.terminate(message) },
  );
  const session = (holder.s = new Session(backend));
  try {
    return await statement(session, text, params, o);
  } finally {
    await backend.close().catch(() => {});
  }
}

/** Statements a read-only caller may send: queries (SELECT, VALUES, TABLE, WITH ... SELECT), EXPLAIN, SHOW. */
const READ_STATEMENTS = new Set(["SelectStmt", "ExplainStmt", "VariableShowStmt"]);

/**
 * A read-only caller's statement must be a query by PostgreSQL's own parser (libpg-query), as the
 * MCP endpoint's read-only SQL: on the embedded engine the service role is its instance's
 * superuser, and a READ ONLY transaction alone would still let it write files of the instance
 * (COPY ... TO a file). What makes the query itself read-only is the transaction.
 */
async function checkReadOnly(text: string): Promise<void> {
  const { parse } = await import("libpg-query");
  let tree: { stmts?: { stmt: Record<string, { intoClause?: unknown }> }[] };
  try {
    tree = await parse(text);
  } catch {
    return; // PostgreSQL reports the syntax error itself, with its position
  }
  const stmts = tree.stmts ?? [];
  if (stmts.length !== 1) return; // PostgreSQL refuses several commands itself
  const [kind, node] = Object.entries(stmts[0]!.stmt)[0] ?? [];
  if (!kind || !READ_STATEMENTS.has(kind) || (kind === "SelectStmt" && node?.intoClause))
    throw new HttpError(403, { error: `a read-only project token runs only queries (SELECT, VALUES, TABLE, WITH ... SELECT, EXPLAIN, SHOW); this is ${kind === "SelectStmt" ? "SELECT ... INTO" : (kind ?? "empty")}` });
}

async function statement(s: Session, text: string, params: (string | number | boolean | null)[], o: SqlOptions): Promise<SqlResult> {
  // A read-only caller's statement runs in a READ ONLY transaction that is rolled back: PostgreSQL
  // refuses every write in it, and nothing it did outlives the request. The SELECT takes the
  // transaction's snapshot, after which it cannot be switched to read-write.
  await s.simple(`SET statement_timeout = ${Math.round(o.timeoutMs)}${o.readOnly ? "; BEGIN READ ONLY; SELECT 1" : ""}`);

  const bind = m().cstring("").cstring("").int16(0).int16(params.length);
  for (const p of params) {
    if (p === null) bind.int32(-1);
    else {
      const bytes = utf8(String(p));
      bind.int32(bytes.length).bytes(bytes);
    }
  }
  bind.int16(0);
  const t0 = performance.now();
  await s.send(
    m().cstring("").cstring(text).int16(0).build(0x50), // Parse
    bind.build(0x42),
    m().byte(0x50).cstring("").build(0x44), // Describe the portal
    m().cstring("").int32(o.maxRows + 1).build(0x45), // Execute, one row past the cap to know it was reached
    sync(),
  );
  const answer = await s.untilReady(async (type) => {
    // COPY ... FROM STDIN waits for data this API has no way to send: end it with an error.
    if (type === COPY_IN) await s.send(copyFail("COPY FROM STDIN is not supported by the SQL API; use a connection string (kiln db psql)"), sync());
  });
  const computeMs = performance.now() - t0;

  let columns: { name: string; type: number; mod: number }[] = [];
  const raw: (string | null)[][] = [];
  let tag: string | null = null;
  let suspended = false;
  let error: Record<string, string> | null = null;
  const notices: string[] = [];
  for (const { type, body } of answer) {
    if (type === B.error && !error) error = errorFields(body);
    else if (type === NOTICE) notices.push(errorFields(body).M ?? "");
    else if (type === ROW_DESCRIPTION) columns = rowDescription(body);
    else if (type === B.dataRow) raw.push(dataRow(body));
    else if (type === B.commandComplete) tag = fromUtf8(body.subarray(0, body.indexOf(0)));
    else if (type === PORTAL_SUSPENDED) suspended = true;
  }
  // Whatever the statement left open (its own BEGIN, or the read-only transaction) is rolled back.
  if (s.status !== "I") await s.simple("ROLLBACK");
  if (error) throw new SqlError(error);

  const typeNames = columns.length ? await typeNamesOf(s, columns) : [];
  let truncated = suspended || raw.length > o.maxRows;
  const rows: unknown[][] = [];
  let bytes = 2;
  for (const r of raw.slice(0, o.maxRows)) {
    const row = r.map((v, i) => value(v, columns[i]!.type));
    const size = JSON.stringify(row).length + 1;
    if (bytes + size > SQL_LIMITS.maxResponseBytes) {
      truncated = true;
      break;
    }
    bytes += size;
    rows.push(row);
  }
  const [command, count] = commandOf(tag, text, rows.length);
  return {
    command,
    row_count: truncated ? rows.length : count,
    columns: columns.map((c, i) => ({ name: c.name, type: typeNames[i] ?? String(c.type) })),
    rows,
    truncated,
    notices,
    computeMs,
    transferBytes: bytes,
  };
}

function rowDescription(body: Uint8Array): { name: string; type: number; mod: number }[] {
  const columns: { name: string; type: number; mod: number }[] = [];
  let at = 2;
  for (let i = readInt16(body, 0); i > 0; i--) {
    const end = body.indexOf(0, at);
    const name = fromUtf8(body.subarray(at, end));
    at = end + 1 + 6; // table oid (4), column number (2)
    columns.push({ name, type: readInt32(body, at), mod: readInt32(body, at + 6) });
    at += 4 + 2 + 4 + 2; // type oid, size, modifier, format
  }
  return columns;
}

function dataRow(body: Uint8Array): (string | null)[] {
  const out: (string | null)[] = [];
  let at = 2;
  for (let i = readInt16(body, 0); i > 0; i--) {
    const len = readInt32(body, at);
    at += 4;
    out.push(len < 0 ? null : fromUtf8(body.subarray(at, at + len)));
    if (len > 0) at += len;
  }
  return out;
}

/** The columns' types as PostgreSQL names them (`integer`, `character varying(20)`, a user's enum). */
async function typeNamesOf(s: Session, columns: { type: number; mod: number }[]): Promise<string[]> {
  const values = columns.map((c) => `(${c.type >>> 0}::oid, ${c.mod | 0})`).join(", ");
  const out = await s.simple(`SELECT format_type(o, nullif(t, -1)) FROM (VALUES ${values}) AS v(o, t)`);
  return out.filter((x) => x.type === B.dataRow).map((x) => dataRow(x.body)[0] ?? "unknown");
}

const NUMBERS = new Set([21, 23, 26, 700, 701]); // int2, int4, oid, float4, float8
const JSON_TYPES = new Set([114, 3802]);

/**
 * A value as JSON: numbers that fit a double (int2/int4/float), booleans, json/jsonb parsed;
 * everything else as PostgreSQL's text output, so int8, numeric and timestamps keep every digit.
 */
function value(text: string | null, type: number): unknown {
  if (text === null) return null;
  if (NUMBERS.has(type)) {
    const n = Number(text);
    return Number.isFinite(n) ? n : text;
  }
  if (type === 16) return text === "t";
  if (JSON_TYPES.has(type)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}

/** The command tag's verb and its row count (`INSERT 0 3` → INSERT, 3); a cut-short result has no tag. */
function commandOf(tag: string | null, text: string, rows: number): [string, number] {
  if (tag) {
    const m = /^(.*?)(?: (\d+))?(?: (\d+))?$/.exec(tag)!;
    const count = m[3] ?? m[2];
    return [m[1]!, count !== undefined ? Number(count) : rows];
  }
  const verb = /^\s*(?:--[^\n]*\n\s*|\/\*[\s\S]*?\*\/\s*)*([a-z]+)/i.exec(text)?.[1]?.toUpperCase() ?? "SELECT";
  return [verb === "WITH" || verb === "VALUES" || verb === "TABLE" ? "SELECT" : verb, rows];
}
