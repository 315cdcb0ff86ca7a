import type { Migration } from "../store/migrations";

/**
 * The log store's schema. It lives where the log store does: in the embedded profile its own
 * PGlite database (`<data-dir>/logs`, on its own thread), in the production profile the control
 * PostgreSQL database (recorded in its `kiln_schema` like every area's). Never edit a released
 * migration: add one.
 *
 * One row per line. `id` is time-ordered and opaque; lines are read newest first by
 * (project_id, at, id), which is also the keyset of search cursors. Build lines (stream `build`)
 * have their own small partial index. The free-text index (pg_trgm) is made by `ensureTextIndex`,
 * not here: a production server without the extension still serves searches, by scanning.
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
];

/** The trigram index behind free-text search (`body ilike '%term%'`); pg_trgm is a trusted extension. */
export const TEXT_INDEX_SQL = [
  `create extension if not exists pg_trgm`,
  `create index if not exists log_lines_body_trgm on log_lines using gin (body gin_trgm_ops)`,
];
