import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { createFromTemplate, fingerprintOf, type TemplateSpec } from "../../store/template";
import {
  DATABASE_SETUP_SQL,
  PRIVILEGES_UPGRADE_SQL,
  sessionInitSql,
  transactionInitSql,
  RestoreNotStarted,
  dumpArgs,
  portablePlainDump,
  type AccessMode,
  type DatabaseEngine,
  type DumpFormat,
  type PointInTime,
  type QueryResult,
} from "./engine";
import { refreshFingerprint } from "./page-hash";
import { coldCopy, divergenceOfDir, fingerprintDir, hotCopy, SNAPSHOT_INFO, trace, type SnapshotInfo } from "./snapshot";
import { listSegments, parseLsn, readCommits, segmentNumber, truncateWal } from "./wal";
import type { WireBackend, WireClient, WireControl } from "./wire/listener";
import { PgliteThread } from "./pglite-thread";
import { EXTENSION_CONF } from "./extension-mount";
import { extensionFiles } from "./extensions";
import { runOverProtocol } from "./protocol-query";
import { PgliteSessionMux } from "./wire/pglite-mux";

const DATABASE_TEMPLATE_DROPS = ["template0", "template1"];
/** Every user database starts as a copy of this: roles, grants and auth.* helpers already in place. */
export const DATABASE_TEMPLATE: TemplateSpec = {
  kind: "database",
  fingerprint: fingerprintOf([...DATABASE_SETUP_SQL, `drop ${DATABASE_TEMPLATE_DROPS.join(",")}`]),
  prepare: async (store) => {
    for (const stmt of DATABASE_SETUP_SQL) await store.query(stmt);
  },
  // Only the database clients reach stays: template1 was half of every copy (create, backup, branch,
  // restore), and a database made from it by `create database` could never be connected to through
  // Kiln's listener (a connection string names one database), so refusing it is the honest answer.
  drop: DATABASE_TEMPLATE_DROPS,
};

/** The PGlite major version (its initdb writes PG_VERSION). */
const PGLITE_PG_MAJOR = 18;

interface OpenInstance {
  db: PgliteThread;
  mux: PgliteSessionMux;
  lastUsed: number;
  /** Snapshots being taken of it: it is not closed for idleness meanwhile. */
  pins: number;
}

/**
 * A fork is not opened when it is built: its first open replays the WAL the copy carries (see fork).
 * Until then FORK_PENDING is in its folder; FORK_FINGERPRINT is its page fingerprint, brought up to
 * date at that first open. Neither is copied into snapshots (snapshot.ts SKIP_TOP).
 */
export const FORK_PENDING = "kiln-fork-pending";
export const FORK_FINGERPRINT = "kiln-fork-fingerprint.json";

/** Attempts at a snapshot before giving up (a client's CHECKPOINT or a session restart mid-copy spoils one). */
const SNAPSHOT_ATTEMPTS = 3;

export interface EmbeddedOptions {
  dir: string;
  /** At most this many PGlite instances open at once; the least recently used idle one closes first. */
  maxOpen: number;
  /**
   * Memory the open instances may add to the process (MB, measured as RSS growth since the engine
   * started); before opening another, idle instances close, least recently used first, until it fits.
   */
  memoryBudgetMb: number;
  /** An instance without clients closes after this long idle. */
  idleCloseMs: number;
  /** A wire client idle inside a transaction this long is ended (unless it set its own timeout); 0: never. */
  idleInTransactionTimeoutMs: number;
  /** The platform clock's offset from real time: the databases' own clock follows it (point-in-time restore needs it). */
  clockOffset?: () => number;
  /** WAL since the last checkpoint past which a snapshot takes a checkpoint first (snapshot.ts; default 64 MB). */
  snapshotReplayLimitBytes?: number;
}

/**
 * Embedded engine: one PGlite instance per database under `<data-dir>/databases/<id>`, each on its
 * own thread (a long statement holds up only its database), opened on first use and closed when
 * idle, so a hundred databases do not hold a hundred instances.
 */
