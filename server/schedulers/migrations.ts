import type { Migration } from "../store/migrations";

/** The schedulers area's schema. Never edit a released migration: add one. */
export const SCHEDULERS_MIGRATIONS: Migration[] = [
  {
    id: "schedulers/001-schedulers-and-runs",
    sql: `
      create table schedulers (
        id text primary key,
        project_id text not null references projects(id),
        function_id text not null references functions(id),
        function_kind text not null,
        name text not null,
        enabled boolean not null,
        cron_expression text not null,
        payload jsonb not null,
        regions jsonb,
        region text,
        next_run_at timestamptz,
        last_run_at timestamptz,
        created_at timestamptz not null,
        updated_at timestamptz not null,
        unique (function_id, name)
      );
      create index schedulers_due on schedulers (next_run_at) where enabled;
      create index schedulers_by_project on schedulers (project_id, created_at, id);
      create table scheduler_runs (
        id text primary key,
        scheduler_id text not null references schedulers(id) on delete cascade,
        project_id text not null,
        function_id text not null,
        status text not null,
        scheduled_for timestamptz not null,
        started_at timestamptz not null,
        finished_at timestamptz,
        duration_ms double precision,
        invocation_id text,
        http_status integer,
        region text,
        error text
      );
      create index scheduler_runs_by_scheduler on scheduler_runs (scheduler_id, started_at, id);
    `,
  },
  {
    // Which instance runs a run, and until when (wall time) it counts as alive without renewing:
    // an instance's start fails only the runs whose owner is gone, not those of other instances.
    id: "schedulers/002-run-owners",
    sql: `
      alter table scheduler_runs add column owner text;
      alter table scheduler_runs add column lease_until timestamptz;
      create index scheduler_runs_running on scheduler_runs (lease_until) where status = 'running';
    `,
  },
];
