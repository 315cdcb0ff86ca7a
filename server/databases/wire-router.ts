import type { ControlStore } from "../store/store";
import { parseAccessMode, type AccessMode } from "../backends/databases/engine";
import type { WireBackend, WireClient, WireControl, WireRouter } from "../backends/databases/wire/listener";
import { fromUtf8, ProtocolViolation, readInt32, readyForQuery } from "../backends/databases/wire/protocol";
import { databaseStatementOf, type DatabaseStatement } from "../backends/databases/wire/database-statements";
import type { BranchesService } from "./branches";
import type { SessionTally, StatementTally } from "./activity";
import type { DatabasesService } from "./service";
import { normalizeDatabaseName, roleName } from "./service";
import { WireDatabaseCommands, WireSessions, type WireStatementContext } from "./wire-database-commands";

/**
 * Who may connect to which database over the wire, and as whom: the role `service_client_<id>`
 * with the database's current client password; `application_name` picks admin or RLS-as-user.
 * A branch has a role of its own (`service_client_<branch id>`) and password; its database name is
 * its parent's (or the branch id).
 */
export class DatabaseWireRouter implements WireRouter {
  private readonly sessions = new WireSessions();
  /** CREATE DATABASE / DROP DATABASE sent over the wire: answered by Kiln (wire-database-commands.ts). */
  private readonly commands: WireDatabaseCommands;

  constructor(
    private readonly databases: DatabasesService,
    private readonly branches: BranchesService,
    private readonly store: ControlStore,
  ) {
    this.commands = new WireDatabaseCommands(databases, store, this.sessions);
  }

  /**
   * A database's or branch's own credentials reach it by its name (or id), and the databases they made
   * with CREATE DATABASE over the wire by theirs (the name as sent, or as the API normalized it).
   */
  async credentials(user: string, database: string) {
    const m = /^service_client_([a-z0-9]{20})$/.exec(user);
    if (!m) return null;
    const d = await this.databases.byId(m[1]!);
    if (d) {
      if (d.status !== "active") return null;
      if (database === d.name || database === d.id) return { target: d.id, password: d.client_password };
      const made = await this.databases.wireCreated(d.project_id, d.id, normalizeDatabaseName(database));
      return made?.status === "active" ? { target: made.id, password: d.client_password } : null;
    }
    const b = await this.target(m[1]!);
    if (!b) return null;
    if (database === b.databaseName || database === b.id) return { target: b.id, password: b.password };
    const made = await this.databases.wireCreated(b.projectId, b.id, normalizeDatabaseName(database));
    return made?.status === "active" ? { target: made.id, password: b.password } : null;
  }

  /** An active database or branch by id: what a connection opens. */
  private async target(id: string): Promise<{ id: string; projectId: string; password: string; databaseName: string } | null> {
    const d = await this.databases.byId(id);
    if (d) return d.status === "active" ? { id: d.id, projectId: d.project_id, password: d.client_password, databaseName: d.name } : null;
    const b = await this.branches.byId(id);
    if (!b || b.status !== "active") return null;
    const parent = await this.databases.byId(b.database_id);
    if (!parent || parent.status === "deleted" || parent.status === "deleting") return null;
    return { id: b.id, projectId: b.project_id, password: b.client_password, databaseName: parent.name };
  }

  async open(target: string, client: WireClient, control: WireControl): Promise<WireBackend> {
    const d = await this.target(target);
    if (!d) throw new Error("the database is not available");
    const parsed = parseAccessMode(client.applicationName);
    if (!parsed) throw refused(`application_name service_user_access: must be followed by an end user's id, got "${client.applicationName}"`);
    let mode: AccessMode = { kind: "admin" };
    if (parsed.kind === "user") {
      // Only the project's own end users: a made-up or another project's id would give a session
      // whose auth.uid() no sign-in ever vouched for (RLS policies trust it).
      const [u] = await this.store.query(`select email from auth_users where id = $1 and project_id = $2`, [parsed.userId, d.projectId]);
      if (!u) throw refused(`no end user ${parsed.userId} in project ${d.projectId} (application_name service_user_access:<user id>)`);
      mode = { kind: "user", userId: parsed.userId, email: u.email };
    }
    const backend = await this.databases.engine.openWire(d.id, mode, client, control);
    const origin = /^service_client_([a-z0-9]{20})$/.exec(client.user)![1]!;
    const context: WireStatementContext = { originId: origin, projectId: d.projectId, sessionTarget: d.id, mode };
    const leave = this.sessions.add(d.id, { end: (message) => control.terminate(message) });
    const wrapped = tracked(backend, d.id, mode.kind === "admin" ? roleName(d.id) : "authenticated", this.databases, this.commands, context);
    return { ...wrapped, close: () => (leave(), wrapped.close()) };
  }
}

