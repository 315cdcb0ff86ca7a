import type { Clock, TimerHandle } from "../clock";
import { conflictCode, notFound } from "../http/errors";
import { newId } from "../ids";
import type { SecretKey } from "../secrets/secret-key";
import { isoTime as iso, isUniqueViolation, type ControlStore, type Row } from "../store/store";

/** A row as the API shows it; `value` is stored encrypted with the instance secret key. */
function view(r: Row, key: SecretKey) {
  return {
    id: r.id as string,
    project_id: r.project_id as string,
    name: r.name as string,
    value: key.decrypt(r.value),
    status: r.status as "provisioning" | "active",
    current_sync_id: r.current_sync_id as string,
    created_at: iso(r.created_at),
    updated_at: iso(r.updated_at),
  };
}

/**
 * A project's variables as function workers get them. Built once per change of the project's
 * variables and shared by every invocation until the next change, so a caller compares `revision`
 * (O(1)) rather than the values (which may be thousands).
 */
export interface VariablesSnapshot {
  /** Unique to these values in this process: a different revision exactly when the values differ. */
  readonly revision: number;
  /** Never changed in place: a change makes a new snapshot. */
  readonly values: Readonly<Record<string, string>>;
}

interface CachedSnapshot extends VariablesSnapshot {
  /** `<count>:<sum of hashtext(current_sync_id)>`; every create, update and delete changes it. */
  readonly fingerprint: string;
  /** When the store last confirmed the fingerprint (platform clock, ms). */
  checkedAt: number;
  usedAt: number;
}

/** How long another Kiln instance's write may take to reach this one's invocations (as the other caches). */
const FRESH_MS = 2000;
/** Snapshots of projects not invoked for this long are dropped (and no longer checked). */
const IDLE_MS = 5 * 60_000;
/** In the production profile, snapshots invoked within this long are re-checked in the background. */
const ACTIVE_MS = 60_000;

/**
 * Project variables. A write starts a sync (new `current_sync_id`, status `provisioning`); once
 * the value has propagated to the places that read it, the same sync turns `active`. A newer write
 * supersedes an older sync, which then never marks the variable active.
 */
export class VariablesService {
  private readonly syncs = new Set<ReturnType<typeof setTimeout>>();
  /** Listeners that must see a new value (function workers); propagation waits for them. */
  private readonly listeners: ((projectId: string, name: string) => Promise<void>)[] = [];

  private readonly now: () => Date;

  constructor(
    private readonly store: ControlStore,
    /** The platform clock: snapshot freshness and the background checks run on it. */
    private readonly clock: Clock,
    private readonly propagationMs: number,
    private readonly secretKey: SecretKey,
  ) {
    this.now = () => clock.now();
  }

  onChange(fn: (projectId: string, name: string) => Promise<void>): void {
    this.listeners.push(fn);
  }

  private startSync(r: Row): void {
    const t = setTimeout(async () => {
      this.syncs.delete(t);
      await this.propagate(r.id, r.project_id, r.name, r.current_sync_id);
    }, this.propagationMs);
    this.syncs.add(t);
  }

  private async propagate(id: string, projectId: string, name: string, syncId: string): Promise<void> {
    for (const l of this.listeners) await l(projectId, name).catch(() => {});
    // By primary key: a project with thousands of variables must not scan them all per write.
    await this.store.query(`update variables set status = 'active' where id = $1 and current_sync_id = $2`, [id, syncId]).catch(() => {});
  }

  async create(projectId: string, input: { name: string; value: string }) {
    const at = this.now().toISOString();
    try {
      const [r] = await this.store.query(
        `insert into variables (id, project_id, name, value, status, current_sync_id, created_at, updated_at)
         values ($1, $2, $3, $4, 'provisioning', $5, $6, $6) returning *`,
        [newId(), projectId, input.name, this.secretKey.encrypt(input.value), newId(), at],
      );
      this.changed(projectId);
      this.startSync(r!);
      return view(r!, this.secretKey);
    } catch (err) {
      if (isUniqueViolation(err)) throw conflictCode("variable_name_exists");
      throw err;
    }
  }

  async list(projectId: string, page: number, limit: number) {
    const [{ total }] = (await this.store.query(`select count(*)::int as total from variables where project_id = $1`, [projectId])) as [
      { total: number },
    ];
    const rows = await this.store.query(
      `select * from variables where project_id = $1 order by name limit ${limit} offset ${(page - 1) * limit}`,
      [projectId],
    );
    return { data: rows.map((r) => view(r, this.secretKey)), total };
  }

  /** By id, or by name for people typing commands. */
  private async row(projectId: string, idOrName: string): Promise<Row> {
    const [r] = await this.store.query(
      `select * from variables where project_id = $1 and (id = $2 or name = $2) order by (id = $2) desc limit 1`,
      [projectId, idOrName],
    );
    if (!r) throw notFound("variable not found");
    return r;
  }