export class EmbeddedEngine implements DatabaseEngine {
  readonly kind = "embedded" as const;
  private readonly open = new Map<string, OpenInstance>();
  private readonly opening = new Map<string, Promise<OpenInstance>>();
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(private readonly o: EmbeddedOptions) {
    mkdirSync(o.dir, { recursive: true });
    this.timer = setInterval(() => void this.closeIdle(), Math.min(o.idleCloseMs, 10_000));
    this.timer.unref?.();
    // The extension bundles are unpacked once per machine (postinstall does it): if they are not yet,
    // now, so that the first open does not wait for it.
    extensionFiles().catch(() => {});
  }

  serverVersions(): number[] {
    return [PGLITE_PG_MAJOR];
  }

  private dirOf(id: string): string {
    return join(this.o.dir, id);
  }

  async create(id: string): Promise<void> {
    if (!existsSync(join(this.dirOf(id), "PG_VERSION"))) await createFromTemplate(DATABASE_TEMPLATE, this.dirOf(id));
  }

  async drop(id: string): Promise<void> {
    const inst = this.open.get(id) ?? (await this.opening.get(id)?.catch(() => undefined));
    if (inst) {
      this.open.delete(id);
      await inst.mux.closeAll("the database was deleted");
      await inst.db.close().catch(() => {});
    }
    rmSync(this.dirOf(id), { recursive: true, force: true });
  }

  private async instance(id: string): Promise<OpenInstance> {
    const hit = this.open.get(id);
    if (hit) {
      hit.lastUsed = Date.now();
      return hit;
    }
    let pending = this.opening.get(id);
    if (!pending) {
      pending = (async () => {
        if (!existsSync(join(this.dirOf(id), "PG_VERSION"))) throw new Error(`database ${id} has no data directory`);
        await this.makeRoom();
        const db = await PgliteThread.open(this.dirOf(id), DATABASE_CONF, this.o.clockOffset ?? (() => 0), { extensions: await extensionFiles() });
        // A database made by an older Kiln is brought to the current privileges model before anyone
        // uses it (a no-op check once done); if that fails, the database stays closed.
        try {
          await runOverProtocol(db, [], PRIVILEGES_UPGRADE_SQL, []);
        } catch (err) {
          await db.close().catch(() => {});
          // Not the caller's SQL error: a failure to reach the database (500 on the query API).
          throw new Error(`database ${id}: privileges upgrade failed: ${(err as Error).message}`);
        }
        try {
          await this.finishFork(id, db);
        } catch (err) {
          await db.close().catch(() => {});
          throw new Error(`branch ${id}: finishing its first open failed: ${(err as Error).message}`);
        }
        const inst = { db, mux: new PgliteSessionMux(db, { idleInTransactionTimeoutMs: this.o.idleInTransactionTimeoutMs }), lastUsed: Date.now(), pins: 0 };
        this.open.set(id, inst);
        return inst;
      })().finally(() => this.opening.delete(id));
      this.opening.set(id, pending);
    }
    return pending;
  }

  private readonly baselineRss = process.memoryUsage().rss;

  private overBudget(): boolean {
    return (process.memoryUsage().rss - this.baselineRss) / 1_048_576 > this.o.memoryBudgetMb;
  }

  /** Closes least recently used instances that have no clients until there is room for one more. */
  private async makeRoom(): Promise<void> {
    while (this.open.size >= this.o.maxOpen || (this.open.size > 0 && this.overBudget())) {
      const idle = [...this.open.entries()].filter(([, i]) => i.mux.stats().clients === 0 && i.pins === 0).sort((a, b) => a[1].lastUsed - b[1].lastUsed);
      if (idle.length === 0) return; // every instance has clients: go over the limit rather than cut anyone off
      await this.closeInstance(idle[0]![0]);
    }
  }

  private async closeInstance(id: string, reason = "the database instance is being closed"): Promise<void> {
    const inst = this.open.get(id) ?? (await this.opening.get(id)?.catch(() => undefined));
    if (!inst) return;
    if (this.open.get(id) === inst) this.open.delete(id);
    await inst.mux.closeAll(reason);
    await inst.db.close().catch(() => {});
  }

  private async closeIdle(): Promise<void> {
    const cutoff = Date.now() - this.o.idleCloseMs;
    for (const [id, inst] of this.open) {
      const s = inst.mux.stats();
      if (s.clients === 0 && inst.pins === 0 && Math.max(inst.lastUsed, s.lastActivityMs) < cutoff) await this.closeInstance(id);
    }
  }

