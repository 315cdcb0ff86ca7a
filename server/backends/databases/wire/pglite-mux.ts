import type { PGlite } from "@electric-sql/pglite";
import type { WireBackend, WireClient, WireControl } from "./listener";
import {
  B,
  closeStatement,
  concatBytes,
  copyFail,
  cstringEnd,
  F,
  firstResult,
  fromUtf8,
  readInt32,
  simpleQuery,
  sqlIdent,
  sqlLiteral,
  sync,
  utf8,
} from "./protocol";

/**
 * Many client sessions over PGlite's single backend session, multiplexed per transaction.
 *
 * A client holds the session from a batch (messages up to Sync, Flush or a simple Query) until a
 * ReadyForQuery with status 'I'; everyone else (clients and `exclusive`) waits in FIFO order. When
 * the session changes hands, the outgoing client's session settings are captured if it may have
 * changed them, and the incoming client gets defaults + its `init` + its own settings back. Named
 * prepared statements are renamed per client.
 */

const I = 0x49; // ReadyForQuery status 'I'
const T = 0x54; // ReadyForQuery status 'T'
const COPY_IN_RESPONSE = 0x47; // G
const COPY_DATA = 0x64; // d
const EMPTY = new Uint8Array(0);
/**
 * Sent after every client batch. Outside COPY PostgreSQL ignores a CopyFail; inside COPY FROM STDIN
 * it ends the copy with an error, where running out of input would make PGlite exit(1) and take the
 * database down for every client.
 */
const COPY_GUARD = copyFail("inside a transaction block, COPY FROM STDIN must be a simple query of its own on Kiln's embedded databases");
/** PostgreSQL truncates prepared-statement names to NAMEDATALEN - 1 bytes. */
const MAX_NAME = 63;
/** A client that sends this much without a Sync or Flush gets it executed anyway. */
const MAX_BATCH_BYTES = 1024 * 1024;
const KILN = "kiln" as const;
type Holder = MuxSession | typeof KILN;

interface Waiter {
  who: Holder;
  resolve: (granted: boolean) => void;
}

/** Startup parameters that are not settings. */
const NOT_SETTINGS = new Set(["user", "database", "options", "replication"]);
const REPORTED = [
  "server_version",
  "server_encoding",
  "client_encoding",
  "DateStyle",
  "IntervalStyle",
  "TimeZone",
  "integer_datetimes",
  "standard_conforming_strings",
  "default_transaction_read_only",
  "in_hot_standby",
];

export class PgliteSessionMux {
  private holder: Holder | null = null;
  private queue: Waiter[] = [];
  /** The client whose settings the session holds; it may have changed them since (`dirty`). */
  private current: MuxSession | null = null;
  /** Key (init + settings) of the state the session holds; null when unknown. */
  private applied: string | null = null;
  /** Whose Parse the unnamed prepared statement is; any simple query or Kiln's own queries drop it. */
  private unnamedOwner: MuxSession | null = null;
  private sessions = new Set<MuxSession>();
  private nextId = 1;
  private closed = false;
  private lastActivity = Date.now();
  private sessionUser = "postgres";
  /** ParameterStatus defaults; also the first thing in the queue, so it runs before any client. */
  readonly defaults: Promise<Record<string, string>>;

  constructor(private readonly db: PGlite) {
    this.defaults = this.withSession(KILN, () => this.setUp());
    this.defaults.catch(() => {});
  }

  /**
   * A WireBackend for one client. `init`: SQL statements run every time this client takes over the
   * PGlite session, before its own saved settings are restored.
   */
  open(init: string[], client: WireClient, control: WireControl): WireBackend {
    if (this.closed) throw new Error("the database is shutting down");
    const s = new MuxSession(this, this.nextId++, init, client, control);
    this.sessions.add(s);
    return s;
  }

