import { randomBytes } from "node:crypto";
import { plan as planOf } from "../accounts/plans";
import type { PlanName } from "../config";
import { badRequest, conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import type { SecretKey } from "../secrets/secret-key";
import type { ControlStore, Row, Sql } from "../store/store";
import { TtlCache } from "../store/ttl-cache";
import { DatabaseQueryError, LINT_SQL, type AccessMode, type DatabaseEngine } from "../backends/databases/engine";
import type { DatabaseActivity } from "./activity";
import { buildQuery, type QueryOperation } from "./query-builder";

export const REGIONS = [
  { id: "cloud-us-east-1", name: "US East (N. Virginia)" },
  { id: "cloud-us-west-2", name: "US West (Oregon)" },
  { id: "cloud-eu-west-1", name: "EU West (Ireland)" },
  { id: "cloud-eu-central-1", name: "EU Central (Frankfurt)" },
  { id: "cloud-ap-southeast-1", name: "Asia Pacific (Singapore)" },
  { id: "cloud-ap-southeast-2", name: "Asia Pacific (Sydney)" },
  { id: "cloud-ap-northeast-1", name: "Asia Pacific (Tokyo)" },
  { id: "cloud-sa-east-1", name: "South America (São Paulo)" },
] as const;
export const DEFAULT_REGION = "cloud-us-east-1";
export const PG_VERSIONS = [14, 15, 16] as const;
export const DEFAULT_PG_VERSION = 16;

/** lowercase, every run of other characters an underscore, at most 64 characters. */
export function normalizeDatabaseName(raw: string): string {
  return raw
    .toLowerCase()
    .replace(/[^a-z0-9]/g, "_")
    .slice(0, 64);
}

export interface DatabaseRecord {
  id: string;
  project_id: string;
  name: string;
  region: string;
  pg_version: number;
  status: "provisioning" | "active" | "restoring" | "failed" | "deleting" | "deleted";
  client_password: string;
  storage_bytes: number | null;
  /** Made by CREATE DATABASE over the wire with the credentials of this database or branch (null: by the API). */
  wire_origin_id: string | null;
  created_at: string;
  updated_at: string;
}

/** A row as services use it; `client_password` is stored encrypted with the instance secret key. */
function toRecord(r: Row, key: SecretKey): DatabaseRecord {
  return {
    id: r.id,
    project_id: r.project_id,
    name: r.name,
    region: r.region,
    pg_version: r.pg_version,
    status: r.status,
    client_password: key.decrypt(r.client_password),
    storage_bytes: r.storage_bytes === null || r.storage_bytes === undefined ? null : Number(r.storage_bytes),
    wire_origin_id: r.wire_origin_id ?? null,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

export function roleName(id: string): string {
  return `service_client_${id}`;
}

/** Role name as recorded in top queries. */
export function roleOf(id: string, mode: AccessMode): string {
  return mode.kind === "admin" ? roleName(id) : mode.kind === "user" ? "authenticated" : "anonymous";
}

function newPassword(): string {
  return randomBytes(24).toString("base64url");
}

export interface WireAddress {
  host: string;
  port: number;
}

/** Managed databases: records in the control store, data in the engine. */
export class DatabasesService {
  private readonly provisioning = new Set<Promise<void>>();
  /** Provisioning jobs by database id, for a caller that waits until its database is ready (CREATE DATABASE over the wire). */
  private readonly provisioningById = new Map<string, Promise<void>>();
  /**
   * Active databases by project and name, for the query API: a store read per query would cost as
   * much as the query itself. Local changes evict at once; other instances' within the TTL.
   */
  private readonly activeCache = new TtlCache<string, DatabaseRecord>(() => 2000);

  constructor(
    private readonly store: ControlStore,
    readonly engine: DatabaseEngine,
    private readonly now: () => Date,
    readonly activity: DatabaseActivity,
    private readonly wire: () => WireAddress,
    private readonly log: { error: (m: string, e?: unknown) => void },
    /** Encrypts the client passwords the store keeps (branches' too). */
    readonly secretKey: SecretKey,
    /** Fault injection for tests (KILN_FAULTS). */
    private readonly fault: (name: string) => boolean = () => false,
    /** Waits on the platform clock (faults that hold work until a test moves the clock). */
    private readonly sleep: (ms: number) => Promise<void> = (ms) => new Promise((r) => setTimeout(r, ms)),
  ) {}

  connectionString(d: DatabaseRecord): string {
    return this.connectionStringFor(d.id, d.client_password, d.name);
  }

  /** A connection string through Kiln's wire listener for the role `service_client_<id>` (a database's or a branch's). */
  connectionStringFor(id: string, password: string, databaseName: string): string {
    const { host, port } = this.wire();
    const h = host.includes(":") ? `[${host}]` : host;
    return `postgres://${roleName(id)}:${encodeURIComponent(password)}@${h}:${port}/${databaseName}?application_name=service_full_access`;
  }

  /**
   * What else goes when a database is deleted (its branches, backups), run before its data is
   * dropped. Registered by the area.
   */
  readonly onDelete: ((databaseId: string) => Promise<void>)[] = [];

  view(d: DatabaseRecord, opts: { list?: boolean } = {}) {
    return {
      id: d.id,
      database_name: d.name,
      status: d.status as Exclude<DatabaseRecord["status"], "deleted">,
      ...(d.status === "active" ? { connection_string: this.connectionString(d) } : {}),
      region: d.region,
      // What runs, not what was asked for: a dump's pg_dump and a client's psql must match it.
      pg_version: this.runningVersion(d.pg_version),
      requested_pg_version: d.pg_version,
      ...(opts.list && d.storage_bytes !== null ? { storage_bytes: d.storage_bytes } : {}),
      created_at: d.created_at,
      updated_at: d.updated_at,
    };
  }

  /**
   * The PostgreSQL major version a database really runs on: the engine's (embedded: PGlite's; production:
   * the server's). `requested` stands in only when the engine cannot tell.
   */
  runningVersion(requested: number): number {
    return this.engine.serverVersions()[0] ?? requested;
  }

  /**
   * `wireOrigin`: made by CREATE DATABASE over the wire with that database's or branch's credentials;
   * `copyOf`: provisioned as a copy of that database (CREATE DATABASE ... TEMPLATE) instead of empty.
   */
  async create(projectId: string, plan: PlanName, input: { name: string; region?: string; pg_version?: number; wireOrigin?: string; copyOf?: string }) {
    const name = normalizeDatabaseName(input.name);
    if (!/[a-z0-9]/.test(name)) throw badRequest("name must contain at least one letter or digit");
    const region = input.region ?? DEFAULT_REGION;
    if (!REGIONS.some((r) => r.id === region)) throw badRequest(`unknown region '${region}'; see GET /databases/regions`);
    const pgVersion = input.pg_version ?? DEFAULT_PG_VERSION;
    const limit = planOf(plan).maxDatabases;
    const at = this.now().toISOString();
    const row = await this.store.transaction(async (tx) => {
      await tx.query(`select id from projects where id = $1 for update`, [projectId]);
      const [{ n }] = (await tx.query(`select count(*)::int as n from databases where project_id = $1 and status <> 'deleted'`, [projectId])) as [{ n: number }];
      if (n >= limit) throw forbidden(`database limit reached: the ${planOf(plan).label} plan allows ${limit} database${limit === 1 ? "" : "s"} per project`);
      const [taken] = await tx.query(`select 1 from databases where project_id = $1 and name = $2 and status <> 'deleted'`, [projectId, name]);
      if (taken) throw conflict(`a database named '${name}' already exists in this project`);
      const [r] = await tx.query(
        `insert into databases (id, project_id, name, region, pg_version, status, client_password, wire_origin_id, copy_of_id, created_at, updated_at)
         values ($1, $2, $3, $4, $5, 'provisioning', $6, $7, $8, $9, $9) returning *`,
        [newId(), projectId, name, region, pgVersion, this.secretKey.encrypt(newPassword()), input.wireOrigin ?? null, input.copyOf ?? null, at],
      );
      return toRecord(r!, this.secretKey);
    });
    this.provision(row.id, input.copyOf);
    return row;
  }

  /** Resolves once the database's provisioning has ended (active or failed); at once if none runs here. */
  async provisioned(id: string): Promise<DatabaseRecord | null> {
    await this.provisioningById.get(id);
    return this.byId(id);
  }

  /** An active database of the project made over the wire with `origin`'s credentials, by name. */
  async wireCreated(projectId: string, origin: string, name: string): Promise<DatabaseRecord | null> {
    const [r] = await this.store.query(`select * from databases where project_id = $1 and name = $2 and wire_origin_id = $3 and status <> 'deleted'`, [
      projectId,
      name,
      origin,
    ]);
    return r ? toRecord(r, this.secretKey) : null;
  }

  /** Provisioning runs in the background; a failure leaves the database `failed` with the reason logged. */
  private provision(id: string, copyOf?: string): void {
    const job = (async () => {
      try {
        // Tests hold a database in provisioning until the clock moves a minute on (KILN_FAULTS=database-provision-delay:N).
        if (this.fault("database-provision-delay")) await Promise.race([this.sleep(60_000), this.stopping.promise]);
        if (copyOf) {
          const why = await this.engine.copiesUnavailable();
          if (why) throw new Error(why);
          await this.engine.fork(copyOf, id);
        } else await this.engine.create(id);
        await this.store.query(`update databases set status = 'active', updated_at = $2 where id = $1 and status = 'provisioning'`, [id, this.now().toISOString()]);
      } catch (err) {
        this.log.error(`database ${id}: provisioning failed`, err);
        await this.store
          .query(`update databases set status = 'failed', failure = $2, updated_at = $3 where id = $1`, [id, String((err as Error).message), this.now().toISOString()])
          .catch(() => {});
      }
    })();
    this.provisioning.add(job);
    this.provisioningById.set(id, job);
    void job.finally(() => {
      this.provisioning.delete(job);
      this.provisioningById.delete(id);
    });
  }

  /** Databases left `provisioning` by a stop are provisioned again at start. */
  async resumeProvisioning(): Promise<void> {
    const rows = await this.store.query<{ id: string; copy_of_id: string | null }>(`select id, copy_of_id from databases where status = 'provisioning'`);
    for (const r of rows) this.provision(r.id, r.copy_of_id ?? undefined);
    const deleting = await this.store.query<{ id: string }>(`select id from databases where status = 'deleting'`);
    for (const r of deleting) await this.finishDelete(r.id);
  }

  private readonly stopping = Promise.withResolvers<void>();

  /** Waits for the provisioning under way (a snapshot restore in place, which does not stop Kiln). */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.provisioning]);
  }

  /** Drops every cached view of a database (a snapshot restore put back their rows). */
  forgetAll(): void {
    this.activeCache.deleteWhere(() => true);
  }

  async drain(): Promise<void> {
    this.stopping.resolve();
    await Promise.allSettled([...this.provisioning]);
  }

  async list(projectId: string): Promise<DatabaseRecord[]> {
    const rows = await this.store.query(
      `select * from databases where project_id = $1 and status <> 'deleted' order by created_at, id`,
      [projectId],
    );
    return rows.map((r) => toRecord(r, this.secretKey));
  }

  async get(projectId: string, name: string): Promise<DatabaseRecord> {
    const [r] = await this.store.query(`select * from databases where project_id = $1 and name = $2 and status <> 'deleted'`, [projectId, name]);
    if (!r) throw notFound("database not found");
    return toRecord(r, this.secretKey);
  }

  async byId(id: string): Promise<DatabaseRecord | null> {
    const [r] = await this.store.query(`select * from databases where id = $1`, [id]);
    return r ? toRecord(r, this.secretKey) : null;
  }

  async delete(projectId: string, name: string): Promise<void> {
    const d = await this.get(projectId, name);
    this.forget(d.id);
    // Not while a restore runs (rule 8): checked and changed in one transaction.
    await this.unlessRestoring(d.id, "delete it", async (tx) => {
      await tx.query(`update databases set status = 'deleting', updated_at = $2 where id = $1`, [d.id, this.now().toISOString()]);
    });
    await this.finishDelete(d.id);
  }

  /**
   * Rule 8: delete and reset-password answer 409 while a restore of the database runs and 503 when that
   * cannot be determined: another operation held the database's row for KILN_RESTORE_STATE_TIMEOUT_MS
   * (5 s), the control store failed or did not answer within 10 s more, or the
   * database and its restores disagree (marked restoring with no restore pending or running, or the
   * other way round). `change` runs in the same transaction, the database's row locked, when no restore
   * runs; it gets the database's status.
   */
  private async unlessRestoring<T>(id: string, what: string, change: (tx: Sql, status: string) => Promise<T>): Promise<T> {
    const timeoutMs = Number(process.env.KILN_RESTORE_STATE_TIMEOUT_MS) || 5000;
    const undetermined = (why: string) =>
      new HttpError(503, { error: `whether a restore of this database is running cannot be determined now (${why}); try again shortly` });
    if (this.fault("restore-state-unavailable")) throw undetermined("injected fault: restore-state-unavailable");
    let abandoned = false;
    const work = this.store.transaction(async (tx) => {
      await tx.query(`set local lock_timeout = ${Math.max(1, Math.floor(timeoutMs))}`);
      const [db] = await tx.query(`select status from databases where id = $1 for update`, [id]);
      if (!db || db.status === "deleted") throw notFound("database not found");
      const [{ n }] = (await tx.query(`select count(*)::int as n from database_restores where database_id = $1 and status in ('pending', 'running')`, [id])) as [{ n: number }];
      const restoring = db.status === "restoring";
      if (restoring !== n > 0)
        throw undetermined(restoring ? "it is marked restoring, but no restore of it is pending or running" : "a restore of it is pending or running, but it is not marked restoring");
      if (restoring) throw conflict(`the database is being restored; ${what} once the restore has ended`);
      // Answered 503 already (the timeout below): change nothing.
      if (abandoned) throw undetermined("timed out");
      return change(tx, db.status);
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(undetermined(`the control store did not answer within ${timeoutMs + 10_000} ms`)), timeoutMs + 10_000);
    });
    try {
      return await Promise.race([work, timeout]);
    } catch (err) {
      abandoned = true;
      if (err instanceof HttpError) throw err;
      // A lock wait that ran out (55P03), a lost connection: the state could not be read.
      this.log.error(`database ${id}: reading its restore state failed`, err);
      const code = (err as { code?: string }).code;
      throw undetermined(code === "55P03" ? `its state was held by another operation for over ${timeoutMs} ms` : "the control store failed");
    } finally {
      clearTimeout(timer);
      work.catch(() => {});
    }
  }

  private async finishDelete(id: string): Promise<void> {
    this.forget(id);
    for (const hook of this.onDelete) await hook(id);
    await this.engine.drop(id);
    await this.store.query(`update databases set status = 'deleted', updated_at = $2 where id = $1`, [id, this.now().toISOString()]);
    await this.store.query(`delete from database_query_stats where database_id = $1`, [id]);
  }

  async resetPassword(projectId: string, name: string) {
    const d = await this.get(projectId, name);
    const password = newPassword();
    const updated = await this.unlessRestoring(d.id, "reset its password", async (tx, status) => {
      if (status !== "active") throw conflict(`the database is ${status}`);
      const [r] = await tx.query(`update databases set client_password = $2, updated_at = $3 where id = $1 returning *`, [d.id, this.secretKey.encrypt(password), this.now().toISOString()]);
      return toRecord(r!, this.secretKey);
    });
    this.forget(d.id);
    return {
      message: "password reset: new connections must use the new password; open connections continue",
      role_name: roleName(d.id),
      new_password: password,
      connection_string: this.connectionString(updated),
    };
  }

  async removeAll(projectId: string): Promise<void> {
    const rows = await this.store.query<{ id: string }>(`select id from databases where project_id = $1 and status <> 'deleted'`, [projectId]);
    for (const r of rows) {
      await this.store.query(`update databases set status = 'deleting' where id = $1`, [r.id]);
      await this.finishDelete(r.id);
    }
  }

  /** The active database of a project by name, for the query API. */
  async activeByName(projectId: string, name: string): Promise<DatabaseRecord> {
    const key = `${projectId}/${name}`;
    const hit = this.activeCache.get(key);
    if (hit) return hit;
    const d = await this.get(projectId, name);
    if (d.status !== "active") throw new HttpError(409, { error: `the database is ${d.status}` });
    this.activeCache.set(key, d);
    return d;
  }

  /** Drops cached views of a database whose state changed (restores). */
  forget(id: string): void {
    this.activeCache.deleteWhere((d) => d.id === id);
  }

  /**
   * One query API call: the body becomes parameterized SQL (400 for bad input), runs as the caller's
   * role, and is counted for stats and top queries. `started` marks when the database work begins
   * (the timing headers). SQL errors are DatabaseQueryError; anything else is a failure to reach it.
   */
  async query(projectId: string, databaseName: string, mode: AccessMode, operation: QueryOperation, body: unknown, started: () => void) {
    const d = await this.activeByName(projectId, databaseName);
    return this.queryOn(d.id, mode, operation, body, started);
  }

  /** One query API call on a database or branch by its id (the engine's name for it). */
  async queryOn(id: string, mode: AccessMode, operation: QueryOperation, body: unknown, started: () => void) {
    const q = buildQuery(operation, body);
    started();
    if (this.fault("database-connection")) throw new Error("injected fault: database-connection");
    let result;
    try {
      result = await this.engine.run(id, mode, q.text, q.params);
    } catch (err) {
      if (err instanceof DatabaseQueryError && err.code === INSUFFICIENT_PRIVILEGE && mode.kind !== "admin")
        throw new DatabaseQueryError(explainDenied(err.message, operation, (body as { table: string }).table, mode.kind === "user" ? "authenticated" : "anonymous"), err.code);
      throw err;
    }
    this.activity.recordQuery(id, q.text, roleOf(id, mode), result.computeMs, result.rows.length);
    this.activity.recordUsage(id, {
      computeMs: result.computeMs,
      activeMs: result.computeMs,
      written: operation === "select" ? 0 : JSON.stringify(q.params).length,
    });
    return { databaseId: id, ...result };
  }

  /** `parts`: what the branches and backups of the database hold, measured by their services. */
  async stats(
    d: DatabaseRecord,
    from: Date,
    to: Date,
    granularity: string,
    parts: { branches: { id: string; name: string; storage_bytes: number }[]; backupBytes: number } = { branches: [], backupBytes: 0 },
  ) {
    await this.activity.flush();
    const size = await this.engine.sizeBytes(d.id);
    const [u] = await this.store.query(
      `select coalesce(sum(data_written_bytes), 0)::float8 as written, coalesce(sum(data_transfer_bytes), 0)::float8 as transfer,
              coalesce(sum(compute_ms), 0)::float8 as compute, coalesce(sum(active_ms), 0)::float8 as active
         from database_usage where database_id = $1 and hour >= date_trunc('hour', $2::timestamptz) and hour <= $3::timestamptz`,
      [d.id, from.toISOString(), to.toISOString()],
    );
    return {
      current_storage_bytes: size,
      current_storage_mb: Math.round((size / 1_048_576) * 100) / 100,
      branches: parts.branches,
      backup_storage_bytes: parts.backupBytes,
      storage_bytes: d.storage_bytes ?? size,
      data_written_bytes: Number(u!.written),
      data_transfer_bytes: Number(u!.transfer),
      compute_time_seconds: Number(u!.compute) / 1000,
      active_time_seconds: Number(u!.active) / 1000,
      time_range: `${from.toISOString()}/${to.toISOString()}`,
      granularity,
    };
  }

  /**
   * Relations row-level security does not guard, and what `anonymous` and `authenticated` may do to
   * them; `exposed` when either role holds a privilege (its rows are open to that role, unchecked).
   */
  async lint(d: DatabaseRecord) {
    if (d.status !== "active") throw conflict(`the database is ${d.status}`);
    const { rows } = await this.engine.run(d.id, { kind: "admin" }, LINT_SQL, []);
    const tables = rows.map((r) => {
      const anonymous = (r.anonymous as string[]) ?? [];
      const authenticated = (r.authenticated as string[]) ?? [];
      return {
        schema: r.schema as string,
        name: r.name as string,
        kind: r.kind as string,
        anonymous,
        authenticated,
        exposed: anonymous.length > 0 || authenticated.length > 0,
      };
    });
    return {
      tables_without_rls: tables,
      exposed_tables: tables.filter((t) => t.exposed).map((t) => `${t.schema}.${t.name}`),
    };
  }

  async topQueries(d: DatabaseRecord, limit: number) {
    await this.activity.flush();
    const rows = await this.store.query(
      `select * from database_query_stats where database_id = $1 order by total_ms desc limit ${limit}`,
      [d.id],
    );
    return rows.map((r) => ({
      query_id: r.query_id as string,
      query: r.query as string,
      database: { id: d.id, name: d.name },
      role: r.role as string,
      calls: r.calls as number,
      total_exec_time_seconds: r.total_ms / 1000,
      max_exec_time_seconds: r.max_ms / 1000,
      mean_exec_time_seconds: r.total_ms / r.calls / 1000,
      min_exec_time_seconds: r.min_ms / 1000,
      rows_processed: r.rows_processed as number,
    }));
  }

  /** A background pass records each database's size for the list's `storage_bytes`. */
  async sampleStorage(extra: (databaseId: string) => Promise<number> = async () => 0): Promise<void> {
    const rows = await this.store.query<{ id: string }>(`select id from databases where status = 'active'`);
    for (const r of rows) {
      const own = await this.engine.sizeBytes(r.id).catch(() => null);
      const size = own === null ? null : own + (await extra(r.id).catch(() => 0));
      if (size !== null)
        await this.store.query(`update databases set storage_bytes = $2, storage_sampled_at = $3 where id = $1`, [r.id, size, this.now().toISOString()]);
    }
  }
}

