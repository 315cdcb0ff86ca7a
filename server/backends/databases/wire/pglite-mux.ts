import type { PgliteSession } from "../pglite-thread";
import { SessionKilled } from "../pglite-thread";
import type { WireBackend, WireClient, WireControl } from "./listener";
import {
  B,
  closeStatement,
  concatBytes,
  copyFail,
  copyInResponse,
  cstringEnd,
  errorResponse,
  F,
  firstResult,
  fromUtf8,
  readInt32,
  readyForQuery,
  simpleQuery,
  sqlIdent,
  sqlLiteral,
  sync,
  utf8,
} from "./protocol";
import { LISTEN_TAGS, type ListenOp, listenOps, mayChangeListens } from "./listen-statements";

/**
 * Many client sessions over PGlite's single backend session, multiplexed per transaction.
 *
 * The protocol state machine, per client:
 * - Between batches and outside a transaction (its last ReadyForQuery said 'I') a client holds
 *   nothing. A batch (messages up to Sync, Flush or a simple Query) takes the session; the client
 *   keeps it until a ReadyForQuery 'I' (its transaction ended) and everyone else (clients and Kiln's
 *   `exclusive` work) waits in FIFO order.
 * - A batch that only manages statements (Parse, Describe and Close of statements, then Sync), from
 *   a client outside a transaction, does not wait for a holder that sits idle in its transaction: it
 *   runs inside a savepoint of that transaction with the client's own settings, rolled back after.
 *   Without this, libpq's synchronous PQprepare deadlocks a single-threaded client with two
 *   connections (pgbench -M prepared -c 2): one connection holds a transaction while the thread
 *   blocks on the other's prepare.
 * - A holder idle for longer than its idle_in_transaction_session_timeout (Kiln's default when it
 *   set none) is terminated (FATAL 25P03) and rolled back, so one stuck client never freezes the rest.
 * - A cancel (CancelRequest, or its statement_timeout) of a running batch restarts the database
 *   thread: the only way to stop WebAssembly. The client gets 57014 and, if it was in a transaction
 *   block, an aborted transaction to roll back; other clients keep their settings and prepared
 *   statements (made again on the new session when they next run).
 *
 * When the session changes hands, the outgoing client's session settings are captured if it may
 * have changed them, and the incoming client gets defaults + its `init` + its own settings back.
 * Named prepared statements are renamed per client.
 *
 * LISTEN/NOTIFY: PGlite's one backend listens to every channel some client listens to; each
 * NotificationResponse in its answers (they follow the commit that sent them) is taken out and
 * routed to the clients listening on that channel when it was committed (`deliver`).
 */

const I = 0x49; // ReadyForQuery status 'I'
const T = 0x54; // ReadyForQuery status 'T'
const E = 0x45; // ReadyForQuery status 'E'
const COPY_IN_RESPONSE = 0x47; // G
const COPY_DATA = 0x64; // d
const COPY_DONE = 0x63; // c
const COPY_FAIL = 0x66; // f
const NOTIFICATION = 0x41; // A
/** Notifications held for a client in a transaction (or not reading) beyond this end it (PostgreSQL's queue is bounded too). */
const MAX_HELD_NOTIFICATIONS_BYTES = 16 * 1024 * 1024;
const EMPTY = new Uint8Array(0);
/**
 * Sent after every client batch. Outside COPY PostgreSQL ignores a CopyFail; inside COPY FROM STDIN
 * it ends the copy with an error, where running out of input would make PGlite exit(1) and take the
 * database down for every client.
 */
const COPY_GUARD = copyFail("inside a transaction block, COPY FROM STDIN must be a simple query of its own on Kiln's embedded databases");
/** PostgreSQL truncates prepared-statement names to NAMEDATALEN - 1 bytes. */
const MAX_NAME = 63;
/** A client that sends this much without a Sync or Flush gets it executed anyway. */
const MAX_BATCH_BYTES = 1024 * 1024;
const SIDE_SAVEPOINT = "kiln_side_work";
const KILN = "kiln" as const;
type Holder = MuxSession | typeof KILN;

/** How a wait for the session ended ("grouped": another client's hand-over ran this batch too). */
type Grant = "owner" | "side" | "cancelled" | "gone" | "grouped";

interface Waiter {
  who: Holder;
  /** The waiting batch may run beside an idle holder (statement management only). */
  side: boolean;
  resolve: (grant: Grant) => void;
  /** The batch that waits and where its answer goes: another client's hand-over may take it along. */
  job?: GroupMember;
}

/** One client batch of a group run in one hand-over. */
interface GroupMember {
  s: MuxSession;
  batch: Batch;
  send: (data: Uint8Array) => void;
}

/** A group's batches go to the database thread in one call: at most this many, and this many bytes (its shared-memory lane). */
const MAX_GROUP = 32;
const MAX_GROUP_BYTES = 128 * 1024;

export interface MuxOptions {
  /** A holder idle this long is terminated when it set no idle_in_transaction_session_timeout; 0: never. */
  idleInTransactionTimeoutMs: number;
}

/** Startup parameters that are not settings. */
const NOT_SETTINGS = new Set(["user", "database", "options", "replication"]);
const REPORTED = [
  "server_version",
  "server_encoding",
  "client_encoding",
  "DateStyle",
  "IntervalStyle",
  "TimeZone",
  "integer_datetimes",
  "standard_conforming_strings",
  "default_transaction_read_only",
  "in_hot_standby",
];
/** Timeouts PGlite accepts but cannot enforce (it has no signals): the mux enforces them. */
const TIMEOUTS = ["statement_timeout", "idle_in_transaction_session_timeout"];
/** Read back after a client changes settings: the timeouts, and the encoding PGlite can only speak in UTF8. */
const WATCHED = [...TIMEOUTS, "client_encoding"];

/**
 * PGlite has no encoding conversions: in any other client encoding it cuts its answer short at the
 * first character it would convert. So the embedded engine speaks UTF8 only, and says so.
 */
function notUtf8(encoding: string): Error & { code: string } {
  return Object.assign(
    new Error(`invalid value for parameter "client_encoding": "${encoding}": Kiln's embedded databases support only UTF8 client encoding`),
    { code: "22023" },
  );
}

export class PgliteSessionMux {
  private holder: Holder | null = null;
  private queue: Waiter[] = [];
  /** The holder has had its answer and sent nothing since: side work may run in its transaction. */
  private holderIdle = false;
  /** Every use of the PGlite session, one at a time (holders and side work alike). */
  private lane: Promise<unknown> = Promise.resolve();
  /** The client whose batch PGlite is running now (a cancel for it restarts the session). */
  private runningFor: MuxSession | null = null;
  /** The clients of the group PGlite is running now (a cancel for one of them restarts the session). */
  private runningGroup: Set<MuxSession> | null = null;
  /** Bumped when the session restarts: clients whose statements are older make them again. */
  private generation = 0;
  /** The client whose settings the session holds; it may have changed them since (`dirty`). */
  private current: MuxSession | null = null;
  /** Key (init + settings) of the state the session holds; null when unknown. */
  private applied: string | null = null;
  /** Whose Parse the unnamed prepared statement is; any simple query or Kiln's own queries drop it. */
  private unnamedOwner: MuxSession | null = null;
  private sessions = new Set<MuxSession>();
  /** Channel -> the clients whose committed LISTEN covers it. */
  private listeners = new Map<string, Set<MuxSession>>();
  /** PGlite's backend may not listen to exactly the channels in `listeners` (an UNLISTEN, a restart). */
  private listenDirty = false;
  /** The client batch PGlite runs now and the LISTEN statements it has yet to answer. */
  private execFor: { s: MuxSession; ops: ListenOp[] } | null = null;
  private nextId = 1;
  private closed = false;
  private lastActivity = Date.now();
  private sessionUser = "postgres";
  /** ParameterStatus defaults; also the first thing in the queue, so it runs before any client. */
  readonly defaults: Promise<Record<string, string>>;

  constructor(
    private readonly db: PgliteSession,
    readonly options: MuxOptions = { idleInTransactionTimeoutMs: 60_000 },
  ) {
    this.routed = {
      ready: () => db.ready(),
      exec: (bytes) => this.exec(bytes),
      restart: () => db.restart(),
      close: () => db.close(),
      get closed() {
        return db.closed;
      },
    };
    this.defaults = this.withSession(KILN, () => this.step(() => this.setUp()));
    this.defaults.catch(() => {});
  }

  /**
   * A WireBackend for one client. `init`: SQL statements run every time this client takes over the
   * PGlite session, before its own saved settings are restored.
   */
  open(init: string[], client: WireClient, control: WireControl): WireBackend {
    if (this.closed) throw new Error("the database is shutting down");
    const encoding = startupSettings(client.params).get("client_encoding");
    if (encoding !== undefined) throw notUtf8(encoding);
    const s = new MuxSession(this, this.nextId++, init, client, control);
    this.sessions.add(s);
    return s;
  }