  /**
   * Runs fn with the session to itself, after any client transaction, with session state reset.
   * Whatever fn leaves behind is reset before the next user (a statement can change session
   * settings in ways no caller sees, e.g. through a view calling set_config).
   */
  exclusive<T>(fn: (db: PGlite) => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error("the database session is closed"));
    return this.withSession(KILN, async () => {
      await this.switchTo(null);
      try {
        return await fn(this.db);
      } finally {
        if (!this.db.closed && this.db.isInTransaction()) await this.db.exec("ROLLBACK");
        this.applied = null;
        this.unnamedOwner = null;
      }
    });
  }

  stats(): { clients: number; inTransaction: boolean; lastActivityMs: number } {
    return { clients: this.sessions.size, inTransaction: this.holder instanceof MuxSession, lastActivityMs: this.lastActivity };
  }

  /** Ends every client (FATAL with reason), rolls back a held transaction, lets queued Kiln work finish. */
  async closeAll(reason: string): Promise<void> {
    this.closed = true;
    const all = [...this.sessions];
    for (const s of all) s.control.terminate(reason);
    await Promise.all(all.map((s) => s.close()));
    await this.withSession(KILN, async () => {});
  }

  // ---- the lock ---------------------------------------------------------------------------------

  private async withSession<T>(who: Holder, fn: () => Promise<T>): Promise<T> {
    if (!this.tryTake(who)) await this.wait(who);
    try {
      return await fn();
    } finally {
      this.lastActivity = Date.now();
      this.release();
    }
  }

  private tryTake(who: Holder): boolean {
    if (this.holder === who) return true;
    if (this.holder !== null || this.queue.length > 0) return false;
    this.holder = who;
    return true;
  }

  /** Resolves true once `who` holds the session, false if its wait was cancelled. */
  private wait(who: Holder): Promise<boolean> {
    return new Promise((resolve) => {
      const w = { who, resolve };
      this.queue.push(w);
      if (who !== KILN) who.waiter = w;
    });
  }

  private cancelWait(s: MuxSession): void {
    const w = s.waiter;
    if (!w) return;
    s.waiter = null;
    this.queue.splice(this.queue.indexOf(w), 1);
    w.resolve(false);
  }

  private release(): void {
    const next = this.queue.shift();
    this.holder = next ? next.who : null;
    if (next && next.who !== KILN) next.who.waiter = null;
    next?.resolve(true);
  }

  // ---- running client batches (called by MuxSession) ---------------------------------------------

  async run(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void): Promise<void> {
    if (!this.tryTake(s) && !(await this.wait(s))) return;
    // On a throw the session stays with `s`: its close() (which follows) rolls back and releases.
    if (this.current !== s && !(await this.switchTo(s))) return this.release();

    const copy = batch.copy;
    const statusBefore = s.status;
    const savepoint = copy ? copy.savepoint : batch.copyStatement && statusBefore === T && batch.fresh;
    if (savepoint) await this.exec(simpleQuery("SAVEPOINT kiln_copy"));
    const out = copy ? await this.exec(concatBytes([...copy.parts, ...copy.data, COPY_GUARD])) : await this.execBatch(s, batch);
    this.lastActivity = Date.now();

    // COPY FROM STDIN ran into the guard: PGlite needs the data within the same call. Undo the
    // attempt, pass its CopyInResponse on, collect the data (MuxSession.handle), then run it all again.
    const skip = copy ? copy.sent : 0;
    const { from, copyIn } = copyInResponses(out, skip);
    if (copyIn >= 0 && (savepoint || (statusBefore === I && (copy !== undefined || batch.fresh)))) {
      // In the extended protocol the client's Sync was swallowed by the COPY: end the attempt first.
      const ended = await this.exec(sync());
      if (savepoint) await this.exec(simpleQuery("ROLLBACK TO SAVEPOINT kiln_copy; RELEASE SAVEPOINT kiln_copy"));
      else if (ended[ended.length - 1] !== I) await this.exec(simpleQuery("ROLLBACK"));
      this.unnamedOwner = null;
      s.copy = { parts: copy?.parts ?? batch.parts, data: copy?.data ?? [], sent: skip + 1, savepoint };
      send(out.subarray(from, copyIn));
      return;
    }
    s.copy = null;
    if (savepoint) await this.exec(simpleQuery("RELEASE SAVEPOINT kiln_copy"));

    const { status, changesSettings } = scanOutput(out);
    if (changesSettings || batch.setsConfig) {
      s.dirty = true;
      this.applied = null;
    }
    if (out.length > from) send(from ? out.subarray(from) : out);
    if (status) {
      s.status = status;
      if (status === I) {
        await this.db.syncToFs();
        this.release();
      }
    }
  }

  /** Runs a client batch, with the COPY guard after it. */
  private async execBatch(s: MuxSession, batch: Batch): Promise<Uint8Array> {
    let out: Uint8Array;
    if (batch.replayAt >= 0 && this.unnamedOwner !== s && batch.replayParse) {
      // The client binds an unnamed statement it parsed in an earlier batch, and someone else's
      // query has replaced it since: parse it again, and hide the ParseComplete the client never asked for.
      const before = batch.parts.slice(0, batch.replayAt);
      const first = before.length ? await this.exec(concatBytes(before)) : EMPTY;
      const replayed = await this.exec(batch.replayParse);
      const isParseComplete = replayed.length === 5 && replayed[0] === B.parseComplete;
      const rest = await this.exec(concatBytes([...batch.parts.slice(batch.replayAt), COPY_GUARD]));
      out = concatBytes([first, isParseComplete ? EMPTY : replayed, rest]);
      this.unnamedOwner = s;
    } else {
      out = await this.exec(concatBytes([...batch.parts, COPY_GUARD], batch.bytes + COPY_GUARD.length));
    }
    if (batch.unnamed !== undefined) this.unnamedOwner = batch.unnamed;
    return out;
  }

  /** Everything PGlite answers to `bytes`, in one buffer (its callback hands out views of wasm memory). */
  private async exec(bytes: Uint8Array): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    let total = 0;
    await this.db.execProtocolRawStream(bytes, {
      syncToFs: false,
      onRawData: (d) => {
        chunks.push(d.slice());
        total += d.length;
      },
    });
    return chunks.length === 1 ? chunks[0]! : concatBytes(chunks, total);
  }

  // ---- switching owners -------------------------------------------------------------------------

  private async setUp(): Promise<Record<string, string>> {
    await this.db.waitReady;
    await this.exec(simpleQuery("RESET ROLE; RESET ALL"));
    const names = REPORTED.map(sqlLiteral).join(", ");
    const { rows, error } = firstResult(
      await this.exec(
        simpleQuery(
          `SELECT 'session_user', session_user::text UNION ALL ` +
            `SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN (${names})`,
        ),
      ),
    );
    if (error) throw new Error(`could not read the database's settings: ${error}`);
    const defaults: Record<string, string> = {};
    for (const [name, value] of rows) defaults[name!] = value ?? "";
    this.sessionUser = defaults.session_user!;
    delete defaults.session_user;
    this.applied = DEFAULT_KEY;
    return defaults;
  }

  /**
   * Gives the session `to`'s state (null: defaults). One simple query: capture the outgoing client's
   * settings if it may have changed them, reset, run `to`'s init, restore `to`'s settings. Skipped
   * when the session already holds exactly that state. Returns false if `to` could not be set up;
   * it is then terminated (fail closed: never run a client with someone else's role).
   */
  private async switchTo(to: MuxSession | null): Promise<boolean> {
    const from = this.current && this.current.dirty && !this.current.closed ? this.current : null;
    const key = to ? to.key : DEFAULT_KEY;
    if (!from && this.applied === key) {
      this.current = to;
      return true;
    }
    const sql: string[] = [];
    if (from) sql.push(captureSql(from.customNames));
    sql.push(...this.resetSql());
    if (to) sql.push(...to.init, ...restoreSql(to.saved));
    const out = await this.exec(simpleQuery(sql.join(";\n")));
    this.unnamedOwner = null;
    const { rows, error, firstComplete } = firstResult(out);
    if (from && firstComplete) {
      from.setSaved(rows, this.sessionUser);
      from.dirty = false;
    }
    if (error) {
      // One implicit transaction, so none of it took effect: fall back to plain defaults.
      const reset = firstResult(await this.exec(simpleQuery(this.resetSql().join(";"))));
      this.current = null;
      this.applied = reset.error ? null : DEFAULT_KEY;
      if (!to) throw new Error(`could not reset the database session: ${error}`);
      to.control.terminate(`could not set up the database session: ${error}`);
      return false;
    }
    this.current = to;
    this.applied = key;
    return true;
  }

  private resetSql(): string[] {
    // RESET ALL leaves role and session authorization alone; RESET SESSION AUTHORIZATION does nothing in PGlite.
    return [`SET SESSION AUTHORIZATION ${sqlIdent(this.sessionUser)}`, "RESET ROLE", "RESET ALL"];
  }

  // ---- closing a client (called by MuxSession.close) ---------------------------------------------

  async cleanUp(s: MuxSession): Promise<void> {
    this.sessions.delete(s);
    this.cancelWait(s);
    await s.busy?.catch(() => {});
    const held = this.holder === s;
    if (!held) {
      if (this.unnamedOwner === s) this.unnamedOwner = null;
      if (s.statements.size === 0) return;
      if (!this.tryTake(s)) await this.wait(s);
    }
    try {
      if (this.db.closed) return;
      if (held) {
        // A Sync ends whatever extended-protocol batch it left open; then roll back what it left.
        const out = await this.exec(sync());
        if (out[out.length - 1] !== I) {
          await this.exec(simpleQuery("ROLLBACK"));
          this.unnamedOwner = null;
        }
      }
      if (s.statements.size) await this.exec(concatBytes([...[...s.statements].map(closeStatement), sync()]));
      if (this.unnamedOwner === s) this.unnamedOwner = null;
    } finally {
      this.release();
    }
  }
}

