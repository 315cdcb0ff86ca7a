import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { copyFile, cp, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { PgliteSession } from "./pglite-thread";
import { runOverProtocol } from "./protocol-query";

/**
 * Consistent copies of a live PGlite data dir, taken while it keeps serving: PostgreSQL's own online
 * backup protocol, run on the database's single session.
 *
 * 1. `pg_backup_start(fast)`: a checkpoint, and full-page writes forced from here on (one short hold
 *    of the session: the checkpoint writes what the 8 MB of shared buffers hold dirty).
 * 2. The files are copied while the database keeps running (`cp --reflink=auto`: a copy-on-write clone
 *    where the filesystem has one, btrfs or XFS; a plain copy elsewhere). Pages written meanwhile may be
 *    torn in the copy: that is what step 3 repairs.
 * 3. `pg_backup_stop()` and, in the same hold of the session, the WAL from the start's segment to the
 *    stop's is copied. Nothing runs on the database between the two, so the copy ends exactly at the
 *    stop: every transaction committed before it, none after.
 * 4. `backup_label` is written into the copy. Opening the copy replays that WAL from the start's
 *    checkpoint (full-page images overwrite torn pages) and rolls back what was uncommitted.
 *
 * The parent is held only for the checkpoint and for the stop plus the WAL copy (a few MB at most);
 * its clients wait, as they would for any other transaction, and nothing is ever copied torn.
 */
export type Exclusive = <T>(fn: (db: PgliteSession) => Promise<T>) => Promise<T>;

/** Files and folders never copied (PostgreSQL's own list for base backups, as they apply to PGlite). */
const SKIP_TOP = new Set(["pg_wal", "postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map", "backup_label.old", "recovery.signal", "standby.signal", "kiln-snapshot.json", "kiln-fork-pending", "kiln-fork-fingerprint.json", "kiln-fork-fingerprint.json.tmp"]);

const SEGMENT = /^[0-9A-F]{24}$/;

const TRACE = !!process.env.KILN_TRACE_SNAPSHOT;
/** A phase's duration, and when it ended (epoch ms, to line up with a client's own timings). */
export const trace = (what: string, t0: number) =>
  TRACE && console.error(`${what} ${(performance.now() - t0).toFixed(1)} ms (ended at ${Date.now()})`);

/** Where a snapshot's copy began and ended in the WAL, and when it ended (the database's clock: the platform's). */
export interface SnapshotInfo {
  startLsn: string;
  endLsn: string;
  endMs: number;
}

/** Kept in each snapshot's folder (PostgreSQL ignores it): what a point-in-time restore needs of its base. */
export const SNAPSHOT_INFO = "kiln-snapshot.json";

/** Copies `from` (a live data dir served through `exclusive`) into `to`, which must not exist. */
export async function hotCopy(exclusive: Exclusive, from: string, to: string): Promise<SnapshotInfo> {
  const q = (db: PgliteSession, text: string) => runOverProtocol(db, [], text, []);
  let t0 = performance.now();
  let started = false;
  try {
    const startSeg = await exclusive(async (db) => {
      let r;
      try {
        r = await q(db, `select pg_walfile_name(pg_backup_start('kiln snapshot', true)) as seg`);
      } catch (err) {
        // An earlier attempt that died half way may have left this session in backup mode.
        if (!/already in progress/.test((err as Error).message)) throw err;
        await q(db, `select pg_backup_stop(false)`);
        r = await q(db, `select pg_walfile_name(pg_backup_start('kiln snapshot', true)) as seg`);
      }
      started = true;
      return r.rows[0]!.seg as string;
    });
    trace("snapshot: start (checkpoint)", t0);
    t0 = performance.now();
    mkdirSync(to, { recursive: true });
    const entries = readdirSync(from).filter((e) => !SKIP_TOP.has(e));
    await copyEntries(from, to, entries);
    trace("snapshot: copy", t0);
    t0 = performance.now();
    mkdirSync(join(to, "pg_wal", "archive_status"), { recursive: true });
    mkdirSync(join(to, "pg_wal", "summaries"), { recursive: true });
    const { labelfile: label, endLsn, endMs } = await exclusive(async (db) => {
      const r = await q(
        db,
        `select labelfile, pg_walfile_name(lsn) as seg, lsn::text as lsn, (extract(epoch from clock_timestamp()) * 1000)::float8 as at from pg_backup_stop(false)`,
      );
      started = false;
      const { labelfile, seg: stopSeg, lsn, at } = r.rows[0] as { labelfile: string; seg: string; lsn: string; at: number };
      const wal = join(from, "pg_wal");
      const needed = readdirSync(wal).filter((f) => (SEGMENT.test(f) && f.slice(8) >= startSeg.slice(8) && f.slice(8) <= stopSeg.slice(8)) || f.endsWith(".history"));
      // A CHECKPOINT run by a client during the copy may have recycled the start's segment: then the
      // copy cannot be repaired, and the caller tries again.
      if (!needed.includes(startSeg) || !needed.includes(stopSeg)) throw new Error(`the WAL between ${startSeg} and ${stopSeg} was recycled during the copy`);
      for (const f of needed) await copyFile(join(wal, f), join(to, "pg_wal", f));
      return { labelfile, endLsn: lsn, endMs: at };
    });
    trace("snapshot: stop and WAL", t0);
    await writeFile(join(to, "backup_label"), label);
    const info: SnapshotInfo = { startLsn: /START WAL LOCATION: (\S+)/.exec(label)![1]!, endLsn, endMs };
    await writeFile(join(to, SNAPSHOT_INFO), JSON.stringify(info));
    return info;
  } catch (err) {
    if (started) await exclusive((db) => q(db, `select pg_backup_stop(false)`)).catch(() => {});
    rmSync(to, { recursive: true, force: true });
    throw err;
  }
}

/** Copies a closed data dir (or a snapshot) as a whole: no database writes to it. */
export async function coldCopy(from: string, to: string): Promise<void> {
  mkdirSync(to, { recursive: true });
  try {
    await copyEntries(from, to, readdirSync(from));
  } catch (err) {
    rmSync(to, { recursive: true, force: true });
    throw err;
  }
}

/** The system cp copies hundreds of small files several times faster than node:fs, and clones on CoW filesystems. */
async function copyEntries(from: string, to: string, entries: string[]): Promise<void> {
  if (entries.length === 0) return;
  try {
    // At a lower CPU priority: the database being copied keeps serving meanwhile, on the same cores.
    const nice = Bun.which("nice") ? ["nice", "-n", "10"] : [];
    const proc = Bun.spawn([...nice, "cp", "-R", "--reflink=auto", ...entries.map((e) => join(from, e)), `${to}/`], { stdout: "ignore", stderr: "pipe" });
    if ((await proc.exited) === 0) return;
  } catch {
    // no GNU cp here: node:fs below
  }
  for (const e of entries) await cp(join(from, e), join(to, e), { recursive: true, force: true });
}

// ---- divergence: page-hash.ts (a module of its own, so its process loads nothing else) ---------------

export { divergenceOfDir, fingerprintDir, PAGE_BYTES } from "./page-hash";
