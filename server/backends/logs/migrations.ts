import type { Migration } from "../../store/migrations";

/**
 * The log store's schema. It lives where the log store does: in the embedded profile its own
 * PGlite database (`<data-dir>/logs`, on its own thread), in the production profile the control
 * PostgreSQL database (recorded in its `kiln_schema` like every area's). Never edit a released
 * migration: add one.
 *
 * One row per line. `id` is time-ordered and opaque; lines are read newest first by
 * (project_id, at, id), which is also the keyset of search cursors. Since logs/003 lines are written
 * in segments with their keys (keys.ts); the trigram index of earlier versions is gone.
 */
export const LOG_SCHEMA: Migration[] = [
  {
    id: "logs/001-log-lines",
    sql: `
      create table log_lines (
        id text not null,
        project_id text not null,
        resource_type text not null,
        resource_id text not null,
        resource_name text not null,
        stream text not null,
        deployment_id text,
        invocation_id text,
        region text not null,
        level text not null,
        structured boolean not null,
        body text not null,
        at timestamptz not null
      );
      create index log_lines_newest on log_lines (project_id, at desc, id desc);
      create index log_lines_levels on log_lines (project_id, level, at desc, id desc) where level <> 'info';
      create index log_lines_builds on log_lines (deployment_id, at, id) where stream = 'build';
      create table log_imports (
        source text primary key,
        position text not null
      );
    `,
  },
  {
    // Live tails across instances (production profile; see fanout.ts): which instance tails which
    // project. Expiry is on the database server's clock, which every instance shares.
    id: "logs/002-log-tails",
    sql: `
      create table log_tails (
        instance_id text not null,
        project_id text not null,
        expires_at timestamptz not null,
        primary key (instance_id, project_id)
      );
      create index log_tails_project on log_tails (project_id);
    `,
  },
  {
    // Segments (keys.ts, store.ts): the text index moves from one pg_trgm entry per trigram of every
    // line to one entry per distinct key of a segment of up to 64 lines; the newest-first index goes
    // (segments are read by their own), the partial index of rarer levels stays. Lines written before keep
    // seg null; each project's are one unindexed segment an hour (read by time through
    // log_lines_legacy) until retention has removed them.
    id: "logs/003-segments",
    sql: `
      alter table log_lines add column seg bigint;
      create table log_segments (
        seg bigint primary key,
        project_id text not null,
        resource_type text not null,
        stream text not null,
        deployment_id text,
        min_at timestamptz not null,
        max_at timestamptz not null,
        lines integer not null,
        keys integer[]
      );
      insert into log_segments (seg, project_id, resource_type, stream, deployment_id, min_at, max_at, lines, keys)
        select -row_number() over (), project_id, resource_type, stream, d, min(at), max(at), count(*)::int, null
          from (select project_id, resource_type, stream, case when stream = 'build' then deployment_id end as d, at,
                       date_trunc('hour', at at time zone 'UTC') as h from log_lines) x
         group by project_id, resource_type, stream, d, h;
      create index log_segments_newest on log_segments (project_id, resource_type, stream, max_at desc, seg desc);
      create index log_segments_keys on log_segments using gin (keys) with (fastupdate = on);
      create index log_segments_builds on log_segments (deployment_id) where stream = 'build';
      create index log_segments_legacy on log_segments (project_id, max_at desc) where keys is null;
      create sequence log_segment_batches;
      create index log_lines_seg on log_lines (seg);
      create index log_lines_legacy on log_lines (project_id, at desc, id desc) where seg is null;
      drop index if exists log_lines_newest;
      drop index if exists log_lines_builds;
      drop index if exists log_lines_body_trgm;
    `,
  },
];
