import type { Migration } from "../store/migrations";

/** The variables area's schema. Never edit a released migration: add one. */
export const VARIABLES_MIGRATIONS: Migration[] = [
  {
    id: "variables/001-variables",
    sql: `
      create table variables (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        value text not null,
        status text not null,
        current_sync_id text not null,
        created_at timestamptz not null,
        updated_at timestamptz not null,
        unique (project_id, name)
      );
    `,
  },
];