const keyOf = (init: string[], saved: Map<string, string>): string =>
  JSON.stringify([init, [...saved].sort(([a], [b]) => (a < b ? -1 : 1))]);
const DEFAULT_KEY = keyOf([], new Map());

/** A COPY FROM STDIN in progress: the batch that started it and the client's copy messages since. */
interface CopyIn {
  parts: Uint8Array[];
  data: Uint8Array[];
  /** CopyInResponses already passed to the client (a simple query may hold several COPYs). */
  sent: number;
  /** The client is in a transaction block; each attempt runs inside a savepoint. */
  savepoint: boolean;
}

/** Messages of one client batch, renamed and ready for PGlite. */
interface Batch {
  parts: Uint8Array[];
  bytes: number;
  /** It starts at a message boundary (not after a Flush). */
  fresh: boolean;
  /** A simple query that starts with COPY and mentions STDIN: within a transaction, attempts run in a savepoint. */
  copyStatement: boolean;
  /** Set when this batch finishes a COPY FROM STDIN. */
  copy?: CopyIn;
  /** Index of a Bind/Describe of the unnamed statement before any Parse of it in this batch; -1 if none. */
  replayAt: number;
  /** The client's earlier Parse of the unnamed statement, for `replayAt`. */
  replayParse: Uint8Array | null;
  /** Who owns the unnamed statement after this batch, if the batch changes that. */
  unnamed?: MuxSession | null;
  /** The SQL calls set_config(): the client's settings may change without a SET command tag. */
  setsConfig: boolean;
}