  async run(id: string, mode: AccessMode, text: string, params: unknown[]): Promise<QueryResult> {
    const inst = await this.instance(id);
    try {
      return await inst.mux.exclusive((db) => runOverProtocol(db, transactionInitSql(mode), text, params));
    } finally {
      inst.lastUsed = Date.now();
    }
  }

  async openWire(id: string, mode: AccessMode, client: WireClient, control: WireControl): Promise<WireBackend> {
    const inst = await this.instance(id);
    return inst.mux.open(sessionInitSql(mode), client, control);
  }

  async sizeBytes(id: string): Promise<number> {
    return dirSize(this.dirOf(id));
  }

  /** Snapshots of one database, one at a time (its single session holds one backup at a time). */
  private readonly snapshotting = new Map<string, Promise<unknown>>();

  /**
   * A consistent copy of the live database `id` in `to` (see snapshot.ts: PostgreSQL's online backup
   * on the database's session; the database keeps serving while its files are copied).
   */
  private async snapshot(id: string, to: string): Promise<void> {
    const prev = this.snapshotting.get(id) ?? Promise.resolve();
    const run = prev.catch(() => {}).then(async () => {
      for (let attempt = 1; ; attempt++) {
        const inst = await this.instance(id);
        inst.pins++;
        try {
          return await hotCopy((fn) => inst.mux.exclusive(fn), this.dirOf(id), to, this.o.snapshotReplayLimitBytes);
        } catch (err) {
          if (attempt >= SNAPSHOT_ATTEMPTS) throw err;
        } finally {
          inst.pins--;
          inst.lastUsed = Date.now();
        }
      }
    });
    this.snapshotting.set(id, run);
    try {
      await run;
    } finally {
      if (this.snapshotting.get(id) === run) this.snapshotting.delete(id);
    }
  }

  async copiesUnavailable(): Promise<string | null> {
    return null;
  }

