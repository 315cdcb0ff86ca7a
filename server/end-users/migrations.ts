import type { Migration } from "../store/migrations";

/** The end-users area's schema. Never edit a released migration: add one. */
export const END_USERS_MIGRATIONS: Migration[] = [
  {
    id: "end-users/001-users-sessions-signing-keys",
    sql: `
      create table auth_signing_keys (
        kid text primary key,
        project_id text not null references projects(id),
        private_jwk jsonb not null,
        public_jwk jsonb not null,
        created_at timestamptz not null,
        rotated_at timestamptz
      );
      create index auth_signing_keys_by_project on auth_signing_keys (project_id, created_at);
      create table auth_config (
        project_id text primary key references projects(id),
        config jsonb not null,
        updated_at timestamptz not null
      );
      create table auth_users (
        id text primary key,
        project_id text not null references projects(id),
        email text not null,
        email_lower text not null,
        email_confirmed_at timestamptz,
        password_hash text,
        raw_user_meta_data jsonb not null default '{}',
        status text not null,
        pending_email text,
        last_sign_in_at timestamptz,
        created_at timestamptz not null,
        updated_at timestamptz not null,
        unique (project_id, email_lower)
      );
      create index auth_users_by_project on auth_users (project_id, created_at);
      create table auth_sessions (
        id text primary key,
        project_id text not null,
        user_id text not null references auth_users(id) on delete cascade,
        created_at timestamptz not null,
        revoked_at timestamptz,
        revoked_reason text
      );
      create index auth_sessions_by_user on auth_sessions (user_id);
      create table auth_refresh_tokens (
        token_hash text primary key,
        session_id text not null references auth_sessions(id) on delete cascade,
        spent_at timestamptz,
        created_at timestamptz not null
      );
      create index auth_refresh_tokens_by_session on auth_refresh_tokens (session_id);
      create table auth_one_time_tokens (
        token_hash text primary key,
        project_id text not null,
        user_id text not null references auth_users(id) on delete cascade,
        purpose text not null,
        new_email text,
        redirect_url text,
        expires_at timestamptz not null,
        used_at timestamptz,
        created_at timestamptz not null
      );
    `,
  },
];
