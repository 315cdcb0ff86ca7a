import type { ControlStore } from "../store/store";
import { parseAccessMode, type AccessMode } from "../backends/databases/engine";
import type { WireBackend, WireClient, WireControl, WireRouter } from "../backends/databases/wire/listener";
import { ProtocolViolation, readCString, readInt32, readyForQuery } from "../backends/databases/wire/protocol";
import { databaseStatementOf, type DatabaseStatement } from "../backends/databases/wire/database-statements";
import type { BranchesService } from "./branches";
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

/**
 * A statement or portal name (the C string at `at` ending at `end`): drivers' names are short ASCII
 * (`""`, `P0_1`, `s42`), read without a decoder; anything else is decoded as UTF-8.
 */
function nameAt(b: Uint8Array, at: number, end: number): string {
  if (end < 0) throw new ProtocolViolation("unterminated string in message");
  if (end === at) return "";
  if (end - at <= 16) {
    let s = "";
    for (let i = at; i < end; i++) {
      const c = b[i]!;
      if (c >= 0x80) return readCString(b, at).value;
      s += String.fromCharCode(c);
    }
    return s;
  }
  return readCString(b, at).value;
}

/**
 * Wraps a client's backend to feed top queries and usage: statement text from Query and Parse
 * messages, time until the result, rows from DataRow messages, bytes each way. It also answers
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
  const statements = new Map<string, string>(); // prepared statement name -> text
  const portals = new Map<string, string>(); // portal -> text
  // The statement being answered: its text, start and DataRow count (the tracker counts them).
  const answers = new AnswerTracker(() => finish());
  const opened = performance.now();
  // Bytes each way add up here and reach the usage figures with each statement's time (and every
  // megabyte, for a long COPY): one record per statement, not one per chunk.
  let written = 0;
  let transfer = 0;
  const flushUsage = (computeMs = 0) => {
    databases.activity.recordUsage(databaseId, { written, transfer, computeMs });
    written = transfer = 0;
  };
  const finish = () => {
    const pending = answers.pending;
    if (!pending) return;
    const ms = performance.now() - pending.start;
    databases.activity.recordQuery(databaseId, pending.text, role, ms, pending.rows);
    answers.pending = null;
    flushUsage(ms);
  };
  /** Notes what one frontend message starts (statement text for Query and Parse, the portal's for Execute); its bytes written, if a write. */
  const track = (message: Uint8Array, at: number, end: number): number => {
    const type = message[at]!;
    answers.sent(type);
    // Payloads start after the type byte and length; names and SQL are C strings.
    if (type === 0x51 /* Q */) answers.pending = { text: readCString(message, at + 5).value, start: performance.now(), rows: 0 };
    else if (type === 0x50 /* P */) {
      const name = readCString(message, at + 5);
      statements.set(name.value, readCString(message, name.next).value);
    } else if (type === 0x42 /* B */) {
      const portalEnd = message.indexOf(0, at + 5);
      portals.set(nameAt(message, at + 5, portalEnd), statements.get(nameAt(message, portalEnd + 1, message.indexOf(0, portalEnd + 1))) ?? "");
    } else if (type === 0x45 /* E */) answers.pending = { text: portals.get(nameAt(message, at + 5, message.indexOf(0, at + 5))) ?? "", start: performance.now(), rows: 0 };
    return type === 0x51 || type === 0x42 || type === 0x64 /* d */ ? end - at : 0;
  };
  const relay = (send: (data: Uint8Array) => void) => (data: Uint8Array) => {
    transfer += data.byteLength;
    if (transfer > 1 << 20) flushUsage();
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
  const passRun = (run: Uint8Array, send: (data: Uint8Array) => void): void | Promise<void> => {
    for (let at = 0; at < run.length; ) {
      const end = at + 1 + readInt32(run, at + 1);
      written += track(run, at, end);
      at = end;
    }
    if (written > 1 << 20) flushUsage();
    return inner.handleRun!(run, relayFor(send));
  };
  return {
    parameters: () => inner.parameters(),
    cancel: () => inner.cancel?.(),
    async handle(message, send) {
      const statement = databaseStatementOf(message);
      if (statement && (await answered(statement, send))) return;
      written += track(message, 0, message.length);
      await inner.handle(message, relayFor(send));
    },
    // A run of messages passed through whole: each is looked at for the statistics, then all go in one
    // write; a CREATE/DROP DATABASE Query splits the run (what came before, it, what came after).
    handleRun: inner.handleRun
      ? (run, send) => {
          for (let at = 0; at < run.length; ) {
            const end = at + 1 + readInt32(run, at + 1);
            const statement = run[at] === 0x51 ? databaseStatementOf(run.subarray(at, end)) : null;
            if (statement)
              return (async () => {
                if (at > 0) await passRun(run.subarray(0, at), send);
                if (!(await answered(statement, send))) await passRun(run.subarray(at, end), send);
                if (end < run.length) await passRun(run.subarray(end), send);
              })();
            at = end;
          }
          return passRun(run, send);
        }
      : undefined,
    async close() {
      finish();
      flushUsage();
      databases.activity.recordUsage(databaseId, { activeMs: performance.now() - opened });
      await inner.close();
    },
  };
}

/**
 * Follows the backend's answers message by message, across chunk boundaries (a proxied chunk is
 * whatever TCP delivered): each message's type for the accounting, the transaction status of the last
 * ReadyForQuery, and whether every Query, Sync and FunctionCall sent has had its ReadyForQuery.
 */
class AnswerTracker {
  /** The last ReadyForQuery's status byte ('I' before any). */
  status = 0x49;
  /** The statement being answered (set by the caller): DataRows add to its rows; CommandComplete or ErrorResponse calls `ended`. */
  pending: { text: string; start: number; rows: number } | null = null;
  private awaiting = 0;
  private readonly head = new Uint8Array(5);
  private headLen = 0;
  private type = 0;
  private left = 0; // bytes of the current message's body still to come
  private waiters: (() => void)[] = [];

  constructor(private readonly ended: () => void) {}

  sent(type: number): void {
    if (type === 0x51 || type === 0x53 || type === 0x46) this.awaiting++; // Q, S, F
  }

  received(data: Uint8Array): void {
    let i = 0;
    const n = data.length;
    while (i < n) {
      if (this.left > 0) {
        if (this.type === 0x5a) this.status = data[i]!;
        const k = Math.min(this.left, n - i);
        i += k;
        this.left -= k;
        if (this.left === 0 && this.type === 0x5a) this.answered();
        continue;
      }
      this.head[this.headLen++] = data[i++]!;
      if (this.headLen < 5) continue;
      this.headLen = 0;
      this.type = this.head[0]!;
      this.left = readInt32(this.head, 1) - 4;
      if (this.pending) {
        if (this.type === 0x44) this.pending.rows++;
        else if (this.type === 0x43 || this.type === 0x45) this.ended();
      }
      if (this.left <= 0 && this.type === 0x5a) this.answered();
    }
  }

  private answered(): void {
    if (this.awaiting > 0) this.awaiting--;
    if (this.awaiting === 0) for (const w of this.waiters.splice(0)) w();
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
