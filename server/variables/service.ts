import { conflictCode, notFound } from "../http/errors";
import { newId } from "../ids";
import { TtlCache } from "../store/ttl-cache";
import { isoTime as iso, isUniqueViolation, type ControlStore, type Row } from "../store/store";

function view(r: Row) {
  return {
    id: r.id as string,
    project_id: r.project_id as string,
    name: r.name as string,
    value: r.value as string,
    status: r.status as "provisioning" | "active",
    current_sync_id: r.current_sync_id as string,
    created_at: iso(r.created_at),
    updated_at: iso(r.updated_at),
  };
}

/**
 * Project variables. A write starts a sync (new `current_sync_id`, status `provisioning`); once
 * the value has propagated to the places that read it, the same sync turns `active`. A newer write
 * supersedes an older sync, which then never marks the variable active.
 */
export class VariablesService {
  private readonly syncs = new Set<ReturnType<typeof setTimeout>>();
  /** Listeners that must see a new value (function workers); propagation waits for them. */
  private readonly listeners: ((projectId: string, name: string) => Promise<void>)[] = [];

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    private readonly propagationMs: number,
  ) {}

  onChange(fn: (projectId: string, name: string) => Promise<void>): void {
    this.listeners.push(fn);
  }

  private startSync(r: Row): void {
    const t = setTimeout(async () => {
      this.syncs.delete(t);
      await this.propagate(r.project_id, r.name, r.current_sync_id);
    }, this.propagationMs);
    this.syncs.add(t);
  }

  private async propagate(projectId: string, name: string, syncId: string): Promise<void> {
    for (const l of this.listeners) await l(projectId, name).catch(() => {});
    await this.store
      .query(`update variables set status = 'active' where project_id = $1 and current_sync_id = $2`, [projectId, syncId])
      .catch(() => {});
  }

  async create(projectId: string, input: { name: string; value: string }) {
    const at = this.now().toISOString();
    try {
      const [r] = await this.store.query(
        `insert into variables (id, project_id, name, value, status, current_sync_id, created_at, updated_at)
         values ($1, $2, $3, $4, 'provisioning', $5, $6, $6) returning *`,
        [newId(), projectId, input.name, input.value, newId(), at],
      );
      this.cache.delete(projectId);
      this.startSync(r!);
      return view(r!);
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
    return { data: rows.map(view), total };
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
    return view(await this.row(projectId, idOrName));
  }

  async update(projectId: string, idOrName: string, input: { name?: string; value?: string }) {
    const cur = await this.row(projectId, idOrName);
    try {
      const [r] = await this.store.query(
        `update variables set name = $2, value = $3, status = 'provisioning', current_sync_id = $4, updated_at = $5 where id = $1 returning *`,
        [cur.id, input.name ?? cur.name, input.value ?? cur.value, newId(), this.now().toISOString()],
      );
      this.cache.delete(projectId);
      this.startSync(r!);
      return view(r!);
    } catch (err) {
      if (isUniqueViolation(err)) throw conflictCode("variable_name_exists");
      throw err;
    }
  }

  async delete(projectId: string, idOrName: string): Promise<void> {
    const cur = await this.row(projectId, idOrName);
    await this.store.query(`delete from variables where id = $1`, [cur.id]);
    this.cache.delete(projectId);
    for (const l of this.listeners) await l(projectId, cur.name).catch(() => {});
  }

  /**
   * Values of every variable of a project, for the places that inject them (function workers).
   * Kept in memory per project; a write here drops the copy at once, and the TTL bounds how long
   * another Kiln instance's write takes to arrive.
   */
  private readonly cache = new TtlCache<string, Record<string, string>>(() => 2000);

  /** The values when they are in memory (the warm invocation path), else undefined. */
  cachedValues(projectId: string): Record<string, string> | undefined {
    return this.cache.get(projectId);
  }

  async values(projectId: string): Promise<Record<string, string>> {
    const hit = this.cache.get(projectId);
    if (hit) return hit;
    const rows = await this.store.query(`select name, value from variables where project_id = $1`, [projectId]);
    const values = Object.fromEntries(rows.map((r) => [r.name, r.value]));
    this.cache.set(projectId, values);
    return values;
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from variables where project_id = $1`, [projectId]);
    this.cache.delete(projectId);
  }

  /** At start, syncs cut short by a stop are finished; at stop, pending ones finish now. */
  async settlePending(): Promise<void> {
    for (const t of this.syncs) clearTimeout(t);
    this.syncs.clear();
    const rows = await this.store.query(`select project_id, name, current_sync_id from variables where status = 'provisioning'`);
    for (const r of rows) await this.propagate(r.project_id, r.name, r.current_sync_id);
  }
}
