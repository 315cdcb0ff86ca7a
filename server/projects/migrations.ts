import type { Migration } from "../store/migrations";

/** The projects area's schema. Never edit a released migration: add one. */
export const PROJECTS_MIGRATIONS: Migration[] = [
  {
    id: "projects/001-projects",
    sql: `
      create table projects (
        id text primary key,
        account_id text not null references accounts(id),
        name text not null,
        status text not null,
        all_regions boolean not null,
        selected_regions jsonb not null default '[]',
        failure text,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create index projects_by_account on projects (account_id, status, created_at, id);
    `,
  },
];
