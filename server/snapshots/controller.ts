import type { Clock } from "../clock";
import type { Config } from "../config";
import type { RequestGate } from "../http/gate";
import { badRequest, conflict, HttpError, notFound } from "../http/errors";
import type { ControlStore } from "../store/store";
import type { PgliteStore } from "../store/pglite-store";
import { SNAPSHOT_NAME, SnapshotFiles, type SnapshotMeta } from "./files";
import { StoreImages } from "./store-image";

/**
 * A restore's answer, and how it went (the `Kiln-Restore` header): the areas' reset hooks under the
 * running areas ("in-place"), every area stopped and started around the store's rows and the changed
 * files ("restarted"), or the whole state swapped for the snapshot's files ("whole").
 */
export interface Restored {
  name: string;
  restored_at: string;
  how: "in-place" | "restarted" | "whole";
}

/** Snapshots Kiln takes itself: the seed applied at start, or the state right after start. */
export const RESET_POINTS = ["seed", "start"] as const;
export type ResetPoint = (typeof RESET_POINTS)[number];

/** How long a snapshot or restore waits for the requests in flight before it gives up (409). */
const QUIESCE_MS = 30_000;
/** The control store's folder in the data dir: with an image in memory, a restore puts it back with SQL. */
const CONTROL = "control";
const KEEP: ReadonlySet<string> = new Set([CONTROL]);

type Changes = { tables: string[]; files: string[] };

/**
 * Snapshots of the whole platform (embedded profile). Every state Kiln has lives in the data dir, so
 * one mechanism covers every area, present and future: close the request gate and wait for the
 * requests in flight, stop the areas and the control store in-process (their drains finish
 * background work; files are closed cleanly), copy or swap the data dir's state, and start the store
 * and the areas again along the path boot takes. The HTTP listener stays up throughout.
 */
export class Snapshots {
  private files: SnapshotFiles;
  /** Per snapshot taken or restored by this process: the control store's rows (server/snapshots/store-image.ts). */
  private images = new StoreImages();
  private chain: Promise<unknown> = Promise.resolve();
  /** What `POST /_kiln/reset` restores: the seed, or the state right after start; set once Kiln took it at start. */
  resetPoint: ResetPoint | null = null;

  constructor(
    private readonly opts: {
      config: Config;
      clock: Clock;
      gate: RequestGate;
      /** Stops every area, and the control store unless `keepStore` (server/main.ts). */
      stopState(keepStore: boolean): Promise<void>;
      /** Ends responses that never finish by themselves (live log tails), so in-flight requests can end. */
      closing(): void;
      /**
       * A restore under the running areas (their reset hooks, server/area.ts): the areas write what
       * they hold in memory, `detect` says what changed; "unhooked" when an area whose tables or
       * files changed has no hook (nothing else done); else the areas let go of what changed,
       * `putBack` puts it back (and returns the tables it put back) and the areas resume: "in
       * place", or "restart" when `putBack` put back tables of an area without a hook after all
       * (written meanwhile) or an area failed to resume: then the caller stops and starts them all.
       */
      resetState(detect: () => Promise<Changes>, putBack: (changes: Changes) => Promise<string[]>): Promise<"unhooked" | "in place" | "restart">;
      /** Starts every area again, on `store` when given (else it opens the control store). */
      startState(store?: ControlStore): Promise<void>;
      /** The running state's control store. */
      store(): ControlStore;
      /** Opens the control store from the data dir's files (with the areas stopped). */
      openStore(): Promise<ControlStore>;
    },
  ) {
    this.files = new SnapshotFiles(opts.config.dataDir);
  }

  /** Why snapshots cannot be taken of this Kiln (the production profile), or null. */
  unavailable(): string | null {
    const c = this.opts.config;
    const outside = [c.databaseUrl && "the control store (--database-url)", c.postgresUrl && "managed databases (--postgres-url)", c.s3 && "storage objects (--s3-endpoint)"].filter(Boolean);
    if (!outside.length) return null;
    return `snapshots and reset need the embedded profile, where all state lives in the data dir; this Kiln keeps ${outside.join(", ")} on servers it cannot copy or put back as one`;
  }