  /**
   * Runs fn with the session to itself, after any client transaction, with session state reset.
   * Whatever fn leaves behind is reset before the next user (a statement can change session
   * settings in ways no caller sees, e.g. through a view calling set_config).
   */
  exclusive<T>(fn: (db: PgliteSession) => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error("the database session is closed"));
    return this.withSession(KILN, () =>
      this.step(async () => {
        await this.switchTo(null);
        if (this.listenDirty) await this.reconcileListens();
        try {
          return await fn(this.routed);
        } finally {
          this.applied = null;
          this.unnamedOwner = null;
        }
      }),
    );
  }

  /** The session as Kiln's own work sees it: notifications its statements commit reach the listeners too. */
  private readonly routed: PgliteSession;

  stats(): { clients: number; inTransaction: boolean; lastActivityMs: number } {
    return { clients: this.sessions.size, inTransaction: this.holder instanceof MuxSession, lastActivityMs: this.lastActivity };
  }

  /** Ends every client (FATAL with reason), rolls back a held transaction, lets queued Kiln work finish. */
  async closeAll(reason: string): Promise<void> {
    this.closed = true;
    const all = [...this.sessions];
    for (const s of all) s.control.terminate(reason);
    // A statement still running would hold this up for as long as it runs: end it, as a shutdown does.
    if (this.runningFor || this.runningGroup) void this.db.restart().catch(() => {});
    await Promise.all(all.map((s) => s.close()));
    await this.withSession(KILN, async () => {});
  }

  // ---- the locks ----------------------------------------------------------------------------------

  private async withSession<T>(who: Holder, fn: () => Promise<T>): Promise<T> {
    if (!this.tryTake(who) && (await this.wait(who, false)) !== "owner") throw new Error("the database session is closed");
    try {
      return await fn();
    } finally {
      this.lastActivity = Date.now();
      this.release();
    }
  }

  /** Runs fn when nothing else uses the PGlite session. */
  private step<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.lane.then(fn, fn);
    this.lane = run.catch(() => {});
    return run;
  }

  private tryTake(who: Holder): boolean {
    if (this.holder === who) return true;
    if (this.holder !== null || this.queue.length > 0) return false;
    this.holder = who;
    return true;
  }

  private wait(who: Holder, side: boolean, job?: GroupMember): Promise<Grant> {
    return new Promise((resolve) => {
      const w: Waiter = { who, side, resolve, job };
      this.queue.push(w);
      if (who !== KILN) {
        who.waiter = w;
        if (side) this.serveSide();
      }
    });
  }

  /** Takes `s` out of the queue; its wait ends with `grant`. */
  cancelWait(s: MuxSession, grant: Grant): boolean {
    const w = s.waiter;
    if (!w) return false;
    s.waiter = null;
    this.queue.splice(this.queue.indexOf(w), 1);
    w.resolve(grant);
    return true;
  }

  private release(): void {
    const next = this.queue.shift();
    this.holder = next ? next.who : null;
    this.holderIdle = false;
    if (next && next.who !== KILN) next.who.waiter = null;
    next?.resolve("owner");
  }

  /** Lets waiting statement-management batches run beside a holder idle in its transaction. */
  private serveSide(): void {
    if (!this.sideAllowed()) return;
    for (const w of this.queue.filter((w) => w.side && w.who !== KILN)) {
      (w.who as MuxSession).waiter = null;
      this.queue.splice(this.queue.indexOf(w), 1);
      w.resolve("side");
    }
  }

  /** The holder is a client idle inside a healthy transaction block, between batches. */
  private sideAllowed(): boolean {
    const h = this.holder;
    return h instanceof MuxSession && this.holderIdle && h.status === T && !h.copy && !h.midBatch && !h.skipToSync;
  }

  holderIs(s: MuxSession): boolean {
    return this.holder === s;
  }

  // ---- running client batches (called by MuxSession) ---------------------------------------------

  async run(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void): Promise<void> {
    s.idle(false);
    if (this.holder === s) this.holderIdle = false;
    let side = batch.side && s.status === I && !s.midBatch;
    const job = batch.joinable ? { s, batch, send } : undefined;
    for (;;) {
      const grant = this.tryTake(s) ? "owner" : await this.wait(s, side, job);
      if (grant === "gone") return;
      if (grant === "grouped") return s.grouped!;
      if (grant === "cancelled") return this.answerCancelled(s, batch, send, s.cancelReason ?? CANCELLED_BY_USER);
      if (grant === "owner") break;
      if (await this.step(() => this.runSide(s, batch, send))) return;
      side = false; // the holder moved on meanwhile: wait the ordinary way
    }
    const group = job && this.joinsGroup(s, batch) ? this.takeGroup(job) : null;
    if (group) return group;
    await this.step(() => this.runOwned(s, batch, send));
    if (this.holder === s) {
      this.holderIdle = true;
      s.idle(true);
      this.serveSide();
    }
  }

  /** A batch of the holder `s`. On a throw the session stays with `s`: its close() rolls back and releases. */
  private async runOwned(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void): Promise<void> {
    const statusBefore = s.status;
    s.cancelReason = null;
    this.runningFor = s;
    let timer: ReturnType<typeof setTimeout> | null = null;
    try {
      // The statement's time starts once the session can run it (not while a restarted thread reopens).
      await this.db.ready();
      if (s.statementTimeoutMs > 0 && !batch.copy) timer = setTimeout(() => this.cancel(s, STATEMENT_TIMEOUT), s.statementTimeoutMs);
      if (this.current !== s && !(await this.switchTo(s))) return this.release();
      if (s.generation !== this.generation) await this.remakeStatements(s, batch);
      // Outside any transaction: make PGlite's backend listen to what the clients listen to.
      if (this.listenDirty && statusBefore === I && batch.fresh && !batch.copy) await this.reconcileListens();
      await this.runBatch(s, batch, send, statusBefore);
      if (this.listenDirty && s.status === I && !s.midBatch && !s.copy) await this.reconcileListens();
      if (s.readTimeouts) await this.readTimeouts(s);
    } catch (err) {
      if (!(err instanceof SessionKilled)) throw err;
      await this.recover(s, batch, send, statusBefore);
    } finally {
      if (timer) clearTimeout(timer);
      this.runningFor = null;
      this.lastActivity = Date.now();
    }
  }

  // ---- groups: several idle clients' batches in one hand-over ------------------------------------

  /**
   * A batch that may share a hand-over with other clients' batches: extended-protocol messages up to
   * a Sync, from a client outside any transaction, whose statements cannot open a transaction block
   * or change session state (SELECT, INSERT, UPDATE, DELETE, WITH, VALUES, TABLE; no set_config, no
   * LISTEN). Each such batch is an implicit transaction of its own that its Sync ends, so running
   * several back to back in one call is what PostgreSQL would do with them one after another: an
   * error in one skips only to its own Sync.
   */
  private joinsGroup(s: MuxSession, batch: Batch): boolean {
    return (
      batch.joinable &&
      batch.fresh &&
      batch.endsWithSync &&
      !batch.copy &&
      !batch.setsConfig &&
      batch.replayAt < 0 &&
      batch.listenOps.length === 0 &&
      s.status === I &&
      !s.copy &&
      !s.skipToSync &&
      !s.dirty &&
      !s.readTimeouts &&
      !s.closed &&
      s.cancelReason === null &&
      s.generation === this.generation &&
      s.pendingListens.length === 0
    );
  }

  /**
   * The group `lead` (who now holds the session) runs: it and the batches waiting right behind it in
   * the queue that can join it (same role and settings), in queue order: done when all are answered.
   * Null when nobody joins.
   * Only the front of the queue is taken, so nobody is overtaken.
   */
  private takeGroup(lead: GroupMember): Promise<void> | null {
    const group = [lead];
    const resolvers: ((grant: Grant) => void)[] = [];
    let bytes = lead.batch.bytes;
    while (this.queue.length > 0 && group.length < MAX_GROUP) {
      const w = this.queue[0]!;
      const j = w.job;
      if (!j || !this.joinsGroup(j.s, j.batch) || j.s.key !== lead.s.key || bytes + j.batch.bytes > MAX_GROUP_BYTES) break;
      this.queue.shift();
      j.s.waiter = null;
      group.push(j);
      resolvers.push(w.resolve);
      bytes += j.batch.bytes;
    }
    if (group.length === 1) return null;
    this.runningGroup = new Set(group.map((m) => m.s));
    const done = this.step(() => this.runGroup(group));
    for (let i = 1; i < group.length; i++) group[i]!.s.grouped = done;
    for (const r of resolvers) r("grouped");
    return done;
  }

  /**
   * Runs a group's batches in one call to the database thread and gives each client its own part of
   * the answer (each part ends with that batch's ReadyForQuery). Never throws: a client whose batch
   * cannot be answered is ended.
   */
  private async runGroup(group: GroupMember[]): Promise<void> {
    const timers: ReturnType<typeof setTimeout>[] = [];
    let live: GroupMember[] = [];
    try {
      await this.db.ready();
      for (const m of group) {
        if (m.s.closed) continue; // gone while it waited: nothing of it runs
        if (m.s.cancelReason) this.answerCancelled(m.s, m.batch, m.send, m.s.cancelReason);
        else live.push(m);
      }
      if (live.length === 0) return;
      for (const m of live) if (m.s.statementTimeoutMs > 0) timers.push(setTimeout(() => this.cancel(m.s, STATEMENT_TIMEOUT), m.s.statementTimeoutMs));
      if (this.current !== live[0]!.s && !(await this.switchTo(live[0]!.s))) {
        // The same role and settings fail for every member alike (fail closed, as for one client).
        for (const m of live.slice(1)) m.s.control.terminate("could not set up the database session");
        live = [];
        return;
      }
      if (this.listenDirty) await this.reconcileListens();
      const parts: Uint8Array[] = [];
      let bytes = COPY_GUARD.length;
      for (const m of live) {
        parts.push(...m.batch.parts);
        bytes += m.batch.bytes;
      }
      parts.push(COPY_GUARD);
      const out = await this.db.exec(concatBytes(parts, bytes));
      const segments = splitAtReadyForQuery(out, live.length);
      if (!segments) {
        await this.db.restart();
        throw new SessionKilled("the database session stopped in the middle of an answer");
      }
      for (let i = 0; i < live.length; i++) {
        const m = live[i]!;
        this.execFor = { s: m.s, ops: [] };
        let answer: Uint8Array;
        try {
          answer = this.route(segments[i]!);
        } finally {
          this.execFor = null;
        }
        const { status, changesSettings } = scanOutput(answer);
        m.s.status = status;
        if (changesSettings) {
          m.s.dirty = true;
          m.s.readTimeouts = true;
          this.applied = null;
        }
        if (m.batch.unnamed !== undefined) this.unnamedOwner = m.batch.unnamed;
        m.send(answer);
        if (status !== I) m.s.control.terminate("a statement left a transaction open where none could be", "XX000");
      }
      live = [];
      this.lastActivity = Date.now();
      if (this.listenDirty) await this.reconcileListens();
    } catch (err) {
      this.groupLost(live, err);
    } finally {
      for (const t of timers) clearTimeout(t);
      this.runningGroup = null;
      this.lastActivity = Date.now();
      this.release();
    }
  }

  /**
   * The session ended under a group (a member's cancel or statement timeout, or the thread failing):
   * a member that was cancelled gets 57014; the others cannot know whether their batch ran (it may
   * have committed before the cancelled one started), so they are ended as by a crashed backend.
   */
  private groupLost(live: GroupMember[], err: unknown): void {
    if (err instanceof SessionKilled) {
      this.generation++;
      this.listenDirty = true; // a new backend listens to nothing
      this.current = null;
      this.applied = null;
      this.unnamedOwner = null;
    }
    const cancelled = live.some((m) => m.s.cancelReason);
    for (const m of live) {
      const reason = m.s.cancelReason;
      m.s.cancelReason = null;
      if (reason && err instanceof SessionKilled) {
        m.s.status = I;
        m.send(concatBytes([errorResponse("ERROR", reason.code, reason.message), readyForQuery("I")]));
      } else if (!(err instanceof SessionKilled)) m.s.control.terminate("internal error in Kiln's database session", "XX000");
      else if (cancelled)
        m.s.control.terminate("terminating connection because another client's statement, run in the same hand-over to the database, was cancelled; whether this client's last statements committed is unknown", "57P01");
      else m.s.control.terminate("terminating connection because the database session ended unexpectedly", "57P01");
    }
  }

  private async runBatch(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void, statusBefore: number): Promise<void> {
    // A COPY FROM STDIN that is a query of its own: answer CopyInResponse ourselves and run it once
    // with its data (PGlite needs all of it in one call). No savepoint, so COPY FREEZE after a
    // TRUNCATE in the same transaction works as in PostgreSQL.
    if (batch.copyPlan && !batch.copy) {
      const columns = batch.copyPlan.columns ?? (await this.columnCount(batch.copyPlan.table));
      if (columns !== null) {
        s.copy = { parts: batch.parts, data: [], sent: 1, savepoint: false };
        send(copyInResponse(batch.copyPlan.binary, columns));
        return;
      }
    }
    const copy = batch.copy;
    const savepoint = copy ? copy.savepoint : batch.copyStatement && statusBefore === T && batch.fresh;
    if (savepoint) await this.exec(simpleQuery("SAVEPOINT kiln_copy"));
    // (A COPY's statements are run more than once: only a plain batch's LISTENs are counted.)
    this.execFor = { s, ops: copy ? [] : batch.listenOps };
    let out: Uint8Array;
    try {
      out = copy ? await this.exec(concatBytes([...copy.parts, ...copy.data, COPY_GUARD])) : await this.execBatch(s, batch);
    } finally {
      this.execFor = null;
    }
    this.lastActivity = Date.now();

    // COPY FROM STDIN ran into the guard: PGlite needs the data within the same call. Undo the
    // attempt, pass its CopyInResponse on, collect the data (MuxSession.handle), then run it all again.
    const skip = copy ? copy.sent : 0;
    const { from, copyIn } = copyInResponses(out, skip);
    if (copyIn >= 0 && (savepoint || (statusBefore === I && (copy !== undefined || batch.fresh)))) {
      // In the extended protocol the client's Sync was swallowed by the COPY: end the attempt first.
      const ended = await this.exec(sync());
      if (savepoint) await this.exec(simpleQuery("ROLLBACK TO SAVEPOINT kiln_copy; RELEASE SAVEPOINT kiln_copy"));
      else if (ended[ended.length - 1] !== I) await this.exec(simpleQuery("ROLLBACK"));
      this.unnamedOwner = null;
      s.copy = { parts: copy?.parts ?? batch.parts, data: copy?.data ?? [], sent: skip + 1, savepoint };
      send(out.subarray(from, copyIn));
      return;
    }
    s.copy = null;
    if (savepoint) await this.exec(simpleQuery("RELEASE SAVEPOINT kiln_copy"));

    const { status, changesSettings, copyIn: enteredCopy } = scanOutput(out);
    // (A COPY FROM STDIN swallows the batch's Sync: no ReadyForQuery is owed then.)
    if (!status && batch.endsWithSync && !enteredCopy) {
      // PGlite stopped in the middle of its answer: the session's state is unknown. Start it afresh
      // and end this client, rather than wait for a ReadyForQuery that never comes.
      await this.db.restart();
      throw new SessionKilled("the database session stopped in the middle of an answer");
    }
    if (changesSettings || batch.setsConfig) {
      s.dirty = true;
      s.readTimeouts = true;
      this.applied = null;
    }
    if (status) {
      s.status = status;
      // Settings it changed live only in this session until captured; capture them now (outside a
      // transaction, where they are final), so a restart of the session does not lose them.
      if (status === I && s.dirty) await this.capture(s);
    }
    if (out.length > from) send(from ? out.subarray(from) : out);
    if (status === I) this.release();
  }

  /** Saves the settings `s`, the current client, has now. */
  private async capture(s: MuxSession): Promise<void> {
    const { rows, error, firstComplete } = firstResult(await this.exec(simpleQuery(captureSql(s.customNames))));
    this.unnamedOwner = null;
    if (error || !firstComplete) return;
    s.setSaved(rows, this.sessionUser);
    s.dirty = false;
    this.applied = s.key;
  }

  /**
   * A statement-management batch of `s` beside the idle holder: in a savepoint, with `s`'s settings.
   * False (nothing ran) when the holder is no longer idle in a healthy transaction.
   */
  private async runSide(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void): Promise<boolean> {
    if (!this.sideAllowed() || this.closed || s.closed) return false;
    const sql = [`SAVEPOINT ${SIDE_SAVEPOINT}`, ...this.resetSql(), ...s.init, ...restoreSql(s.saved)];
    const setUp = firstResult(await this.exec(simpleQuery(sql.join(";\n"))));
    let out: Uint8Array = EMPTY;
    if (!setUp.error) {
      if (s.generation !== this.generation) await this.remakeStatements(s, batch);
      out = await this.execBatch(s, batch);
    }
    await this.exec(simpleQuery(`ROLLBACK TO SAVEPOINT ${SIDE_SAVEPOINT}; RELEASE SAVEPOINT ${SIDE_SAVEPOINT}`));
    if (setUp.error) {
      s.control.terminate(`could not set up the database session: ${setUp.error}`);
      return true;
    }
    // The holder's transaction shows through the status byte; the client itself is in none.
    send(withStatus(out, I));
    return true;
  }

  /** Runs a client batch, with the COPY guard after it. */
  private async execBatch(s: MuxSession, batch: Batch): Promise<Uint8Array> {
    let out: Uint8Array;
    if (batch.replayAt >= 0 && this.unnamedOwner !== s && batch.replayParse) {
      // The client binds an unnamed statement it parsed in an earlier batch, and someone else's
      // query has replaced it since: parse it again, and hide the ParseComplete the client never asked for.
      const before = batch.parts.slice(0, batch.replayAt);
      const first = before.length ? await this.exec(concatBytes(before)) : EMPTY;
      const replayed = await this.exec(batch.replayParse);
      const isParseComplete = replayed.length === 5 && replayed[0] === B.parseComplete;
      const rest = await this.exec(concatBytes([...batch.parts.slice(batch.replayAt), COPY_GUARD]));
      out = concatBytes([first, isParseComplete ? EMPTY : replayed, rest]);
      this.unnamedOwner = s;
    } else {
      out = await this.exec(concatBytes([...batch.parts, COPY_GUARD], batch.bytes + COPY_GUARD.length));
    }
    if (batch.unnamed !== undefined) this.unnamedOwner = batch.unnamed;
    return out;
  }

  private async exec(bytes: Uint8Array): Promise<Uint8Array> {
    return this.route(await this.db.exec(bytes));
  }

  // ---- LISTEN / NOTIFY ----------------------------------------------------------------------------

  /**
   * Takes the NotificationResponses out of PGlite's answer and delivers them; for the client batch
   * running (`execFor`), follows its LISTEN/UNLISTEN statements through its transaction: they take
   * effect when it commits, as on PostgreSQL. A NotificationResponse only ever follows a commit.
   */
  private route(out: Uint8Array): Uint8Array {
    const ctx = this.execFor;
    const s = ctx?.s;
    let kept: Uint8Array[] | null = null;
    let last = 0;
    let at = 0;
    while (at + 5 <= out.length) {
      const type = out[at]!;
      const end = at + 1 + readInt32(out, at + 1);
      if (type === NOTIFICATION) {
        s?.endTransaction(true); // its LISTENs count for the notifications its commit sends
        this.deliver(out.subarray(at, end), s ?? null);
        (kept ??= []).push(out.subarray(last, at));
        last = end;
      } else if (s && (ctx.ops.length > 0 || s.pendingListens.length > 0)) {
        if (type === B.commandComplete) {
          const tag = fromUtf8(out.subarray(at + 5, end - 1));
          if (LISTEN_TAGS.has(tag)) {
            const op = ctx.ops.shift();
            if (op) s.pendingListens.push(op);
          } else if (tag === "COMMIT") s.endTransaction(true);
          else if (tag === "ROLLBACK") s.sawRollback = true;
        } else if (type === B.error) s.failed = true;
        else if (type === B.readyForQuery) {
          const status = out[at + 5];
          if (status === I) s.endTransaction(!s.failed && !s.sawRollback);
          else if (status === T && s.sawRollback) s.sawRollback = s.failed = false; // ROLLBACK TO SAVEPOINT
        }
      }
      at = end;
    }
    if (!kept) return out;
    kept.push(out.subarray(last));
    return concatBytes(kept);
  }

  /** One NotificationResponse to every client listening on its channel, with the sender's process id. */
  private deliver(note: Uint8Array, sender: MuxSession | null): void {
    const channelEnd = cstringEnd(note, 9);
    if (channelEnd < 0) return;
    const to = this.listeners.get(fromUtf8(note.subarray(9, channelEnd)));
    if (!to?.size) return;
    const copy = note.slice();
    const pid = sender?.processId;
    if (pid !== undefined) {
      copy[5] = (pid >>> 24) & 0xff;
      copy[6] = (pid >>> 16) & 0xff;
      copy[7] = (pid >>> 8) & 0xff;
      copy[8] = pid & 0xff;
    }
    for (const l of to) l.notify(copy);
  }

  /** `s` committed these LISTEN/UNLISTEN statements. */
  applyListens(s: MuxSession, ops: ListenOp[]): void {
    for (const op of ops) {
      const channels = op.channel === null ? [...s.listening] : [op.channel];
      for (const c of channels) {
        if (op.listen) {
          s.listening.add(c);
          let set = this.listeners.get(c);
          if (!set) this.listeners.set(c, (set = new Set()));
          set.add(s);
        } else {
          s.listening.delete(c);
          this.listeners.get(c)?.delete(s);
          if (this.listeners.get(c)?.size === 0) this.listeners.delete(c);
        }
      }
      // Its UNLISTEN ran on the shared backend: others may still want those channels.
      if (!op.listen) this.listenDirty = true;
    }
  }

  /** Makes PGlite's backend listen to exactly the channels some client listens to. Outside any transaction only. */
  private async reconcileListens(): Promise<void> {
    this.listenDirty = false;
    const { rows, error } = firstResult(await this.exec(simpleQuery("SELECT pg_catalog.pg_listening_channels()")));
    this.unnamedOwner = null;
    if (error) return;
    const have = new Set(rows.map((r) => r[0]!));
    const sql: string[] = [];
    for (const c of this.listeners.keys()) if (!have.has(c)) sql.push(`LISTEN ${sqlIdent(c)}`);
    for (const c of have) if (!this.listeners.has(c)) sql.push(`UNLISTEN ${sqlIdent(c)}`);
    if (sql.length) await this.exec(simpleQuery(sql.join(";")));
  }

  /** Columns a COPY without a column list expects, or null when the table does not resolve (let PostgreSQL say why). */
  private async columnCount(table: string): Promise<number | null> {
    const { rows, error } = firstResult(
      await this.exec(
        simpleQuery(
          `SELECT count(a.attnum) FROM pg_catalog.pg_attribute a WHERE a.attrelid = pg_catalog.to_regclass(${sqlLiteral(table)}) ` +
            `AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' HAVING pg_catalog.to_regclass(${sqlLiteral(table)}) IS NOT NULL`,
        ),
      ),
    );
    this.unnamedOwner = null;
    return error || rows.length === 0 ? null : Number(rows[0]![0]);
  }

  /**
   * The timeouts `s` has set for itself (after it ran SET or set_config, or asked for them at
   * startup), and its encoding: a client that switched away from UTF8 is ended before PGlite cuts an
   * answer short.
   */
  private async readTimeouts(s: MuxSession): Promise<void> {
    if (s.status === E) return; // nothing runs in an aborted transaction; read them after it ends
    const { rows, error } = firstResult(
      await this.exec(simpleQuery(`SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN (${WATCHED.map(sqlLiteral).join(", ")})`)),
    );
    this.unnamedOwner = null;
    if (error) return;
    s.readTimeouts = false;
    for (const [name, value] of rows) {
      if (name === "statement_timeout") s.statementTimeoutMs = Number(value) || 0;
      else if (name === "idle_in_transaction_session_timeout") s.idleTimeoutMs = Number(value) || 0;
      else if (name === "client_encoding" && value !== "UTF8") {
        await this.exec(simpleQuery("SET client_encoding TO 'UTF8'"));
        s.control.terminate(notUtf8(value ?? "").message, "22023");
      }
    }
  }

  // ---- cancelling ---------------------------------------------------------------------------------

  /**
   * Cancels what `s` is doing, as a CancelRequest does: a batch waiting for the session is answered
   * with the error at once; a running one restarts the session (PGlite cannot be interrupted).
   */
  cancel(s: MuxSession, reason: CancelReason): void {
    if (s.closed) return;
    s.cancelReason = reason;
    if (this.cancelWait(s, "cancelled")) return;
    if (this.runningFor === s || this.runningGroup?.has(s)) void this.db.restart().catch(() => {});
  }

  private answerCancelled(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void, reason: CancelReason): void {
    s.cancelReason = null;
    s.copy = null;
    send(errorResponse("ERROR", reason.code, reason.message));
    if (batch.endsWithSync) send(readyForQuery(statusChar(s.status)));
    else s.skipToSync = true;
  }

  /**
   * After the session was killed under `s` (its cancel, or the thread failing): a new session with
   * nobody's state. `s` gets the error; if it was in a transaction block it holds an aborted one,
   * as a cancelled PostgreSQL backend would, until it rolls back.
   */
  private async recover(s: MuxSession, batch: Batch, send: (data: Uint8Array) => void, statusBefore: number): Promise<void> {
    this.generation++;
    this.listenDirty = true; // a new backend listens to nothing
    this.current = null;
    this.applied = null;
    this.unnamedOwner = null;
    const reason = s.cancelReason;
    s.cancelReason = null;
    s.copy = null;
    if (!reason) {
      // Not a cancel: the database thread died. The client cannot know what happened to its work.
      s.control.terminate("terminating connection because the database session ended unexpectedly", "57P01");
      if (this.holder === s) {
        s.status = I;
        this.release();
      }
      return;
    }
    send(errorResponse("ERROR", reason.code, reason.message));
    s.status = I;
    if (statusBefore !== I && (await this.switchTo(s))) {
      // Its statements first: nothing can be prepared inside the aborted transaction it gets back.
      await this.remakeStatements(s, null);
      await this.exec(simpleQuery("BEGIN; DO $$ BEGIN RAISE EXCEPTION 'cancelled'; END $$"));
      s.status = E;
    }
    if (batch.endsWithSync) send(readyForQuery(statusChar(s.status)));
    else s.skipToSync = true;
    if (s.status === I && this.holder === s) this.release();
  }

  /** Prepares `s`'s named statements again on a session that lost them (not those `batch` parses itself). */
  private async remakeStatements(s: MuxSession, batch: Batch | null): Promise<void> {
    s.generation = this.generation;
    const parses = [...s.statements].filter(([name]) => !batch?.parsed.includes(name)).map(([, parse]) => parse);
    if (parses.length) await this.exec(concatBytes([...parses, sync()]));
  }

  // ---- switching owners -------------------------------------------------------------------------

  private async setUp(): Promise<Record<string, string>> {
    await this.exec(simpleQuery("RESET ROLE; RESET ALL"));
    const names = REPORTED.map(sqlLiteral).join(", ");
    const { rows, error } = firstResult(
      await this.exec(
        simpleQuery(
          `SELECT 'session_user', session_user::text UNION ALL ` +
            `SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN (${names})`,
        ),
      ),
    );
    if (error) throw new Error(`could not read the database's settings: ${error}`);
    const defaults: Record<string, string> = {};
    for (const [name, value] of rows) defaults[name!] = value ?? "";
    this.sessionUser = defaults.session_user!;
    delete defaults.session_user;
    this.applied = DEFAULT_KEY;
    return defaults;
  }

  /**
   * Gives the session `to`'s state (null: defaults). One simple query: capture the outgoing client's
   * settings if it may have changed them, reset, run `to`'s init, restore `to`'s settings. Skipped
   * when the session already holds exactly that state. Returns false if `to` could not be set up;
   * it is then terminated (fail closed: never run a client with someone else's role).
   */
  private async switchTo(to: MuxSession | null): Promise<boolean> {
    const from = this.current && this.current.dirty && !this.current.closed ? this.current : null;
    const key = to ? to.key : DEFAULT_KEY;
    // A client that changed settings and left before they were captured leaves them in the session:
    // never skip the reset then (createdb's set_config('search_path', '', false) reached the next client).
    const leftBehind = Boolean(this.current?.dirty && this.current.closed);
    if (!from && !leftBehind && this.applied === key) {
      this.current = to;
      return true;
    }
    const sql: string[] = [];
    if (from) sql.push(captureSql(from.customNames));
    sql.push(...this.resetSql());
    if (to) sql.push(...to.init, ...restoreSql(to.saved));
    const out = await this.exec(simpleQuery(sql.join(";\n")));
    this.unnamedOwner = null;
    const { rows, error, firstComplete } = firstResult(out);
    if (from && firstComplete) {
      from.setSaved(rows, this.sessionUser);
      from.dirty = false;
    }
    if (error) {
      // One implicit transaction, so none of it took effect: fall back to plain defaults.
      const reset = firstResult(await this.exec(simpleQuery(this.resetSql().join(";"))));
      this.current = null;
      this.applied = reset.error ? null : DEFAULT_KEY;
      if (!to) throw new Error(`could not reset the database session: ${error}`);
      to.control.terminate(`could not set up the database session: ${error}`);
      return false;
    }
    this.current = to;
    this.applied = key;
    return true;
  }

  private resetSql(): string[] {
    // RESET ALL leaves role and session authorization alone; RESET SESSION AUTHORIZATION does nothing in PGlite.
    return [`SET SESSION AUTHORIZATION ${sqlIdent(this.sessionUser)}`, "RESET ROLE", "RESET ALL"];
  }

  // ---- closing a client (called by MuxSession.close) ---------------------------------------------

  async cleanUp(s: MuxSession): Promise<void> {
    this.sessions.delete(s);
    if (s.listening.size) {
      this.applyListens(s, [{ listen: false, channel: null }]); // PGlite's backend unlistens at the next reconcile
    }
    s.idle(false);
    this.cancelWait(s, "gone");
    await s.busy?.catch(() => {});
    const held = this.holder === s;
    if (!held) {
      if (this.unnamedOwner === s) this.unnamedOwner = null;
      if (s.statements.size === 0 || s.generation !== this.generation) return;
      if (!this.tryTake(s) && (await this.wait(s, false)) !== "owner") return;
    }
    try {
      await this.step(async () => {
        if (this.db.closed) return;
        if (held) {
          // A Sync ends whatever extended-protocol batch it left open; then roll back what it left.
          const out = await this.exec(sync());
          if (out[out.length - 1] !== I) {
            await this.exec(simpleQuery("ROLLBACK"));
            this.unnamedOwner = null;
          }
        }
        if (s.statements.size && s.generation === this.generation)
          await this.exec(concatBytes([...[...s.statements.keys()].map(closeStatement), sync()]));
        if (this.unnamedOwner === s) this.unnamedOwner = null;
      });
    } catch (err) {
      if (!(err instanceof SessionKilled)) throw err;
    } finally {
      this.release();
    }
  }
}

