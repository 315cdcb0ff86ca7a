import type { ControlStore } from "./store";

/**
 * Versioned schema migrations, applied in order at start and recorded in `kiln_migrations`.
 * Never edit a released migration: add a new one. The embedded template data dir is keyed by the
 * hash of this list, so a new migration also makes a new template.
 */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export const MIGRATIONS: Migration[] = [
  {
    version: 1,
    name: "foundation",
    sql: `
      create table accounts (
        id text primary key,
        plan text not null,
        is_default boolean not null default false,
        created_at timestamptz not null
      );
      create table platform_tokens (
        id text primary key,
        account_id text not null references accounts(id) on delete cascade,
        token_hash text not null unique,
        token_prefix text not null,
        created_at timestamptz not null
      );
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
  {
    version: 2,
    name: "end-users",
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
  {
    version: 3,
    name: "databases",
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
    version: 4,
    name: "functions",
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
];

/** Identifies the schema a template data dir was made with. */
export function migrationsFingerprint(): string {
  const h = new Bun.CryptoHasher("sha256");
  for (const m of MIGRATIONS) h.update(`${m.version}:${m.sql}`);
  return h.digest("hex").slice(0, 16);
}

/**
 * Applies pending migrations. An advisory lock serialises several Kiln instances starting against
 * one PostgreSQL server at the same moment.
 */
export async function migrate(store: ControlStore): Promise<number> {
  await store.query(`select pg_advisory_lock(7420001)`);
  try {
    await store.query(
      `create table if not exists kiln_migrations (version integer primary key, name text not null, applied_at timestamptz not null default now())`,
    );
    const done = new Set(
      (await store.query<{ version: number }>(`select version from kiln_migrations`)).map((r) => r.version),
    );
    let applied = 0;
    for (const m of MIGRATIONS) {
      if (done.has(m.version)) continue;
      await store.transaction(async (tx) => {
        for (const stmt of splitStatements(m.sql)) await tx.query(stmt);
        await tx.query(`insert into kiln_migrations (version, name) values ($1, $2)`, [m.version, m.name]);
      });
      applied++;
    }
    return applied;
  } finally {
    await store.query(`select pg_advisory_unlock(7420001)`);
  }
}

/** Migrations hold plain DDL (no functions with bodies), so splitting on `;` is safe. */
function splitStatements(sql: string): string[] {
  return sql
    .split(/;\s*(?:\n|$)/)
    .map((s) => s.replace(/^\s*--.*$/gm, "").trim())
    .filter(Boolean);
}
