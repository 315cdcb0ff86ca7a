import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { plan as planOf } from "../accounts/plans";
import type { Clock } from "../clock";
import type { PlanName } from "../config";
import { badRequest, conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import type { ControlStore, Row, Sql } from "../store/store";
import { isUniqueViolation } from "../store/store";
import { EngineUnavailable, type DatabaseEngine } from "../backends/databases/engine";
import type { DatabaseRecord } from "./service";
import type { DueWork } from "./timers";

export const BACKUP_NAME = /^[a-z0-9_-]{1,63}$/;
export const RESERVED_PREFIX = "service-";
/** Names of pre-restore states: `service-pre-restore-<yyyymmdd>-<hhmmss>` (plus `-<n>` on a clash). */
export const PRE_RESTORE_PREFIX = `${RESERVED_PREFIX}pre-restore-`;
/** Shortest time between two backups of one database (pre-restore states, taken by the service, aside). */
export const BACKUP_SPACING_MS = 60_000;
/** Entries of one schedule at most. */
export const SCHEDULE_ENTRIES_MAX = 24;
// How many backups a database may hold and how long they are kept are the plan's: server/accounts/plans.ts.

/** A backup no pending or running restore reads. */
const NOT_BUSY = `not exists (select from database_restores r where r.backup_id = b.id and r.status in ('pending', 'running'))`;

export type Frequency = "daily" | "weekly" | "monthly";

export interface BackupRecord {
  id: string;
  database_id: string;
  name: string;
  source: "manual" | "scheduled";
  status: "creating" | "ready" | "deleted";
  /** Set on a pre-restore state: the restore whose replaced data it holds. */
  restore_id: string | null;
  size_bytes: number | null;
  expires_at: string | null;
  created_at: string;
}

function toBackup(r: Row): BackupRecord {
  return {
    id: r.id,
    database_id: r.database_id,
    name: r.name,
    source: r.source,
    status: r.status,
    restore_id: r.restore_id ?? null,
    size_bytes: r.size_bytes === null || r.size_bytes === undefined ? null : Number(r.size_bytes),
    expires_at: r.expires_at ? new Date(r.expires_at).toISOString() : null,
    created_at: new Date(r.created_at).toISOString(),
  };
}

export interface ScheduleEntry {
  frequency: Frequency;
  hour: number;
  day?: number;
  retention_seconds?: number;
}

/**
 * The first instant after `afterMs` at which a schedule entry runs: `hour`:00 UTC every day, on ISO
 * weekday `day` (1 Monday to 7 Sunday) every week, or on day `day` (1-28) of every month.
 */
export function nextRun(e: { frequency: Frequency; hour: number; day?: number | null }, afterMs: number): number {
  const a = new Date(afterMs);
  const y = a.getUTCFullYear();
  const m = a.getUTCMonth();
  const d = a.getUTCDate();
  if (e.frequency === "daily") {
    let c = Date.UTC(y, m, d, e.hour);
    if (c <= afterMs) c = Date.UTC(y, m, d + 1, e.hour);
    return c;
  }
  if (e.frequency === "weekly") {
    const iso = ((a.getUTCDay() + 6) % 7) + 1;
    let c = Date.UTC(y, m, d + ((e.day! - iso + 7) % 7), e.hour);
    if (c <= afterMs) c = Date.UTC(y, m, d + ((e.day! - iso + 7) % 7) + 7, e.hour);
    return c;
  }
  let c = Date.UTC(y, m, e.day!, e.hour);
  if (c <= afterMs) c = Date.UTC(y, m + 1, e.day!, e.hour);
  return c;
}

/**
 * Backups of databases (SUPERAGENT): manual ones, taken synchronously, and scheduled ones, taken on
 * the platform clock by the database's schedule and removed when their retention ends. A backup is
 * the engine's consistent copy of the database (`DatabaseEngine.backup`: a snapshot of the data dir
 * on the embedded engine, a pg_dump archive on the production one) under `<data-dir>/database-backups`.
 */
export class BackupsService {
  /** Set by the area: rearms the schedule and retention timers after a change. */
  onChange: () => void = () => {};

  constructor(
    private readonly store: ControlStore,
    private readonly engine: DatabaseEngine,
    private readonly clock: Clock,
    private readonly dir: string,
    private readonly log: { error: (m: string, e?: unknown) => void },
  ) {}

  /** HOBBY answers 403 on every backup route, reads included. */
  requirePlan(plan: PlanName): void {
    if (!planOf(plan).databaseBackups) throw forbidden(`backups and restores are not available on the ${planOf(plan).label} plan`);
  }

  /** Reads answer 409 for a database that has no storage yet (still provisioning). */
  requireStorage(d: DatabaseRecord): void {
    if (d.status === "provisioning") throw conflict("the database has no storage yet: it is still provisioning");
  }

  pathOf(b: { database_id: string; id: string }): string {
    return join(this.dir, b.database_id, b.id);
  }

  view(b: BackupRecord) {
    return {
      name: b.name,
      source: b.source,
      ...(b.size_bytes !== null ? { size_bytes: b.size_bytes } : {}),
      expires_at: b.expires_at,
      created_at: b.created_at,
    };
  }

  async list(d: Pick<DatabaseRecord, "id">): Promise<BackupRecord[]> {
    const rows = await this.store.query(`select * from database_backups where database_id = $1 and status = 'ready' order by created_at desc, id desc`, [d.id]);
    return rows.map(toBackup);
  }

  async get(d: DatabaseRecord, name: string): Promise<BackupRecord> {
    const [r] = await this.store.query(`select * from database_backups where database_id = $1 and name = $2 and status = 'ready'`, [d.id, name]);
    if (!r) throw notFound("backup not found");
    return toBackup(r);
  }

  async byId(id: string): Promise<BackupRecord | null> {
    const [r] = await this.store.query(`select * from database_backups where id = $1`, [id]);
    return r ? toBackup(r) : null;
  }

  async totalBytes(databaseId: string): Promise<number> {
    const [r] = await this.store.query<{ n: number }>(
      `select coalesce(sum(size_bytes), 0)::float8 as n from database_backups where database_id = $1 and status = 'ready'`,
      [databaseId],
    );
    return Number(r?.n ?? 0);
  }

  /** A manual backup, synchronous (rule 4). */
  async create(d: DatabaseRecord, plan: PlanName, name: string): Promise<BackupRecord> {
    if (!BACKUP_NAME.test(name)) throw badRequest("invalid backup name: use 1 to 63 lowercase letters, digits, underscores and hyphens");
    if (name.startsWith(RESERVED_PREFIX)) throw badRequest(`backup names starting with '${RESERVED_PREFIX}' are reserved for backups the service takes`);
    return this.take(d.id, name, "manual", null, planOf(plan).maxManualBackups);
  }

  /**
   * Reserves the name (and the minute) in the store, then lets the engine copy the database.
   * `retentionSeconds`: a scheduled backup's, counted from its creation; null keeps it until deleted.
   * `manualLimit`: manual backups the database may hold (rule 3: scheduled ones are not counted).
   */
  private async take(databaseId: string, name: string, source: "manual" | "scheduled", retentionSeconds: number | null, manualLimit = 0): Promise<BackupRecord> {
    const d = { id: databaseId };
    const unavailable = await this.engine.copiesUnavailable();
    if (unavailable) throw new HttpError(503, { error: `backups are unavailable: ${unavailable}` });
    const now = this.clock.now();
    let row: BackupRecord;
    try {
      row = await this.store.transaction(async (tx) => {
        const [db] = await tx.query(`select status from databases where id = $1 for update`, [d.id]);
        if (!db || db.status === "deleted") throw notFound("database not found");
        if (db.status === "restoring") throw conflict("the database is being restored");
        if (db.status !== "active") throw conflict(`the database is ${db.status}`);
        const [taken] = await tx.query(`select 1 from database_backups where database_id = $1 and name = $2 and status <> 'deleted'`, [d.id, name]);
        if (taken) throw conflict(`a backup named '${name}' already exists`);
        if (source === "manual") {
          const [last] = await tx.query<{ at: Date | string | null }>(
            `select max(created_at) as at from database_backups where database_id = $1 and restore_id is null`,
            [d.id],
          );
          if (last?.at && now.getTime() - new Date(last.at).getTime() < BACKUP_SPACING_MS)
            throw conflict("a backup of this database was taken less than a minute ago");
          const [{ n }] = (await tx.query(`select count(*)::int as n from database_backups where database_id = $1 and source = 'manual' and status <> 'deleted'`, [
            d.id,
          ])) as [{ n: number }];
          if (n >= manualLimit) throw forbidden(`backup limit reached: ${manualLimit} manual backups per database (scheduled ones are not counted)`);
        }
        const [r] = await tx.query(
          `insert into database_backups (id, database_id, name, source, status, expires_at, created_at) values ($1, $2, $3, $4, 'creating', $5, $6) returning *`,
          [newId(), d.id, name, source, retentionSeconds === null ? null : new Date(now.getTime() + retentionSeconds * 1000).toISOString(), now.toISOString()],
        );
        return toBackup(r!);
      });
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a backup named '${name}' already exists`);
      throw err;
    }
    const path = this.pathOf(row);
    try {
      mkdirSync(join(this.dir, d.id), { recursive: true });
      const size = await this.engine.backup(d.id, path);
      const [r] = await this.store.query(`update database_backups set status = 'ready', size_bytes = $2 where id = $1 and status = 'creating' returning *`, [row.id, size]);
      if (!r) {
        // The database was deleted meanwhile.
        rmSync(path, { recursive: true, force: true });
        throw notFound("database not found");
      }
      this.onChange();
      return toBackup(r);
    } catch (err) {
      await this.store.query(`delete from database_backups where id = $1 and status = 'creating'`, [row.id]).catch(() => {});
      rmSync(path, { recursive: true, force: true });
      if (err instanceof HttpError) throw err;
      this.log.error(`database ${d.id}: backup failed`, err);
      throw new HttpError(503, { error: `backups are unavailable: ${err instanceof EngineUnavailable ? err.message : "the copy failed"}` });
    }
  }

  async delete(d: DatabaseRecord, name: string): Promise<void> {
    if (d.status === "restoring") throw conflict("the database is being restored");
    const b = await this.get(d, name);
    const [r] = await this.store.query(`update database_backups set status = 'deleted' where id = $1 and status = 'ready' returning id`, [b.id]);
    if (!r) throw notFound("backup not found");
    rmSync(this.pathOf(b), { recursive: true, force: true });
  }

  /** Every backup of a database goes with it. */
  async removeForDatabase(databaseId: string): Promise<void> {
    await this.store.query(`update database_backups set status = 'deleted' where database_id = $1`, [databaseId]);
    await this.store.query(`delete from database_backup_schedule where database_id = $1`, [databaseId]);
    rmSync(join(this.dir, databaseId), { recursive: true, force: true });
  }

  // ---- pre-restore states -------------------------------------------------------------------------

  /**
   * The pre-restore states a database holds (rule 6 counts them): the data each completed restore
   * replaced, kept as a backup named `service-pre-restore-...` until its retention ends or it is
   * deleted. `tx` reads them inside a caller's transaction.
   */
  async preRestoreStates(databaseId: string, tx: Sql = this.store): Promise<BackupRecord[]> {
    const rows = await tx.query(
      `select * from database_backups where database_id = $1 and restore_id is not null and status in ('creating', 'ready') order by created_at, id`,
      [databaseId],
    );
    return rows.map(toBackup);
  }

  /**
   * Reserves the pre-restore state of a restore about to replace the database's data: where the engine
   * puts the replaced data, `ready` (its size) lists it as a backup, `discard` forgets it (nothing was
   * replaced). Null when the restore keeps one already (a retry after a failed attempt: what that
   * attempt replaced was kept the first time).
   */
  async reservePreRestore(r: { id: string; database_id: string; keep_seconds: number }): Promise<{
    path: string;
    ready: (sizeBytes: number) => Promise<void>;
    discard: () => Promise<void>;
  } | null> {
    const [held] = await this.store.query(`select 1 from database_backups where restore_id = $1 and status = 'ready'`, [r.id]);
    if (held) return null;
    // What an attempt Kiln stopped in the middle of left behind.
    for (const stale of await this.store.query(`delete from database_backups where restore_id = $1 and status = 'creating' returning *`, [r.id]))
      rmSync(this.pathOf(toBackup(stale)), { recursive: true, force: true });
    const now = this.clock.now();
    const stamp = now.toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15);
    let name = `${PRE_RESTORE_PREFIX}${stamp}`;
    const [clash] = await this.store.query(`select 1 from database_backups where database_id = $1 and name = $2 and status <> 'deleted'`, [r.database_id, name]);
    if (clash) name = `${name}-${r.id.slice(-8).toLowerCase()}`;
    const [row] = await this.store.query(
      `insert into database_backups (id, database_id, name, source, status, restore_id, created_at) values ($1, $2, $3, 'scheduled', 'creating', $4, $5) returning *`,
      [newId(), r.database_id, name, r.id, now.toISOString()],
    );
    const b = toBackup(row!);
    const path = this.pathOf(b);
    mkdirSync(join(this.dir, b.database_id), { recursive: true });
    rmSync(path, { recursive: true, force: true });
    return {
      path,
      ready: async (sizeBytes) => {
        const at = this.clock.now();
        await this.store.query(`update database_backups set status = 'ready', size_bytes = $2, created_at = $3, expires_at = $4 where id = $1 and status = 'creating'`, [
          b.id,
          sizeBytes,
          at.toISOString(),
          new Date(at.getTime() + r.keep_seconds * 1000).toISOString(),
        ]);
        this.onChange();
      },
      discard: async () => {
        await this.store.query(`delete from database_backups where id = $1 and status = 'creating'`, [b.id]);
        rmSync(path, { recursive: true, force: true });
      },
    };
  }

  // ---- the schedule -------------------------------------------------------------------------------

  async schedule(d: DatabaseRecord) {
    const rows = await this.store.query(`select * from database_backup_schedule where database_id = $1 order by position`, [d.id]);
    return rows.map((r) => ({
      frequency: r.frequency as Frequency,
      hour: r.hour as number,
      ...(r.day !== null && r.day !== undefined ? { day: r.day as number } : {}),
      retention_seconds: r.retention_seconds as number,
      next_run_at: new Date(r.next_run_at).toISOString(),
    }));
  }

  /** Replaces the schedule wholesale; retention defaults to the plan's and is clamped to it (rule 5). */
  async replaceSchedule(d: DatabaseRecord, plan: PlanName, entries: ScheduleEntry[]) {
    const max = planOf(plan).backupRetentionSeconds;
    const now = this.clock.nowMs();
    await this.store.transaction(async (tx) => {
      const [db] = await tx.query(`select status from databases where id = $1 for update`, [d.id]);
      if (db?.status !== "active") throw conflict(`the database is ${db?.status === "restoring" ? "being restored" : (db?.status ?? "gone")}`);
      await tx.query(`delete from database_backup_schedule where database_id = $1`, [d.id]);
      for (const [i, e] of entries.entries()) {
        const day = e.frequency === "daily" ? null : e.day!;
        await tx.query(
          `insert into database_backup_schedule (database_id, position, frequency, hour, day, retention_seconds, next_run_at) values ($1, $2, $3, $4, $5, $6, $7)`,
          [d.id, i, e.frequency, e.hour, day, Math.min(e.retention_seconds ?? max, max), new Date(nextRun({ ...e, day }, now)).toISOString()],
        );
      }
    });
    this.onChange();
    return this.schedule(d);
  }

  /** Scheduled backups on the platform clock; each due entry claimed by a compare-and-set on its next run. */
  readonly scheduled: DueWork = {
    label: "scheduled database backups",
    nextDue: async () => {
      const [r] = await this.store.query<{ at: Date | string | null }>(`select min(next_run_at) as at from database_backup_schedule`);
      return r?.at ? new Date(r.at).getTime() : null;
    },
    run: async (nowMs) => {
      const now = new Date(nowMs);
      const due = await this.store.query(
        `select s.*, d.status as database_status from database_backup_schedule s join databases d on d.id = s.database_id
          where s.next_run_at <= $1 order by s.next_run_at limit 100`,
        [now.toISOString()],
      );
      for (const e of due) {
        // Missed occurrences (Kiln was not running) become one backup, never a burst.
        const next = nextRun({ frequency: e.frequency, hour: e.hour, day: e.day }, nowMs);
        const [claimed] = await this.store.query(
          `update database_backup_schedule set next_run_at = $3 where database_id = $1 and position = $2 and next_run_at = $4 returning database_id`,
          [e.database_id, e.position, new Date(next).toISOString(), new Date(e.next_run_at).toISOString()],
        );
        if (!claimed || e.database_status !== "active") continue;
        const at = new Date(e.next_run_at);
        const stamp = `${at.toISOString().slice(0, 10).replaceAll("-", "")}-${String(at.getUTCHours()).padStart(2, "0")}00`;
        let name = `${RESERVED_PREFIX}${e.frequency}-${stamp}`;
        const [clash] = await this.store.query(`select 1 from database_backups where database_id = $1 and name = $2 and status <> 'deleted'`, [e.database_id, name]);
        if (clash) name = `${name}-${e.position}`;
        try {
          await this.take(e.database_id, name, "scheduled", e.retention_seconds);
        } catch (err) {
          this.log.error(`database ${e.database_id}: scheduled backup ${name} failed`, err);
        }
      }
    },
  };

  /** Scheduled backups whose retention ended are removed. */
  readonly retention: DueWork = {
    label: "database backup retention",
    nextDue: async () => {
      // A backup a pending or running restore reads stays until that restore ends (then this is rearmed).
      const [r] = await this.store.query<{ at: Date | string | null }>(
        `select min(expires_at) as at from database_backups b where status = 'ready' and ${NOT_BUSY}`,
      );
      return r?.at ? new Date(r.at).getTime() : null;
    },
    run: async (nowMs) => {
      const due = await this.store.query(`select * from database_backups b where status = 'ready' and expires_at <= $1 and ${NOT_BUSY} limit 500`, [
        new Date(nowMs).toISOString(),
      ]);
      for (const r of due) {
        const [claimed] = await this.store.query(`update database_backups set status = 'deleted' where id = $1 and status = 'ready' returning id`, [r.id]);
        if (claimed) rmSync(this.pathOf(toBackup(r)), { recursive: true, force: true });
      }
    },
  };
}