  private check(): void {
    const why = this.unavailable();
    if (why) throw badRequest(why);
  }

  has(name: string): boolean {
    return this.files.get(name) !== null;
  }

  /** A seed that failed at start leaves no state: the data dir's state entries go (snapshots stay). */
  removeState(): void {
    this.files.removeState();
  }

  list(): SnapshotMeta[] {
    this.check();
    return this.files.list();
  }

  save(name: string, own = 1): Promise<SnapshotMeta> {
    this.check();
    checkName(name, "create");
    return this.serial(async () => {
      if (this.files.get(name)) throw conflict(`snapshot '${name}' exists; delete it first`);
      return this.saving(own, name);
    });
  }

  restore(name: string, own = 1): Promise<Restored> {
    this.check();
    if (!SNAPSHOT_NAME.test(name)) throw notFound(`snapshot '${name}' not found`);
    return this.serial(async () => {
      const meta = this.files.get(name);
      if (!meta) throw notFound(`snapshot '${name}' not found`);
      let how: Restored["how"] = "whole";
      if (this.images.has(name)) {
        // The store stays open and gets its rows back with SQL; the other files are copied back where
        // they differ. Under the running areas when every area whose state changed has a reset hook.
        await this.quiesced(own, async (t) => {
          const store = this.opts.store();
          const db = pglite(store);
          const outcome = await this.opts.resetState(
            async () => {
              const tables = await this.images.changed(db, name);
              t("tables written found");
              const found = { tables, files: this.files.changedPaths(name, KEEP) };
              t(`changes found (${found.tables.length} tables, ${found.files.length} files)`);
              if (process.env.KILN_TRACE_SNAPSHOTS === "1") console.error(`snapshot: tables ${found.tables.join(" ")}; files ${found.files.join(" ")}`);
              return found;
            },
            async (changes) => {
              const files = this.files.restoreWithin(name, changes.files);
              t(`files put back (${files.copied} copied, ${files.removed} removed)`);
              const tables = await this.images.restore(db, name);
              t(`control store rows put back (${tables.length} tables)`);
              await this.opts.clock.restoreOffset(meta.clock_offset_ms, true);
              return tables;
            },
          );
          t(`areas reset (${outcome})`);
          how = outcome === "in place" ? "in-place" : "restarted";
          if (outcome === "in place") return;
          // (After a "restart" outcome this puts back what the areas' stops wrote.)
          await this.restarting(true, t, async () => {
            const files = this.files.restoreChanged(name, KEEP);
            t(`files put back (${files.copied} copied, ${files.removed} removed)`);
            const tables = await this.images.restore(db, name);
            t(`control store rows put back (${tables.length} tables)`);
            await this.opts.clock.restoreOffset(meta.clock_offset_ms);
            return store;
          });
        });
      } else {
        // A snapshot this process has no image of (taken before a restart): its files, whole; the
        // store is opened from them and imaged, so the next restore of it is the quick one.
        await this.swapping(own, false, async (_, t) => {
          await this.files.restore(name);
          t("files copied");
          const store = await this.opts.openStore();
          await this.images.take(pglite(store), name).catch(() => this.images.delete(name));
          t("control store opened and imaged");
          await this.opts.clock.restoreOffset(meta.clock_offset_ms);
          return store;
        });
      }
      return { name, restored_at: this.opts.clock.now().toISOString(), how };
    });
  }

  delete(name: string): Promise<void> {
    this.check();
    if (!SNAPSHOT_NAME.test(name)) throw notFound(`snapshot '${name}' not found`);
    return this.serial(async () => {
      if ((RESET_POINTS as readonly string[]).includes(name) && this.resetPoint === name) throw badRequest(`snapshot '${name}' is what POST /_kiln/reset restores; it cannot be deleted`);
      if (!this.files.delete(name)) throw notFound(`snapshot '${name}' not found`);
      this.images.delete(name);
    });
  }