/** A connection refused for what its startup asked for: SQLSTATE 28000, invalid_authorization_specification. */
function refused(message: string): Error {
  return Object.assign(new Error(message), { code: "28000" });
}

/** The index of the NUL ending the C string at `at` (before `end`); a protocol violation if there is none. */
function cstringEnd(b: Uint8Array, at: number, end: number): number {
  for (let i = at; i < end; i++) if (b[i] === 0) return i;
  throw new ProtocolViolation("unterminated string in message");
}

/**
 * Statement or portal names to values, looked up by the name's bytes where they lie in a message: no
 * string is made per Bind or Execute (drivers send the same few names, `""` most of all).
 */
class NameTable<T> {
  private unnamed: T | undefined;
  private readonly named = new Map<number, { name: Uint8Array; value: T; next: unknown }>();

  private static hash(b: Uint8Array, at: number, end: number): number {
    let h = 0x811c9dc5;
    for (let i = at; i < end; i++) h = Math.imul(h ^ b[i]!, 0x01000193);
    return h;
  }

  private static same(name: Uint8Array, b: Uint8Array, at: number, end: number): boolean {
    if (name.length !== end - at) return false;
    for (let i = 0; i < name.length; i++) if (name[i] !== b[at + i]) return false;
    return true;
  }

  get(b: Uint8Array, at: number, end: number): T | undefined {
    if (at === end) return this.unnamed;
    type Entry = { name: Uint8Array; value: T; next: Entry | undefined };
    for (let e = this.named.get(NameTable.hash(b, at, end)) as Entry | undefined; e; e = e.next) if (NameTable.same(e.name, b, at, end)) return e.value;
    return undefined;
  }

  set(b: Uint8Array, at: number, end: number, value: T): void {
    if (at === end) return void (this.unnamed = value);
    type Entry = { name: Uint8Array; value: T; next: Entry | undefined };
    const h = NameTable.hash(b, at, end);
    const first = this.named.get(h) as Entry | undefined;
    for (let e = first; e; e = e.next) if (NameTable.same(e.name, b, at, end)) return void (e.value = value);
    // A client naming endless distinct statements does not make the table grow for ever.
    if (this.named.size >= 10_000) this.named.clear();
    this.named.set(h, { name: b.slice(at, end), value, next: first });
  }
}

/**
 * Wraps a client's backend to feed top queries and usage: statement text from Query and Parse
 * messages, time until the result, rows from DataRow messages, bytes each way, all counted in the
 * session's tally (activity.ts: a few additions per statement, drained by the flush). It also answers
 * CREATE DATABASE / DROP DATABASE itself (wire-database-commands.ts), on both engines.
 */
