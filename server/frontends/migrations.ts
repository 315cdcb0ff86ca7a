import type { Migration } from "../store/migrations";

/** The frontends area's schema. Never edit a released migration: add one. */
export const FRONTENDS_MIGRATIONS: Migration[] = [
  {
    id: "frontends/001-frontends-deployments-domains",
    sql: `
      create table frontends (
        id text primary key,
        project_id text not null references projects(id),
        name text not null,
        status text not null,
        framework text,
        app_root text,
        variable_scope text not null,
        variables jsonb not null,
        -- the deployment whose archive a redeploy builds again
        artifact_deployment_id text,
        -- the deployment that serves (null until one succeeded)
        serving_deployment_id text,
        current_deployment_id text,
        pending_deployment_id text,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index frontends_name_held on frontends (project_id, name) where status <> 'deleted';
      create table frontend_deployments (
        id text primary key,
        frontend_id text not null references frontends(id),
        project_id text not null,
        kind text not null,
        status text not null,
        source_deployment_id text,
        app_root text,
        framework text,
        source_sha256 text,
        result jsonb,
        warnings jsonb not null default '[]',
        error text,
        created_at timestamptz not null,
        started_at timestamptz,
        finished_at timestamptz
      );
      create index frontend_deployments_by_frontend on frontend_deployments (frontend_id, created_at);
      create table frontend_domains (
        frontend_id text primary key references frontends(id),
        project_id text not null,
        domain text not null,
        status text not null,
        verification_token text not null,
        certificate_pem text not null,
        private_key_pem text not null,
        certificate_chain_pem text,
        created_at timestamptz not null,
        updated_at timestamptz not null
      );
      create unique index frontend_domains_domain on frontend_domains (domain);
    `,
  },
  {
    // The production profile: instances share the control store, each with its own data dir. A
    // deployment's archive and its built output are kept here too, so any instance serves (and
    // redeploys) what another built.
    id: "frontends/002-frontend-code",
    sql: `
      create table frontend_code (
        deployment_id text not null,
        kind text not null,
        bytes bytea not null,
        primary key (deployment_id, kind)
      );
      -- The data dir of the instance running a deployment: its restart runs it again, another instance's does not.
      alter table frontend_deployments add column builder text;
    `,
  },
];
