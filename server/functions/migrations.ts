import type { Migration } from "../store/migrations";

/** The functions area's schema. Never edit a released migration: add one. */
export const FUNCTIONS_MIGRATIONS: Migration[] = [
  {
    id: "functions/001-functions-deployments-logs",
    sql: `
      create table functions (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        status text not null,
        is_public boolean not null,
        invocation_mode text not null,
        http_auth_mode text not null,
        openapi_spec jsonb,
        runtime text not null,
        handler text not null,
        active_deployment_id text,
        pending_deployment_id text,
        delete_requested boolean not null default false,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index functions_name_held on functions (project_id, name) where status <> 'deleted';
      create table function_deployments (
        id text primary key,
        function_id text not null references functions(id),
        project_id text not null,
        kind text not null,
        status text not null,
        runtime text,
        handler text,
        source_sha256 text,
        build jsonb,
        error text,
        created_at timestamptz not null,
        started_at timestamptz,
        finished_at timestamptz
      );
      create index function_deployments_by_function on function_deployments (function_id, created_at);
      create table function_build_logs (
        deployment_id text not null,
        seq integer not null,
        at timestamptz not null,
        level text not null,
        line text not null,
        primary key (deployment_id, seq)
      );
      create table function_logs (
        id text primary key,
        project_id text not null,
        function_id text not null,
        deployment_id text,
        invocation_id text,
        region text not null,
        level text not null,
        body text not null,
        at timestamptz not null
      );
      create index function_logs_by_project on function_logs (project_id, at);
    `,
  },
  {
    id: "functions/002-deployment-batch-id",
    sql: `
      alter table function_deployments add column batch_id text;
    `,
  },
  {
    // Durable functions share the table, the deploy pipeline and the build; each kind is its own
    // collection (names and the cap are per kind).
    id: "functions/003-function-kind",
    sql: `
      alter table functions add column kind text not null default 'standard';
      drop index functions_name_held;
      create unique index functions_name_held on functions (project_id, kind, name) where status <> 'deleted';
    `,
  },
  {
    // Production profile (several instances, each with its own data dir): a deployment's source
    // archive and its built code are kept in the control store too, so any instance can build a
    // deployment queued on another and run code another built; a running deployment has an owner and
    // a lease (wall time), so a build whose instance died is failed by another once it lapses.
    id: "functions/004-shared-code-and-build-leases",
    sql: `
      create table function_code (
        deployment_id text not null,
        kind text not null,
        bytes bytea not null,
        primary key (deployment_id, kind)
      );
      alter table function_deployments add column builder text;
      alter table function_deployments add column lease_until timestamptz;
      -- Each instance looks for unsettled deployments every second: a partial index keeps that off the history.
      create index function_deployments_unsettled on function_deployments (function_id) where status in ('queued', 'building');
    `,
  },
];
