import { execFile } from "node:child_process";
import { constants, copyFileSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, symlinkSync, utimesSync, writeFileSync, type Stats } from "node:fs";
import { rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

/**
 * Snapshots of the embedded profile's state: copies of the data dir's entries, taken and put back
 * while nothing has them open (server/snapshots/controller.ts stops the areas and the control store
 * around these calls). Each lives in `<data-dir>/snapshots/<name>/` with `kiln-snapshot.json`.
 */

/** Data-dir entries that are the instance, not its state: never copied, never replaced by a restore. */
const NOT_STATE = new Set([
  "snapshots",
  "kiln.pid", // the data-dir lock (this process)
  "secret.key", // the instance secret key: the store's secrets stay readable with it
  "credentials.json", // the generated platform token, shown once
  "tls", // the wire listener's certificate and CA, which clients may have pinned
]);
const META = "kiln-snapshot.json";
/** Old state removed after a restore, in the background (a rename is instant; deleting is not). */
const TRASH = ".snapshot-trash";

export interface SnapshotMeta {
  name: string;
  created_at: string;
  size_bytes: number;
  /** The platform clock's offset when it was taken: a restore puts it back (docs/testing.md). */
  clock_offset_ms: number;
}

export const SNAPSHOT_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export class SnapshotFiles {
  constructor(private readonly dataDir: string) {}

  private dir(name: string): string {
    return join(this.dataDir, "snapshots", name);
  }

  private stateEntries(dir: string): string[] {
    return existsSync(dir) ? readdirSync(dir).filter((e) => !NOT_STATE.has(e) && e !== META && !e.startsWith(TRASH)) : [];
  }

  get(name: string): SnapshotMeta | null {
    try {
      return JSON.parse(readFileSync(join(this.dir(name), META), "utf8")) as SnapshotMeta;
    } catch {
      return null;
    }
  }

  list(): SnapshotMeta[] {
    const root = join(this.dataDir, "snapshots");
    if (!existsSync(root)) return [];
    return readdirSync(root)
      .map((n) => this.get(n))
      .filter((m): m is SnapshotMeta => m !== null)
      .sort((a, b) => a.created_at.localeCompare(b.created_at) || a.name.localeCompare(b.name));
  }

  /**
   * Copies the state into a new snapshot: reflinks where the file system has them (`cp
   * --reflink=auto`: btrfs, XFS, bcachefs share the blocks until either side writes), plain copies
   * elsewhere. Written under a temporary name and renamed, so a snapshot is whole or absent.
   */
  async save(name: string, createdAt: string, clockOffsetMs: number): Promise<SnapshotMeta> {
    const final = this.dir(name);
    const tmp = `${final}.partial-${process.pid}-${Date.now()}`;
    mkdirSync(tmp, { recursive: true });
    try {
      await copyEntries(this.dataDir, this.stateEntries(this.dataDir), tmp);
      const meta: SnapshotMeta = { name, created_at: createdAt, size_bytes: sizeOf(tmp), clock_offset_ms: clockOffsetMs };
      writeFileSync(join(tmp, META), JSON.stringify(meta));
      rmSync(final, { recursive: true, force: true });
      renameSync(tmp, final);
      return meta;
    } catch (err) {
      rmSync(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  /** Replaces the data dir's state with the snapshot's: the old entries move aside and are deleted later. */
  async restore(name: string): Promise<void> {
    const trash = join(this.dataDir, `${TRASH}-${Date.now()}`);
    mkdirSync(trash);
    for (const e of this.stateEntries(this.dataDir)) renameSync(join(this.dataDir, e), join(trash, e));
    const from = this.dir(name);
    await copyEntries(from, this.stateEntries(from), this.dataDir);
    void rm(trash, { recursive: true, force: true }).catch(() => {});
  }

  /**
   * Makes the data dir's state equal to the snapshot's by copying back only the files that differ
   * (size or modification time: a copy keeps the snapshot's time, and any later write changes it)
   * and removing what the snapshot does not have; `keep` entries (the control store, put back with
   * SQL) are left alone. A test's few writes cost a few files instead of the whole state.
   */
  restoreChanged(name: string, keep: ReadonlySet<string>): { copied: number; removed: number } {
    return this.walk(name, keep, true).counts;
  }

  /**
   * `restoreChanged` for the folders `changedPaths` found changes in (each path's first two parts:
   * one database's folder, say), walked again since (what held them open may have written them as
   * it closed); the rest of the state is taken as unchanged since that look.
   */
  restoreWithin(name: string, paths: readonly string[]): { copied: number; removed: number } {
    const from = this.dir(name);
    const sync: SyncRun = { counts: { copied: 0, removed: 0 }, paths: [], apply: true };
    const prefixes = new Set(paths.map((p) => p.split("/").slice(0, 2).join("/")));
    for (const p of prefixes) {
      // (A prefix inside another one is walked with it.)
      if ([...prefixes].some((q) => q !== p && p.startsWith(q + "/"))) continue;
      if (existsSync(join(from, p))) {
        const parent = dirname(join(this.dataDir, p));
        if (!existsSync(parent)) syncEntry(dirname(join(from, p)), parent, dirname(p), sync);
        else syncEntry(join(from, p), join(this.dataDir, p), p, sync);
      } else if (existsSync(join(this.dataDir, p))) {
        rmSync(join(this.dataDir, p), { recursive: true, force: true });
        sync.counts.removed++;
      }
    }
    return sync.counts;
  }

  /**
   * What `restoreChanged` would copy or remove, touching nothing: paths relative to the data dir (a
   * folder that is missing on either side is one path). A restore in place asks the areas that own
   * them to let go of those files first.
   */
  changedPaths(name: string, keep: ReadonlySet<string>): string[] {
    return this.walk(name, keep, false).paths;
  }

  private walk(name: string, keep: ReadonlySet<string>, apply: boolean): { counts: { copied: number; removed: number }; paths: string[] } {
    const from = this.dir(name);
    const sync: SyncRun = { counts: { copied: 0, removed: 0 }, paths: [], apply };
    const wanted = new Set(this.stateEntries(from).filter((e) => !keep.has(e)));
    for (const e of this.stateEntries(this.dataDir)) {
      if (keep.has(e) || wanted.has(e)) continue;
      if (apply) rmSync(join(this.dataDir, e), { recursive: true, force: true });
      sync.counts.removed++;
      sync.paths.push(e);
    }
    for (const e of wanted) syncEntry(join(from, e), join(this.dataDir, e), e, sync);
    return sync;
  }

  removeState(): void {
    for (const e of this.stateEntries(this.dataDir)) rmSync(join(this.dataDir, e), { recursive: true, force: true });
  }

  delete(name: string): boolean {
    const d = this.dir(name);
    if (!existsSync(join(d, META))) return false;
    rmSync(d, { recursive: true, force: true });
    return true;
  }
}

/**
 * `cp -a --reflink=auto`: GNU cp clones (FICLONE) where it can and copies otherwise, keeping modes
 * and sparse files. Hard links are not used even for stored objects: the filesystem blob store
 * appends to multipart parts in place, and a linked file would carry such a write into the snapshot.
 */
async function copyEntries(fromDir: string, entries: string[], toDir: string): Promise<void> {
  if (!entries.length) return;
  await run("cp", ["-a", "--reflink=auto", ...entries.map((e) => join(fromDir, e)), toDir + "/"], { maxBuffer: 1 << 20 });
}

function sizeOf(path: string): number {
  const st = lstatSync(path);
  if (!st.isDirectory()) return st.size;
  let total = 0;
  for (const e of readdirSync(path)) total += sizeOf(join(path, e));
  return total;
}

/** Files up to this size whose time differs but size does not are compared byte for byte. */
const SAME_BYTES_MAX = 64 * 1024;

interface SyncRun {
  counts: { copied: number; removed: number };
  /** Relative paths that differ. */
  paths: string[];
  /** False: only list what differs. */
  apply: boolean;
}

/** `to` becomes a copy of `from`; files whose size and modification time match are taken as equal. */
function syncEntry(from: string, to: string, rel: string, run: SyncRun): void {
  const { counts, apply } = run;
  const src = lstatSync(from);
  let dst: Stats | null = null;
  try {
    dst = lstatSync(to);
  } catch {}
  if (src.isDirectory()) {
    if (dst && !dst.isDirectory()) {
      run.paths.push(rel);
      if (!apply) return;
      rmSync(to, { recursive: true, force: true }), (dst = null);
    }
    if (!dst) {
      if (!apply) return void run.paths.push(rel);
      mkdirSync(to, { mode: src.mode & 0o7777 });
    }
    const names = readdirSync(from);
    const keep = new Set(names);
    if (dst)
      for (const n of readdirSync(to))
        if (!keep.has(n)) {
          if (apply) rmSync(join(to, n), { recursive: true, force: true });
          counts.removed++;
          run.paths.push(join(rel, n));
        }
    for (const n of names) syncEntry(join(from, n), join(to, n), join(rel, n), run);
    return;
  }
  if (dst && dst.isFile() && src.isFile() && dst.size === src.size) {
    if (Math.abs(dst.mtimeMs - src.mtimeMs) < 1) return;
    // A small file written again with the same bytes (the lock journal is rewritten at every open):
    // equal, and given the snapshot's time so that the next look is by size and time again.
    if (src.size <= SAME_BYTES_MAX && readFileSync(from).equals(readFileSync(to))) {
      if (apply) utimesSync(to, src.atimeMs / 1000, src.mtimeMs / 1000);
      return;
    }
  }
  run.paths.push(rel);
  counts.copied++;
  if (!apply) return;
  if (dst) rmSync(to, { recursive: true, force: true });
  if (src.isSymbolicLink()) symlinkSync(readlinkSync(from), to);
  else {
    // A reflink where the file system has them, a copy elsewhere; the snapshot's time marks it unchanged.
    copyFileSync(from, to, constants.COPYFILE_FICLONE);
    utimesSync(to, src.atimeMs / 1000, src.mtimeMs / 1000);
  }
}
