import type { Migration } from "../store/migrations";

/** The config area's schema. Never edit a released migration: add one. */
export const CONFIG_MIGRATIONS: Migration[] = [
  {
    id: "config/001-applies",
    // One row while a project's configuration apply runs: a second apply finds it and answers 409.
    sql: `
      create table config_applies (
        project_id text primary key references projects(id),
        started_at timestamptz not null
      );
    `,
  },
];
