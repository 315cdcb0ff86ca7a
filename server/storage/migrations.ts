import type { Migration } from "../store/migrations";

/**
 * The storage area's schema: buckets, objects, policies, resumable upload sessions and the month's
 * bandwidth, plus the functions storage policies call (auth.uid(), auth.role(), auth.email() read
 * transaction-local settings Kiln sets from the caller; the storage.* path helpers are pure).
 */
export const STORAGE_MIGRATIONS: Migration[] = [
  {
    id: "storage/001-buckets-objects-policies-uploads",
    sql: `
      create table storage_buckets (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        file_size_limit bigint,
        allowed_mime_types jsonb not null default '[]',
        created_at timestamptz not null,
        updated_at timestamptz not null,
        unique (project_id, name)
      );
      create table storage_objects (
        id text primary key,
        project_id text not null,
        bucket_id text not null references storage_buckets(id) on delete cascade,
        name text not null,
        owner_id text,
        size bigint not null,
        mime_type text not null,
        etag text not null,
        is_public boolean not null default false,
        metadata jsonb not null default '{}',
        blob_key text not null,
        created_at timestamptz not null,
        updated_at timestamptz not null,
        unique (bucket_id, name)
      );
      create index storage_objects_by_project_owner on storage_objects (project_id, owner_id, created_at, id);
      create table storage_policies (
        id text primary key,
        project_id text not null,
        bucket_id text not null references storage_buckets(id) on delete cascade,
        name text not null,
        operation text not null,
        definition text not null,
        created_at timestamptz not null,
        unique (bucket_id, name)
      );
      create table storage_upload_sessions (
        id text primary key,
        project_id text not null,
        bucket_id text not null references storage_buckets(id) on delete cascade,
        path text not null,
        content_type text not null,
        total_size bigint not null,
        part_size bigint not null,
        total_parts integer not null,
        owner_id text,
        created_by_service boolean not null,
        metadata jsonb not null default '{}',
        upsert boolean not null default false,
        expires_at timestamptz not null,
        created_at timestamptz not null
      );
      create index storage_upload_sessions_expiry on storage_upload_sessions (expires_at);
      create table storage_upload_parts (
        session_id text not null references storage_upload_sessions(id) on delete cascade,
        part_number integer not null,
        size bigint not null,
        etag text not null,
        blob_key text not null,
        uploaded_at timestamptz not null,
        primary key (session_id, part_number)
      );
      create table storage_bandwidth (
        project_id text not null,
        month text not null,
        bytes bigint not null,
        primary key (project_id, month)
      );
      create schema if not exists auth;
      create schema if not exists storage;
      create or replace function auth.uid() returns text language sql stable as $$ select nullif(current_setting('kiln.uid', true), '') $$;
      create or replace function auth.role() returns text language sql stable as $$ select nullif(current_setting('kiln.role', true), '') $$;
      create or replace function auth.email() returns text language sql stable as $$ select nullif(current_setting('kiln.email', true), '') $$;
      create or replace function storage.foldername(name text) returns text[] language sql immutable as $$ select (string_to_array(name, '/'))[1:cardinality(string_to_array(name, '/')) - 1] $$;
      create or replace function storage.filename(name text) returns text language sql immutable as $$ select (string_to_array(name, '/'))[cardinality(string_to_array(name, '/'))] $$;
      create or replace function storage.extension(name text) returns text language sql immutable as $$ select coalesce(substring(storage.filename(name) from '\\.([^./]*)$'), '') $$;
    `,
  },
  {
    // What a project stores, kept as a running total so the quota check is one row, not a sum over every object.
    id: "storage/002-project-usage",
    sql: `
      create table storage_project_usage (
        project_id text primary key,
        bytes bigint not null
      );
      insert into storage_project_usage (project_id, bytes) select project_id, sum(size) from storage_objects group by project_id;
    `,
  },
  {
    // The sweep of unreferenced blobs (orphans.ts) asks which of a batch of keys a row holds.
    id: "storage/003-objects-by-blob-key",
    sql: `create index storage_objects_by_blob_key on storage_objects (blob_key);`,
  },
];
