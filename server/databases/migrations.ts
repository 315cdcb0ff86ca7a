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
  {
    id: "databases/002-branches",
    sql: `
      create table database_branches (
        id text primary key,
        database_id text not null references databases(id),
        project_id text not null,
        name text not null,
        status text not null,
        client_password text not null,
        ttl_seconds integer not null,
        expires_at timestamptz not null,
        storage_bytes bigint,
        storage_sampled_at timestamptz,
        failure text,
        generation integer not null default 0,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index database_branches_name_held on database_branches (database_id, name) where status <> 'deleted';
      create index database_branches_by_database on database_branches (database_id, created_at);
      create index database_branches_expiry on database_branches (expires_at) where status in ('provisioning', 'active', 'failed');
      create table database_branch_fingerprints (
        branch_id text primary key,
        fingerprint text not null
      );
    `,
  },
  {
    id: "databases/003-backups-and-restores",
    sql: `
      create table database_backups (
        id text primary key,
        database_id text not null references databases(id),
        name text not null,
        source text not null,
        status text not null,
        size_bytes bigint,
        expires_at timestamptz,
        created_at timestamptz not null
      );
      create unique index database_backups_name_held on database_backups (database_id, name) where status <> 'deleted';
      create index database_backups_by_database on database_backups (database_id, created_at);
      create index database_backups_expiry on database_backups (expires_at) where status = 'ready';
      create table database_backup_schedule (
        database_id text not null references databases(id),
        position integer not null,
        frequency text not null,
        hour integer not null,
        day integer,
        retention_seconds integer not null,
        next_run_at timestamptz not null,
        primary key (database_id, position)
      );
      create table database_restores (
        id text primary key,
        database_id text not null references databases(id),
        project_id text not null,
        kind text not null,
        status text not null,
        backup_id text,
        backup_name text,
        restore_to timestamptz,
        attempts integer not null default 0,
        next_attempt_at timestamptz,
        error text,
        completed_at timestamptz,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create index database_restores_by_database on database_restores (database_id, created_at);
      create index database_restores_due on database_restores (next_attempt_at) where status = 'pending';
    `,
  },
  {
    // A pre-restore state: the data a restore replaced, kept as a backup of the restore that replaced it
    // (restore_id), for the plan's retention at the time the restore was asked for (keep_seconds).
    id: "databases/004-pre-restore-states",
    sql: `
      alter table database_backups add column restore_id text;
      alter table database_restores add column keep_seconds integer not null default 0;
      create index database_backups_pre_restore on database_backups (database_id) where restore_id is not null and status = 'ready';
    `,
  },
  {
    // A database made by CREATE DATABASE over the wire: whose credentials (a database's or branch's id)
    // made it. Those credentials reach it (only the database name changes) and may DROP it.
    // copy_of_id: provisioned as a copy of that database (CREATE DATABASE ... TEMPLATE), so a start
    // that resumes its provisioning copies it again rather than leave it empty.
    id: "databases/005-wire-created",
    sql: `
      alter table databases add column wire_origin_id text;
      alter table databases add column copy_of_id text;
      create index databases_wire_origin on databases (wire_origin_id) where wire_origin_id is not null;
    `,
  },
];