function tracked(
  inner: WireBackend,
  databaseId: string,
  role: string,
  databases: DatabasesService,
  commands: WireDatabaseCommands,
  context: WireStatementContext,
): WireBackend {
  const tally = databases.activity.openSession(databaseId, role);
  const statements = new NameTable<StatementTally>(); // prepared statement name -> its tally
  const portals = new NameTable<StatementTally | null>(); // portal -> its statement's tally
  const answers = new AnswerTracker(tally);
  const opened = performance.now();

  /** Notes what one frontend message (`message[at..end)`) starts, and the bytes a write sends. */
  const track = (message: Uint8Array, at: number, end: number): void => {
    const type = message[at]!;
    // Payloads start after the type byte and length; names and SQL are C strings.
    switch (type) {
      case 0x42 /* B */: {
        const portalEnd = cstringEnd(message, at + 5, end);
        portals.set(message, at + 5, portalEnd, statements.get(message, portalEnd + 1, cstringEnd(message, portalEnd + 1, end)) ?? null);
        tally.written += end - at;
        return;
      }
      case 0x45 /* E */:
        answers.execute(portals.get(message, at + 5, cstringEnd(message, at + 5, end)) ?? null);
        return;
      case 0x53 /* S */:
      case 0x46 /* F */:
        answers.sync();
        return;
      case 0x50 /* P */: {
        const nameEnd = cstringEnd(message, at + 5, end);
        const textEnd = cstringEnd(message, nameEnd + 1, end);
        statements.set(message, at + 5, nameEnd, tally.statement(fromUtf8(message.subarray(nameEnd + 1, textEnd))));
        return;
      }
      case 0x51 /* Q */:
        answers.query(tally.statement(fromUtf8(message.subarray(at + 5, cstringEnd(message, at + 5, end)))));
        tally.written += end - at;
        return;
      case 0x64 /* d */:
        tally.written += end - at;
        return;
    }
  };
  const relay = (send: (data: Uint8Array) => void) => (data: Uint8Array) => {
    tally.transfer += data.byteLength;
    answers.received(data);
    send(data);
  };
  let relayed: { send: (data: Uint8Array) => void; relay: (data: Uint8Array) => void } | null = null;
  const relayFor = (send: (data: Uint8Array) => void) => (relayed?.send === send ? relayed.relay : (relayed = { send, relay: relay(send) }).relay);

  /**
   * CREATE/DROP DATABASE outside a transaction block: Kiln's to answer, once what the client sent
   * before is answered (a pipelining client's answers stay in order). Inside a transaction block the
   * engine answers PostgreSQL's 25001 itself (and aborts the transaction, as the client expects).
   * False when the engine is to have the message after all.
   */
  const answered = async (statement: DatabaseStatement, send: (data: Uint8Array) => void): Promise<boolean> => {
    if ((await answers.quiet()) !== 0x49) return false;
    send(await commands.run(statement, context));
    send(readyForQuery("I"));
    return true;
  };
  /**
   * A run of messages passed through whole: each is looked at for the statistics (one pass over the
   * headers), then all go in one write; a CREATE/DROP DATABASE Query splits the run (what came
   * before, it, what came after).
   */
  const passRun = (run: Uint8Array, send: (data: Uint8Array) => void): void | Promise<void> => {
    for (let at = 0; at < run.length; ) {
      const end = at + 1 + readInt32(run, at + 1);
      if (run[at] === 0x51) {
        const statement = databaseStatementOf(run.subarray(at, end));
        if (statement)
          return (async () => {
            if (at > 0) await inner.handleRun!(run.subarray(0, at), relayFor(send));
            if (!(await answered(statement, send))) {
              track(run, at, end);
              await inner.handleRun!(run.subarray(at, end), relayFor(send));
            }
            if (end < run.length) await passRun(run.subarray(end), send);
          })();
      }
      track(run, at, end);
      at = end;
    }
    return inner.handleRun!(run, relayFor(send));
  };
  return {
    parameters: () => inner.parameters(),
    cancel: () => inner.cancel?.(),
    async handle(message, send) {
      const statement = databaseStatementOf(message);
      if (statement && (await answered(statement, send))) return;
      track(message, 0, message.length);
      await inner.handle(message, relayFor(send));
    },
    handleRun: inner.handleRun ? passRun : undefined,
    async close() {
      tally.activeMs += performance.now() - opened;
      databases.activity.closeSession(tally);
      await inner.close();
    },
  };
}

/**
 * Follows the backend's answers message by message, across chunk boundaries (a proxied chunk is
 * whatever TCP delivered), reading headers in place: each statement's result (DataRows counted,
 * CommandComplete or an error ends it), the transaction status of the last ReadyForQuery, and
 * whether every Query, Sync and FunctionCall sent has had its ReadyForQuery.
 */
class AnswerTracker {
  /** The last ReadyForQuery's status byte ('I' before any). */
  status = 0x49;
  private awaiting = 0;
  private waiters: (() => void)[] = [];
  // Statements sent and not yet answered, oldest first (a pipelining client sends several): their
  // tally (null: text unknown), when sent, rows so far, and how many sync points were sent before
  // them (what a ReadyForQuery answers: the ones before it that never got a result, after an
  // error in an extended-protocol batch, are dropped there).
  // Entries `head` to `tail` of the arrays (kept at their size: no allocation per statement).
  private readonly tallies: (StatementTally | null)[] = [];
  private readonly starts: number[] = [];
  private readonly seqs: number[] = [];
  /** Whether the entry is a simple Query (its ReadyForQuery, not its first result, ends it). */
  private readonly simple: boolean[] = [];
  private head = 0;
  private tail = 0;
  private rows = 0;
  private syncsSent = 0;
  private syncsAnswered = 0;
  // A header split across chunks, and the rest of the current message's body.
  private readonly split = new Uint8Array(5);
  private splitLen = 0;
  private type = 0;
  private left = 0;

