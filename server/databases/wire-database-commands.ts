import type { PlanName } from "../config";
import { HttpError } from "../http/errors";
import type { AccessMode } from "../backends/databases/engine";
import type { DatabaseStatement } from "../backends/databases/wire/database-statements";
import { MessageBuilder, concatBytes } from "../backends/databases/wire/protocol";
import type { ControlStore } from "../store/store";
import { normalizeDatabaseName, type DatabaseRecord, type DatabasesService } from "./service";

/** Who sent the statement: the credentials' database or branch, its project, the session's database and access mode. */
export interface WireStatementContext {
  originId: string;
  projectId: string;
  /** The database (or branch) this session is connected to. */
  sessionTarget: string;
  mode: AccessMode;
}

/** Open wire sessions per database id (this Kiln's), for DROP DATABASE's "being accessed by other users". */
export class WireSessions {
  private readonly open = new Map<string, Set<{ end: (message: string) => void }>>();
  add(id: string, session: { end: (message: string) => void }): () => void {
    let set = this.open.get(id);
    if (!set) this.open.set(id, (set = new Set()));
    set.add(session);
    return () => {
      set!.delete(session);
      if (!set!.size) this.open.delete(id);
    };
  }
  count(id: string): number {
    return this.open.get(id)?.size ?? 0;
  }
  /** Ends every session of `id` (FATAL 57P01 with `message`). */
  endAll(id: string, message: string): void {
    for (const s of [...(this.open.get(id) ?? [])]) s.end(message);
  }
}

/** How long DROP DATABASE waits for the database's other sessions to go: 5 s, as PostgreSQL does (tests shorten it). */
const dropWaitMs = () => Number(process.env.KILN_DROP_DATABASE_WAIT_MS ?? 5_000);

/** Values of CREATE DATABASE options that change nothing here (Kiln databases are UTF8, C collation, default tablespace). */
const HARMLESS: Record<string, (v: string) => boolean> = {
  encoding: (v) => /^(utf-?8|unicode|6)$/i.test(v),
  locale: (v) => /^(c|posix|c\.utf-?8)$/i.test(v),
  lc_collate: (v) => /^(c|posix|c\.utf-?8)$/i.test(v),
  lc_ctype: (v) => /^(c|posix|c\.utf-?8)$/i.test(v),
  builtin_locale: (v) => /^(c|c\.utf-?8)$/i.test(v),
  locale_provider: (v) => /^(libc|builtin)$/i.test(v),
  strategy: (v) => /^(wal_log|file_copy)$/i.test(v),
  tablespace: (v) => v === "pg_default" || v.toLowerCase() === "default",
  allow_connections: (v) => /^(true|on|1|yes|default)$/i.test(v),
  is_template: (v) => /^(false|off|0|no|default)$/i.test(v),
  "connection limit": (v) => v === "-1" || v.toLowerCase() === "default",
  owner: () => true, // the database's own role owns it, whoever is named
};

/** An answer to the statement: a CommandComplete or an ErrorResponse (with NOTICEs before it), without the ReadyForQuery. */
export class WireDatabaseCommands {
  constructor(
    private readonly databases: DatabasesService,
    private readonly store: ControlStore,
    readonly sessions: WireSessions,
  ) {}

  async run(stmt: DatabaseStatement, ctx: WireStatementContext): Promise<Uint8Array> {
    try {
      return stmt.kind === "create" ? await this.create(stmt, ctx) : await this.drop(stmt, ctx);
    } catch (e) {
      if (e instanceof SqlError) return concatBytes([...e.notices, e.response()]);
      throw e;
    }
  }

  private async create(stmt: Extract<DatabaseStatement, { kind: "create" }>, ctx: WireStatementContext): Promise<Uint8Array> {
    if (ctx.mode.kind !== "admin")
      throw new SqlError("42501", "permission denied to create database", undefined, "an end user's session (service_user_access) cannot create databases; connect with application_name=service_full_access");
    for (const o of stmt.options)
      if (!HARMLESS[o.name]!(o.value))
        throw new SqlError("0A000", `CREATE DATABASE ... ${o.name.toUpperCase()} ${o.value} is not supported by Kiln`, undefined, "Kiln databases are UTF8 with the C collation, in the default tablespace");
    const name = normalizeDatabaseName(stmt.name);
    let copyOf: DatabaseRecord | null = null;
    if (stmt.template && !["template0", "template1"].includes(stmt.template)) {
      copyOf = await this.reachable(ctx, normalizeDatabaseName(stmt.template));
      if (!copyOf) throw new SqlError("3D000", `template database "${stmt.template}" does not exist`);
      if (copyOf === NOT_OURS) throw new SqlError("42501", `permission denied to copy database "${stmt.template}"`, undefined, TEMPLATE_HINT);
      if (copyOf.status !== "active") throw new SqlError("55000", `template database "${stmt.template}" is ${copyOf.status}`);
    }
    let made: DatabaseRecord;
    try {
      made = await this.databases.create(ctx.projectId, await this.plan(ctx.projectId), { name, wireOrigin: ctx.originId, copyOf: copyOf?.id });
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      const message = (e.body as { error?: string }).error ?? "could not create the database";
      if (e.status === 409) throw new SqlError("42P04", `database "${stmt.name}" already exists`);
      if (e.status === 403) throw new SqlError("53400", message, undefined, "delete a database of the project (DROP DATABASE, or DELETE /projects/{id}/databases/{name}) or move to a larger plan");
      if (e.status === 400) throw new SqlError("42602", `invalid database name "${stmt.name}": ${message}`);
      throw new SqlError("58000", message);
    }
    const ready = await this.databases.provisioned(made.id);
    if (ready?.status !== "active") throw new SqlError("58000", `creating database "${stmt.name}" failed (the database is ${ready?.status ?? "gone"}; see Kiln's log)`);
    return commandComplete("CREATE DATABASE");
  }