interface CancelReason {
  code: string;
  message: string;
}
const CANCELLED_BY_USER: CancelReason = { code: "57014", message: "canceling statement due to user request" };
const STATEMENT_TIMEOUT: CancelReason = { code: "57014", message: "canceling statement due to statement timeout" };

/**
 * A group's answer cut after each of its `count` batches' ReadyForQuery; null if some is missing.
 * (What follows the last one, the COPY guard's nothing, goes to nobody.)
 */
function splitAtReadyForQuery(out: Uint8Array, count: number): Uint8Array[] | null {
  const parts: Uint8Array[] = [];
  let start = 0;
  let at = 0;
  while (at + 5 <= out.length && parts.length < count) {
    const end = at + 1 + readInt32(out, at + 1);
    if (out[at] === B.readyForQuery) {
      // The whole answer as it is when it is one batch's (a view made of a fresh buffer costs JSC an ArrayBuffer).
      parts.push(start === 0 && end === out.length ? out : out.subarray(start, end));
      start = end;
    }
    at = end;
  }
  return parts.length === count ? parts : null;
}

const statusChar = (status: number): "I" | "T" | "E" => (status === T ? "T" : status === E ? "E" : "I");

/** `out` with every ReadyForQuery status set to `status`. */
function withStatus(out: Uint8Array, status: number): Uint8Array {
  let at = 0;
  while (at + 5 <= out.length) {
    if (out[at] === B.readyForQuery) out[at + 5] = status;
    at += 1 + readInt32(out, at + 1);
  }
  return out;
}

