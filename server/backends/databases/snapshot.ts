import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { copyFile, cp, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { PgliteSession } from "./pglite-thread";
import { runOverProtocol } from "./protocol-query";
import { backgroundPriority } from "./background-priority";

/**
 * Consistent copies of a live PGlite data dir, taken while it keeps serving, the way a crash-safe
 * PostgreSQL comes back after a crash: pages from any moment after a checkpoint's redo point, plus the
 * WAL from that redo point to past the end of the copy.
 *
 * 1. A hold of the database's session (between two client transactions): read the last checkpoint
 *    (`pg_control_checkpoint()`) and keep the bytes of `global/pg_control` as they are now. No
 *    checkpoint is forced (PGlite is a single-user backend: a checkpoint holds every client of the
 *    database), unless the WAL since the last one is over REPLAY_LIMIT, which bounds the copy's replay.
 * 2. The files are copied while the database keeps running (`cp --reflink=auto`: a copy-on-write clone
 *    where the filesystem has one, btrfs or XFS; a plain copy elsewhere), and the copy's `pg_control`
 *    is then the one kept in step 1, so its recovery starts at that redo point: every page on disk at
 *    the copy already holds everything before it (a checkpoint is recorded only once all pages before
 *    its redo are written). Pages written during the copy may be torn: full-page writes are on (checked
 *    in step 1), so the first change of every page after the redo point carries the whole page, and
 *    replay repairs them. The WAL segments that were complete at step 1 are copied here too (nothing
 *    writes to them again: they are before the flush position).
 * 3. A second hold: the WAL's flush position is the end of the copy, and the segments written since
 *    step 1 are copied (usually one or two 1 MB segments). Every page copied was written after its WAL
 *    (PostgreSQL's rule), so the WAL copied covers every change any copied page holds; every
 *    transaction committed before this hold is in it, none after.
 * 4. Opening the copy is crash recovery: replay from the redo point to the end of the copied WAL, and
 *    what was uncommitted is rolled back. This is what pg_basebackup does, except that Kiln's saved
 *    `pg_control` stands where its `backup_label` would (a label from a primary also needs the
 *    end-of-backup record that only `pg_backup_stop` writes, after a forced checkpoint).
 *
 * The parent is held only for a query and an 8 KB read, and for the copy of the last WAL segments.
 */
export type Exclusive = <T>(fn: (db: PgliteSession) => Promise<T>) => Promise<T>;

/** Files and folders never copied (PostgreSQL's own list for base backups, as they apply to PGlite). */
const SKIP_TOP = new Set(["pg_wal", "postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map", "backup_label.old", "recovery.signal", "standby.signal", "kiln-snapshot.json", "kiln-fork-pending", "kiln-fork-fingerprint.json", "kiln-fork-fingerprint.json.tmp"]);

const SEGMENT = /^[0-9A-F]{24}$/;

/** WAL since the last checkpoint beyond which a snapshot takes a checkpoint first: the most a copy's first open replays. */
export const REPLAY_LIMIT = 64 * 1024 * 1024;

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
export async function hotCopy(exclusive: Exclusive, from: string, to: string, replayLimit = REPLAY_LIMIT): Promise<SnapshotInfo> {
  const q = (db: PgliteSession, text: string) => runOverProtocol(db, [], text, []);
  const wal = join(from, "pg_wal");
  const walTo = join(to, "pg_wal");
  const segmentsFrom = (first: string, last: string) =>
    readdirSync(wal).filter((f) => SEGMENT.test(f) && f.slice(8) >= first.slice(8) && f.slice(8) <= last.slice(8));
  let t0 = performance.now();
  try {
    const start = await exclusive(async (db) => {
      const read = async () =>
        (await q(db, `select redo_lsn::text as redo, pg_walfile_name(redo_lsn) as redo_seg, pg_walfile_name(pg_current_wal_flush_lsn()) as now_seg, full_page_writes as fpw, (pg_current_wal_insert_lsn() - redo_lsn)::float8 as behind from pg_control_checkpoint()`)).rows[0] as { redo: string; redo_seg: string; now_seg: string; fpw: boolean; behind: number };
      let r = await read();
      if (!r.fpw) throw new Error("full_page_writes is off: a copy of the live files could not be repaired");
      if (r.behind > replayLimit) {
        await q(db, "checkpoint");
        r = await read();
      }
      return { ...r, control: readFileSync(join(from, "global", "pg_control")) };
    });
    trace("snapshot: start", t0);
    t0 = performance.now();
    mkdirSync(to, { recursive: true });
    const entries = readdirSync(from).filter((e) => !SKIP_TOP.has(e));
    await copyEntries(from, to, entries);
    writeFileSync(join(to, "global", "pg_control"), start.control);
    mkdirSync(join(walTo, "archive_status"), { recursive: true });
    mkdirSync(join(walTo, "summaries"), { recursive: true });
    // Segments before the one the WAL was flushed into at the start are complete in their files (the
    // insert position may be further on, with the end of an earlier segment still in WAL buffers):
    // copied without a hold. A checkpoint by a client during the copy, then Kiln's WAL pruning (which
    // removes the oldest first), may have removed the first: then this copy cannot be repaired, and
    // the caller tries again.
    const settled = segmentsFrom(start.redo_seg, start.now_seg).filter((f) => f.slice(8) < start.now_seg.slice(8));
    for (const f of settled) await copyFile(join(wal, f), join(walTo, f));
    trace("snapshot: copy", t0);
    t0 = performance.now();
    const end = await exclusive(async (db) => {
      const r = (await q(db, `select pg_walfile_name(lsn) as seg, lsn::text as lsn, (extract(epoch from clock_timestamp()) * 1000)::float8 as at from pg_current_wal_flush_lsn() as lsn`)).rows[0] as { seg: string; lsn: string; at: number };
      const needed = segmentsFrom(start.now_seg, r.seg);
      if (!needed.includes(start.now_seg) || !needed.includes(r.seg)) throw new Error(`the WAL between ${start.now_seg} and ${r.seg} was removed during the copy`);
      for (const f of needed) await copyFile(join(wal, f), join(walTo, f));
      return r;
    });
    for (const f of readdirSync(wal)) if (f.endsWith(".history")) await copyFile(join(wal, f), join(walTo, f));
    if (!existsSync(join(walTo, start.redo_seg))) throw new Error(`the WAL segment ${start.redo_seg} was removed during the copy`);
    trace("snapshot: end and WAL", t0);
    const info: SnapshotInfo = { startLsn: start.redo, endLsn: end.lsn, endMs: end.at };
    await writeFile(join(to, SNAPSHOT_INFO), JSON.stringify(info));
    return info;
  } catch (err) {
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
    // At the lowest CPU priority: the database being copied keeps serving meanwhile, on the same cores.
    const proc = Bun.spawn([...(await backgroundPriority()), "cp", "-R", "--reflink=auto", ...entries.map((e) => join(from, e)), `${to}/`], { stdout: "ignore", stderr: "pipe" });
    if ((await proc.exited) === 0) return;
  } catch {
    // no GNU cp here: node:fs below
  }
  for (const e of entries) await cp(join(from, e), join(to, e), { recursive: true, force: true });
}

// ---- divergence: page-hash.ts (a module of its own, so its process loads nothing else) ---------------

export { divergenceOfDir, fingerprintDir, PAGE_BYTES } from "./page-hash";
