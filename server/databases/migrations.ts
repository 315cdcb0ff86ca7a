import type { Migration } from "../store/migrations";

/** The databases area's schema. Never edit a released migration: add one. */
export const DATABASES_MIGRATIONS: Migration[] = [
  {
    id: "databases/001-databases-and-usage",
    sql: `
      create table databases (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        region text not null,
        pg_version integer not null,
        status text not null,
        client_password text not null,
        failure text,
        storage_bytes bigint,
        storage_sampled_at timestamptz,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index databases_name_held on databases (project_id, name) where status <> 'deleted';
      create index databases_by_project on databases (project_id, created_at);
      create table database_query_stats (
        database_id text not null,
        query_id text not null,
        query text not null,
        role text not null,
        calls integer not null,
        total_ms double precision not null,
        min_ms double precision not null,
        max_ms double precision not null,
        rows_processed integer not null,
        primary key (database_id, query_id, role)
      );
      create table database_usage (
        database_id text not null,
        hour timestamptz not null,
        data_written_bytes bigint not null default 0,
        data_transfer_bytes bigint not null default 0,
        compute_ms double precision not null default 0,
        active_ms double precision not null default 0,
        primary key (database_id, hour)
      );
    `,
  },
];