const keyOf = (init: string[], saved: Map<string, string>): string =>
  JSON.stringify([init, [...saved].sort(([a], [b]) => (a < b ? -1 : 1))]);
const DEFAULT_KEY = keyOf([], new Map());

/** A COPY FROM STDIN in progress: the batch that started it and the client's copy messages since. */
interface CopyIn {
  parts: Uint8Array[];
  data: Uint8Array[];
  /** CopyInResponses already passed to the client (a simple query may hold several COPYs). */
  sent: number;
  /** The client is in a transaction block; each attempt runs inside a savepoint. */
  savepoint: boolean;
}

/** Messages of one client batch, renamed and ready for PGlite. */
interface Batch {
  parts: Uint8Array[];
  bytes: number;
  /** It starts at a message boundary (not after a Flush). */
  fresh: boolean;
  /** It ends with Sync or a simple Query: the client expects a ReadyForQuery. */
  endsWithSync: boolean;
  /** Only Parse, Describe and Close of statements, and Sync: it may run beside an idle holder. */
  side: boolean;
  /** A simple query that starts with COPY and mentions STDIN: within a transaction, attempts run in a savepoint. */
  copyStatement: boolean;
  /** A simple query that is exactly one COPY FROM STDIN: announced without a trial run. */
  copyPlan: CopyPlan | null;
  /** Set when this batch finishes a COPY FROM STDIN. */
  copy?: CopyIn;
  /** Index of a Bind/Describe of the unnamed statement before any Parse of it in this batch; -1 if none. */
  replayAt: number;
  /** The client's earlier Parse of the unnamed statement, for `replayAt`. */
  replayParse: Uint8Array | null;
  /** Who owns the unnamed statement after this batch, if the batch changes that. */
  unnamed?: MuxSession | null;
  /** The SQL calls set_config(): the client's settings may change without a SET command tag. */
  setsConfig: boolean;
  /** Server-side names of the statements it parses. */
  parsed: string[];
  /** Its LISTEN / UNLISTEN / DISCARD ALL statements, in the order their command tags will come. */
  listenOps: ListenOp[];
  /** Extended protocol only, and every statement it binds is plain (`isPlainSql`): it may join a group. */
  joinable: boolean;
}

