import type { Migration } from "../store/migrations";

/** The keys area's schema. Never edit a released migration: add one. */
export const KEYS_MIGRATIONS: Migration[] = [
  {
    id: "keys/001-service-and-anon-keys",
    sql: `
      create table service_keys (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        key_hash text not null unique,
        key_prefix text not null,
        permissions jsonb,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create table anon_keys (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        key text not null unique,
        permissions jsonb not null,
        created_at timestamptz not null
      );
    `,
  },
];
