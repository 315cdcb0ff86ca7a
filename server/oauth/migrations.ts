import type { Migration } from "../store/migrations";

/** The OAuth area's schema. Never edit a released migration: add one. */
export const OAUTH_MIGRATIONS: Migration[] = [
  {
    id: "oauth/001-configs-identities-flows",
    sql: `
      -- Provider configurations: one per provider and project, and any number of device clients
      -- (one per client_id). client_secret is written encrypted with the instance secret key.
      create table oauth_configs (
        id text primary key,
        project_id text not null references projects(id),
        provider text not null,
        client_id text not null,
        client_secret text,
        enabled boolean not null,
        redirect_url text,
        scopes jsonb not null,
        issuer text,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index oauth_configs_one_per_provider on oauth_configs (project_id, provider) where provider <> 'device';
      create unique index oauth_configs_device_client on oauth_configs (project_id, client_id) where provider = 'device';

      -- An end user's sign-in through a provider: the provider's subject, linked to one user.
      create table oauth_identities (
        id text primary key,
        project_id text not null references projects(id),
        user_id text not null references auth_users(id) on delete cascade,
        provider text not null,
        subject text not null,
        email text,
        linked_at timestamptz not null,
        updated_at timestamptz not null,
        unique (project_id, provider, subject),
        unique (user_id, provider)
      );

      -- One authorization in flight: the state sent to the provider (hashed), PKCE verifier, nonce.
      create table oauth_states (
        state_hash text primary key,
        project_id text not null references projects(id),
        provider text not null,
        purpose text not null,
        user_id text,
        redirect_url text,
        client_state text,
        code_verifier text not null,
        nonce text not null,
        device_code_hash text,
        expires_at timestamptz not null,
        used_at timestamptz,
        created_at timestamptz not null
      );
      create index oauth_states_by_project on oauth_states (project_id);

      -- The single-use code a redirect carries back to the app, and the identity it stands for.
      create table oauth_codes (
        code_hash text primary key,
        project_id text not null references projects(id),
        provider text not null,
        redirect_url text not null,
        identity jsonb not null,
        expires_at timestamptz not null,
        used_at timestamptz,
        created_at timestamptz not null
      );
      create index oauth_codes_by_project on oauth_codes (project_id);

      -- RFC 8628 device authorizations.
      create table oauth_device_codes (
        device_code_hash text primary key,
        project_id text not null references projects(id),
        client_id text not null,
        user_code text not null,
        scope text,
        status text not null,
        user_id text references auth_users(id) on delete cascade,
        interval_seconds integer not null,
        last_polled_at timestamptz,
        expires_at timestamptz not null,
        created_at timestamptz not null
      );
      create unique index oauth_device_codes_user_code on oauth_device_codes (user_code);
      create index oauth_device_codes_by_project on oauth_device_codes (project_id);
    `,
  },
];
