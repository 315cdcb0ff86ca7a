import { closeSync, existsSync, fdatasync, fdatasyncSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { isReclaimable, type Lease } from "./lock-table";

/**
 * What the in-memory lock table keeps: leases by project and key, and each project's last fencing
 * token (kept after its leases are gone, so a project's tokens never go down).
 */
export interface LockState {
  projects: Map<string, Map<string, Lease>>;
  counters: Map<string, number>;
}

export const emptyLockState = (): LockState => ({ projects: new Map(), counters: new Map() });

/** Where the in-memory table records its changes (the embedded profile's LeaseJournal). */
export interface LeaseLog {
  /** The lease of (project, key) is now `lease`: a take, a same-token acquire or a renewal. */
  put(projectId: string, key: string, lease: Lease): void;
  /** The lease of (project, key) is gone (a release or a force release). */
  free(projectId: string, key: string): void;
  /** Every lease of the project is gone (its deletion); its counter stays. */
  dropProject(projectId: string): void;
  /** Resolves once everything recorded so far is on disk (fdatasync). */
  synced(): Promise<void>;
  close(): Promise<void>;
}

const FILE = "leases.journal";
const NEXT = "leases.journal.next";
/** The first line of every journal: its format. */
const HEADER = JSON.stringify(["kiln-locks", 1]);
/** The journal is rewritten (the state only) once it has grown this much past its last rewrite, and to twice that. */
const COMPACT_MIN_BYTES = 8 * 1024 * 1024;

const isText = (v: unknown): v is string => typeof v === "string" && v.length > 0;
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** Applies one journal record to `state`; false when the line is not a well-formed record. */
function apply(state: LockState, rec: unknown): boolean {
  if (!Array.isArray(rec)) return false;
  const [kind, p] = rec;
  if (!isText(p)) return false;
  switch (kind) {
    case "L": {
      const [, , key, holder, fencingToken, deadlineMs, expiresAtMs] = rec;
      if (rec.length !== 7 || !isText(key) || !isText(holder) || !isCount(fencingToken) || !isCount(deadlineMs) || !isCount(expiresAtMs)) return false;
      let leases = state.projects.get(p);
      if (!leases) state.projects.set(p, (leases = new Map()));
      leases.set(key, { holder, fencingToken, deadlineMs, expiresAtMs });
      state.counters.set(p, Math.max(state.counters.get(p) ?? 0, fencingToken));
      return true;
    }
    case "F": {
      if (rec.length !== 3 || !isText(rec[2])) return false;
      const leases = state.projects.get(p);
      leases?.delete(rec[2]);
      if (leases && !leases.size) state.projects.delete(p);
      return true;
    }
    case "D":
      if (rec.length !== 2) return false;
      state.projects.delete(p);
      return true;
    case "C":
      if (rec.length !== 3 || !isCount(rec[2])) return false;
      state.counters.set(p, Math.max(state.counters.get(p) ?? 0, rec[2]));
      return true;
    default:
      return false;
  }
}

/** Every byte of `text` written at the descriptor's position. */
function writeAll(fd: number, text: string): number {
  const buf = Buffer.from(text);
  let off = 0;
  while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
  return buf.length;
}

/**
 * The embedded profile's lease journal: one append-only file, `<data-dir>/locks/leases.journal`, of
 * JSON lines (a lease set, freed, a project dropped, a project's counter), replayed at start.
 *
 * - Every change is written (write(2)) just before the table's memory changes, in the same
 *   synchronous step: what the table holds is always what the OS holds, so a kill -9 loses nothing.
 * - `synced()` is group commit: one fdatasync at a time, and everyone who wrote while it ran shares
 *   the next. Acquires and renewals are answered after it (power loss loses nothing acknowledged);
 *   releases are not (losing one keeps a lock held until its expiry, which never breaks exclusion,
 *   and the next acquire's sync covers it anyway).
 * - Start: the file is replayed up to its first malformed line (a torn tail: only the unsynced end
 *   of the file can be torn, and nothing in it was acknowledged), then rewritten as the state alone
 *   (reclaimable leases dropped, counters kept). The rewrite is a new file, fdatasynced, renamed
 *   over the old one, the folder fsynced; it also runs whenever the file has grown past twice its
 *   last rewrite (at least 8 MiB), between two syncs.
 */
export class LeaseJournal implements LeaseLog {
  private fd: number;
  private size = 0;
  private compactAt = 0;
  private inFlight: Promise<void> | null = null;
  private waiting: { promise: Promise<void>; resolve: () => void; reject: (e: unknown) => void } | null = null;
  private closed = false;
  private compactQueued = false;

  private constructor(
    private readonly dir: string,
    readonly state: LockState,
    private readonly nowMs: () => number,
    private readonly compactMinBytes: number,
  ) {
    this.fd = this.rewrite();
  }

  /**
   * Opens (or creates) the journal in `dir` and replays it. `nowMs` is the platform clock: lapsed
   * leases are left out of rewrites. `warn` hears about a torn tail that was cut off.
   * `compactMinBytes`: COMPACT_MIN_BYTES, smaller in tests.
   */
  static open(dir: string, opts: { nowMs: () => number; warn?: (message: string) => void; compactMinBytes?: number }): LeaseJournal {
    const warn = opts.warn ?? (() => {});
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    // A rewrite that never reached its rename: the old file is whole.
    rmSync(join(dir, NEXT), { force: true });
    const state = emptyLockState();
    const path = join(dir, FILE);
    if (existsSync(path)) {
      const text = readFileSync(path, "utf8");
      const lines = text.split("\n");
      // The last element follows the last newline: empty, or an unfinished line.
      const complete = lines.length - 1;
      // The header is never torn (a journal is made whole by a rename): anything else is not ours.
      if (text.length && lines[0] !== HEADER) throw new Error(`${path} is not a Kiln lock journal (first line ${JSON.stringify(lines[0]!.slice(0, 40))})`);
      let i = 1;
      for (; i < complete; i++) {
        let rec: unknown;
        try {
          rec = JSON.parse(lines[i]!);
        } catch {
          break;
        }
        if (!apply(state, rec)) break;
      }
      const cut = lines.slice(i).join("\n");
      if (cut.length) warn(`lock journal: cut off a torn tail of ${Buffer.byteLength(cut)} bytes at line ${i + 1} (changes never acknowledged)`);
    }
    // Lapsed leases are not kept (their projects' counters are).
    const now = opts.nowMs();
    for (const [p, leases] of state.projects) {
      for (const [key, lease] of leases) if (isReclaimable(lease, now)) leases.delete(key);
      if (!leases.size) state.projects.delete(p);
    }
    return new LeaseJournal(dir, state, opts.nowMs, opts.compactMinBytes ?? COMPACT_MIN_BYTES);
  }

  put(projectId: string, key: string, lease: Lease): void {
    this.append(JSON.stringify(["L", projectId, key, lease.holder, lease.fencingToken, lease.deadlineMs, lease.expiresAtMs]));
  }

  free(projectId: string, key: string): void {
    this.append(JSON.stringify(["F", projectId, key]));
  }

  dropProject(projectId: string): void {
    this.append(JSON.stringify(["D", projectId]));
  }

  synced(): Promise<void> {
    if (!this.inFlight) return (this.inFlight = this.sync());
    // The running sync may have begun before our write: wait for the next one.
    if (!this.waiting) {
      let resolve!: () => void;
      let reject!: (e: unknown) => void;
      const promise = new Promise<void>((ok, fail) => ((resolve = ok), (reject = fail)));
      this.waiting = { promise, resolve, reject };
    }
    return this.waiting.promise;
  }

  /** The file's bytes now (tests). */
  get bytes(): number {
    return this.size;
  }

  /** Kiln is stopping and no request is in flight: the last sync ends, then the file is closed. */
  async close(): Promise<void> {
    if (this.closed) return;
    while (this.inFlight) await this.inFlight.catch(() => {});
    this.closed = true;
    fdatasyncSync(this.fd);
    closeSync(this.fd);
  }

  private append(line: string): void {
    if (this.closed) throw new Error("lock journal is closed");
    this.size += writeAll(this.fd, line + "\n");
    // Not now: the table changes its memory right after this write, and a rewrite must include it.
    if (this.size >= this.compactAt && !this.compactQueued) {
      this.compactQueued = true;
      queueMicrotask(() => {
        this.compactQueued = false;
        if (!this.inFlight && !this.closed && this.size >= this.compactAt) this.compact();
      });
    }
  }

  private sync(): Promise<void> {
    const fd = this.fd;
    return new Promise<void>((ok, fail) => fdatasync(fd, (err) => (err ? fail(err) : ok()))).finally(() => {
      this.inFlight = null;
      const next = this.waiting;
      this.waiting = null;
      // Between two syncs (and never inside a table operation): the file may be replaced.
      if (this.size >= this.compactAt && !this.closed) this.compact();
      if (next) {
        this.inFlight = this.sync();
        this.inFlight.then(next.resolve, next.reject);
      }
    });
  }

  /** Replaces the file by the state alone; a failure leaves the old file in use (and is retried later). */
  private compact(): void {
    const old = this.fd;
    try {
      this.fd = this.rewrite();
    } catch {
      this.compactAt = this.size * 2;
      return;
    }
    closeSync(old);
  }

  /**
   * Writes the state to a new file, fdatasyncs it, renames it over the journal and fsyncs the
   * folder; returns its descriptor, positioned at its end for the next appends.
   */
  private rewrite(): number {
    const now = this.nowMs();
    const lines = [HEADER];
    for (const [p, n] of this.state.counters) lines.push(JSON.stringify(["C", p, n]));
    for (const [p, leases] of this.state.projects) {
      for (const [key, l] of leases) {
        if (!isReclaimable(l, now)) lines.push(JSON.stringify(["L", p, key, l.holder, l.fencingToken, l.deadlineMs, l.expiresAtMs]));
      }
    }
    const next = join(this.dir, NEXT);
    const fd = openSync(next, "w", 0o600);
    try {
      const size = writeAll(fd, lines.join("\n") + "\n");
      fdatasyncSync(fd);
      renameSync(next, join(this.dir, FILE));
      const dirFd = openSync(this.dir, "r");
      try {
        fsyncSync(dirFd);
      } finally {
        closeSync(dirFd);
      }
      this.size = size;
      this.compactAt = Math.max(this.compactMinBytes, size * 2);
      return fd;
    } catch (err) {
      closeSync(fd);
      rmSync(next, { force: true });
      throw err;
    }
  }
}