  reset(own = 1): Promise<Restored> {
    this.check();
    if (!this.resetPoint) throw badRequest("nothing to reset to: start Kiln with --seed <file>, or with --resettable to keep the state right after start");
    return this.restore(this.resetPoint, own);
  }

  /** At start (no request in flight): keeps the current state as a reset point. */
  async takeResetPoint(point: ResetPoint): Promise<void> {
    const why = this.unavailable();
    if (why) throw new Error(`--resettable: ${why}`);
    if (this.files.get(point)) this.files.delete(point);
    this.images.delete(point);
    await this.serial(() => this.saving(0, point));
    this.resetPoint = point;
  }

  /** Settles once no snapshot, restore or reset is running (Kiln's stop waits for it). */
  settled(): Promise<unknown> {
    return this.chain;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn);
    this.chain = next.catch(() => {});
    return next;
  }

  /**
   * Stops the areas (the control store stays open), checkpoints the store so its files on disk are
   * whole, copies the state, and keeps an image of the store's rows for a quick restore.
   */
  private saving(own: number, name: string): Promise<SnapshotMeta> {
    return this.swapping(own, true, async (store, t) => {
      await store.query("checkpoint");
      const meta = await this.files.save(name, this.opts.clock.now().toISOString(), this.opts.clock.offsetMs());
      t("files copied");
      await this.images.take(pglite(store), name);
      t("control store imaged");
      return store;
    }).then(() => this.files.get(name)!);
  }

  /**
   * With the gate closed and the areas stopped (and the control store closed unless `keepStore`):
   * run `fn`, which returns the store to start the areas on; the areas start again even if `fn`
   * failed (on the store kept open, or one opened from the files).
   */
  private swapping(own: number, keepStore: boolean, fn: (store: ControlStore, trace: (phase: string) => void) => Promise<ControlStore>): Promise<void> {
    return this.quiesced(own, (t) => this.restarting(keepStore, t, fn));
  }

  /** Runs `fn` with the request gate closed once the requests in flight have finished (409 if they do not). */
  private async quiesced(own: number, fn: (trace: (phase: string) => void) => Promise<void>): Promise<void> {
    const { gate } = this.opts;
    const t = phaseTimer();
    if (!(await gate.close(own, QUIESCE_MS, () => this.opts.closing()))) throw new HttpError(409, { error: `requests still in flight after ${QUIESCE_MS / 1000} s; nothing was changed` });
    t("quiesced");
    try {
      await fn(t);
    } finally {
      gate.open();
    }
  }

  private async restarting(keepStore: boolean, t: (phase: string) => void, fn: (store: ControlStore, trace: (phase: string) => void) => Promise<ControlStore>): Promise<void> {
    const kept = keepStore ? this.opts.store() : null;
    await this.opts.stopState(keepStore);
    t(keepStore ? "areas stopped" : "areas and control store stopped");
    let store: ControlStore | undefined = kept ?? undefined;
    try {
      store = await fn(kept!, t);
    } finally {
      await this.opts.startState(store);
      t("areas started");
    }
  }
}

function pglite(store: ControlStore) {
  if (store.kind !== "pglite") throw new Error("snapshots need the embedded control store");
  return (store as PgliteStore).pglite;
}

/** `KILN_TRACE_SNAPSHOTS=1` prints how long each phase of a snapshot or restore took (bench/testing.ts). */
function phaseTimer(): (phase: string) => void {
  if (process.env.KILN_TRACE_SNAPSHOTS !== "1") return () => {};
  let last = performance.now();
  return (phase) => {
    const now = performance.now();
    console.error(`snapshot: ${phase} +${Math.round(now - last)} ms`);
    last = now;
  };
}

function checkName(name: string, verb: string): void {
  if (!SNAPSHOT_NAME.test(name))
    throw badRequest(`invalid request: body field 'name': a snapshot name is 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit (got '${name.slice(0, 80)}')`);
  if ((RESET_POINTS as readonly string[]).includes(name)) throw badRequest(`invalid request: body field 'name': '${name}' is reserved for the snapshot Kiln takes at start; cannot ${verb} it`);
}
