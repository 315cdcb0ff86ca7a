import type { Clock } from "../clock";
import type { Config } from "../config";
import { takeFault } from "../config";
import { plan as planOf } from "../accounts/plans";
import type { PlanName } from "../config";
import { badRequest, forbidden } from "../http/errors";
import { decodeCursor, DEFAULT_LIMIT, encodeCursor, likePattern } from "../http/pagination";
import { newId } from "../ids";
import type { ControlStore, Row, Sql } from "../store/store";

export type { ProjectRecord, ProjectStatus } from "./record";
import type { ProjectRecord, ProjectStatus } from "./record";

export type ListMode =
  | { mode: "offset"; page: number; limit: number; search?: string }
  | { mode: "cursor"; limit: number; cursor?: string; endingBefore?: string; offset: number; search?: string };

/** Something an area sets up inside the transaction that creates a project (the default anon key). */
export type ProjectSetup = (tx: Sql, projectId: string) => Promise<void>;

/** Something an area must remove when its project is deleted; it must be safe to run twice. */
export type ProjectCleanup = (projectId: string) => Promise<void>;

function toRecord(r: Row): ProjectRecord {
  return {
    id: r.id,
    account_id: r.account_id,
    name: r.name,
    status: r.status,
    all_regions: r.all_regions,
    selected_regions: r.selected_regions ?? [],
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

export function projectView(p: ProjectRecord, opts: { detail?: boolean } = {}) {
  return {
    id: p.id,
    name: p.name,
    status: p.status as "active" | "deleting" | "failed",
    all_regions: p.all_regions,
    selected_regions: p.selected_regions,
    ...(opts.detail ? { cloud_application_name: `kiln-${p.id}` } : {}),
    created_at: p.created_at,
    updated_at: p.updated_at,
  };
}

const LISTED = `status in ('active', 'failed')`;

export class ProjectsService {
  private readonly cleanups: { name: string; run: ProjectCleanup }[] = [];
  private readonly creators: ProjectSetup[] = [];
  /** Projects being cleaned up in this process, so a second DELETE does not start a second run. */
  private readonly running = new Map<string, Promise<void>>();

  private readonly now: () => Date;

  constructor(
    private readonly store: ControlStore,
    private readonly config: Config,
    private readonly clock: Clock,
    private readonly onRevoked: (projectId: string) => void,
    private readonly log: { error: (m: string, e?: unknown) => void },
  ) {
    this.now = () => clock.now();
  }

  /** Areas register what they own; project deletion runs every cleanup in registration order. */
  registerCleanup(name: string, run: ProjectCleanup): void {
    this.cleanups.push({ name, run });
  }

  registerSetup(run: ProjectSetup): void {
    this.creators.push(run);
  }

  /** A project that has not finished deleting (active, deleting or failed). */
  async findVisible(id: string): Promise<ProjectRecord | null> {
    const [r] = await this.store.query(`select * from projects where id = $1 and status <> 'deleted'`, [id]);
    return r ? toRecord(r) : null;
  }

  private checkRegions(plan: PlanName, allRegions: boolean, selected: string[]): void {
    const restricting = !allRegions || selected.length > 0;
    if (restricting && !planOf(plan).restrictRegions)
      throw forbidden("restricting regions (all_regions false, selected_regions) requires the SUPERAGENT plan");
    if (allRegions && selected.length > 0) throw badRequest("selected_regions applies only when all_regions is false");
    if (!allRegions && selected.length === 0) throw badRequest("selected_regions must name at least one region when all_regions is false");
    for (const r of selected)
      if (!this.config.regions.includes(r))
        throw badRequest(`unknown region '${r}' in selected_regions; this instance serves: ${this.config.regions.join(", ")}`);
  }

  async create(
    accountId: string,
    plan: PlanName,
    input: { name: string; all_regions?: boolean; selected_regions?: string[] },
  ): Promise<ProjectRecord> {
    const selected = [...new Set(input.selected_regions ?? [])];
    const allRegions = input.all_regions ?? selected.length === 0;
    this.checkRegions(plan, allRegions, selected);
    const limit = planOf(plan).maxProjects;
    return this.store.transaction(async (tx) => {
      // Lock the account row so two concurrent creates cannot both take the last place.
      await tx.query(`select id from accounts where id = $1 for update`, [accountId]);
      const [{ n }] = (await tx.query(`select count(*)::int as n from projects where account_id = $1 and status <> 'deleted'`, [accountId])) as [{ n: number }];
      if (n >= limit) throw forbidden(`project limit reached: an account may have at most ${limit} projects`);
      const at = this.now().toISOString();
      const [row] = await tx.query(
        `insert into projects (id, account_id, name, status, all_regions, selected_regions, created_at, updated_at)
         values ($1, $2, $3, 'active', $4, $5::text::jsonb, $6, $6) returning *`,
        [newId(), accountId, input.name, allRegions, JSON.stringify(allRegions ? [] : selected), at],
      );
      for (const setup of this.creators) await setup(tx, row!.id);
      return toRecord(row!);
    });
  }

  async update(
    project: ProjectRecord,
    plan: PlanName,
    input: { name?: string; all_regions?: boolean; selected_regions?: string[] },
  ): Promise<ProjectRecord> {
    let allRegions = input.all_regions ?? project.all_regions;
    let selected = input.selected_regions ? [...new Set(input.selected_regions)] : project.selected_regions;
    // Switching to all regions clears a previous selection unless the caller sent one.
    if (input.all_regions === true && !input.selected_regions) selected = [];
    if (input.selected_regions && input.selected_regions.length > 0 && input.all_regions === undefined) allRegions = false;
    this.checkRegions(plan, allRegions, selected);
    const [row] = await this.store.query(
      `update projects set name = $2, all_regions = $3, selected_regions = $4::text::jsonb, updated_at = $5
        where id = $1 and status <> 'deleted' returning *`,
      [project.id, input.name ?? project.name, allRegions, JSON.stringify(allRegions ? [] : selected), this.now().toISOString()],
    );
    return toRecord(row!);
  }

  async list(accountId: string, m: ListMode) {
    const params: unknown[] = [accountId];
    let filter = `account_id = $1 and ${LISTED}`;
    if (m.search) {
      params.push(likePattern(m.search));
      filter += ` and name ilike $${params.length}`;
    }
    const [{ total }] = (await this.store.query(`select count(*)::int as total from projects where ${filter}`, params)) as [{ total: number }];
    if (m.mode === "offset") {
      const rows = await this.store.query(
        `select * from projects where ${filter} order by created_at desc, id desc limit ${m.limit} offset ${(m.page - 1) * m.limit}`,
        params,
      );
      return { mode: "offset" as const, data: rows.map(toRecord), total };
    }
    // Cursor mode over the order (created_at desc, id desc). `cursor` pages forward (older rows),
    // `ending_before` pages back (newer rows); `offset` skips rows after the anchor.
    const limit = m.limit ?? DEFAULT_LIMIT;
    let rows: Row[];
    if (m.endingBefore) {
      const a = decodeCursor(m.endingBefore, "ending_before");
      const p = [...params, a.t, a.id];
      rows = await this.store.query(
        `select * from projects where ${filter} and (created_at, id) > ($${p.length - 1}::timestamptz, $${p.length})
          order by created_at asc, id asc limit ${limit} offset ${m.offset}`,
        p,
      );
      rows.reverse();
    } else {
      const p = [...params];
      let where = filter;
      if (m.cursor) {
        const a = decodeCursor(m.cursor, "cursor");
        p.push(a.t, a.id);
        where += ` and (created_at, id) < ($${p.length - 1}::timestamptz, $${p.length})`;
      }
      rows = await this.store.query(
        `select * from projects where ${where} order by created_at desc, id desc limit ${limit} offset ${m.offset}`,
        p,
      );
    }
    const data = rows.map(toRecord);
    const anchor = (r: ProjectRecord) => ({ t: r.created_at, id: r.id });
    const exists = async (op: "<" | ">", r: ProjectRecord) => {
      const p = [...params, r.created_at, r.id];
      const found = await this.store.query(
        `select 1 from projects where ${filter} and (created_at, id) ${op} ($${p.length - 1}::timestamptz, $${p.length}) limit 1`,
        p,
      );
      return found.length > 0;
    };
    const first = data[0];
    const last = data[data.length - 1];
    const next_cursor = last && (await exists("<", last)) ? encodeCursor(anchor(last)) : undefined;
    const prev_cursor = first && (await exists(">", first)) ? encodeCursor(anchor(first)) : undefined;
    const has_more = m.endingBefore ? prev_cursor !== undefined : next_cursor !== undefined;
    return { mode: "cursor" as const, data, total, next_cursor, prev_cursor, has_more, limit };
  }

  /**
   * Starts deletion: the project leaves listings at once and its access tokens stop working at
   * once; everything it owns is removed in the background. Calling it again while deleting is a
   * no-op; on a failed deletion it retries the cleanup.
   */
  async requestDelete(project: ProjectRecord): Promise<ProjectRecord> {
    if (project.status === "deleting" && this.running.has(project.id)) return project;
    const at = this.now().toISOString();
    const updated = await this.store.transaction(async (tx) => {
      const [row] = await tx.query(
        `update projects set status = 'deleting', failure = null, updated_at = $2 where id = $1 and status <> 'deleted' returning *`,
        [project.id, at],
      );
      await tx.query(`update access_tokens set revoked_at = $2 where project_id = $1 and revoked_at is null`, [project.id, at]);
      return toRecord(row!);
    });
    this.onRevoked(project.id);
    this.startCleanup(project.id);
    return updated;
  }

  private startCleanup(projectId: string): void {
    const run = this.cleanup(projectId).finally(() => this.running.delete(projectId));
    this.running.set(projectId, run);
  }

  private async cleanup(projectId: string): Promise<void> {
    try {
      if (takeFault(this.config, "project-cleanup")) throw new Error("injected fault: project-cleanup");
      // Holds the deletion in `deleting` until the platform clock has moved a minute on (tests move it).
      if (takeFault(this.config, "project-cleanup-delay")) await this.clock.sleep(60_000);
      for (const c of this.cleanups) await c.run(projectId);
      await this.store.query(`update projects set status = 'deleted', updated_at = $2 where id = $1`, [projectId, this.now().toISOString()]);
    } catch (err) {
      this.log.error(`project ${projectId}: deletion cleanup failed; DELETE the project again to retry`, err);
      await this.store
        .query(`update projects set status = 'failed', failure = $2, updated_at = $3 where id = $1`, [
          projectId,
          String((err as Error)?.message ?? err),
          this.now().toISOString(),
        ])
        .catch(() => {});
    }
  }

  /** Deletions interrupted by a stop or crash continue at the next start. */
  async resumeDeletions(): Promise<void> {
    const rows = await this.store.query<{ id: string }>(`select id from projects where status = 'deleting'`);
    for (const r of rows) this.startCleanup(r.id);
  }

  /** Waits for background cleanups (graceful stop). */
  async drain(): Promise<void> {
    await Promise.allSettled([...this.running.values()]);
  }
}