const newBatch = (): Batch => ({
  parts: [],
  bytes: 0,
  fresh: true,
  endsWithSync: false,
  side: true,
  copyStatement: false,
  copyPlan: null,
  replayAt: -1,
  replayParse: null,
  setsConfig: false,
  parsed: [],
  listenOps: [],
  joinable: true,
});

class MuxSession implements WireBackend {
  /** Server-side names of this client's named statements and their Parse messages (to make them again). */
  readonly statements = new Map<string, Uint8Array>();
  /** Settings to restore when it takes the session back (startup parameters at first). */
  saved = new Map<string, string>();
  key: string;
  /** It may have changed settings since they were last captured. */
  dirty = false;
  /** Custom (dotted) settings its SQL names; PostgreSQL lists them nowhere, so capture asks for each. */
  readonly customNames = new Set<string>();
  status = I;
  midBatch = false;
  copy: CopyIn | null = null;
  closed = false;
  waiter: Waiter | null = null;
  busy: Promise<void> | null = null;
  /** Its batch runs in another client's group: done when answered. */
  grouped: Promise<void> | null = null;
  generation = 0;
  /** Its timeouts may have changed: read them after the batch. */
  readTimeouts: boolean;
  statementTimeoutMs = 0;
  /** Its own idle_in_transaction_session_timeout (0: Kiln's default applies). */
  idleTimeoutMs = 0;
  cancelReason: CancelReason | null = null;
  /** An error ended its extended-protocol batch before Sync: drop messages until Sync, then answer it. */
  skipToSync = false;
  /** Channels its committed LISTENs cover. */
  readonly listening = new Set<string>();
  /** LISTEN/UNLISTEN run in its open transaction: they take effect when it commits. */
  pendingListens: ListenOp[] = [];
  /** Its open transaction saw an error / a ROLLBACK (while it had pending LISTENs). */
  failed = false;
  sawRollback = false;
  /** Between a message that needs an answer and the end of that answer. */
  private answering = false;
  /** Notifications for it held until it is idle outside a transaction (then sent before its ReadyForQuery 'I'). */
  private notes: Uint8Array[] = [];
  private noteBytes = 0;
  /** The extended-protocol statement names whose SQL is a LISTEN statement, and what it does. */
  private readonly listenStatements = new Map<string, ListenOp[]>();
  private unnamedListenOps: ListenOp[] = [];