  constructor(private readonly tally: SessionTally) {}

  /** An Execute of a statement. */
  execute(t: StatementTally | null): void {
    this.push(t, false);
  }

  /** A simple Query: a statement, and a sync point. */
  query(t: StatementTally): void {
    this.push(t, true);
    this.sync();
  }

  /** A Sync or FunctionCall (a ReadyForQuery answers it). */
  sync(): void {
    this.awaiting++;
    this.syncsSent++;
  }

  private push(t: StatementTally | null, simple: boolean): void {
    // Statements sent in their thousands with no answer read (a client that never reads) are not
    // all remembered: the oldest are dropped, uncounted.
    if (this.tail - this.head >= 10_000) this.head = this.tail = 0;
    const i = this.tail++;
    this.tallies[i] = t;
    this.starts[i] = performance.now();
    this.seqs[i] = this.syncsSent;
    this.simple[i] = simple;
  }

  /** The oldest statement has its result: counted (a simple Query's stays until its ReadyForQuery, uncounted from here on). */
  private result(): void {
    const i = this.head;
    if (i === this.tail) return;
    const t = this.tallies[i];
    if (t) this.tally.ran(t, performance.now() - this.starts[i]!, this.rows);
    this.rows = 0;
    if (this.simple[i]) this.tallies[i] = null;
    else this.advance();
  }

  private advance(): void {
    this.tallies[this.head] = null;
    if (++this.head === this.tail) this.head = this.tail = 0;
  }

  private readyForQuery(): void {
    this.syncsAnswered++;
    // What was sent before the sync point this answers and got no result is over.
    while (this.head < this.tail && this.seqs[this.head]! < this.syncsAnswered) this.advance();
    this.rows = 0;
    if (this.awaiting > 0) this.awaiting--;
    if (this.awaiting === 0 && this.waiters.length) for (const w of this.waiters.splice(0)) w();
  }

  private header(type: number): void {
    if (type === 0x44 /* DataRow */) this.rows++;
    else if (type === 0x43 /* CommandComplete */ || type === 0x45 /* ErrorResponse */ || type === 0x49 /* EmptyQueryResponse */ || type === 0x73 /* PortalSuspended */) this.result();
  }

  received(data: Uint8Array): void {
    let i = 0;
    const n = data.length;
    while (i < n) {
      if (this.left > 0) {
        const k = this.left < n - i ? this.left : n - i;
        if (this.type === 0x5a) this.status = data[i]!;
        i += k;
        this.left -= k;
        if (this.left === 0 && this.type === 0x5a) this.readyForQuery();
        continue;
      }
      let type: number;
      let len: number;
      if (this.splitLen === 0 && n - i >= 5) {
        type = data[i]!;
        len = readInt32(data, i + 1);
        i += 5;
      } else {
        while (this.splitLen < 5 && i < n) this.split[this.splitLen++] = data[i++]!;
        if (this.splitLen < 5) return;
        this.splitLen = 0;
        type = this.split[0]!;
        len = readInt32(this.split, 1);
      }
      this.type = type;
      this.left = len - 4;
      this.header(type);
      if (this.left <= 0 && type === 0x5a) this.readyForQuery();
    }
  }

  /**
   * The transaction status once everything sent has been answered. At most 2 s: a Query the backend
   * drops unanswered (sent inside a failed extended-protocol batch, or during COPY) must not hold the
   * client for ever; the count starts again from there.
   */
  async quiet(): Promise<number> {
    if (this.awaiting > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        new Promise<void>((r) => this.waiters.push(r)),
        new Promise<void>((r) => (timer = setTimeout(r, 2000))),
      ]);
      clearTimeout(timer);
      this.awaiting = 0;
      this.waiters = [];
    }
    return this.status;
  }
}
