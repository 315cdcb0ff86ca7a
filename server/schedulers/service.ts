import type { Clock } from "../clock";
import { deployedRegions } from "../functions/regions";
import type { FunctionRecord } from "../functions/records";
import { badRequest, conflict, forbidden, notFound } from "../http/errors";
import { newId } from "../ids";
import { isoTime, isoTimeOrNull, isUniqueViolation, type ControlStore, type Row, type Sql } from "../store/store";
import { parseCron, type CronSchedule } from "./cron";
import type { CreateSchedulerBody, PatchSchedulerBody, SchedulerView } from "./schemas";

/** Schedulers one function may have (Kiln's cap; the spec gives none): 403 beyond, like other caps. */
export const MAX_SCHEDULERS_PER_FUNCTION = 100;
/** Runs kept per scheduler: older ones are dropped as new ones are recorded. */
export const RUNS_KEPT = 1000;

export type FunctionKind = "standard" | "durable";

export interface SchedulerRow extends Row {
  id: string;
  project_id: string;
  function_id: string;
  function_kind: FunctionKind;
  name: string;
  enabled: boolean;
  cron_expression: string;
  payload: Record<string, unknown>;
  regions: string[] | null;
  region: string | null;
  next_run_at: Date | string | null;
  last_run_at: Date | string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

/**
 * The region that runs a scheduler's ticks (rules 3 and 4): the given one; else the one chosen
 * before while it is still deployed; else a deployed region at random (null while none is).
 */
export function chooseRegion(deployed: readonly string[], given: string[] | null, current: string | null): string | null {
  if (given) return given[0]!;
  if (current && deployed.includes(current)) return current;
  return deployed.length ? deployed[Math.floor(Math.random() * deployed.length)]! : null;
}

export function cronOf(expr: string): CronSchedule {
  const parsed = parseCron(expr);
  if (!parsed.ok) throw badRequest(`invalid request: body field 'schedule.cron_expression': ${parsed.error}`);
  return parsed.cron;
}

export function schedulerView(r: SchedulerRow): SchedulerView {
  return {
    id: r.id,
    function_id: r.function_id,
    function_kind: r.function_kind,
    name: r.name,
    enabled: r.enabled,
    schedule: { kind: "cron", cron_expression: r.cron_expression },
    payload: r.payload,
    regions: r.regions ?? [],
    region: r.region,
    next_run_at: isoTimeOrNull(r.next_run_at),
    last_run_at: isoTimeOrNull(r.last_run_at),
    created_at: isoTime(r.created_at),
    updated_at: isoTime(r.updated_at),
  };
}

/**
 * Scheduler records: create, read, update, delete, with the spec's rules (standard 5-field cron in
 * UTC, at most once a minute and at least once every 31 days, exactly one deployed region when
 * given). Ticking is the SchedulerTicker's; every change here tells it through `changed`.
 */
export class SchedulersService {
  constructor(
    private readonly store: ControlStore,
    private readonly clock: Clock,
    private readonly regions: readonly string[],
    /** Tells the ticker the schedule changed; awaited, so a clock advance right after sees it. */
    private readonly changed: () => Promise<void>,
  ) {}

  private chooseRegion(fn: Pick<FunctionRecord, "active_deployment_id">, given: string[] | null, current: string | null): string | null {
    return chooseRegion(deployedRegions(this.regions, fn), given, current);
  }

  /** Explicit regions must name a region the function is deployed to (or, before its first deployment, one Kiln serves). */
  private checkRegions(fn: FunctionRecord, regions: string[] | undefined | null): void {
    if (!regions) return;
    const deployed = deployedRegions(this.regions, fn);
    const allowed = deployed.length ? deployed : this.regions;
    if (!allowed.includes(regions[0]!))
      throw badRequest(`invalid request: body field 'regions': '${regions[0]}' is not a deployed region of this function (deployed: ${allowed.join(", ")})`);
  }