const INSUFFICIENT_PRIVILEGE = "42501";

/** What each query API operation needs on its table: it returns the rows it touched, hence SELECT. */
const NEEDED: Record<QueryOperation, string> = {
  select: "select",
  insert: "select, insert",
  update: "select, update",
  delete: "select, delete",
};

/**
 * PostgreSQL's "permission denied for table items", with who was refused and the grant that would
 * allow it. Row-level security refusals (also 42501) keep PostgreSQL's own message.
 */
export function explainDenied(message: string, operation: QueryOperation, table: string, role: string): string {
  const m = /^permission denied for (table|view|materialized view|foreign table|sequence) (.+)$/.exec(message);
  if (!m) return message;
  const [, kind, name] = m as unknown as [string, string, string];
  if (kind === "sequence")
    return `${message}: role ${role} may not use it; its owner can grant it (grant usage on sequence ${name} to ${role}), or use an identity column, which needs no grant`;
  if (name === table)
    return `${message}: role ${role} has no privilege for this ${operation} (the query API's ${operation} needs ${NEEDED[operation].toUpperCase()}); its owner can grant it (grant ${NEEDED[operation]} on ${name} to ${role})`;
  return `${message}: role ${role} has no privilege on it; its owner can grant it (grant select on ${name} to ${role})`;
}
