import type { Migration } from "../store/migrations";

/** The durable functions area's schema. Never edit a released migration: add one. */
export const DURABLE_MIGRATIONS: Migration[] = [
  {
    id: "durable/001-executions-steps",
    sql: `
      create table durable_executions (
        id text primary key,
        project_id text not null,
        function_id text not null,
        status text not null,
        input jsonb,
        identity jsonb,
        output jsonb,
        error text,
        rerun_of text,
        wake_at timestamptz,
        lease_owner text,
        lease_until timestamptz,
        segments integer not null default 0,
        crashes integer not null default 0,
        compute_ms double precision not null default 0,
        created_at timestamptz not null,
        updated_at timestamptz not null,
        finished_at timestamptz
      );
      create index durable_executions_by_function on durable_executions (function_id, created_at desc, id desc);
      create index durable_executions_due on durable_executions (wake_at) where status in ('queued', 'sleeping');
      create index durable_executions_running on durable_executions (lease_until) where status = 'running';
      create table durable_steps (
        execution_id text not null,
        seq integer not null,
        name text not null,
        op text not null,
        status text not null,
        attempts integer not null default 0,
        output jsonb,
        error jsonb,
        wake_at timestamptz,
        started_at timestamptz,
        finished_at timestamptz,
        primary key (execution_id, seq)
      );
    `,
  },
  {
    // The hourly retention sweep finds finished executions by age.
    id: "durable/002-finished-index",
    sql: `create index durable_executions_finished on durable_executions (finished_at) where finished_at is not null;`,
  },
];