const newBatch = (): Batch => ({ parts: [], bytes: 0, fresh: true, copyStatement: false, replayAt: -1, replayParse: null, setsConfig: false });

class MuxSession implements WireBackend {
  /** Server-side names of this client's named statements, closed when it leaves. */
  readonly statements = new Set<string>();
  /** Settings to restore when it takes the session back (startup parameters at first). */
  saved = new Map<string, string>();
  key: string;
  /** It may have changed settings since they were last captured. */
  dirty = false;
  /** Custom (dotted) settings its SQL names; PostgreSQL lists them nowhere, so capture asks for each. */
  readonly customNames = new Set<string>();
  status = I;
  midBatch = false;
  copy: CopyIn | null = null;
  closed = false;
  waiter: Waiter | null = null;
  busy: Promise<void> | null = null;

  private readonly prefix: Uint8Array;
  private readonly longNames = new Map<string, string>();
  /** Server-side names of its statements whose SQL calls set_config(). */
  private readonly settingStatements = new Set<string>();
  private unnamedParse: Uint8Array | null = null;
  private batch = newBatch();
  private closing: Promise<void> | null = null;

  constructor(
    private readonly mux: PgliteSessionMux,
    private readonly id: number,
    readonly init: string[],
    private readonly client: WireClient,
    readonly control: WireControl,
  ) {
    this.prefix = utf8(`c${id}_`);
    for (const [name, value] of startupSettings(client.params)) this.saved.set(name, value);
    this.key = keyOf(init, this.saved);
  }

