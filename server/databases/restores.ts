import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { plan as planOf } from "../accounts/plans";
import type { Clock } from "../clock";
import type { PlanName } from "../config";
import { badRequest, conflict, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import type { ControlStore, Row } from "../store/store";
import { RestoreNotStarted, type DatabaseEngine } from "../backends/databases/engine";
import type { BackupRecord, BackupsService } from "./backups";
import type { ClockJournal } from "./clock-journal";
import type { DatabaseRecord } from "./service";
import type { DueWork } from "./timers";

/** Restore records kept per database (the newest). */
export const RESTORE_HISTORY = 50;
/** Attempts before a restore is `exhausted`. */
export const RESTORE_ATTEMPTS = 3;
/** Wait before the next attempt after a failed one (platform clock). */
export const RESTORE_RETRY_MS = 10_000;

export type RestoreStatus = "pending" | "running" | "completed" | "failed" | "exhausted";

export interface RestoreRecord {
  id: string;
  database_id: string;
  project_id: string;
  kind: "snapshot" | "point_in_time";
  status: RestoreStatus;
  backup_id: string | null;
  backup_name: string | null;
  restore_to: string | null;
  attempts: number;
  /** How long the pre-restore state this restore keeps is held (the plan's, when it was asked for). */
  keep_seconds: number;
  error: string | null;
  completed_at: string | null;
  created_at: string;
  updated_at: string;
}

function toRestore(r: Row): RestoreRecord {
  return {
    id: r.id,
    database_id: r.database_id,
    project_id: r.project_id,
    kind: r.kind,
    status: r.status,
    backup_id: r.backup_id ?? null,
    backup_name: r.backup_name ?? null,
    restore_to: r.restore_to ? new Date(r.restore_to).toISOString() : null,
    attempts: r.attempts,
    keep_seconds: r.keep_seconds ?? 0,
    error: r.error ?? null,
    completed_at: r.completed_at ? new Date(r.completed_at).toISOString() : null,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

/**
 * In-place restores: the database becomes `restoring` (no connections, most operations 409), and
 * an attempt on the platform clock replaces its data with the backup's (`DatabaseEngine.restore`).
 * State machine: pending -> running -> completed; a failed attempt with tries left goes back to
 * pending (retried after RESTORE_RETRY_MS), the last one ends `exhausted` and leaves the database
 * `failed` (its data may be replaced in part). An attempt that could not start (the backup is gone,
 * or the engine refused it before the swap) ends `failed` and leaves the database `active`, untouched.
 */
export class RestoresService {
  /** Set by the area: rearms the attempt timer after a change. */
  onChange: () => void = () => {};
  /** Set by the area: forget cached views of a database whose state changed. */
  onDatabaseChange: (databaseId: string) => void = () => {};

  constructor(
    private readonly store: ControlStore,
    private readonly engine: DatabaseEngine,
    private readonly clock: Clock,
    private readonly backups: BackupsService,
    private readonly log: { error: (m: string, e?: unknown) => void },
    private readonly fault: (name: string) => boolean = () => false,
    /** Platform instants to real ones, for the production engine's point in time (its WAL carries real time). */
    private readonly journal: ClockJournal | null = null,
  ) {}

  view(r: RestoreRecord) {
    return {
      id: r.id,
      database_id: r.database_id,
      project_id: r.project_id,
      kind: r.kind,
      status: r.status,
      ...(r.kind === "snapshot" ? { backup_name: r.backup_name } : { restore_to: r.restore_to }),
      completed_at: r.completed_at,
      error: r.error,
      created_at: r.created_at,
      updated_at: r.updated_at,
    };
  }

  async list(d: DatabaseRecord): Promise<RestoreRecord[]> {
    const rows = await this.store.query(`select * from database_restores where database_id = $1 order by created_at desc, id desc limit ${RESTORE_HISTORY}`, [d.id]);
    return rows.map(toRestore);
  }

  async get(d: DatabaseRecord, id: string): Promise<RestoreRecord> {
    const [r] = await this.store.query(`select * from database_restores where database_id = $1 and id = $2`, [d.id, id]);
    if (!r) throw notFound("restore not found");
    return toRestore(r);
  }

  /**
   * The backups a point-in-time restore of the database can start from now: ready, taken since its
   * last completed restore (a restore starts a new history: older WAL no longer leads to the present),
   * with the WAL since their start still kept. Oldest first.
   */
  private async bases(d: Pick<DatabaseRecord, "id">): Promise<{ backup: BackupRecord; endMs: number; startLsn: number }[]> {
    const pit = this.engine.pointInTime;
    if (!pit) return [];
    const [last] = await this.store.query<{ at: Date | string | null }>(
      `select max(completed_at) as at from database_restores where database_id = $1 and status = 'completed'`,
      [d.id],
    );
    const since = last?.at ? new Date(last.at).getTime() : -Infinity;
    const walStart = pit.walStart(d.id);
    const out = [];
    for (const b of await this.backups.list(d)) {
      if (b.restore_id || new Date(b.created_at).getTime() <= since) continue;
      const base = pit.baseOf(this.backups.pathOf(b));
      if (!base || walStart === null || base.startLsn < walStart) continue;
      out.push({ backup: b, endMs: base.endMs, startLsn: base.startLsn });
    }
    return out.sort((a, b) => a.endMs - b.endMs);
  }

  /**
   * The instants `restore_to` may name now (epoch ms, platform clock), or null. Embedded: from the end
   * of the oldest usable backup to now. Production: from the end of the oldest kept base backup of the
   * server (or the database's creation, if later) to the last instant the WAL archive was known
   * complete, both mapped from real time to the platform clock.
   */
  async window(d: DatabaseRecord): Promise<{ earliest: number; latest: number } | null> {
    if (this.engine.pointInTime) {
      const bases = await this.bases(d);
      if (bases.length === 0) return null;
      return { earliest: Math.ceil(bases[0]!.endMs), latest: this.clock.nowMs() };
    }
    const server = this.engine.serverPointInTime;
    const range = server?.range();
    if (!range || !this.journal) return null;
    const earliest = Math.max(Math.ceil(this.journal.platformAt(range.earliestMs)), new Date(d.created_at).getTime());
    const latest = Math.min(Math.floor(this.journal.platformAt(range.latestMs)), this.clock.nowMs());
    return earliest <= latest ? { earliest, latest } : null;
  }

  /**
   * Background pass: each active database's WAL older than what a point-in-time restore may need
   * (the oldest base's start) goes.
   */
  async pruneWal(): Promise<void> {
    const pit = this.engine.pointInTime;
    if (!pit) return;
    for (const { id } of await this.store.query<{ id: string }>(`select id from databases where status = 'active'`)) {
      const bases = await this.bases({ id });
      await pit.pruneWal(id, bases.length ? Math.min(...bases.map((b) => b.startLsn)) : null).catch((e) => this.log.error(`database ${id}: pruning its WAL`, e));
    }
  }

  /**
   * Rule 6: 400 both targets or neither, or an instant outside the window; 404 backup; 409 a restore
   * running, the database not active, a backup being taken, or the plan's pre-restore states all held;
   * 503 when the engine cannot restore here.
   */
  async create(d: DatabaseRecord, plan: PlanName, input: { backup_name?: string; restore_to?: string }): Promise<RestoreRecord> {
    const byBackup = input.backup_name !== undefined;
    if (byBackup === (input.restore_to !== undefined)) throw badRequest("give exactly one of backup_name or restore_to");
    const unavailable = await this.engine.copiesUnavailable();
    if (unavailable) throw new HttpError(503, { error: `restores are unavailable: ${unavailable}` });
    let base: BackupRecord | null = null;
    if (!byBackup) {
      const at = new Date(input.restore_to!).getTime();
      const server = this.engine.serverPointInTime?.status();
      if (server?.state === "unavailable") throw new HttpError(503, { error: `point-in-time restore is unavailable: ${server.reason}` });
      const window = await this.window(d);
      if (!window)
        throw badRequest(
          `restore_to is outside the restore window: there is none (${
            server?.state === "off"
              ? server.reason
              : this.engine.pointInTime
                ? "it opens with the first backup taken since the last restore"
                : "it opens once the first base backup of the server is archived"
          })`,
        );
      if (at < window.earliest || at > window.latest)
        throw badRequest(`restore_to is outside the restore window (${new Date(window.earliest).toISOString()} to ${new Date(window.latest).toISOString()})`);
      // Embedded: the latest base that ended at or before the instant.
      if (this.engine.pointInTime)
        base = (await this.bases(d))
          .filter((b) => b.endMs <= at)
          .pop()!.backup;
    }
    const { maxPreRestoreStates, preRestoreRetentionSeconds } = planOf(plan);
    const now = this.clock.now();
    const r = await this.store.transaction(async (tx) => {
      const [db] = await tx.query(`select status from databases where id = $1 for update`, [d.id]);
      if (!db || db.status === "deleted") throw notFound("database not found");
      if (db.status === "restoring") throw conflict("a restore of this database is already in progress");
      if (db.status !== "active") throw conflict(`the database is ${db.status}`);
      let b: Record<string, any> | null = null;
      if (byBackup || base) {
        [b] = base
          ? await tx.query(`select * from database_backups where id = $1 and status = 'ready'`, [base.id])
          : await tx.query(`select * from database_backups where database_id = $1 and name = $2 and status = 'ready'`, [d.id, input.backup_name]);
        if (!b) throw notFound("backup not found");
      }
      const [busy] = await tx.query(`select 1 from database_backups where database_id = $1 and status = 'creating'`, [d.id]);
      if (busy) throw conflict("another operation on this database is running: a backup is being taken");
      const held = await this.backups.preRestoreStates(d.id, tx);
      if (held.length >= maxPreRestoreStates) {
        const next = held.map((x) => x.expires_at).filter((x): x is string => !!x).sort()[0];
        throw conflict(
          `too many pre-restore states held: ${held.length} of ${maxPreRestoreStates} (each restore keeps the data it replaced as a backup: ${held.map((x) => x.name).join(", ")}); ` +
            `delete one (DELETE .../backups/<name>)${next ? ` or wait until ${next}, when the oldest expires` : ""}`,
        );
      }
      // Tests hold the first attempt until the platform clock moves a minute on (KILN_FAULTS=restore-start-delay:N).
      const firstAttempt = this.fault("restore-start-delay") ? new Date(now.getTime() + 60_000) : now;
      const [row] = await tx.query(
        `insert into database_restores (id, database_id, project_id, kind, status, backup_id, backup_name, restore_to, keep_seconds, next_attempt_at, created_at, updated_at)
         values ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $9, $10, $10) returning *`,
        [
          newId(),
          d.id,
          d.project_id,
          byBackup ? "snapshot" : "point_in_time",
          b?.id ?? null,
          byBackup ? b!.name : null,
          byBackup ? null : new Date(input.restore_to!).toISOString(),
          preRestoreRetentionSeconds,
          firstAttempt.toISOString(),
          now.toISOString(),
        ],
      );
      await tx.query(`update databases set status = 'restoring', updated_at = $2 where id = $1`, [d.id, now.toISOString()]);
      // The history keeps the newest RESTORE_HISTORY.
      await tx.query(
        `delete from database_restores where database_id = $1 and status in ('completed', 'failed', 'exhausted')
            and id not in (select id from database_restores where database_id = $1 order by created_at desc, id desc limit ${RESTORE_HISTORY})`,
        [d.id],
      );
      return toRestore(row!);
    });
    this.onDatabaseChange(d.id);
    // Restoring: not connectable.
    await this.engine.disconnect(d.id, "the database is being restored").catch((e) => this.log.error(`database ${d.id}: disconnect for restore`, e));
    this.onChange();
    return r;
  }

  /** Restores a stop interrupted: a running attempt is counted as failed and tried again. */
  async resume(): Promise<void> {
    await this.store.query(
      `update database_restores set status = 'pending', next_attempt_at = $1, error = 'interrupted: Kiln stopped during the attempt', updated_at = $1
        where status = 'running'`,
      [this.clock.now().toISOString()],
    );
  }

  readonly attempts: DueWork = {
    label: "database restores",
    nextDue: async () => {
      const [r] = await this.store.query<{ at: Date | string | null }>(`select min(next_attempt_at) as at from database_restores where status = 'pending'`);
      return r?.at ? new Date(r.at).getTime() : null;
    },
    run: async (nowMs) => {
      const due = await this.store.query(`select * from database_restores where status = 'pending' and next_attempt_at <= $1 order by next_attempt_at`, [
        new Date(nowMs).toISOString(),
      ]);
      for (const r of due) {
        const [claimed] = await this.store.query(
          `update database_restores set status = 'running', attempts = attempts + 1, updated_at = $2 where id = $1 and status = 'pending' returning *`,
          [r.id, this.clock.now().toISOString()],
        );
        if (claimed) await this.attempt(toRestore(claimed));
      }
    },
  };

  private async attempt(r: RestoreRecord): Promise<void> {
    const finish = async (restore: Record<string, unknown>, database: "active" | "failed" | null) => {
      const at = this.clock.now().toISOString();
      await this.store.transaction(async (tx) => {
        const sets = Object.keys(restore).map((k, i) => `${k} = $${i + 2}`);
        await tx.query(`update database_restores set ${sets.join(", ")}, updated_at = $${sets.length + 2} where id = $1`, [r.id, ...Object.values(restore), at]);
        if (database) await tx.query(`update databases set status = $2, updated_at = $3 where id = $1 and status = 'restoring'`, [r.database_id, database, at]);
      });
      this.onDatabaseChange(r.database_id);
      if (database) this.onChange();
    };
    try {
      const b = r.backup_id ? await this.backups.byId(r.backup_id) : null;
      const server = r.kind === "point_in_time" && !this.engine.pointInTime ? this.engine.serverPointInTime : undefined;
      if (!server && (!b || b.status !== "ready")) throw new RestoreNotStarted("the backup no longer exists");
      if (this.fault("restore-fail")) throw new Error("injected fault: restore-fail");
      // The data this restore replaces is kept (the pre-restore state), once per restore.
      const keep = await this.backups.reservePreRestore(r);
      try {
        let kept: number | null;
        if (r.kind === "snapshot") kept = await this.engine.restore(r.database_id, this.backups.pathOf(b!), keep?.path);
        else if (this.engine.pointInTime) kept = await this.engine.pointInTime.restoreTo(r.database_id, this.backups.pathOf(b!), new Date(r.restore_to!).getTime(), keep?.path);
        else if (server && this.journal) kept = await server.restoreTo(r.database_id, this.journal.realAt(new Date(r.restore_to!).getTime()), keep?.path);
        else throw new RestoreNotStarted("point-in-time restore is not available on this engine");
        if (keep) await (kept !== null ? keep.ready(kept) : keep.discard());
      } catch (err) {
        // Replaced in part: what was kept before the failure stays (a later attempt keeps nothing more).
        if (keep) await (!(err instanceof RestoreNotStarted) && existsSync(keep.path) ? keep.ready(sizeOnDisk(keep.path)) : keep.discard());
        throw err;
      }
      await finish({ status: "completed", completed_at: this.clock.now().toISOString(), next_attempt_at: null }, "active");
    } catch (err) {
      const message = String((err as Error).message ?? err).slice(0, 2000);
      if (err instanceof RestoreNotStarted) {
        // Nothing was replaced: the database is as it was, and usable again.
        await finish({ status: "failed", error: message, next_attempt_at: null }, "active");
        return;
      }
      this.log.error(`database ${r.database_id}: restore ${r.id} attempt ${r.attempts} failed`, err);
      if (r.attempts < RESTORE_ATTEMPTS) await finish({ status: "pending", error: message, next_attempt_at: new Date(this.clock.nowMs() + RESTORE_RETRY_MS).toISOString() }, null);
      else await finish({ status: "exhausted", error: message, next_attempt_at: null }, "failed");
    }
  }
}

/** Bytes a file or folder takes. */
function sizeOnDisk(path: string): number {
  const st = statSync(path);
  if (!st.isDirectory()) return st.size;
  let total = 0;
  for (const e of readdirSync(path)) total += sizeOnDisk(join(path, e));
  return total;
}
