import { randomBytes } from "node:crypto";
import { plan as planOf } from "../accounts/plans";
import type { Clock } from "../clock";
import type { PlanName } from "../config";
import { badRequest, conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import type { SecretKey } from "../secrets/secret-key";
import type { ControlStore, Row } from "../store/store";
import { isUniqueViolation } from "../store/store";
import { TtlCache } from "../store/ttl-cache";
import { EngineUnavailable, type AccessMode, type DatabaseEngine } from "../backends/databases/engine";
import type { DueWork } from "./timers";
import { roleName, type DatabaseRecord, type DatabasesService } from "./service";
import type { QueryOperation } from "./query-builder";

export const BRANCH_TTL = { min: 3600, max: 2_592_000, default: 604_800 } as const;
export const BRANCH_NAME = /^[a-z0-9_]{1,64}$/;

export type BranchStatus = "provisioning" | "active" | "failed" | "deleting" | "deleted";

export interface BranchRecord {
  id: string;
  database_id: string;
  project_id: string;
  name: string;
  status: BranchStatus;
  client_password: string;
  ttl_seconds: number;
  expires_at: string;
  storage_bytes: number | null;
  generation: number;
  created_at: string;
  updated_at: string;
}

/** A row as services use it; `client_password` is stored encrypted with the instance secret key. */
function toBranch(r: Row, key: SecretKey): BranchRecord {
  return {
    id: r.id,
    database_id: r.database_id,
    project_id: r.project_id,
    name: r.name,
    status: r.status,
    client_password: key.decrypt(r.client_password),
    ttl_seconds: r.ttl_seconds,
    expires_at: new Date(r.expires_at).toISOString(),
    storage_bytes: r.storage_bytes === null || r.storage_bytes === undefined ? null : Number(r.storage_bytes),
    generation: r.generation,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

function newPassword(): string {
  return randomBytes(24).toString("base64url");
}

/** States in which a branch exists and counts (everything but gone). */
const LIVE = `status in ('provisioning', 'active', 'failed', 'deleting')`;
/** States that expire. */
const EXPIRING = `status in ('provisioning', 'active', 'failed')`;

/**
 * Database branches: copies of a database taken while it serves (`DatabaseEngine.fork`), with their
 * own credentials, a lifetime on the platform clock, reset, and teardown in the background. Each
 * branch's background jobs (build, teardown) run one after another; a build that finds its branch
 * deleted or reset meanwhile (`generation`) leaves its result to the job after it.
 */
export class BranchesService {
  private readonly jobs = new Map<string, Promise<void>>();
  private readonly inFlight = new Set<Promise<void>>();
  /** Active branches for the query API, like DatabasesService's cache. */
  private readonly activeCache = new TtlCache<string, { branch: BranchRecord; database: DatabaseRecord }>(() => 2000);
  /** Set by the area: rearms the expiry timer after a change of `expires_at`. */
  onExpiryChange: () => void = () => {};

  constructor(
    private readonly store: ControlStore,
    private readonly engine: DatabaseEngine,
    private readonly clock: Clock,
    private readonly databases: DatabasesService,
    private readonly log: { error: (m: string, e?: unknown) => void },
    private readonly fault: (name: string) => boolean = () => false,
  ) {}

  // ---- views --------------------------------------------------------------------------------------

  connectionString(b: BranchRecord, d: DatabaseRecord): string {
    return this.databases.connectionStringFor(b.id, b.client_password, d.name);
  }

  view(b: BranchRecord, d: DatabaseRecord, opts: { connection?: boolean } = {}) {
    return {
      id: b.id,
      database_id: b.database_id,
      project_id: b.project_id,
      name: b.name,
      status: b.status as Exclude<BranchStatus, "deleted">,
      ...(opts.connection && b.status === "active" ? { connection_string: this.connectionString(b, d) } : {}),
      ttl_seconds: b.ttl_seconds,
      expires_at: b.expires_at,
      storage_bytes: b.storage_bytes ?? 0,
      created_at: b.created_at,
      updated_at: b.updated_at,
    };
  }

  // ---- reads --------------------------------------------------------------------------------------

  async list(d: DatabaseRecord): Promise<BranchRecord[]> {
    const rows = await this.store.query(`select * from database_branches where database_id = $1 and ${LIVE} order by created_at, id`, [d.id]);
    return rows.map((r) => toBranch(r, this.databases.secretKey));
  }

  async get(d: DatabaseRecord, name: string): Promise<BranchRecord> {
    const [r] = await this.store.query(`select * from database_branches where database_id = $1 and name = $2 and ${LIVE}`, [d.id, name]);
    if (!r) throw notFound("branch not found");
    return toBranch(r, this.databases.secretKey);
  }

  async byId(id: string): Promise<BranchRecord | null> {
    const [r] = await this.store.query(`select * from database_branches where id = $1`, [id]);
    return r ? toBranch(r, this.databases.secretKey) : null;
  }

  /** A single branch as GET shows it: its divergence measured now while active. */
  async measured(b: BranchRecord): Promise<BranchRecord> {
    if (b.status !== "active") return b;
    const bytes = await this.measure(b).catch((e) => {
      this.log.error(`branch ${b.id}: measuring its divergence failed`, e);
      return null;
    });
    return bytes === null ? b : { ...b, storage_bytes: bytes };
  }

  /** The branch's divergence from its parent, measured now and recorded. */
  private async measure(b: BranchRecord): Promise<number | null> {
    const [fp] = await this.store.query<{ fingerprint: string }>(`select fingerprint from database_branch_fingerprints where branch_id = $1`, [b.id]);
    if (!fp) return null;
    const bytes = await this.engine.divergenceBytes(b.id, fp.fingerprint);
    await this.store.query(`update database_branches set storage_bytes = $2, storage_sampled_at = $3 where id = $1 and status = 'active'`, [
      b.id,
      bytes,
      this.clock.now().toISOString(),
    ]);
    return bytes;
  }

  /** `branches` of the database's stats: every branch that holds data, divergence measured now, most expensive first. */
  async statsOf(d: DatabaseRecord): Promise<{ id: string; name: string; storage_bytes: number }[]> {
    const out = [];
    for (const b of await this.list(d)) {
      if (b.status === "deleting") continue;
      const m = await this.measured(b);
      out.push({ id: m.id, name: m.name, storage_bytes: m.storage_bytes ?? 0 });
    }
    return out.sort((a, b) => b.storage_bytes - a.storage_bytes || a.name.localeCompare(b.name));
  }

  /** Sum of the recorded divergence of a database's branches (the list's `storage_bytes`). */
  async divergenceTotal(databaseId: string): Promise<number> {
    const [r] = await this.store.query<{ n: number }>(
      `select coalesce(sum(storage_bytes), 0)::float8 as n from database_branches where database_id = $1 and status = 'active'`,
      [databaseId],
    );
    return Number(r?.n ?? 0);
  }

  /** Background pass: each active branch's divergence recorded. */
  async sample(): Promise<void> {
    const rows = await this.store.query(`select * from database_branches where status = 'active'`);
    for (const r of rows) await this.measure(toBranch(r, this.databases.secretKey)).catch(() => null);
  }

  // ---- writes -------------------------------------------------------------------------------------

  async create(d: DatabaseRecord, plan: PlanName, input: { name: string; ttl_seconds?: number }): Promise<BranchRecord> {
    if (!BRANCH_NAME.test(input.name)) throw badRequest("invalid branch name: use 1 to 64 lowercase letters, digits and underscores");
    const ttl = input.ttl_seconds ?? BRANCH_TTL.default;
    const unavailable = await this.engine.copiesUnavailable();
    if (unavailable) throw new HttpError(503, { error: `branching is unavailable: ${unavailable}` });
    const { maxBranchesPerDatabase: limit, label } = planOf(plan);
    const now = this.clock.now();
    let row: BranchRecord;
    try {
      row = await this.store.transaction(async (tx) => {
        const [db] = await tx.query(`select status from databases where id = $1 for update`, [d.id]);
        if (!db || db.status === "deleted") throw notFound("database not found");
        if (db.status !== "active") throw conflict(`the database cannot be branched now: it is ${db.status}`);
        const [taken] = await tx.query(`select 1 from database_branches where database_id = $1 and name = $2 and ${LIVE}`, [d.id, input.name]);
        if (taken) throw conflict(`a branch named '${input.name}' already exists in this database`);
        const [{ n }] = (await tx.query(`select count(*)::int as n from database_branches where database_id = $1 and ${LIVE}`, [d.id])) as [{ n: number }];
        if (n >= limit) throw forbidden(`branch limit reached: the ${label} plan allows ${limit} branches per database, in every state`);
        const [r] = await tx.query(
          `insert into database_branches (id, database_id, project_id, name, status, client_password, ttl_seconds, expires_at, storage_bytes, created_at, updated_at)
           values ($1, $2, $3, $4, 'provisioning', $5, $6, $7, 0, $8, $8) returning *`,
          [newId(), d.id, d.project_id, input.name, this.databases.secretKey.encrypt(newPassword()), ttl, new Date(now.getTime() + ttl * 1000).toISOString(), now.toISOString()],
        );
        return toBranch(r!, this.databases.secretKey);
      });
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a branch named '${input.name}' already exists in this database`);
      throw err;
    }
    this.build(row);
    this.onExpiryChange();
    return row;
  }

  /** PATCH: a new lifetime, counted from now, and kept for later resets. */
  async extend(d: DatabaseRecord, name: string, ttl: number): Promise<BranchRecord> {
    const b = await this.get(d, name);
    const now = this.clock.now();
    const [r] = await this.store.query(
      `update database_branches set ttl_seconds = $2, expires_at = $3, updated_at = $4 where id = $1 and ${EXPIRING} returning *`,
      [b.id, ttl, new Date(now.getTime() + ttl * 1000).toISOString(), now.toISOString()],
    );
    if (!r) throw conflict(`the branch is ${b.status}`);
    this.onExpiryChange();
    return toBranch(r, this.databases.secretKey);
  }

  /** Discards the branch's writes: re-forked from the parent as it is now; same name, credentials and lifetime. */
  async reset(d: DatabaseRecord, name: string): Promise<BranchRecord> {
    const b = await this.get(d, name);
    const unavailable = await this.engine.copiesUnavailable();
    if (unavailable) throw new HttpError(503, { error: `branching is unavailable: ${unavailable}` });
    const now = this.clock.now();
    const r = await this.store.transaction(async (tx) => {
      const [db] = await tx.query(`select status from databases where id = $1 for update`, [d.id]);
      if (db?.status === "restoring") throw conflict("the parent database is being restored");
      if (db?.status !== "active") throw conflict(`the parent database is ${db?.status ?? "gone"}`);
      const [cur] = await tx.query(`select status from database_branches where id = $1 for update`, [b.id]);
      if (cur?.status === "provisioning") throw conflict("the branch is being built or reset already");
      if (cur?.status !== "active") throw conflict(`the branch is ${cur?.status ?? "gone"}; only an active branch can be reset`);
      const [u] = await tx.query(
        `update database_branches set status = 'provisioning', generation = generation + 1, storage_bytes = 0, expires_at = $2, updated_at = $3
          where id = $1 returning *`,
        [b.id, new Date(now.getTime() + b.ttl_seconds * 1000).toISOString(), now.toISOString()],
      );
      return toBranch(u!, this.databases.secretKey);
    });
    this.forget(b.id);
    // It serves no connections until it is active again.
    await this.engine.disconnect(b.id, "the branch is being reset");
    this.build(r);
    this.onExpiryChange();
    return r;
  }

  async resetPassword(d: DatabaseRecord, name: string) {
    const b = await this.get(d, name);
    if (b.status !== "active") throw conflict(`the branch is ${b.status}`);
    const password = newPassword();
    const [r] = await this.store.query(`update database_branches set client_password = $2, updated_at = $3 where id = $1 and status = 'active' returning *`, [
      b.id,
      this.databases.secretKey.encrypt(password),
      this.clock.now().toISOString(),
    ]);
    if (!r) throw conflict("the branch is no longer active");
    this.forget(b.id);
    const updated = toBranch(r, this.databases.secretKey);
    return {
      message: "branch password reset: new connections must use the new password; open connections continue; the parent's credentials are unchanged",
      role_name: roleName(b.id),
      new_password: password,
      connection_string: this.connectionString(updated, d),
    };
  }

  /** 202: its connections end now, its data goes in the background. Repeatable until it is gone. */
  async delete(d: DatabaseRecord, name: string): Promise<BranchRecord> {
    const b = await this.get(d, name);
    return this.startTeardown(b);
  }

  private async startTeardown(b: BranchRecord): Promise<BranchRecord> {
    const [r] = await this.store.query(
      `update database_branches set status = 'deleting', updated_at = $2 where id = $1 and ${LIVE} returning *`,
      [b.id, this.clock.now().toISOString()],
    );
    this.forget(b.id);
    if (!r) return b;
    await this.engine.disconnect(b.id, "the branch was deleted");
    if (b.status !== "deleting" || !this.jobs.has(b.id)) this.enqueue(b.id, () => this.teardown(b.id));
    return toBranch(r, this.databases.secretKey);
  }

  /** Every branch of a database, removed now (the database is being deleted). */
  async removeForDatabase(databaseId: string): Promise<void> {
    const rows = await this.store.query(`select id from database_branches where database_id = $1 and ${LIVE}`, [databaseId]);
    for (const r of rows) {
      await this.store.query(`update database_branches set status = 'deleting', updated_at = $2 where id = $1`, [r.id, this.clock.now().toISOString()]);
      this.forget(r.id);
      await this.enqueue(r.id, () => this.teardown(r.id));
    }
  }

  // ---- background jobs ----------------------------------------------------------------------------

  private enqueue(id: string, job: () => Promise<void>): Promise<void> {
    const prev = this.jobs.get(id) ?? Promise.resolve();
    const run = prev.then(job).catch((e) => this.log.error(`branch ${id}: background job failed`, e));
    this.jobs.set(id, run);
    this.inFlight.add(run);
    void run.finally(() => {
      this.inFlight.delete(run);
      if (this.jobs.get(id) === run) this.jobs.delete(id);
    });
    return run;
  }

  /** Forks the parent into the branch; `active` on success, `failed` with the reason otherwise. */
  private build(b: BranchRecord): void {
    void this.enqueue(b.id, async () => {
      // Tests hold a build until the platform clock moves a minute on (KILN_FAULTS=branch-build-delay:N),
      // or Kiln stops.
      if (this.fault("branch-build-delay")) await Promise.race([this.clock.sleep(60_000), this.stopping.promise]);
      // Kiln is stopping: no new copy starts (the branch stays provisioning; `resume` builds it at the next start).
      if (this.draining) return;
      const still = async () => {
        const [cur] = await this.store.query(`select status, generation from database_branches where id = $1`, [b.id]);
        return cur?.status === "provisioning" && cur.generation === b.generation;
      };
      if (!(await still())) return;
      try {
        if (this.fault("branch-build-fail")) throw new Error("injected fault: branch-build-fail");
        const fingerprint = await this.engine.fork(b.database_id, b.id);
        await this.store.transaction(async (tx) => {
          await tx.query(
            `insert into database_branch_fingerprints (branch_id, fingerprint) values ($1, $2)
             on conflict (branch_id) do update set fingerprint = excluded.fingerprint`,
            [b.id, fingerprint],
          );
          await tx.query(
            `update database_branches set status = 'active', storage_bytes = 0, failure = null, updated_at = $3
              where id = $1 and status = 'provisioning' and generation = $2`,
            [b.id, b.generation, this.clock.now().toISOString()],
          );
        });
      } catch (err) {
        this.log.error(`branch ${b.id}: building it failed`, err);
        const reason = err instanceof EngineUnavailable ? err.message : String((err as Error).message);
        await this.store.query(
          `update database_branches set status = 'failed', failure = $3, updated_at = $4 where id = $1 and status = 'provisioning' and generation = $2`,
          [b.id, b.generation, reason.slice(0, 2000), this.clock.now().toISOString()],
        );
      }
    });
  }

  private async teardown(id: string): Promise<void> {
    const [cur] = await this.store.query(`select status from database_branches where id = $1`, [id]);
    if (cur?.status !== "deleting") return;
    await this.engine.drop(id);
    await this.store.query(`delete from database_branch_fingerprints where branch_id = $1`, [id]);
    await this.store.query(`delete from database_query_stats where database_id = $1`, [id]);
    await this.store.query(`delete from database_usage where database_id = $1`, [id]);
    await this.store.query(`update database_branches set status = 'deleted', updated_at = $2 where id = $1 and status = 'deleting'`, [
      id,
      this.clock.now().toISOString(),
    ]);
  }

  /** Builds and teardowns a stop interrupted start again. */
  async resume(): Promise<void> {
    for (const r of await this.store.query(`select * from database_branches where status = 'provisioning'`)) this.build(toBranch(r, this.databases.secretKey));
    for (const r of await this.store.query(`select id from database_branches where status = 'deleting'`)) void this.enqueue(r.id, () => this.teardown(r.id));
  }

  private readonly stopping = Promise.withResolvers<void>();
  private draining = false;

  /** Waits for the branch copies under way (a snapshot restore in place, which does not stop Kiln). */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.inFlight]);
  }

  async drain(): Promise<void> {
    this.draining = true;
    this.stopping.resolve();
    await Promise.allSettled([...this.inFlight]);
  }

  /** Branch lifetimes on the platform clock: an expired branch is deleted like a DELETE would. */
  readonly expiry: DueWork = {
    label: "branch expiry",
    nextDue: async () => {
      const [r] = await this.store.query<{ at: Date | string | null }>(`select min(expires_at) as at from database_branches where ${EXPIRING}`);
      return r?.at ? new Date(r.at).getTime() : null;
    },
    run: async (nowMs) => {
      const due = await this.store.query(`select * from database_branches where ${EXPIRING} and expires_at <= $1 order by expires_at limit 100`, [
        new Date(nowMs).toISOString(),
      ]);
      const teardowns: Promise<void>[] = [];
      for (const r of due) {
        // Claimed by the state change: of several instances, one moves it to deleting.
        const [claimed] = await this.store.query(
          `update database_branches set status = 'deleting', updated_at = $2 where id = $1 and ${EXPIRING} and expires_at <= $2 returning id`,
          [r.id, new Date(nowMs).toISOString()],
        );
        if (!claimed) continue;
        this.forget(r.id);
        await this.engine.disconnect(r.id, "the branch expired");
        teardowns.push(this.enqueue(r.id, () => this.teardown(r.id)));
      }
      await Promise.all(teardowns);
    },
  };

  // ---- the query API twin -------------------------------------------------------------------------

  private forget(id: string): void {
    this.activeCache.deleteWhere((x) => x.branch.id === id);
  }

  /** The active branch of a project's database, by names; a missing one reads as a missing database. */
  async activeByName(projectId: string, databaseName: string, branchName: string): Promise<{ branch: BranchRecord; database: DatabaseRecord }> {
    const key = `${projectId}/${databaseName}/${branchName}`;
    const hit = this.activeCache.get(key);
    if (hit) return hit;
    const database = await this.databases.get(projectId, databaseName);
    const branch = await this.get(database, branchName).catch((err) => {
      if (err instanceof HttpError && err.status === 404) throw notFound("database not found");
      throw err;
    });
    if (branch.status !== "active") throw conflict(`the branch is ${branch.status}`);
    const v = { branch, database };
    this.activeCache.set(key, v);
    return v;
  }

  async query(projectId: string, databaseName: string, branchName: string, mode: AccessMode, operation: QueryOperation, body: unknown, started: () => void) {
    const { branch } = await this.activeByName(projectId, databaseName, branchName);
    return this.databases.queryOn(branch.id, mode, operation, body, started);
  }
}
