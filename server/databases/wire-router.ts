import type { ControlStore } from "../store/store";
import { parseAccessMode, type AccessMode } from "../backends/databases/engine";
import type { WireBackend, WireClient, WireControl, WireRouter } from "../backends/databases/wire/listener";
import { ProtocolViolation, readCString, readInt32 } from "../backends/databases/wire/protocol";
import type { BranchesService } from "./branches";
import type { DatabasesService } from "./service";
import { roleName } from "./service";

/**
 * Who may connect to which database over the wire, and as whom: the role `service_client_<id>`
 * with the database's current client password; `application_name` picks admin or RLS-as-user.
 * A branch has a role of its own (`service_client_<branch id>`) and password; its database name is
 * its parent's (or the branch id).
 */
export class DatabaseWireRouter implements WireRouter {
  constructor(
    private readonly databases: DatabasesService,
    private readonly branches: BranchesService,
    private readonly store: ControlStore,
  ) {}

  async credentials(user: string, database: string) {
    const m = /^service_client_([a-z0-9]{20})$/.exec(user);
    if (!m) return null;
    const d = await this.databases.byId(m[1]!);
    if (d) {
      if (d.status !== "active" || (database !== d.name && database !== d.id)) return null;
      return { target: d.id, password: d.client_password };
    }
    const b = await this.target(m[1]!);
    if (!b || (database !== b.databaseName && database !== b.id)) return null;
    return { target: b.id, password: b.password };
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
    return tracked(backend, d.id, mode.kind === "admin" ? roleName(d.id) : "authenticated", this.databases);
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
 * messages, time until the result, rows from DataRow messages, bytes each way.
 */
function tracked(inner: WireBackend, databaseId: string, role: string, databases: DatabasesService): WireBackend {
  const statements = new Map<string, string>(); // prepared statement name -> text
  const portals = new Map<string, string>(); // portal -> text
  let pending: { text: string; start: number; rows: number } | null = null;
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
    if (!pending) return;
    const ms = performance.now() - pending.start;
    databases.activity.recordQuery(databaseId, pending.text, role, ms, pending.rows);
    pending = null;
    flushUsage(ms);
  };
  /** Notes what one frontend message starts (statement text for Query and Parse, the portal's for Execute); its bytes written, if a write. */
  const track = (message: Uint8Array, at: number, end: number): number => {
    const type = message[at]!;
    // Payloads start after the type byte and length; names and SQL are C strings.
    if (type === 0x51 /* Q */) pending = { text: readCString(message, at + 5).value, start: performance.now(), rows: 0 };
    else if (type === 0x50 /* P */) {
      const name = readCString(message, at + 5);
      statements.set(name.value, readCString(message, name.next).value);
    } else if (type === 0x42 /* B */) {
      const portalEnd = message.indexOf(0, at + 5);
      portals.set(nameAt(message, at + 5, portalEnd), statements.get(nameAt(message, portalEnd + 1, message.indexOf(0, portalEnd + 1))) ?? "");
    } else if (type === 0x45 /* E */) pending = { text: portals.get(nameAt(message, at + 5, message.indexOf(0, at + 5))) ?? "", start: performance.now(), rows: 0 };
    return type === 0x51 || type === 0x42 || type === 0x64 /* d */ ? end - at : 0;
  };
  const relay = (send: (data: Uint8Array) => void) => (data: Uint8Array) => {
    transfer += data.byteLength;
    if (transfer > 1 << 20) flushUsage();
    // Count DataRow messages; CommandComplete or ErrorResponse ends the statement. A proxied chunk
    // may split a message: this is accounting, so a partial tail is simply not counted.
    for (let at = 0; pending && at + 5 <= data.length; ) {
      const len = readInt32(data, at + 1);
      if (len < 4) break; // not a message boundary
      const t = data[at];
      if (t === 0x44) pending.rows++;
      else if (t === 0x43 || t === 0x45) finish();
      at += 1 + len;
    }
    send(data);
  };
  let relayed: { send: (data: Uint8Array) => void; relay: (data: Uint8Array) => void } | null = null;
  const relayFor = (send: (data: Uint8Array) => void) => (relayed?.send === send ? relayed.relay : (relayed = { send, relay: relay(send) }).relay);
  return {
    parameters: () => inner.parameters(),
    cancel: () => inner.cancel?.(),
    async handle(message, send) {
      written += track(message, 0, message.length);
      await inner.handle(message, relayFor(send));
    },
    // A run of messages passed through whole: each is looked at for the statistics, then all go in one write.
    // (A simple Query to answer here rather than on the server would be split out of the run at its `track`.)
    handleRun: inner.handleRun
      ? (run, send) => {
          for (let at = 0; at < run.length; ) {
            const end = at + 1 + readInt32(run, at + 1);
            written += track(run, at, end);
            at = end;
          }
          if (written > 1 << 20) flushUsage();
          return inner.handleRun!(run, relayFor(send));
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
