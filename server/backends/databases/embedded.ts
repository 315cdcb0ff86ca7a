import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { createFromTemplate, fingerprintOf, type TemplateSpec } from "../../store/template";
import {
  DATABASE_SETUP_SQL,
  PRIVILEGES_UPGRADE_SQL,
  sessionInitSql,
  transactionInitSql,
  type AccessMode,
  type DatabaseEngine,
  type QueryResult,
} from "./engine";
import type { WireBackend, WireClient, WireControl } from "./wire/listener";
import { PgliteThread } from "./pglite-thread";
import { runOverProtocol } from "./protocol-query";
import { PgliteSessionMux } from "./wire/pglite-mux";

/** Every user database starts as a copy of this: roles, grants and auth.* helpers already in place. */
export const DATABASE_TEMPLATE: TemplateSpec = {
  kind: "database",
  fingerprint: fingerprintOf(DATABASE_SETUP_SQL),
  prepare: async (store) => {
    for (const stmt of DATABASE_SETUP_SQL) await store.query(stmt);
  },
  // template1 stays so `create database` works for people who try it; template0 is never connectable.
  drop: ["template0"],
};

/** The PGlite major version (its initdb writes PG_VERSION). */
const PGLITE_PG_MAJOR = 18;

interface OpenInstance {
  db: PgliteThread;
  mux: PgliteSessionMux;
  lastUsed: number;
}

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
        const db = await PgliteThread.open(this.dirOf(id), DATABASE_CONF);
        // A database made by an older Kiln is brought to the current privileges model before anyone
        // uses it (a no-op check once done); if that fails, the database stays closed.
        try {
          await runOverProtocol(db, [], PRIVILEGES_UPGRADE_SQL, []);
        } catch (err) {
          await db.close().catch(() => {});
          // Not the caller's SQL error: a failure to reach the database (500 on the query API).
          throw new Error(`database ${id}: privileges upgrade failed: ${(err as Error).message}`);
        }
        const inst = { db, mux: new PgliteSessionMux(db, { idleInTransactionTimeoutMs: this.o.idleInTransactionTimeoutMs }), lastUsed: Date.now() };
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
      const idle = [...this.open.entries()].filter(([, i]) => i.mux.stats().clients === 0).sort((a, b) => a[1].lastUsed - b[1].lastUsed);
      if (idle.length === 0) return; // every instance has clients: go over the limit rather than cut anyone off
      await this.closeInstance(idle[0]![0]);
    }
  }

  private async closeInstance(id: string): Promise<void> {
    const inst = this.open.get(id);
    if (!inst) return;
    this.open.delete(id);
    await inst.mux.closeAll("the database instance is being closed");
    await inst.db.close().catch(() => {});
  }

  private async closeIdle(): Promise<void> {
    const cutoff = Date.now() - this.o.idleCloseMs;
    for (const [id, inst] of this.open) {
      const s = inst.mux.stats();
      if (s.clients === 0 && Math.max(inst.lastUsed, s.lastActivityMs) < cutoff) await this.closeInstance(id);
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

  /** Open instances right now (for stats and the memory bench). */
  openCount(): number {
    return this.open.size;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const id of [...this.open.keys()]) await this.closeInstance(id);
  }
}

/** Small buffers: a database here serves one developer's app, and many may be open at once. */
const DATABASE_CONF = ["shared_buffers=8MB", "work_mem=4MB", "maintenance_work_mem=16MB"];

function dirSize(dir: string): number {
  if (!existsSync(dir)) return 0;
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    total += e.isDirectory() ? dirSize(p) : statSync(p).size;
  }
  return total;
}