  private async drop(stmt: Extract<DatabaseStatement, { kind: "drop" }>, ctx: WireStatementContext): Promise<Uint8Array> {
    const name = normalizeDatabaseName(stmt.name);
    const [row] = await this.store.query(`select id, wire_origin_id from databases where project_id = $1 and name = $2 and status <> 'deleted'`, [ctx.projectId, name]);
    if (!row) {
      if (stmt.ifExists) return concatBytes([notice(`database "${stmt.name}" does not exist, skipping`), commandComplete("DROP DATABASE")]);
      throw new SqlError("3D000", `database "${stmt.name}" does not exist`);
    }
    if (ctx.mode.kind !== "admin" || row.wire_origin_id !== ctx.originId)
      throw new SqlError(
        "42501",
        `must be owner of database ${stmt.name}`,
        undefined,
        "over the wire, only a database made with CREATE DATABASE through these same credentials can be dropped; delete others with the API (DELETE /projects/{id}/databases/{name}) or kiln db delete",
      );
    if (row.id === ctx.sessionTarget) throw new SqlError("55006", "cannot drop the currently open database");
    const id = row.id as string;
    if (stmt.force) this.sessions.endAll(id, `terminating connection due to administrator command: database "${stmt.name}" is dropped (DROP DATABASE ... WITH (FORCE))`);
    else {
      // As PostgreSQL: give sessions that are closing (a client that just let go of a pool) a few seconds.
      const until = performance.now() + dropWaitMs();
      while (this.sessions.count(id) > 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 50));
      const n = this.sessions.count(id);
      if (n > 0)
        throw new SqlError("55006", `database "${stmt.name}" is being accessed by other users`, `There ${n === 1 ? "is 1 other session" : `are ${n} other sessions`} using the database.`);
    }
    try {
      await this.databases.delete(ctx.projectId, name);
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      const message = (e.body as { error?: string }).error ?? "could not drop the database";
      if (e.status === 404) throw new SqlError("3D000", `database "${stmt.name}" does not exist`);
      throw new SqlError(e.status === 409 ? "55000" : "58000", message);
    }
    return commandComplete("DROP DATABASE");
  }

  /** A database of the project these credentials reach (their own, or one they made over the wire); NOT_OURS for another. */
  private async reachable(ctx: WireStatementContext, name: string): Promise<DatabaseRecord | typeof NOT_OURS | null> {
    const [row] = await this.store.query(`select id from databases where project_id = $1 and name = $2 and status <> 'deleted'`, [ctx.projectId, name]);
    if (!row) return null;
    const d = await this.databases.byId(row.id);
    if (!d) return null;
    return d.id === ctx.originId || d.wire_origin_id === ctx.originId ? d : NOT_OURS;
  }

  private async plan(projectId: string): Promise<PlanName> {
    const [r] = await this.store.query<{ plan: PlanName }>(`select a.plan from projects p join accounts a on a.id = p.account_id where p.id = $1`, [projectId]);
    if (!r) throw new SqlError("58000", "the project of this database is gone");
    return r.plan;
  }
}

const NOT_OURS = Object.freeze({}) as DatabaseRecord;
const TEMPLATE_HINT = "a template must be the database these credentials belong to, or one made with CREATE DATABASE through them";

/** An SQL error to answer the client with, PostgreSQL's way. */
class SqlError extends Error {
  readonly notices: Uint8Array[] = [];
  constructor(
    readonly code: string,
    message: string,
    readonly detail?: string,
    readonly hint?: string,
  ) {
    super(message);
  }
  response(): Uint8Array {
    return errorMessage("ERROR", this.code, this.message, this.detail, this.hint);
  }
}

function errorMessage(severity: string, code: string, message: string, detail?: string, hint?: string, type = 0x45): Uint8Array {
  const m = new MessageBuilder().byte(0x53).cstring(severity).byte(0x56).cstring(severity).byte(0x43).cstring(code).byte(0x4d).cstring(message);
  if (detail) m.byte(0x44).cstring(detail);
  if (hint) m.byte(0x48).cstring(hint);
  return m.byte(0).build(type);
}

const notice = (message: string) => errorMessage("NOTICE", "00000", message, undefined, undefined, 0x4e);
const commandComplete = (tag: string) => new MessageBuilder().cstring(tag).build(0x43);
