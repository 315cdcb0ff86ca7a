import type { ControlStore } from "../store/store";
import { parseAccessMode, type AccessMode } from "../backends/databases/engine";
import type { WireBackend, WireClient, WireControl, WireRouter } from "../backends/databases/wire/listener";
import { eachMessage, readCString } from "../backends/databases/wire/protocol";
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
 * Wraps a client's backend to feed top queries and usage: statement text from Query and Parse
 * messages, time until the result, rows from DataRow messages, bytes each way.
 */
function tracked(inner: WireBackend, databaseId: string, role: string, databases: DatabasesService): WireBackend {
  const statements = new Map<string, string>(); // prepared statement name -> text
  const portals = new Map<string, string>(); // portal -> text
  let pending: { text: string; start: number; rows: number } | null = null;
  const opened = performance.now();
  const finish = () => {
    if (!pending) return;
    const ms = performance.now() - pending.start;
    databases.activity.recordQuery(databaseId, pending.text, role, ms, pending.rows);
    databases.activity.recordUsage(databaseId, { computeMs: ms });
    pending = null;
  };
  return {
    parameters: () => inner.parameters(),
    cancel: () => inner.cancel?.(),
    async handle(message, send) {
      const type = String.fromCharCode(message[0]!);
      // Payloads start after the type byte and length; names and SQL are C strings.
      if (type === "Q") pending = { text: readCString(message, 5).value, start: performance.now(), rows: 0 };
      else if (type === "P") {
        const name = readCString(message, 5);
        statements.set(name.value, readCString(message, name.next).value);
      } else if (type === "B") {
        const portal = readCString(message, 5);
        portals.set(portal.value, statements.get(readCString(message, portal.next).value) ?? "");
      } else if (type === "E") pending = { text: portals.get(readCString(message, 5).value) ?? "", start: performance.now(), rows: 0 };
      const isWrite = type === "Q" || type === "B" || type === "d";
      databases.activity.recordUsage(databaseId, { written: isWrite ? message.byteLength : 0 });
      await inner.handle(message, (data) => {
        databases.activity.recordUsage(databaseId, { transfer: data.byteLength });
        // Count DataRow messages; CommandComplete or ErrorResponse ends the statement. A proxied chunk
        // may split a message: this is accounting, so a partial tail is simply not counted.
        if (pending)
          eachMessage(data, (t) => {
            if (!pending) return;
            if (t === 0x44) pending.rows++;
            else if (t === 0x43 || t === 0x45) finish();
          });
        send(data);
      });
    },
    async close() {
      finish();
      databases.activity.recordUsage(databaseId, { activeMs: performance.now() - opened });
      await inner.close();
    },
  };
}