  async parameters(): Promise<Record<string, string>> {
    const params = { ...(await this.mux.defaults) };
    for (const [name, value] of this.saved) {
      const reported = Object.keys(params).find((k) => k.toLowerCase() === name.toLowerCase());
      if (reported) params[reported] = value;
    }
    params.application_name = this.client.applicationName;
    return params;
  }

  async handle(message: Uint8Array, send: (data: Uint8Array) => void): Promise<void> {
    if (this.closed) return;
    const type = message[0];
    if (type === F.terminate) return;
    let batch: Batch;
    if (this.copy) {
      // PostgreSQL ignores Flush and Sync during COPY FROM STDIN; anything but data ends it.
      this.copy.data.push(message);
      if (type === COPY_DATA || type === F.flush || type === F.sync) return;
      batch = { ...newBatch(), copy: this.copy };
    } else {
      this.add(message);
      const buffered = type === F.parse || type === F.bind || type === F.describe || type === F.execute || type === F.close;
      if (buffered && this.batch.bytes < MAX_BATCH_BYTES) return;
      batch = this.batch;
      batch.fresh = !this.midBatch;
      this.batch = newBatch();
      // Held across Flush: the implicit transaction stays open until Sync.
      this.midBatch = type !== F.sync && type !== F.query;
    }
    this.busy = this.mux.run(this, batch, send);
    await this.busy;
  }

  close(): Promise<void> {
    this.closed = true;
    this.closing ??= this.mux.cleanUp(this);
    return this.closing;
  }

  setSaved(rows: (string | null)[][], sessionUser: string): void {
    this.saved = new Map();
    for (const [name, value] of rows) {
      if (!name || value === null || value === "") continue;
      if (name === "role" && value === "none") continue;
      if (name === "session_authorization" && value === sessionUser) continue;
      this.saved.set(name, value);
    }
    this.key = keyOf(this.init, this.saved);
  }

  /** Buffers one message, renaming named statements and noting what the batch does. */
  private add(m: Uint8Array): void {
    const b = this.batch;
    const type = m[0];
    let out = m;
    if (type === F.parse) {
      const end = cstringEnd(m, 5);
      let server: string | null = null;
      if (end === 5) {
        this.unnamedParse = m;
        b.unnamed = this;
      } else {
        out = this.renamed(m, 5, end);
        server = fromUtf8(out.subarray(5, cstringEnd(out, 5)));
        this.statements.add(server);
      }
      if (this.noteSql(m, end + 1) && server) this.settingStatements.add(server);
    } else if (type === F.bind) {
      const portalEnd = cstringEnd(m, 5);
      const end = cstringEnd(m, portalEnd + 1);
      if (end === portalEnd + 1) this.usesUnnamed(b);
      else {
        out = this.renamed(m, portalEnd + 1, end);
        if (this.settingStatements.size && this.settingStatements.has(fromUtf8(out.subarray(portalEnd + 1, cstringEnd(out, portalEnd + 1)))))
          b.setsConfig = true;
      }
    } else if ((type === F.describe || type === F.close) && m[5] === 0x53 /* S */) {
      const end = cstringEnd(m, 6);
      if (end === 6) {
        if (type === F.describe) this.usesUnnamed(b);
      } else {
        out = this.renamed(m, 6, end);
        if (type === F.close) this.statements.delete(fromUtf8(out.subarray(6, cstringEnd(out, 6))));
      }
    } else if (type === F.query) {
      this.noteSql(m, 5);
      b.copyStatement = isCopyFromStdin(m);
      // A simple query drops the unnamed statement.
      this.unnamedParse = null;
      b.unnamed = null;
    }
    b.parts.push(out);
    b.bytes += out.length;
  }

  private usesUnnamed(b: Batch): void {
    if (b.replayAt < 0 && b.unnamed === undefined && this.unnamedParse) {
      b.replayAt = b.parts.length;
      b.replayParse = this.unnamedParse;
    }
  }

