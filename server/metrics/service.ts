import type { Clock, TimerHandle } from "../clock";
import { HttpError } from "../http/errors";
import { newId } from "../ids";
import type { Logger } from "../log";
import { FlushLoop } from "../store/flush-loop";
import type { ControlStore, Sql } from "../store/store";
import { BUCKETS, bucketOf, mergeInto, quantile } from "./histogram";

const MINUTE_MS = 60_000;
const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;
/**
 * Another instance counts as live (its unwritten minutes may be missing here) while seen this
 * recently; one that stopped cleanly signs off at once, one that crashed stops counting after this.
 */
const LIVE_INSTANCE_MS = 10 * MINUTE_MS;
/** An idle instance still says it is alive (and fresh) this often, in wall time. */
const HEARTBEAT_MS = 10_000;

export const WINDOWS = { "30m": 30 * MINUTE_MS, "1h": HOUR_MS, "24h": DAY_MS, "7d": 7 * DAY_MS } as const;
export type MetricsWindow = keyof typeof WINDOWS;
export const METRICS = ["request_count", "server_error_count", "availability", "p95_latency"] as const;
export type MetricName = (typeof METRICS)[number];
export type GroupBy = "region" | "resource_type";
const UNITS: Record<MetricName, "count" | "ratio" | "ms"> = { request_count: "count", server_error_count: "count", availability: "ratio", p95_latency: "ms" };

/** The spec's usage metrics, in its order, with the key each is kept under. */
export const USAGE_METRICS = [
  ["Function Invocations", "function_invocations"],
  ["Frontend Requests", "frontend_requests"],
  ["Durable Executions", "durable_executions"],
  ["Durable Operations", "durable_operations"],
  ["Durable Compute (MB-Seconds)", "durable_compute_mb_seconds"],
] as const;
/** Which usage metric a finished request of each resource type counts toward. */
const USAGE_OF_REQUESTS: Record<string, string> = { function: "function_invocations", frontend: "frontend_requests" };

export type ResourceType = "function" | "frontend";

/**
 * Adds to usage counters in the caller's transaction: work counted once, when it finishes, in the
 * same commit that records it finished (durable executions), so a crash never counts it twice.
 */
export async function countUsage(tx: Sql, projectId: string, values: Partial<Record<(typeof USAGE_METRICS)[number][1], number>>, atMs: number): Promise<void> {
  for (const [metric, value] of Object.entries(values))
    if (value)
      await tx.query(
        `insert into usage_hours (project_id, metric, hour, value) values ($1, $2, $3, $4)
         on conflict (project_id, metric, hour) do update set value = usage_hours.value + excluded.value`,
        [projectId, metric, iso(floorTo(atMs, HOUR_MS)), value],
      );
}

/** Requests to one frontend in one platform-clock minute, held until that minute is written. */
interface FrontendMinute {
  project_id: string;
  frontend_id: string;
  frontend_name: string;
  minute: number;
  requests: number;
}

export interface FrontendUsage {
  frontend_id: string;
  frontend_name: string;
  requests: number;
}

interface MinuteAgg {
  project_id: string;
  resource_type: string;
  region: string;
  minute: number;
  requests: number;
  server_errors: number;
  max: number;
  buckets: number[];
}

export interface MetricsQuery {
  id: string;
  metric: MetricName;
  group_by?: GroupBy;
}

export interface MetricsResult {
  observed_at: string;
  fresh_through: string;
  window: { from: string; to: string };
  results: Array<{
    id: string;
    metric: MetricName;
    unit: "count" | "ratio" | "ms";
    data_status: "complete" | "partial" | "no_data";
    values: Array<{ dimensions: Record<string, string>; value: number }>;
  }>;
}

export interface UsageSeries {
  metric: string;
  total: number;
  all_time: number;
  daily: Array<{ timestamp: string; value: number }>;
  hourly: Array<{ timestamp: string; value: number }>;
}

const iso = (ms: number) => new Date(ms).toISOString();
const floorTo = (ms: number, unit: number) => Math.floor(ms / unit) * unit;

