import { execFile } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
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