  private readonly prefix: Uint8Array;
  private readonly longNames = new Map<string, string>();
  /** Server-side names of its statements whose SQL is plain (`isPlainSql`). */
  private readonly plainStatements = new Set<string>();
  /** Its unnamed statement's SQL is plain. */
  private unnamedPlain = false;
  /** Server-side names of its statements whose SQL calls set_config(). */
  private readonly settingStatements = new Set<string>();
  private unnamedParse: Uint8Array | null = null;
  private batch = newBatch();
  private closing: Promise<void> | null = null;
  private idleTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(
    private readonly mux: PgliteSessionMux,
    private readonly id: number,
    readonly init: string[],
    private readonly client: WireClient,
    readonly control: WireControl,
  ) {
    this.prefix = utf8(`c${id}_`);
    for (const [name, value] of startupSettings(client.params)) this.saved.set(name, value);
    this.key = keyOf(init, this.saved);
    this.readTimeouts = TIMEOUTS.some((t) => this.saved.has(t));
  }

  async parameters(): Promise<Record<string, string>> {
    const params = { ...(await this.mux.defaults) };
    for (const [name, value] of this.saved) {
      const reported = Object.keys(params).find((k) => k.toLowerCase() === name.toLowerCase());
      if (reported) params[reported] = value;
    }
    params.application_name = this.client.applicationName;
    return params;
  }

  get processId(): number | undefined {
    return this.client.processId;
  }

  /**
   * A run of complete messages as they arrived together (the listener's `serveRuns`): the
   * extended-protocol messages that only get buffered until Sync cost no promise each; the message
   * that needs an answer goes through `handle`, and the rest of the run waits for it.
   */
  handleRun(run: Uint8Array, sendRaw: (data: Uint8Array) => void): void | Promise<void> {
    let at = 0;
    const next = (): void | Promise<void> => {
      while (at < run.length) {
        const end = at + 1 + readInt32(run, at + 1);
        const message = at === 0 && end === run.length ? run : run.subarray(at, end);
        at = end;
        if (!this.buffered(message)) return this.handle(message, sendRaw).then(next);
      }
    };
    return next();
  }

  /** Buffers a Parse, Bind, Describe, Execute or Close that waits for its Sync, as `handle` would; false if `handle` must see it. */
  private buffered(message: Uint8Array): boolean {
    const type = message[0];
    if (type !== F.parse && type !== F.bind && type !== F.describe && type !== F.execute && type !== F.close) return false;
    if (this.closed || this.copy || this.skipToSync || this.batch.bytes + message.length + MAX_NAME >= MAX_BATCH_BYTES) return false;
    this.add(message);
    return true;
  }

  async handle(message: Uint8Array, sendRaw: (data: Uint8Array) => void): Promise<void> {
    if (this.closed) return;
    const type = message[0];
    if (type === F.terminate) return;
    // Held notifications go out just before the ReadyForQuery 'I' that ends the answer, as PostgreSQL sends them.
    const send = (data: Uint8Array) => sendRaw(this.notes.length ? this.withNotes(data) : data);
    if (!this.copy && (type === COPY_DATA || type === COPY_DONE || type === COPY_FAIL)) {
      // Outside COPY FROM STDIN PostgreSQL ignores these (a client may still be sending after a
      // failed COPY; postgres.js sends a CopyFail after its COPY ended): never the start of a batch.
      return;
    }
    if (type === F.flush && this.batch.parts.length === 0 && !this.copy) return; // nothing buffered: nothing to flush
    this.answering = true;
    try {
      await this.handleMessage(type!, message, send);
    } finally {
      this.answering = false;
      if (this.notes.length && this.idleOutside()) this.flushNotes();
    }
  }

  private async handleMessage(type: number, message: Uint8Array, send: (data: Uint8Array) => void): Promise<void> {
    if (this.skipToSync) {
      if (type !== F.sync) return;
      this.skipToSync = false;
      this.midBatch = false;
      this.batch = newBatch();
      send(readyForQuery(statusChar(this.status)));
      return;
    }
    let batch: Batch;
    if (this.copy) {
      // PostgreSQL ignores Flush and Sync during COPY FROM STDIN; anything but data ends it.
      this.copy.data.push(message);
      if (type === COPY_DATA || type === F.flush || type === F.sync) return this.idle(true);
      // No ReadyForQuery is owed here for a COPY begun in the extended protocol (that waits for a Sync).
      batch = { ...newBatch(), side: false, endsWithSync: false, copy: this.copy };
    } else {
      this.add(message);
      const buffered = type === F.parse || type === F.bind || type === F.describe || type === F.execute || type === F.close;
      if (buffered && this.batch.bytes < MAX_BATCH_BYTES) return;
      batch = this.batch;
      batch.fresh = !this.midBatch;
      batch.endsWithSync = type === F.sync || type === F.query;
      if (type !== F.sync) batch.side = false;
      this.batch = newBatch();
      // Held across Flush: the implicit transaction stays open until Sync.
      this.midBatch = type !== F.sync && type !== F.query;
    }
    this.busy = this.mux.run(this, batch, send);
    await this.busy;
  }

  /** Idle between transactions, nothing buffered: where PostgreSQL sends a notification at once. */
  private idleOutside(): boolean {
    return !this.answering && this.status === I && !this.midBatch && !this.copy && !this.skipToSync && this.batch.parts.length === 0;
  }

  /** A NotificationResponse for it: now if it is idle outside a transaction, else held until it is. */
  notify(note: Uint8Array): void {
    if (this.closed) return;
    if (this.idleOutside() && this.control.send) return this.control.send(note);
    this.notes.push(note);
    this.noteBytes += note.length;
    if (this.noteBytes > MAX_HELD_NOTIFICATIONS_BYTES) {
      this.notes = [];
      this.noteBytes = 0;
      this.control.terminate("too many notifications held for this client while it stays in a transaction", "54000");
    }
  }