/**
 * Runtime metrics and usage. Each finished request is counted in memory in its platform-clock
 * minute (requests, server errors, a latency histogram) by project, resource type and region:
 * a few additions, no I/O on the request's path. Completed minutes are written in one transaction
 * every second (minute rows, and hourly usage counters kept for good); reads merge what is still
 * in memory, so this instance's figures are always complete. With several instances on one
 * PostgreSQL, each says how far it has written (`metric_instances`), which gives `fresh_through`.
 */
export class MetricsService {
  private minutes = new Map<string, MinuteAgg>();
  private frontendMinutes = new Map<string, FrontendMinute>();
  /**
   * Set by the frontends area: the current names of a project's frontends by id (deleted ones
   * included while their row is kept); usage falls back to the last name recorded.
   */
  frontendNames: ((projectId: string, ids: string[]) => Promise<Map<string, string>>) | null = null;
  private readonly instanceId = newId();
  private chain: Promise<unknown> = Promise.resolve();
  private readonly loop: FlushLoop;
  private lastHeartbeat = -Infinity;
  private lastHeartbeatMinute = -1;
  private retention: TimerHandle | null = null;

  constructor(
    private readonly d: {
      store: ControlStore;
      clock: Clock;
      log: Logger;
      retentionDays: () => number;
      /** Fault injection: the metrics backend fails this read. */
      fault: () => boolean;
    },
  ) {
    this.loop = new FlushLoop(() => this.serial(() => this.write(false)), (e) => d.log.error("metrics flush failed", e));
    this.loop.start(1000);
  }

  /** A finished request (an invocation): counted in memory, never awaited. */
  record(projectId: string, resourceType: ResourceType, region: string, status: number, latencyMs: number, frontend?: { id: string; name: string }): void {
    const minute = floorTo(this.d.clock.nowMs(), MINUTE_MS);
    if (frontend) {
      const fk = `${minute}\u0000${projectId}\u0000${frontend.id}`;
      const f = this.frontendMinutes.get(fk);
      if (f) f.requests++;
      else this.frontendMinutes.set(fk, { project_id: projectId, frontend_id: frontend.id, frontend_name: frontend.name, minute, requests: 1 });
    }
    const key = `${minute}\u0000${projectId}\u0000${resourceType}\u0000${region}`;
    let m = this.minutes.get(key);
    if (!m) this.minutes.set(key, (m = { project_id: projectId, resource_type: resourceType, region, minute, requests: 0, server_errors: 0, max: 0, buckets: new Array(BUCKETS).fill(0) }));
    m.requests++;
    if (status >= 500) m.server_errors++;
    const ms = Number.isFinite(latencyMs) && latencyMs > 0 ? latencyMs : 0;
    if (ms > m.max) m.max = ms;
    m.buckets[bucketOf(ms)]!++;
  }