  /**
   * Looks at SQL text for what changes settings without a SET command tag (set_config) and for
   * custom setting names. Cheap unless the text contains "set". Returns whether it may call
   * set_config for the session (not only for the transaction).
   */
  private noteSql(m: Uint8Array, from: number): boolean {
    if (!containsSet(m, from)) return false;
    const sql = fromUtf8(m.subarray(from, cstringEnd(m, from)));
    for (const match of sql.matchAll(/set_config\s*\(\s*'((?:[^']|'')*)'/gi)) this.noteName(match[1]!.replace(/''/g, "'"));
    for (const match of sql.matchAll(/\b(?:re)?set\s+(?:session\s+|local\s+)?("?[a-z_][\w$]*"?\s*\.\s*"?[\w$.]+"?)/gi)) this.noteName(match[1]!);
    const calls = callsSessionSetConfig(sql);
    if (calls) this.batch.setsConfig = true;
    return calls;
  }

  private noteName(name: string): void {
    const n = name.replace(/["\s]/g, "").toLowerCase();
    if (n.includes(".") && /^[\w$.]+$/.test(n)) this.customNames.add(n);
  }

  /** `m` with the statement name at [start, end) replaced by this client's server-side name. */
  private renamed(m: Uint8Array, start: number, end: number): Uint8Array {
    const name = m.subarray(start, end);
    let server: Uint8Array;
    if (this.prefix.length + name.length <= MAX_NAME) {
      server = new Uint8Array(this.prefix.length + name.length);
      server.set(this.prefix);
      server.set(name, this.prefix.length);
    } else {
      // Too long to prefix without truncation: a short alias (the '~' keeps it apart from prefixed names).
      const key = fromUtf8(name);
      let alias = this.longNames.get(key);
      if (!alias) this.longNames.set(key, (alias = `c${this.id}~${this.longNames.size}`));
      server = utf8(alias);
    }
    const out = new Uint8Array(m.length - name.length + server.length);
    out.set(m.subarray(0, start));
    out.set(server, start);
    out.set(m.subarray(end), start + server.length);
    const len = out.length - 1;
    out[1] = len >>> 24;
    out[2] = (len >>> 16) & 0xff;
    out[3] = (len >>> 8) & 0xff;
    out[4] = len & 0xff;
    return out;
  }
}

/** Whether the C string from `from` contains "set" in any case. */
function containsSet(m: Uint8Array, from: number): boolean {
  for (let i = from; i + 2 < m.length && m[i] !== 0; i++) {
    if ((m[i]! | 0x20) === 0x73 && (m[i + 1]! | 0x20) === 0x65 && (m[i + 2]! | 0x20) === 0x74) return true;
  }
  return false;
}

/**
 * Whether some set_config() call in `sql` may be session-level: its last argument is not a literal
 * `true`. PostgREST-style code sets its claims per transaction on every request; capturing settings
 * after each of those would cost ~0.5 ms a switch for nothing. Anything it cannot read counts as yes.
 */
export function callsSessionSetConfig(sql: string): boolean {
  const call = /set_config\s*\(/gi;
  while (call.exec(sql)) {
    let depth = 1;
    let lastArg = call.lastIndex;
    let i = call.lastIndex;
    for (; i < sql.length && depth > 0; i++) {
      const c = sql[i];
      if (c === "'" || c === '"') {
        const close = sql.indexOf(c, i + 1); // a doubled quote just reopens on the next character
        if (close < 0) return true;
        i = close;
      } else if (c === "(") depth++;
      else if (c === ")") depth--;
      else if (c === "," && depth === 1) lastArg = i + 1;
    }
    if (depth > 0 || !/^\s*true\s*$/i.test(sql.slice(lastArg, i - 1))) return true;
  }
  return false;
}

/** A simple query whose first statement is COPY and which mentions STDIN (cheap; only decides on a savepoint). */
function isCopyFromStdin(query: Uint8Array): boolean {
  const sql = fromUtf8(query.subarray(5, query.length - 1));
  return /^(?:\s|--[^\n]*\n|\/\*[\s\S]*?\*\/)*copy\b/i.test(sql) && /\bstdin\b/i.test(sql);
}

/**
 * In PGlite's answer: where the part to pass on starts (after the first `skip` CopyInResponses, which
 * the client has already had) and the end of the next CopyInResponse the COPY guard failed (-1: none).
 */
function copyInResponses(out: Uint8Array, skip: number): { from: number; copyIn: number } {
  let from = 0;
  let seen = 0;
  let at = 0;
  while (at + 5 <= out.length) {
    const end = at + 1 + readInt32(out, at + 1);
    if (out[at] === COPY_IN_RESPONSE) {
      if (seen++ < skip) from = end;
      else if (out[end] === B.error) return { from, copyIn: end };
    }
    at = end;
  }
  return { from, copyIn: -1 };
}

const TAG_SET = utf8("SET\0");
const TAG_RESET = utf8("RESET\0");
const TAG_DISCARD = utf8("DISCARD ");
const TAG_DO = utf8("DO\0");
const TAG_CALL = utf8("CALL\0");

function startsWith(b: Uint8Array, at: number, prefix: Uint8Array): boolean {
  for (let i = 0; i < prefix.length; i++) if (b[at + i] !== prefix[i]) return false;
  return true;
}

/**
 * The last ReadyForQuery status in PGlite's answer (0 if none), and whether a command that can change
 * session settings completed: SET, RESET, DISCARD, and DO / CALL (their bodies may SET).
 */
function scanOutput(out: Uint8Array): { status: number; changesSettings: boolean } {
  let status = 0;
  let changesSettings = false;
  let at = 0;
  while (at + 5 <= out.length) {
    const type = out[at]!;
    if (type === B.readyForQuery) status = out[at + 5]!;
    else if (type === B.commandComplete && !changesSettings) {
      const t = at + 5;
      changesSettings =
        startsWith(out, t, TAG_SET) || startsWith(out, t, TAG_RESET) || startsWith(out, t, TAG_DISCARD) || startsWith(out, t, TAG_DO) || startsWith(out, t, TAG_CALL);
    }
    at += 1 + readInt32(out, at + 1);
  }
  return { status, changesSettings };
}

/** Session-level settings (`source = 'session'`), role, session authorization and the custom ones named. */
function captureSql(customNames: Set<string>): string {
  let sql =
    "SELECT name, setting FROM pg_catalog.pg_settings WHERE source = 'session'" +
    " UNION ALL SELECT 'session_authorization', pg_catalog.current_setting('session_authorization')" +
    " UNION ALL SELECT 'role', pg_catalog.current_setting('role')";
  if (customNames.size)
    sql += ` UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[${[...customNames].map(sqlLiteral).join(", ")}]::text[]) n`;
  return sql;
}

/** set_config for each saved setting; session authorization and role last, so the others are set with the init's privileges. */
function restoreSql(saved: Map<string, string>): string[] {
  if (saved.size === 0) return [];
  const rank = (n: string) => (n === "session_authorization" ? 1 : n === "role" ? 2 : 0);
  const calls = [...saved]
    .sort(([a], [b]) => rank(a) - rank(b))
    .map(([n, v]) => `pg_catalog.set_config(${sqlLiteral(n)}, ${sqlLiteral(v)}, false)`);
  return [`SELECT ${calls.join(", ")}`];
}

/** The settings a startup packet asks for: its parameters, and `-c name=value` / `--name=value` in `options`. */
export function startupSettings(params: Record<string, string>): Map<string, string> {
  const out = new Map<string, string>();
  for (const [name, value] of Object.entries(params)) if (!NOT_SETTINGS.has(name) && !name.startsWith("_pq_.")) out.set(name, value);
  const words = (params.options ?? "").match(/(?:\\.|\S)+/g)?.map((w) => w.replace(/\\(.)/g, "$1")) ?? [];
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    const setting = w === "-c" ? words[++i] : w.startsWith("-c") ? w.slice(2) : w.startsWith("--") ? w.slice(2) : undefined;
    const eq = setting?.indexOf("=") ?? -1;
    if (setting && eq > 0) out.set(setting.slice(0, eq).replace(/-/g, "_"), setting.slice(eq + 1));
  }
  // UTF8 is what the session speaks anyway; restoring it on every switch would be wasted work.
  if (/^utf-?8$/i.test(out.get("client_encoding") ?? "")) out.delete("client_encoding");
  if (out.get("application_name") === "") out.delete("application_name");
  return out;
}
