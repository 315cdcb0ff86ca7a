import type { ControlStore } from "../store/store";
import { parseAccessMode, type AccessMode } from "../backends/databases/engine";
import type { WireBackend, WireClient, WireControl, WireRouter } from "../backends/databases/wire/listener";
import type { DatabasesService } from "./service";
import { roleName } from "./service";

/**
 * Who may connect to which database over the wire, and as whom: the role `service_client_<id>`
 * with the database's current client password; `application_name` picks admin or RLS-as-user.
 */
export class DatabaseWireRouter implements WireRouter {
  constructor(
    private readonly databases: DatabasesService,
    private readonly store: ControlStore,
  ) {}

  async credentials(user: string, database: string) {
    const m = /^service_client_([a-z0-9]{20})$/.exec(user);
    if (!m) return null;
    const d = await this.databases.byId(m[1]!);
    if (!d || d.status !== "active" || (database !== d.name && database !== d.id)) return null;
    return { target: d.id, password: d.client_password };
  }

  async open(target: string, client: WireClient, control: WireControl): Promise<WireBackend> {
    const d = await this.databases.byId(target);
    if (!d || d.status !== "active") throw new Error("the database is not available");
    const parsed = parseAccessMode(client.applicationName);
    if (!parsed) throw new Error(`application_name must be service_full_access or service_user_access:<user id>, got "${client.applicationName}"`);
    let mode: AccessMode = { kind: "admin" };
    if (parsed.kind === "user") {
      const [u] = await this.store.query(`select email from auth_users where id = $1 and project_id = $2`, [parsed.userId, d.project_id]);
      mode = { kind: "user", userId: parsed.userId, email: u?.email ?? null };
    }
    const backend = await this.databases.engine.openWire(d.id, mode, client, control);
    return tracked(backend, d.id, mode.kind === "admin" ? roleName(d.id) : "authenticated", this.databases);
  }
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
    async handle(message, send) {
      const type = String.fromCharCode(message[0]!);
      const body = Buffer.from(message.buffer, message.byteOffset + 5, message.byteLength - 5);
      const cstrAt = (at: number) => {
        const end = body.indexOf(0, at);
        return [body.toString("utf8", at, end), end + 1] as const;
      };
      if (type === "Q") pending = { text: cstrAt(0)[0], start: performance.now(), rows: 0 };
      else if (type === "P") {
        const [name, next] = cstrAt(0);
        statements.set(name, cstrAt(next)[0]);
      } else if (type === "B") {
        const [portal, next] = cstrAt(0);
        portals.set(portal, statements.get(cstrAt(next)[0]) ?? "");
      } else if (type === "E") pending = { text: portals.get(cstrAt(0)[0]) ?? "", start: performance.now(), rows: 0 };
      const isWrite = type === "Q" || type === "B" || type === "d";
      databases.activity.recordUsage(databaseId, { written: isWrite ? message.byteLength : 0 });
      await inner.handle(message, (data) => {
        databases.activity.recordUsage(databaseId, { transfer: data.byteLength });
        if (pending) {
          // Count DataRow messages; CommandComplete or ErrorResponse ends the statement.
          for (let i = 0; i + 5 <= data.byteLength; ) {
            const t = data[i]!;
            const len = new DataView(data.buffer, data.byteOffset + i + 1, 4).getInt32(0);
            if (t === 0x44) pending.rows++;
            else if (t === 0x43 || t === 0x45) finish();
            if (len < 4) break;
            i += 1 + len;
            if (!pending) break;
          }
        }
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
