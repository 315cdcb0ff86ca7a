import type { Migration } from "../store/migrations";

/** The access-tokens area's schema. Never edit a released migration: add one. */
export const ACCESS_TOKENS_MIGRATIONS: Migration[] = [
  {
    id: "access-tokens/001-access-tokens",
    sql: `
      create table access_tokens (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        token_hash text not null unique,
        token_prefix text not null,
        scope text not null,
        token_source text not null,
        expires_at timestamptz,
        revoked_at timestamptz,
        last_used_at timestamptz,
        all_time_requests integer not null default 0,
        created_at timestamptz not null
      );
      -- a name is held by every token that is not revoked (expired ones included)
      create unique index access_tokens_name_held on access_tokens (project_id, name) where revoked_at is null;
      create index access_tokens_by_project on access_tokens (project_id, created_at);
      create table access_token_usage (
        token_id text not null references access_tokens(id) on delete cascade,
        day date not null,
        requests integer not null,
        primary key (token_id, day)
      );
    `,
  },
];