  /** Writes and reads take turns, so a read never sees a minute both in memory and in the store (or in neither). */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => {});
    return run;
  }

  private async write(all: boolean): Promise<void> {
    const now = this.d.clock.nowMs();
    const current = floorTo(now, MINUTE_MS);
    const done = [...this.minutes.entries()].filter(([, m]) => all || m.minute < current);
    // Others read how far this instance has written: say so whenever that moved (a new minute), and now and then.
    const doneFrontends = [...this.frontendMinutes.entries()].filter(([, f]) => all || f.minute < current);
    const heartbeat = done.length > 0 || doneFrontends.length > 0 || all || current !== this.lastHeartbeatMinute || performance.now() - this.lastHeartbeat >= HEARTBEAT_MS;
    if (!heartbeat) return;
    const usage = new Map<string, { project: string; metric: string; hour: number; value: number }>();
    for (const [, m] of done) {
      const metric = USAGE_OF_REQUESTS[m.resource_type];
      if (!metric) continue;
      const hour = floorTo(m.minute, HOUR_MS);
      const k = `${m.project_id}\u0000${metric}\u0000${hour}`;
      const u = usage.get(k);
      if (u) u.value += m.requests;
      else usage.set(k, { project: m.project_id, metric, hour, value: m.requests });
    }
    const perFrontend = new Map<string, { project: string; id: string; name: string; hour: number; requests: number }>();
    for (const [, f] of doneFrontends) {
      const hour = floorTo(f.minute, HOUR_MS);
      const k = `${f.project_id}\u0000${f.frontend_id}\u0000${hour}`;
      const u = perFrontend.get(k);
      if (u) (u.requests += f.requests), (u.name = f.frontend_name);
      else perFrontend.set(k, { project: f.project_id, id: f.frontend_id, name: f.frontend_name, hour, requests: f.requests });
    }
    // Everything before this instant is in the store (the minutes not yet complete are not).
    const flushedThrough = all ? now : current;
    await this.d.store.transaction(async (tx) => {
      // A minute is written once per instance: only past minutes are (the clock never goes back),
      // and the current one only at stop, after which this instance records nothing.
      for (const [, m] of done)
        await tx.query(
          `insert into metric_minutes (project_id, minute, resource_type, region, instance_id, requests, server_errors, latency_max_ms, latency_buckets)
           values ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb)`,
          [m.project_id, iso(m.minute), m.resource_type, m.region, this.instanceId, m.requests, m.server_errors, m.max, JSON.stringify(m.buckets)],
        );
      for (const u of usage.values())
        await tx.query(
          `insert into usage_hours (project_id, metric, hour, value) values ($1, $2, $3, $4)
           on conflict (project_id, metric, hour) do update set value = usage_hours.value + excluded.value`,
          [u.project, u.metric, iso(u.hour), u.value],
        );
      for (const u of perFrontend.values())
        await tx.query(
          `insert into usage_frontend_hours (project_id, frontend_id, frontend_name, hour, requests) values ($1, $2, $3, $4, $5)
           on conflict (project_id, frontend_id, hour) do update set requests = usage_frontend_hours.requests + excluded.requests, frontend_name = excluded.frontend_name`,
          [u.project, u.id, u.name, iso(u.hour), u.requests],
        );
      await tx.query(
        `insert into metric_instances (instance_id, flushed_through, seen_at) values ($1, $2, $3)
         on conflict (instance_id) do update set flushed_through = excluded.flushed_through, seen_at = excluded.seen_at`,
        [this.instanceId, iso(flushedThrough), iso(now)],
      );
    });
    for (const [k] of done) this.minutes.delete(k);
    for (const [k] of doneFrontends) this.frontendMinutes.delete(k);
    this.lastHeartbeat = performance.now();
    this.lastHeartbeatMinute = current;
  }

  private held(projectId: string, fromMs: number, toMs: number): MinuteAgg[] {
    const out: MinuteAgg[] = [];
    for (const m of this.minutes.values()) if (m.project_id === projectId && m.minute >= fromMs && m.minute < toMs) out.push(m);
    return out;
  }

  /** POST /projects/{id}/metrics/query: windows end at the most recent completed UTC minute. */
  async query(projectId: string, window: MetricsWindow, queries: readonly MetricsQuery[]): Promise<MetricsResult> {
    const now = this.d.clock.nowMs();
    const to = floorTo(now, MINUTE_MS);
    const from = to - WINDOWS[window];
    const { rows, freshThrough } = await this.serial(async () => {
      try {
        if (this.d.fault()) throw new Error("injected fault: metrics-backend");
        const stored = await this.d.store.query(
          `select resource_type, region, requests, server_errors, latency_max_ms, latency_buckets::text as buckets from metric_minutes where project_id = $1 and minute >= $2 and minute < $3`,
          [projectId, iso(from), iso(to)],
        );
        const [others] = await this.d.store.query<{ through: Date | string | null }>(
          `select min(flushed_through) as through from metric_instances where instance_id <> $1 and seen_at >= $2`,
          [this.instanceId, iso(now - LIVE_INSTANCE_MS)],
        );
        const rows: MinuteAgg[] = stored.map((r) => ({
          project_id: projectId,
          resource_type: r.resource_type,
          region: r.region,
          minute: 0,
          requests: r.requests,
          server_errors: r.server_errors,
          max: Number(r.latency_max_ms),
          buckets: JSON.parse(r.buckets as string) as number[],
        }));
        rows.push(...this.held(projectId, from, to));
        const through = others?.through ? new Date(others.through).getTime() : to;
        return { rows, freshThrough: Math.min(to, through) };
      } catch (err) {
        this.d.log.error("metrics query failed", err);
        throw new HttpError(503, { error: "the metrics backend is unavailable; retry shortly" });
      }
    });
    const results = queries.map((q) => {
      const groups = new Map<string, { dimensions: Record<string, string>; requests: number; errors: number; max: number; buckets: number[] }>();
      for (const r of rows) {
        const dimensions: Record<string, string> = q.group_by === "region" ? { region: r.region } : q.group_by === "resource_type" ? { resource_type: r.resource_type } : {};
        const key = JSON.stringify(dimensions);
        let g = groups.get(key);
        if (!g) groups.set(key, (g = { dimensions, requests: 0, errors: 0, max: 0, buckets: new Array(BUCKETS).fill(0) }));
        g.requests += r.requests;
        g.errors += r.server_errors;
        g.max = Math.max(g.max, r.max);
        mergeInto(g.buckets, r.buckets);
      }
      const values: MetricsResult["results"][number]["values"] = [];
      for (const g of [...groups.values()].sort((a, b) => JSON.stringify(a.dimensions).localeCompare(JSON.stringify(b.dimensions)))) {
        if (g.requests === 0) continue;
        const value =
          q.metric === "request_count"
            ? g.requests
            : q.metric === "server_error_count"
              ? g.errors
              : q.metric === "availability"
                ? 1 - g.errors / g.requests
                : Math.round(quantile(g.buckets, 0.95, g.max)! * 1000) / 1000;
        values.push({ dimensions: g.dimensions, value });
      }
      const data_status = values.length === 0 ? "no_data" : freshThrough >= to ? "complete" : "partial";
      return { id: q.id, metric: q.metric, unit: UNITS[q.metric], data_status, values } as const;
    });
    return { observed_at: iso(now), fresh_through: iso(freshThrough), window: { from: iso(from), to: iso(to) }, results };
  }

  /** GET /projects/{id}/usage: a UTC month's series (daily and hourly up to now), its total and all time. */
  async usage(projectId: string, month: string): Promise<{ project_id: string; month: string; metrics: UsageSeries[]; frontends: FrontendUsage[] }> {
    const [y, mo] = month.split("-").map(Number) as [number, number];
    const start = Date.UTC(y, mo - 1, 1);
    const end = Date.UTC(y, mo, 1);
    const now = this.d.clock.nowMs();
    const { hours, allTime, frontends } = await this.serial(async () => {
      const rows = await this.d.store.query(`select metric, hour, value from usage_hours where project_id = $1 and hour >= $2 and hour < $3`, [projectId, iso(start), iso(end)]);
      const totals = await this.d.store.query(`select metric, sum(value) as value from usage_hours where project_id = $1 group by metric`, [projectId]);
      const hours = new Map<string, number>();
      const allTime = new Map<string, number>();
      const add = (m: Map<string, number>, k: string, v: number) => m.set(k, (m.get(k) ?? 0) + v);
      for (const r of rows) add(hours, `${r.metric}\u0000${new Date(r.hour).getTime()}`, Number(r.value));
      for (const r of totals) add(allTime, r.metric as string, Number(r.value));
      // Minutes not yet written count too (usage is counted when a request finishes).
      for (const m of this.minutes.values()) {
        const metric = USAGE_OF_REQUESTS[m.resource_type];
        if (m.project_id !== projectId || !metric) continue;
        add(allTime, metric, m.requests);
        if (m.minute >= start && m.minute < end) add(hours, `${metric}\u0000${floorTo(m.minute, HOUR_MS)}`, m.requests);
      }
      // Per frontend: the month's hours written, the last name written (from its latest hour), then what is held.
      const perFrontend = await this.d.store.query(
        `select frontend_id, sum(requests) as requests,
                (select u2.frontend_name from usage_frontend_hours u2 where u2.project_id = $1 and u2.frontend_id = u.frontend_id order by u2.hour desc limit 1) as frontend_name
         from usage_frontend_hours u where project_id = $1 and hour >= $2 and hour < $3 group by frontend_id`,
        [projectId, iso(start), iso(end)],
      );
      const frontends = new Map<string, FrontendUsage>();
      for (const r of perFrontend) frontends.set(r.frontend_id as string, { frontend_id: r.frontend_id as string, frontend_name: r.frontend_name as string, requests: Number(r.requests) });
      for (const f of this.frontendMinutes.values()) {
        if (f.project_id !== projectId || f.minute < start || f.minute >= end) continue;
        const u = frontends.get(f.frontend_id);
        if (u) (u.requests += f.requests), (u.frontend_name = f.frontend_name);
        else frontends.set(f.frontend_id, { frontend_id: f.frontend_id, frontend_name: f.frontend_name, requests: f.requests });
      }
      return { hours, allTime, frontends };
    });
    const lastHour = Math.min(end, floorTo(now, HOUR_MS) + HOUR_MS);
    const lastDay = Math.min(end, floorTo(now, DAY_MS) + DAY_MS);
    const metrics = USAGE_METRICS.map(([name, key]) => {
      const hourly: UsageSeries["hourly"] = [];
      for (let h = start; h < lastHour; h += HOUR_MS) hourly.push({ timestamp: iso(h), value: hours.get(`${key}\u0000${h}`) ?? 0 });
      const daily: UsageSeries["daily"] = [];
      for (let d = start; d < lastDay; d += DAY_MS) {
        let v = 0;
        for (let h = d; h < d + DAY_MS; h += HOUR_MS) v += hours.get(`${key}\u0000${h}`) ?? 0;
        daily.push({ timestamp: iso(d), value: v });
      }
      let total = 0;
      for (const [k, v] of hours) if (k.startsWith(`${key}\u0000`)) total += v;
      return { metric: name, total, all_time: allTime.get(key) ?? 0, daily, hourly };
    });
    if (frontends.size > 0 && this.frontendNames) {
      const current = await this.frontendNames(projectId, [...frontends.keys()]);
      for (const f of frontends.values()) f.frontend_name = current.get(f.frontend_id) ?? f.frontend_name;
    }
    const byRequests = [...frontends.values()].sort((a, b) => b.requests - a.requests || (a.frontend_name < b.frontend_name ? -1 : a.frontend_name > b.frontend_name ? 1 : 0) || (a.frontend_id < b.frontend_id ? -1 : 1));
    return { project_id: projectId, month, metrics, frontends: byRequests };
  }

  /** Per-minute rows older than KILN_METRICS_RETENTION_DAYS go, hourly on the platform clock (usage counters stay). */
  startRetention(): void {
    this.retention = this.d.clock.every(HOUR_MS, () => this.sweep(), "metrics retention");
  }

  /**
   * One retention pass. Completed minutes still in memory are written first, so that none older
   * than the cutoff is written after the pass (when the clock jumps days, the one-second writes
   * have not yet run for the minutes passed over).
   */
  async sweep(): Promise<void> {
    await this.serial(async () => {
      await this.write(false);
      await this.d.store.query(`delete from metric_minutes where minute < $1`, [iso(this.d.clock.nowMs() - this.d.retentionDays() * DAY_MS)]);
    });
  }

  async removeProject(projectId: string): Promise<void> {
    await this.serial(async () => {
      for (const [k, m] of this.minutes) if (m.project_id === projectId) this.minutes.delete(k);
      for (const [k, f] of this.frontendMinutes) if (f.project_id === projectId) this.frontendMinutes.delete(k);
      await this.d.store.query(`delete from metric_minutes where project_id = $1`, [projectId]);
      await this.d.store.query(`delete from usage_hours where project_id = $1`, [projectId]);
      await this.d.store.query(`delete from usage_frontend_hours where project_id = $1`, [projectId]);
    });
  }

  /** At stop: every minute held (the current one too) is written, and this instance signs off. */
  /**
   * A snapshot restore in place: everything counted so far is written before the rows are put back
   * (so it goes with them), and this instance says again how far it has written.
   */
  async writeAll(): Promise<void> {
    await this.serial(() => this.write(true));
  }

  restored(): void {
    this.lastHeartbeat = -Infinity;
    this.lastHeartbeatMinute = -1;
  }

  async stop(): Promise<void> {
    this.retention?.cancel();
    await this.loop.stop();
    await this.serial(async () => {
      await this.write(true);
      await this.d.store.query(`delete from metric_instances where instance_id = $1`, [this.instanceId]);
    });
  }
}