  private flushNotes(): void {
    if (!this.control.send) return;
    const notes = this.notes;
    this.notes = [];
    this.noteBytes = 0;
    this.control.send(concatBytes(notes));
  }

  /** `data` with the held notifications put before its final ReadyForQuery 'I', if it ends with one. */
  private withNotes(data: Uint8Array): Uint8Array {
    const n = data.length;
    if (n < 6 || data[n - 6] !== B.readyForQuery || data[n - 1] !== I || readInt32(data, n - 5) !== 5) return data;
    const notes = this.notes;
    this.notes = [];
    this.noteBytes = 0;
    return concatBytes([data.subarray(0, n - 6), ...notes, data.subarray(n - 6)]);
  }

  /** Its transaction ended: its LISTEN/UNLISTEN statements take effect if it committed. */
  endTransaction(committed: boolean): void {
    const ops = this.pendingListens;
    this.pendingListens = [];
    this.failed = this.sawRollback = false;
    if (!committed || ops.length === 0) return;
    this.mux.applyListens(this, ops);
    // Notifications held for channels it no longer listens to are not delivered (PostgreSQL checks on reading them).
    if (this.notes.length && ops.some((op) => !op.listen)) {
      this.notes = this.notes.filter((n) => this.listening.has(fromUtf8(n.subarray(9, cstringEnd(n, 9)))));
      this.noteBytes = this.notes.reduce((t, n) => t + n.length, 0);
    }
  }

  /** Asks for the statement it runs (or waits to run) to be cancelled: a CancelRequest. */
  cancel(): void {
    this.mux.cancel(this, CANCELLED_BY_USER);
  }

  holds(): boolean {
    return this.mux.holderIs(this);
  }