  async get(projectId: string, idOrName: string) {
    return view(await this.row(projectId, idOrName), this.secretKey);
  }

  async update(projectId: string, idOrName: string, input: { name?: string; value?: string }) {
    const cur = await this.row(projectId, idOrName);
    try {
      const [r] = await this.store.query(
        `update variables set name = $2, value = $3, status = 'provisioning', current_sync_id = $4, updated_at = $5 where id = $1 returning *`,
        [cur.id, input.name ?? cur.name, input.value === undefined ? cur.value : this.secretKey.encrypt(input.value), newId(), this.now().toISOString()],
      );
      this.changed(projectId);
      this.startSync(r!);
      return view(r!, this.secretKey);
    } catch (err) {
      if (isUniqueViolation(err)) throw conflictCode("variable_name_exists");
      throw err;
    }
  }

  async delete(projectId: string, idOrName: string): Promise<void> {
    const cur = await this.row(projectId, idOrName);
    await this.store.query(`delete from variables where id = $1`, [cur.id]);
    this.changed(projectId);
    for (const l of this.listeners) await l(projectId, cur.name).catch(() => {});
  }

  // ---------------------------------------------------------------------------------------------
  // Snapshots for the places that inject the values (function workers).
  //
  // A write on this instance drops the project's snapshot at once: the next invocation loads the new
  // values (one query, once per change). Writes on other instances (production profile, several Kiln
  // instances on one PostgreSQL) are found by a cheap fingerprint query per project (count and a sum
  // of hashes, no values sent), run in the background every FRESH_MS / 4 for recently invoked
  // projects, so a warm invocation never waits for the store and never looks at the values; a
  // snapshot not confirmed for FRESH_MS (a slow store, or a project idle for a while) is checked
  // before it is used, which keeps the bound other caches have: another instance's write is seen
  // within FRESH_MS. The embedded profile has one Kiln per data dir, so every write passes through
  // here and there is nothing to re-check.

  private readonly snapshots = new Map<string, CachedSnapshot>();
  private readonly loading = new Map<string, Promise<CachedSnapshot>>();
  /** Local writes per project: a load that started before one must not install what it read. */
  private readonly writes = new Map<string, number>();
  private nextRevision = 1;
  /**
   * The revision of each snapshot dropped for idleness: reloaded with the same fingerprint it keeps its
   * revision, so a quiet project (or a test moving the platform clock past IDLE_MS) keeps warm workers.
   */
  private readonly dropped = new Map<string, { fingerprint: string; revision: number }>();
  /** Per project, the values of the last load by ciphertext (a new write is a new ciphertext: random nonce). */
  private readonly decrypted = new Map<string, Map<string, string>>();
  private timer: TimerHandle | null = null;
  private refreshing = false;
  private get revalidates(): boolean {
    return this.store.kind !== "pglite";
  }

  private changed(projectId: string): void {
    this.writes.set(projectId, (this.writes.get(projectId) ?? 0) + 1);
    this.snapshots.delete(projectId);
    this.loading.delete(projectId);
    this.dropped.delete(projectId);
  }

  /** The project's snapshot when it is in memory and fresh (the warm invocation path: O(1)), else undefined. */
  cachedSnapshot(projectId: string): VariablesSnapshot | undefined {
    const s = this.snapshots.get(projectId);
    if (!s) return undefined;
    const now = this.clock.nowMs();
    if (this.revalidates && now - s.checkedAt >= FRESH_MS) return undefined;
    s.usedAt = now;
    return s;
  }

  async snapshot(projectId: string): Promise<VariablesSnapshot> {
    const hit = this.cachedSnapshot(projectId);
    if (hit) return hit;
    let p = this.loading.get(projectId);
    if (!p) {
      p = this.load(projectId).finally(() => {
        if (this.loading.get(projectId) === p) this.loading.delete(projectId);
      });
      this.loading.set(projectId, p);
    }
    const s = await p;
    s.usedAt = this.clock.nowMs();
    return s;
  }

  /** The values when they are in memory and fresh, else undefined. */
  cachedValues(projectId: string): Readonly<Record<string, string>> | undefined {
    return this.cachedSnapshot(projectId)?.values;
  }

  async values(projectId: string): Promise<Readonly<Record<string, string>>> {
    return (await this.snapshot(projectId)).values;
  }