  async create(fn: FunctionRecord, kind: FunctionKind, body: CreateSchedulerBody): Promise<SchedulerRow> {
    const cron = cronOf(body.schedule.cron_expression);
    this.checkRegions(fn, body.regions);
    const enabled = body.enabled ?? true;
    const now = this.clock.nowMs();
    const at = new Date(now).toISOString();
    const next = enabled ? cron.nextAfter(now) : null;
    try {
      const row = await this.store.transaction(async (tx) => {
        await tx.query(`select id from functions where id = $1 for update`, [fn.id]);
        const [{ n }] = (await tx.query(`select count(*)::int as n from schedulers where function_id = $1`, [fn.id])) as [{ n: number }];
        if (n >= MAX_SCHEDULERS_PER_FUNCTION) throw forbidden(`a function may have at most ${MAX_SCHEDULERS_PER_FUNCTION} schedulers`);
        const [r] = await tx.query<SchedulerRow>(
          `insert into schedulers (id, project_id, function_id, function_kind, name, enabled, cron_expression, payload, regions, region, next_run_at, created_at, updated_at)
           values ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9::text::jsonb, $10, $11, $12, $12) returning *`,
          [
            newId(),
            fn.project_id,
            fn.id,
            kind,
            body.name,
            enabled,
            cron.expression,
            JSON.stringify(body.payload ?? {}),
            body.regions ? JSON.stringify(body.regions) : null,
            this.chooseRegion(fn, body.regions ?? null, null),
            next === null ? null : new Date(next).toISOString(),
            at,
          ],
        );
        return r!;
      });
      await this.changed();
      return row;
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a scheduler named '${body.name}' already exists for this function`);
      throw err;
    }
  }

  async list(functionId: string, page: number, limit: number): Promise<{ data: SchedulerRow[]; total: number }> {
    const [{ total }] = (await this.store.query(`select count(*)::int as total from schedulers where function_id = $1`, [functionId])) as [{ total: number }];
    const data = await this.store.query<SchedulerRow>(`select * from schedulers where function_id = $1 order by created_at, id limit $2 offset $3`, [functionId, limit, (page - 1) * limit]);
    return { data, total };
  }

  /** Every scheduler of the project, of standard and durable functions alike. */
  async listProject(projectId: string, page: number, limit: number): Promise<{ data: SchedulerRow[]; total: number }> {
    const [{ total }] = (await this.store.query(`select count(*)::int as total from schedulers where project_id = $1`, [projectId])) as [{ total: number }];
    const data = await this.store.query<SchedulerRow>(`select * from schedulers where project_id = $1 order by created_at, id limit $2 offset $3`, [projectId, limit, (page - 1) * limit]);
    return { data, total };
  }

  async get(functionId: string, schedulerId: string): Promise<SchedulerRow> {
    const [r] = await this.store.query<SchedulerRow>(`select * from schedulers where id = $1 and function_id = $2`, [schedulerId, functionId]);
    if (!r) throw notFound("scheduler not found");
    return r;
  }

  async update(fn: FunctionRecord, schedulerId: string, patch: PatchSchedulerBody): Promise<SchedulerRow> {
    const cron = patch.schedule ? cronOf(patch.schedule.cron_expression) : null;
    this.checkRegions(fn, patch.regions);
    try {
      const row = await this.store.transaction(async (tx) => {
        const [cur] = await tx.query<SchedulerRow>(`select * from schedulers where id = $1 and function_id = $2 for update`, [schedulerId, fn.id]);
        if (!cur) throw notFound("scheduler not found");
        const now = this.clock.nowMs();
        const enabled = patch.enabled ?? cur.enabled;
        const expression = cron?.expression ?? cur.cron_expression;
        // A new schedule, or a scheduler enabled again, counts from now: no catch-up for the time it was off.
        const reschedule = cron !== null || (enabled && !cur.enabled);
        const next = !enabled ? null : reschedule ? (cron ?? cronOf(expression)).nextAfter(now) : cur.next_run_at ? new Date(cur.next_run_at).getTime() : cronOf(expression).nextAfter(now);
        const regions = patch.regions === undefined ? cur.regions : patch.regions;
        const [r] = await tx.query<SchedulerRow>(
          `update schedulers set name = $2, enabled = $3, cron_expression = $4, payload = $5::text::jsonb, regions = $6::text::jsonb, region = $7,
                  next_run_at = $8, updated_at = $9 where id = $1 returning *`,
          [
            schedulerId,
            patch.name ?? cur.name,
            enabled,
            expression,
            JSON.stringify(patch.payload ?? cur.payload),
            regions ? JSON.stringify(regions) : null,
            this.chooseRegion(fn, regions, patch.regions === undefined ? cur.region : null),
            next === null ? null : new Date(next).toISOString(),
            new Date(now).toISOString(),
          ],
        );
        return r!;
      });
      await this.changed();
      return row;
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a scheduler named '${patch.name}' already exists for this function`);
      throw err;
    }
  }

  async delete(functionId: string, schedulerId: string): Promise<void> {
    const rows = await this.store.query(`delete from schedulers where id = $1 and function_id = $2 returning id`, [schedulerId, functionId]);
    if (!rows.length) throw notFound("scheduler not found");
    await this.changed();
  }

  /** A deleted function's schedulers and their runs go with it (in the deletion's transaction). */
  removeForFunction(tx: Sql, functionId: string): Promise<unknown> {
    return tx.query(`delete from schedulers where function_id = $1`, [functionId]);
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from schedulers where project_id = $1`, [projectId]);
    await this.changed();
  }

  async runs(schedulerId: string, page: number, limit: number) {
    const [{ total }] = (await this.store.query(`select count(*)::int as total from scheduler_runs where scheduler_id = $1`, [schedulerId])) as [{ total: number }];
    const rows = await this.store.query(`select * from scheduler_runs where scheduler_id = $1 order by started_at desc, id desc limit $2 offset $3`, [
      schedulerId,
      limit,
      (page - 1) * limit,
    ]);
    const data = rows.map((r) => ({
      id: r.id as string,
      scheduler_id: r.scheduler_id as string,
      status: r.status as "running" | "succeeded" | "failed",
      scheduled_for: isoTime(r.scheduled_for),
      started_at: isoTime(r.started_at),
      finished_at: isoTimeOrNull(r.finished_at),
      duration_ms: r.duration_ms === null ? null : Number(r.duration_ms),
      invocation_id: (r.invocation_id as string | null) ?? null,
      http_status: (r.http_status as number | null) ?? null,
      region: (r.region as string | null) ?? null,
      error: (r.error as string | null) ?? null,
    }));
    return { data, total };
  }
}