  /** Arms (or disarms) the idle-in-transaction timer while it holds the session and sends nothing. */
  idle(on: boolean): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
    const ms = this.idleTimeoutMs || this.mux.options.idleInTransactionTimeoutMs;
    if (!on || this.closed || ms <= 0 || !this.holds()) return;
    this.idleTimer = setTimeout(() => {
      if (this.holds()) this.control.terminate("terminating connection due to idle-in-transaction timeout", "25P03");
    }, ms);
    this.idleTimer.unref?.();
  }

  close(): Promise<void> {
    this.closed = true;
    this.idle(false);
    this.closing ??= this.mux.cleanUp(this);
    return this.closing;
  }

  setSaved(rows: (string | null)[][], sessionUser: string): void {
    this.saved = new Map();
    for (const [name, value] of rows) {
      // An empty value is a setting too (createdb and pg_dump run set_config('search_path', '', false));
      // only a custom (dotted) name read back as '' is one nobody set in this session.
      if (!name || value === null || (value === "" && name.includes("."))) continue;
      if (name === "role" && value === "none") continue;
      if (name === "session_authorization" && value === sessionUser) continue;
      this.saved.set(name, value);
    }
    this.key = keyOf(this.init, this.saved);
  }

  /** Buffers one message, renaming named statements and noting what the batch does. */
  private add(m: Uint8Array): void {
    const b = this.batch;
    const type = m[0];
    let out = m;
    if (type === F.parse) {
      const end = cstringEnd(m, 5);
      let server: string | null = null;
      if (end === 5) {
        this.unnamedParse = m;
        b.unnamed = this;
      } else {
        out = this.renamed(m, 5, end);
        server = fromUtf8(out.subarray(5, cstringEnd(out, 5)));
        this.statements.set(server, out);
        b.parsed.push(server);
      }
      if (this.noteSql(m, end + 1) && server) this.settingStatements.add(server);
      const plain = isPlainSql(m, end + 1);
      if (!server) this.unnamedPlain = plain;
      else if (plain) this.plainStatements.add(server);
      else this.plainStatements.delete(server);
      const ops = mayChangeListens(m, end + 1) ? listenOps(fromUtf8(m.subarray(end + 1, cstringEnd(m, end + 1)))) : [];
      if (!server) this.unnamedListenOps = ops;
      else if (ops.length) this.listenStatements.set(server, ops);
      else this.listenStatements.delete(server);
    } else if (type === F.bind) {
      b.side = false;
      const portalEnd = cstringEnd(m, 5);
      const end = cstringEnd(m, portalEnd + 1);
      if (end === portalEnd + 1) {
        this.usesUnnamed(b);
        b.listenOps.push(...this.unnamedListenOps);
        if (!this.unnamedPlain) b.joinable = false;
      } else {
        out = this.renamed(m, portalEnd + 1, end);
        const server = fromUtf8(out.subarray(portalEnd + 1, cstringEnd(out, portalEnd + 1)));
        if (!this.plainStatements.has(server)) b.joinable = false;
        if (this.settingStatements.size || this.listenStatements.size) {
          if (this.settingStatements.has(server)) b.setsConfig = true;
          b.listenOps.push(...(this.listenStatements.get(server) ?? []));
        }
      }
    } else if ((type === F.describe || type === F.close) && m[5] === 0x53 /* S */) {
      const end = cstringEnd(m, 6);
      if (end === 6) {
        if (type === F.describe) this.usesUnnamed(b);
      } else {
        out = this.renamed(m, 6, end);
        if (type === F.close) this.statements.delete(fromUtf8(out.subarray(6, cstringEnd(out, 6))));
      }
    } else if (type === F.query) {
      b.side = false;
      b.joinable = false;
      this.unnamedPlain = false;
      this.noteSql(m, 5);
      b.copyStatement = isCopyFromStdin(m);
      if (b.copyStatement) b.copyPlan = parseCopyFromStdin(fromUtf8(m.subarray(5, m.length - 1)));
      if (mayChangeListens(m, 5)) b.listenOps.push(...listenOps(fromUtf8(m.subarray(5, cstringEnd(m, 5)))));
      // A simple query drops the unnamed statement.
      this.unnamedParse = null;
      this.unnamedListenOps = [];
      b.unnamed = null;
    } else if (type !== F.sync) {
      b.side = false;
      if (type !== F.execute && type !== F.describe && type !== F.close) b.joinable = false;
    }
    b.parts.push(out);
    b.bytes += out.length;
  }

  private usesUnnamed(b: Batch): void {
    if (b.replayAt < 0 && b.unnamed === undefined && this.unnamedParse) {
      b.replayAt = b.parts.length;
      b.replayParse = this.unnamedParse;
    }
  }

  /**
   * Looks at SQL text for what changes settings without a SET command tag (set_config) and for
   * custom setting names. Cheap unless the text contains "set". Returns whether it may call
   * set_config for the session (not only for the transaction).
   */
  private noteSql(m: Uint8Array, from: number): boolean {
    if (!containsSet(m, from)) return false;
    const sql = fromUtf8(m.subarray(from, cstringEnd(m, from)));
    for (const match of sql.matchAll(/set_config\s*\(\s*'((?:[^']|'')*)'/gi)) this.noteName(match[1]!.replace(/''/g, "'"));
    for (const match of sql.matchAll(/\b(?:re)?set\s+(?:session\s+|local\s+)?("?[a-z_][\w$]*"?\s*\.\s*"?[\w$.]+"?)/gi)) this.noteName(match[1]!);
    const calls = callsSessionSetConfig(sql);
    if (calls) this.batch.setsConfig = true;
    return calls;
  }

  private noteName(name: string): void {
    const n = name.replace(/["\s]/g, "").toLowerCase();
    if (n.includes(".") && /^[\w$.]+$/.test(n)) this.customNames.add(n);
  }

  /** `m` with the statement name at [start, end) replaced by this client's server-side name. */
  private renamed(m: Uint8Array, start: number, end: number): Uint8Array {
    const name = m.subarray(start, end);
    let server: Uint8Array;
    if (this.prefix.length + name.length <= MAX_NAME) {
      server = new Uint8Array(this.prefix.length + name.length);
      server.set(this.prefix);
      server.set(name, this.prefix.length);
    } else {
      // Too long to prefix without truncation: a short alias (the '~' keeps it apart from prefixed names).
      const key = fromUtf8(name);
      let alias = this.longNames.get(key);
      if (!alias) this.longNames.set(key, (alias = `c${this.id}~${this.longNames.size}`));
      server = utf8(alias);
    }
    const out = new Uint8Array(m.length - name.length + server.length);
    out.set(m.subarray(0, start));
    out.set(server, start);
    out.set(m.subarray(end), start + server.length);
    const len = out.length - 1;
    out[1] = len >>> 24;
    out[2] = (len >>> 16) & 0xff;
    out[3] = (len >>> 8) & 0xff;
    out[4] = len & 0xff;
    return out;
  }
}

const PLAIN_SQL = /^(?:\s|\(|--[^\n]*\n|\/\*[\s\S]*?\*\/)*(?:select|insert|update|delete|with|values|table)\b/i;

/**
 * Whether the SQL (a C string from `from`) starts with SELECT, INSERT, UPDATE, DELETE, WITH, VALUES
 * or TABLE: a statement that can neither open or end a transaction block nor run a utility command
 * (SET, LISTEN, COPY, PREPARE, ...). Several statements in one Parse are an error in PostgreSQL.
 */
function isPlainSql(m: Uint8Array, from: number): boolean {
  const end = cstringEnd(m, from);
  return end > from && PLAIN_SQL.test(fromUtf8(m.subarray(from, Math.min(end, from + 512))));
}

/** Whether the C string from `from` contains "set" in any case. */
function containsSet(m: Uint8Array, from: number): boolean {
  for (let i = from; i + 2 < m.length && m[i] !== 0; i++) {
    if ((m[i]! | 0x20) === 0x73 && (m[i + 1]! | 0x20) === 0x65 && (m[i + 2]! | 0x20) === 0x74) return true;
  }
  return false;
}

/**
 * Whether some set_config() call in `sql` may be session-level: its last argument is not a literal
 * `true`. PostgREST-style code sets its claims per transaction on every request; capturing settings
 * after each of those would cost ~0.5 ms a switch for nothing. Anything it cannot read counts as yes.
 */
export function callsSessionSetConfig(sql: string): boolean {
  const call = /set_config\s*\(/gi;
  while (call.exec(sql)) {
    let depth = 1;
    let lastArg = call.lastIndex;
    let i = call.lastIndex;
    for (; i < sql.length && depth > 0; i++) {
      const c = sql[i];
      if (c === "'" || c === '"') {
        const close = sql.indexOf(c, i + 1); // a doubled quote just reopens on the next character
        if (close < 0) return true;
        i = close;
      } else if (c === "(") depth++;
      else if (c === ")") depth--;
      else if (c === "," && depth === 1) lastArg = i + 1;
    }
    if (depth > 0 || !/^\s*true\s*$/i.test(sql.slice(lastArg, i - 1))) return true;
  }
  return false;
}

/** What a COPY FROM STDIN needs announced: its table, the number of columns it lists (null: all of them), the format. */
export interface CopyPlan {
  table: string;
  columns: number | null;
  binary: boolean;
}

const IDENT = String.raw`(?:"(?:[^"]|"")+"|[A-Za-z_\u0080-\uffff][\w$\u0080-\uffff]*)`;
const COPY_FROM_STDIN = new RegExp(
  String.raw`^(?:\s|--[^\n]*\n|/\*[\s\S]*?\*/)*copy\s+(?:only\s+)?(${IDENT}(?:\s*\.\s*${IDENT}){0,2})\s*(\(\s*${IDENT}(?:\s*,\s*${IDENT})*\s*\))?\s*from\s+stdin\b([^;]*?)[\s;]*$`,
  "i",
);

/**
 * A simple query that is exactly one `COPY table [(columns)] FROM STDIN [options]`, read well enough
 * to answer its CopyInResponse: anything else (several statements, a query in the options) is null.
 */
export function parseCopyFromStdin(sql: string): CopyPlan | null {
  const m = COPY_FROM_STDIN.exec(sql);
  if (!m || /['"]/.test(m[3]!.replace(/'(?:[^']|'')*'/g, ""))) return null;
  const options = m[3]!.replace(/'(?:[^']|'')*'/g, (q) => (/^'binary'$/i.test(q) ? "binary" : "''"));
  const columns = m[2] ? (m[2].match(new RegExp(IDENT, "g")) ?? []).length : null;
  return { table: m[1]!, columns, binary: /\bbinary\b/i.test(options) };
}

/** A simple query whose first statement is COPY and which mentions STDIN (cheap; only decides on a savepoint). */
function isCopyFromStdin(query: Uint8Array): boolean {
  const sql = fromUtf8(query.subarray(5, query.length - 1));
  return /^(?:\s|--[^\n]*\n|\/\*[\s\S]*?\*\/)*copy\b/i.test(sql) && /\bstdin\b/i.test(sql);
}

/**
 * In PGlite's answer: where the part to pass on starts (after the first `skip` CopyInResponses, which
 * the client has already had) and the end of the next CopyInResponse the COPY guard failed (-1: none).
 */
function copyInResponses(out: Uint8Array, skip: number): { from: number; copyIn: number } {
  let from = 0;
  let seen = 0;
  let at = 0;
  while (at + 5 <= out.length) {
    const end = at + 1 + readInt32(out, at + 1);
    if (out[at] === COPY_IN_RESPONSE) {
      if (seen++ < skip) from = end;
      else if (out[end] === B.error) return { from, copyIn: end };
    }
    at = end;
  }
  return { from, copyIn: -1 };
}

const TAG_SET = utf8("SET\0");
const TAG_RESET = utf8("RESET\0");
const TAG_DISCARD = utf8("DISCARD ");
const TAG_DO = utf8("DO\0");
const TAG_CALL = utf8("CALL\0");

function startsWith(b: Uint8Array, at: number, prefix: Uint8Array): boolean {
  for (let i = 0; i < prefix.length; i++) if (b[at + i] !== prefix[i]) return false;
  return true;
}

/**
 * The last ReadyForQuery status in PGlite's answer (0 if none), whether a command that can change
 * session settings completed (SET, RESET, DISCARD, and DO / CALL, whose bodies may SET), and whether
 * a COPY FROM STDIN began.
 */
function scanOutput(out: Uint8Array): { status: number; changesSettings: boolean; copyIn: boolean } {
  let status = 0;
  let changesSettings = false;
  let copyIn = false;
  let at = 0;
  while (at + 5 <= out.length) {
    const type = out[at]!;
    if (type === B.readyForQuery) status = out[at + 5]!;
    else if (type === COPY_IN_RESPONSE) copyIn = true;
    else if (type === B.commandComplete && !changesSettings) {
      const t = at + 5;
      changesSettings =
        startsWith(out, t, TAG_SET) || startsWith(out, t, TAG_RESET) || startsWith(out, t, TAG_DISCARD) || startsWith(out, t, TAG_DO) || startsWith(out, t, TAG_CALL);
    }
    at += 1 + readInt32(out, at + 1);
  }
  return { status, changesSettings, copyIn };
}

/** Session-level settings (`source = 'session'`), role, session authorization and the custom ones named. */
function captureSql(customNames: Set<string>): string {
  let sql =
    "SELECT name, setting FROM pg_catalog.pg_settings WHERE source = 'session'" +
    " UNION ALL SELECT 'session_authorization', pg_catalog.current_setting('session_authorization')" +
    " UNION ALL SELECT 'role', pg_catalog.current_setting('role')";
  if (customNames.size)
    sql += ` UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[${[...customNames].map(sqlLiteral).join(", ")}]::text[]) n`;
  return sql;
}

/** set_config for each saved setting; session authorization and role last, so the others are set with the init's privileges. */
function restoreSql(saved: Map<string, string>): string[] {
  if (saved.size === 0) return [];
  const rank = (n: string) => (n === "session_authorization" ? 1 : n === "role" ? 2 : 0);
  const calls = [...saved]
    .sort(([a], [b]) => rank(a) - rank(b))
    .map(([n, v]) => `pg_catalog.set_config(${sqlLiteral(n)}, ${sqlLiteral(v)}, false)`);
  return [`SELECT ${calls.join(", ")}`];
}

/** The settings a startup packet asks for: its parameters, and `-c name=value` / `--name=value` in `options`. */
export function startupSettings(params: Record<string, string>): Map<string, string> {
  const out = new Map<string, string>();
  // Setting names are case-insensitive in PostgreSQL (DateStyle, datestyle); `user`, `database`, `options` are not.
  for (const [name, value] of Object.entries(params)) if (!NOT_SETTINGS.has(name) && !name.startsWith("_pq_.")) out.set(name.toLowerCase(), value);
  const words = (params.options ?? "").match(/(?:\\.|\S)+/g)?.map((w) => w.replace(/\\(.)/g, "$1")) ?? [];
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    const setting = w === "-c" ? words[++i] : w.startsWith("-c") ? w.slice(2) : w.startsWith("--") ? w.slice(2) : undefined;
    const eq = setting?.indexOf("=") ?? -1;
    if (setting && eq > 0) out.set(setting.slice(0, eq).replace(/-/g, "_").toLowerCase(), setting.slice(eq + 1));
  }
  // UTF8 is what the session speaks anyway; restoring it on every switch would be wasted work.
  // Encoding names are read as PostgreSQL reads them: letters and digits only, any case ('utf-8' with its quotes is UTF8).
  const encoding = out.get("client_encoding");
  if (encoding !== undefined && /^(utf8|unicode)$/.test(encoding.toLowerCase().replace(/[^a-z0-9]/g, ""))) out.delete("client_encoding");
  if (out.get("application_name") === "") out.delete("application_name");
  return out;
}