  /** A stale snapshot is kept when its fingerprint still matches (same revision: workers stay warm). */
  private async load(projectId: string): Promise<CachedSnapshot> {
    const writes = this.writes.get(projectId) ?? 0;
    const started = this.clock.nowMs();
    const old = this.snapshots.get(projectId);
    if (old) {
      const [fp] = await this.fingerprints([projectId]);
      if (fp!.fingerprint === old.fingerprint && this.snapshots.get(projectId) === old) {
        old.checkedAt = Math.max(old.checkedAt, started);
        return old;
      }
    }
    const rows = await this.store.query(`select name, value, hashtext(current_sync_id) as h from variables where project_id = $1`, [projectId]);
    const values: Record<string, string> = {};
    let sum = 0;
    // Decrypted when loaded, not per invocation (the snapshot is shared); a reload after a change
    // decrypts only the values whose ciphertext changed (~20-60 µs each: 8,000 would cost 0.2-0.5 s).
    const known = this.decrypted.get(projectId);
    const decrypted = new Map<string, string>();
    for (const r of rows) {
      const value = known?.get(r.value) ?? this.secretKey.decrypt(r.value);
      decrypted.set(r.value, value);
      values[r.name] = value;
      sum += Number(r.h);
    }
    this.decrypted.set(projectId, decrypted);
    const fingerprint = `${rows.length}:${sum}`;
    const cur = this.snapshots.get(projectId);
    let s: CachedSnapshot;
    if (cur && cur.fingerprint === fingerprint) {
      cur.checkedAt = Math.max(cur.checkedAt, started);
      s = cur;
    } else {
      const prior = this.dropped.get(projectId);
      s = { revision: prior?.fingerprint === fingerprint ? prior.revision : this.nextRevision++, values, fingerprint, checkedAt: started, usedAt: started };
    }
    // A local write since the load began: what was read may predate it, so it is not kept.
    if ((this.writes.get(projectId) ?? 0) === writes) {
      this.snapshots.set(projectId, s);
      this.startTimer();
    }
    return s;
  }

  /** `count:sum` per project, computed by the store (no values sent); a project without variables is `0:0`. */
  private async fingerprints(projectIds: string[]): Promise<Array<{ projectId: string; fingerprint: string }>> {
    const rows = await this.store.query(
      `select project_id, count(*)::int as n, coalesce(sum(hashtext(current_sync_id)), 0)::text as h
         from variables where project_id in (${projectIds.map((_, i) => `$${i + 1}`).join(", ")}) group by project_id`,
      projectIds,
    );
    const by = new Map(rows.map((r) => [r.project_id as string, `${r.n}:${r.h}`]));
    return projectIds.map((projectId) => ({ projectId, fingerprint: by.get(projectId) ?? "0:0" }));
  }

  /**
   * The background checks run on the platform clock while snapshots are held, and stop when none
   * is left (so a test that moves the clock a day ahead does not pay for a day of checks).
   */
  private startTimer(): void {
    if (this.timer) return;
    this.timer = this.clock.after(
      FRESH_MS / 4,
      async () => {
        this.timer = null;
        await this.refresh();
        if (this.snapshots.size) this.startTimer();
      },
      "variables refresh",
    );
  }

  /** Drops idle snapshots; in the production profile re-checks the recently invoked ones. */
  private async refresh(): Promise<void> {
    if (this.refreshing) return;
    this.refreshing = true;
    try {
      const now = this.clock.nowMs();
      const due: string[] = [];
      for (const [id, s] of this.snapshots) {
        if (now - s.usedAt > IDLE_MS) {
          this.snapshots.delete(id);
          this.decrypted.delete(id);
          this.dropped.set(id, { fingerprint: s.fingerprint, revision: s.revision });
        } else if (this.revalidates && now - s.usedAt < ACTIVE_MS && now - s.checkedAt >= FRESH_MS / 4) due.push(id);
      }
      if (!this.snapshots.size) this.stop();
      for (let i = 0; i < due.length; i += 200) {
        const started = this.clock.nowMs();
        const before = new Map(due.slice(i, i + 200).map((id) => [id, this.snapshots.get(id)]));
        for (const { projectId, fingerprint } of await this.fingerprints([...before.keys()])) {
          const s = this.snapshots.get(projectId);
          if (!s || s !== before.get(projectId)) continue; // replaced or dropped meanwhile
          if (fingerprint === s.fingerprint) {
            s.checkedAt = Math.max(s.checkedAt, started);
            continue;
          }
          // Changed on another instance: load the new values now, so the next invocation finds them.
          this.changed(projectId);
          void this.snapshot(projectId).catch(() => {});
        }
      }
    } catch {
      // the store is away (stopping, say): a snapshot left unconfirmed is checked before its next use
    } finally {
      this.refreshing = false;
    }
  }

  /** Stops the background checks (they also stop by themselves when no snapshot is left). */
  stop(): void {
    this.timer?.cancel();
    this.timer = null;
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from variables where project_id = $1`, [projectId]);
    this.changed(projectId);
    this.decrypted.delete(projectId);
  }

  /** At start, syncs cut short by a stop are finished; at stop, pending ones finish now. */
  async settlePending(): Promise<void> {
    for (const t of this.syncs) clearTimeout(t);
    this.syncs.clear();
    const rows = await this.store.query(`select id, project_id, name, current_sync_id from variables where status = 'provisioning'`);
    for (const r of rows) await this.propagate(r.id, r.project_id, r.name, r.current_sync_id);
  }
}
