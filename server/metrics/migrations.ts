import type { Migration } from "../store/migrations";

/** The metrics area's schema. Never edit a released migration: add one. */
export const METRICS_MIGRATIONS: Migration[] = [
  {
    id: "metrics/001-minutes-usage-instances",
    sql: `
      create table metric_minutes (
        project_id text not null,
        minute timestamptz not null,
        resource_type text not null,
        region text not null,
        instance_id text not null,
        requests integer not null,
        server_errors integer not null,
        latency_max_ms double precision not null,
        latency_buckets jsonb not null,
        primary key (project_id, minute, resource_type, region, instance_id)
      );
      create index metric_minutes_by_minute on metric_minutes (minute);
      create table usage_hours (
        project_id text not null,
        metric text not null,
        hour timestamptz not null,
        value double precision not null,
        primary key (project_id, metric, hour)
      );
      create table metric_instances (
        instance_id text primary key,
        flushed_through timestamptz not null,
        seen_at timestamptz not null
      );
    `,
  },
  {
    // Frontend Requests broken down by frontend (the usage resource's `frontends`), written with usage_hours.
    id: "metrics/002-usage-frontend-hours",
    sql: `
      create table usage_frontend_hours (
        project_id text not null,
        frontend_id text not null,
        frontend_name text not null,
        hour timestamptz not null,
        requests double precision not null,
        primary key (project_id, frontend_id, hour)
      );
    `,
  },
];