  async fork(parentId: string, childId: string): Promise<string> {
    const target = this.dirOf(childId);
    const tmp = `${target}.fork-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    await this.snapshot(parentId, tmp);
    // The branch is active once its copy is complete and fingerprinted; it is not opened here. Its first
    // open (at first use, like any database closed for idleness) replays the WAL the copy carries, and
    // finishFork then re-hashes the pages that replay rewrote, before any client gets the instance.
    const t0 = performance.now();
    const fp = await fingerprintDir(tmp);
    trace("fork: fingerprint", t0);
    writeFileSync(join(tmp, FORK_FINGERPRINT), fp);
    writeFileSync(join(tmp, FORK_PENDING), "");
    await this.closeInstance(childId, "the branch is being reset");
    rmSync(target, { recursive: true, force: true });
    renameSync(tmp, target);
    return fp;
  }

  /** At a fork's first open, after the WAL replay: a checkpoint, then the fingerprint brought up to date. */
  private async finishFork(id: string, db: PgliteThread): Promise<void> {
    const dir = this.dirOf(id);
    if (!existsSync(join(dir, FORK_PENDING))) return;
    await runOverProtocol(db, [], "checkpoint", []);
    const fp = await refreshFingerprint(dir, readFileSync(join(dir, FORK_FINGERPRINT), "utf8"));
    writeFileSync(join(dir, `${FORK_FINGERPRINT}.tmp`), fp);
    renameSync(join(dir, `${FORK_FINGERPRINT}.tmp`), join(dir, FORK_FINGERPRINT));
    rmSync(join(dir, FORK_PENDING), { force: true });
  }

  private async checkpoint(id: string): Promise<void> {
    const inst = await this.instance(id);
    await inst.mux.exclusive((db) => runOverProtocol(db, [], "checkpoint", []));
  }

  async divergenceBytes(id: string, fingerprint: string): Promise<number> {
    const dir = this.dirOf(id);
    if (!existsSync(join(dir, "PG_VERSION"))) return 0;
    // A fork never opened since it was made holds nothing of its own yet.
    if (existsSync(join(dir, FORK_PENDING))) return 0;
    // Pages still in an open instance's buffers are written first.
    if (this.open.has(id)) await this.checkpoint(id);
    // The fingerprint as its first open left it (the replay of the copy's WAL is not the branch's doing).
    const local = existsSync(join(dir, FORK_FINGERPRINT)) ? readFileSync(join(dir, FORK_FINGERPRINT), "utf8") : fingerprint;
    return divergenceOfDir(dir, local);
  }

  async disconnect(id: string, reason: string): Promise<void> {
    await this.closeInstance(id, reason);
  }

  async backup(id: string, path: string): Promise<number> {
    await this.snapshot(id, path);
    return dirSize(path);
  }

  /**
   * pg_dump (WebAssembly, on its own thread) of a snapshot of `id`: the snapshot is opened on a thread
   * of its own (replaying the WAL it carries, as a fork's first open does) and dumped there, so the
   * database serves its clients meanwhile; the copy is removed afterwards.
   */
  async dump(id: string, format: DumpFormat, path: string): Promise<number> {
    const copy = `${this.dirOf(id)}.dump-${process.pid}-${++this.dumps}`;
    rmSync(copy, { recursive: true, force: true });
    try {
      await this.snapshot(id, copy);
      const db = await PgliteThread.open(copy, DATABASE_CONF, this.o.clockOffset ?? (() => 0), { extensions: await extensionFiles() });
      try {
        await db.dump(dumpArgs(format), path);
      } finally {
        await db.close().catch(() => {});
      }
      if (format === "plain") await portablePlainDump(path);
      return statSync(path).size;
    } catch (err) {
      rmSync(path, { force: true });
      throw err;
    } finally {
      rmSync(copy, { recursive: true, force: true });
    }
  }

  private dumps = 0;

  async restore(id: string, path: string, keepAt?: string): Promise<number | null> {
    return this.replaceWith(
      id,
      async (incoming) => {
        if (!existsSync(join(path, "PG_VERSION"))) throw new Error("the backup no longer exists: its files are gone");
        await coldCopy(path, incoming);
      },
      keepAt,
    );
  }

  /**
   * Replaces the database's folder with one `fill` prepares beside it, once that opens (PostgreSQL
   * replays what it carries). Until the swap nothing is touched (RestoreNotStarted); a folder that
   * does not open is undone and the old one put back (RestoreNotStarted too). With `keepAt`, the
   * replaced folder (closed, so a consistent data dir) becomes the pre-restore state there instead of
   * being removed; its size is returned.
   */
  private async replaceWith(id: string, fill: (incoming: string) => Promise<void>, keepAt?: string): Promise<number | null> {
    const target = this.dirOf(id);
    const incoming = `${target}.restore-${process.pid}`;
    const aside = `${target}.pre-restore-${process.pid}`;
    rmSync(incoming, { recursive: true, force: true });
    // No writes while the copy is made: the database's clients were ended when the restore began.
    await this.closeInstance(id, "the database is being restored");
    try {
      await fill(incoming);
    } catch (err) {
      rmSync(incoming, { recursive: true, force: true });
      throw err instanceof RestoreNotStarted ? err : new RestoreNotStarted((err as Error).message);
    }
    await this.closeInstance(id, "the database is being restored");
    rmSync(aside, { recursive: true, force: true });
    renameSync(target, aside);
    renameSync(incoming, target);
    try {
      await this.checkpoint(id);
    } catch (err) {
      // The copy does not open: put the database back as it was.
      await this.closeInstance(id);
      rmSync(target, { recursive: true, force: true });
      renameSync(aside, target);
      throw new RestoreNotStarted(`the restored copy could not be opened: ${(err as Error).message}`);
    }
    if (!keepAt) {
      rmSync(aside, { recursive: true, force: true });
      return null;
    }
    // The pre-restore state: the old folder as it was closed (a restore of it replays its WAL). What
    // it carried of an earlier snapshot's identity goes, so it never passes for a point-in-time base.
    for (const f of [SNAPSHOT_INFO, "backup_label", "backup_label.old"]) rmSync(join(aside, f), { force: true });
    mkdirSync(dirname(keepAt), { recursive: true });
    try {
      renameSync(aside, keepAt);
    } catch {
      await coldCopy(aside, keepAt);
      rmSync(aside, { recursive: true, force: true });
    }
    return dirSize(keepAt);
  }

  /**
   * Point-in-time restore. Every database keeps its WAL (`wal_keep_size`) until Kiln lets it go
   * (`pruneWal`: older than the oldest backup a restore could start from). A restore copies the base
   * (a backup: a snapshot whose pg_control starts recovery at its redo point), adds the database's WAL from the base's start, walks
   * it for the first commit after the instant (commit timestamps are the platform's: the database
   * thread's clock follows it), zeroes the log from that commit record on, and opens the result:
   * PostgreSQL's crash recovery replays everything before the cut and rolls back what was uncommitted.
   */
  readonly pointInTime: PointInTime = {
    baseOf: (backupPath) => {
      try {
        const info = JSON.parse(readFileSync(join(backupPath, SNAPSHOT_INFO), "utf8")) as SnapshotInfo;
        return { startLsn: parseLsn(info.startLsn), endLsn: parseLsn(info.endLsn), endMs: info.endMs };
      } catch {
        return null;
      }
    },
    walStart: (id) => {
      const wal = join(this.dirOf(id), "pg_wal");
      const segs = existsSync(wal) ? listSegments(wal) : null;
      if (!segs || segs.files.size === 0) return null;
      return Math.min(...segs.files.keys()) * segs.segmentBytes;
    },
    pruneWal: async (id, keepFromLsn) => {
      const inst = this.open.get(id);
      if (!inst) return; // a closed database writes no WAL; it is pruned when next open
      const { rows } = await inst.mux.exclusive((db) => runOverProtocol(db, [], `select redo_lsn::text as redo from pg_control_checkpoint()`, []));
      const redo = parseLsn(rows[0]!.redo as string);
      const keep = Math.min(redo, keepFromLsn ?? redo);
      const wal = join(this.dirOf(id), "pg_wal");
      const segs = listSegments(wal);
      if (!segs) return;
      const keepSeg = Math.floor(keep / segs.segmentBytes);
      for (const f of readdirSync(wal)) if (/^[0-9A-F]{24}$/.test(f) && segmentNumber(f, segs.segmentBytes) < keepSeg) rmSync(join(wal, f), { force: true });
    },
    restoreTo: async (id, basePath, atMs, keepAt) => {
      const base = this.pointInTime.baseOf(basePath);
      if (!base || !existsSync(join(basePath, "PG_VERSION"))) throw new RestoreNotStarted("the backup no longer exists");
      return this.replaceWith(id, async (incoming) => {
        await coldCopy(basePath, incoming);
        // The database's WAL from the base's start on (the base carries only what its copy needed).
        const live = join(this.dirOf(id), "pg_wal");
        const segs = listSegments(live);
        if (!segs) throw new Error("the database's WAL is gone");
        const from = Math.floor(base.startLsn / segs.segmentBytes);
        if (!segs.files.has(from)) throw new Error("the WAL since the backup is no longer kept");
        for (const [n, path] of segs.files) if (n >= from) copyFileSync(path, join(incoming, "pg_wal", path.slice(live.length + 1)));
        const { commits, end } = readCommits(join(incoming, "pg_wal"), base.startLsn);
        if (end < base.endLsn) throw new Error("the WAL since the backup is incomplete");
        const cut = commits.find((c) => c.lsn >= base.endLsn && c.atMs > atMs);
        if (cut) truncateWal(join(incoming, "pg_wal"), cut.lsn);
      }, keepAt);
    },
  };

  /** Open instances right now (for stats and the memory bench). */
  openCount(): number {
    return this.open.size;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    // Each closes on its own thread (a shutdown checkpoint): together, not one after another.
    await Promise.all([...this.open.keys()].map((id) => this.closeInstance(id)));
  }
}

/**
 * Checkpoints never remove WAL segments by themselves: Kiln keeps what point-in-time restore needs and
 * removes the rest (`pointInTime.pruneWal`).
 */
const WAL_KEPT = "wal_keep_size=1TB";

/** Small buffers: a database here serves one developer's app, and many may be open at once. */
const DATABASE_CONF = ["shared_buffers=8MB", "work_mem=4MB", "maintenance_work_mem=16MB", WAL_KEPT, ...EXTENSION_CONF];

function dirSize(dir: string): number {
  if (!existsSync(dir)) return 0;
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    total += e.isDirectory() ? dirSize(p) : statSync(p).size;
  }
  return total;
}
