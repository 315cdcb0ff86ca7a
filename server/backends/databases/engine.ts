import { createWriteStream, renameSync } from "node:fs";
import type { WireBackend, WireClient, WireControl } from "./wire/listener";

/**
 * Who a statement runs as. `admin` is the service role: it owns the tables and bypasses row-level
 * security. `user` and `anonymous` run as the `authenticated` / `anonymous` roles with the request
 * claims set, so RLS policies and the auth.* helpers see that user.
 */
export type AccessMode = (
  | { kind: "admin" }
  | { kind: "user"; userId: string; email: string | null }
  | { kind: "anonymous" }
) & {
  /** `run` only: the statement's transaction is READ ONLY (PostgreSQL refuses every write in it; the MCP endpoint's read-only SQL). */
  readOnly?: boolean;
};

export interface QueryResult {
  rows: Record<string, unknown>[];
  /** Time spent inside the database, in milliseconds. */
  computeMs: number;
}

/** A database error PostgreSQL reported (bad SQL, missing table, constraint): the caller's fault. */
export class DatabaseQueryError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/** What this engine cannot do here (the production engine without pg_dump, say): 503, not 500. */
export class EngineUnavailable extends Error {}

/**
 * Where managed databases live. Two engines implement it: embedded (one PGlite per database in the
 * data dir) and production (databases on a real PostgreSQL server). Routes and services never know
 * which one runs.
 */
export interface DatabaseEngine {
  readonly kind: "embedded" | "postgres";
  /** The PostgreSQL major version(s) this engine really runs; `pg_version` is recorded, not emulated. */
  serverVersions(): number[];
  create(id: string): Promise<void>;
  drop(id: string): Promise<void>;
  /** One statement as the given role, in its own transaction. Throws DatabaseQueryError for SQL errors. */
  run(id: string, mode: AccessMode, text: string, params: unknown[]): Promise<QueryResult>;
  /** A wire-protocol session for an authenticated client of this database. */
  openWire(id: string, mode: AccessMode, client: WireClient, control: WireControl): Promise<WireBackend>;
  sizeBytes(id: string): Promise<number>;
  /** Why forks, backups and restores cannot run here (503), or null when they can. */
  copiesUnavailable(): Promise<string | null>;
  /**
   * Makes `childId` (replacing whatever it held) a transactionally consistent copy of `parentId`,
   * taken while the parent keeps serving. Returns a fingerprint of the copy for `divergenceBytes`.
   */
  fork(parentId: string, childId: string): Promise<string>;
  /** Bytes of `id` that differ from what it held when `fingerprint` was taken (a branch's divergence). */
  divergenceBytes(id: string, fingerprint: string): Promise<number>;
  /** Ends every client of `id` at once (FATAL with `reason`); its data stays. */
  disconnect(id: string, reason: string): Promise<void>;
  /** A consistent copy of `id` at `path` (a new file or folder), taken while it serves; its size in bytes. */
  backup(id: string, path: string): Promise<number>;
  /**
   * Replaces `id`'s data with the backup at `path`. Clients are ended. If it throws before the swap
   * (`RestoreNotStarted`), the database is untouched. With `keepAt`, the data it replaces is kept there
   * first (a backup `restore` accepts: the pre-restore state); it returns that copy's size in bytes
   * (null without `keepAt`). A pre-restore state that cannot be kept is a RestoreNotStarted.
   */
  restore(id: string, path: string, keepAt?: string): Promise<number | null>;
  /**
   * A pg_dump of `id` (`custom` or `plain`) written to `path`, taken from a consistent snapshot while
   * the database keeps serving; its size in bytes. Without owners (a restore's objects belong to
   * whoever restores) and without Kiln's own `auth` schema (every Kiln database already has it).
   */
  dump(id: string, format: DumpFormat, path: string): Promise<number>;
  /** Point-in-time restore from the database's own backups and WAL (embedded); absent otherwise. */
  readonly pointInTime?: PointInTime;
  /** Point-in-time restore from the engine's own base backups and WAL archive of the server (production); absent otherwise. */
  readonly serverPointInTime?: ServerPointInTime;
  close(): Promise<void>;
}

/**
 * Restoring a database to any instant after one of its backups: the backup is the base, the
 * database's own WAL since then is replayed up to the instant. Times are the platform clock's (the
 * engine's databases keep it).
 */
export interface PointInTime {
  /** What a backup offers as a base: where its copy began and ended in the WAL, and when it ended; null if it is not one. */
  baseOf(backupPath: string): { startLsn: number; endLsn: number; endMs: number } | null;
  /** The oldest WAL position the database still holds (a base older than it cannot be replayed from). */
  walStart(id: string): number | null;
  /** Lets the WAL before `keepFromLsn` (and before the last checkpoint) go; null keeps only what the database needs. */
  pruneWal(id: string, keepFromLsn: number | null): Promise<void>;
  /**
   * Replaces `id`'s data with its state at `atMs`: the base, and the WAL up to the first transaction
   * committed after that instant (which, and everything after it, is discarded). RestoreNotStarted
   * when it cannot (nothing replaced).
   */
  restoreTo(id: string, basePath: string, atMs: number, keepAt?: string): Promise<number | null>;
}

/**
 * Point-in-time restore of one database of a PostgreSQL server the engine does not own: the engine
 * archives the server's WAL and takes base backups of it, and restores an instant by recovering a
 * throwaway copy of the server to it. Times are real time (epoch ms on Kiln's clock; the engine
 * corrects for the server's clock): the caller maps platform-clock instants to them.
 */
export interface ServerPointInTime {
  /** Why it cannot run here (503), null when it can; `off` when it was not turned on. */
  status(): { state: "on" } | { state: "off"; reason: string } | { state: "unavailable"; reason: string };
  /** The real instants it can restore now: from the end of the oldest kept base backup to the last moment the archive was known complete; null before the first base. */
  range(): { earliestMs: number; latestMs: number } | null;
  /** Replaces `id`'s data with its state at real instant `atMs` (as `restore`, `keepAt` keeps what it replaces). RestoreNotStarted when nothing was replaced. */
  restoreTo(id: string, atMs: number, keepAt?: string): Promise<number | null>;
}

export type DumpFormat = "custom" | "plain";

/** pg_dump's arguments for a user's dump, the same on both engines. */
export function dumpArgs(format: DumpFormat): string[] {
  return [`--format=${format}`, "--no-owner", "--exclude-schema=auth"];
}

/**
 * Makes the plain dump at `path` loadable by an older psql and server: pg_dump 17+ writes
 * `SET transaction_timeout = 0;` in its header, a setting PostgreSQL 15 and 16 do not know (an error
 * at every load). That line goes; nothing else changes (`\restrict`, pg_dump's guard against
 * meta-commands hidden in the dump's data, stays: psql 15.14+, 16.10+ and 17.6+ know it). Only the
 * header is read; the rest is copied file to file.
 */
export async function portablePlainDump(path: string): Promise<void> {
  const HEAD = 16_384;
  const file = Bun.file(path);
  const head = Buffer.from(await file.slice(0, HEAD).arrayBuffer());
  const line = Buffer.from("\nSET transaction_timeout = 0;\n");
  const at = head.indexOf(line);
  if (at < 0) return;
  const tmp = `${path}.portable`;
  const out = createWriteStream(tmp);
  out.write(head.subarray(0, at + 1));
  for await (const chunk of file.slice(at + line.length).stream()) if (!out.write(chunk)) await new Promise((r) => out.once("drain", r));
  await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
  renameSync(tmp, path);
}

/** A restore failed before it replaced anything: the database holds what it held. */
export class RestoreNotStarted extends Error {}

/**
 * Marks a database whose privileges follow the current model (on `schema auth`'s comment). Model 2:
 * `anonymous` and `authenticated` get nothing on what the service role creates, except the auth.*
 * helpers; the owner grants what each role may do (`grant select on items to anonymous`), and
 * row-level security then decides the rows. Model 1 (databases made before it) granted everything in
 * `public` to both roles by default privileges, which left every table without RLS open to the anon key.
 */
export const PRIVILEGES_MARKER = "kiln: privileges model 2 (anonymous and authenticated get only what the owner grants)";

/**
 * Brings a database to privileges model 2, once (the marker says it is done; later grants by the owner
 * are never touched again), and idempotently. From a model-1 database it:
 * - removes the default privileges for `anonymous` and `authenticated` in `public` (tables, sequences,
 *   functions), whoever's they are, so new objects get nothing;
 * - revokes both roles' privileges on every relation in `public` without row-level security (tables,
 *   views, materialized views, foreign tables): those were open to the public anon key with no row check;
 * - revokes them on sequences in `public`, except those owned by a column of a table with RLS enabled;
 * - keeps the grants on tables with RLS enabled (and their sequences): their policies already decide
 *   the rows, and apps built on them keep working;
 * - leaves functions' grants alone (PostgreSQL lets PUBLIC execute functions anyway).
 * An advisory lock serializes instances upgrading the same database at once (production profile).
 */
export const PRIVILEGES_UPGRADE_SQL = `do $kiln$
declare r record;
begin
  if obj_description('auth'::regnamespace, 'pg_namespace') is not distinct from ${literal(PRIVILEGES_MARKER)} then return; end if;
  perform pg_advisory_xact_lock(74320002);
  if obj_description('auth'::regnamespace, 'pg_namespace') is not distinct from ${literal(PRIVILEGES_MARKER)} then return; end if;
  for r in select distinct pg_get_userbyid(defaclrole) as owner from pg_default_acl where defaclnamespace = 'public'::regnamespace loop
    execute format('alter default privileges for role %I in schema public revoke all on tables from anonymous, authenticated', r.owner);
    execute format('alter default privileges for role %I in schema public revoke all on sequences from anonymous, authenticated', r.owner);
    execute format('alter default privileges for role %I in schema public revoke all on functions from anonymous, authenticated', r.owner);
  end loop;
  for r in select c.oid::regclass as rel from pg_class c
            where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p', 'v', 'm', 'f') and not c.relrowsecurity loop
    execute format('revoke all on table %s from anonymous, authenticated', r.rel);
  end loop;
  for r in select s.oid::regclass as rel from pg_class s
            where s.relnamespace = 'public'::regnamespace and s.relkind = 'S'
              and not exists (select from pg_depend d join pg_class t on t.oid = d.refobjid
                               where d.classid = 'pg_class'::regclass and d.objid = s.oid and d.refclassid = 'pg_class'::regclass
                                 and d.deptype in ('a', 'i') and t.relrowsecurity) loop
    execute format('revoke all on sequence %s from anonymous, authenticated', r.rel);
  end loop;
  -- Only the service role creates objects (PostgreSQL 15+ already has it this way).
  revoke create on schema public from public;
  comment on schema auth is ${literal(PRIVILEGES_MARKER)};
end
$kiln$`;

/**
 * The SQL that makes a fresh database a Kiln database: roles, the auth.* helpers and their grants,
 * and privileges model 2 (no default privileges for `anonymous` or `authenticated`).
 */
export const DATABASE_SETUP_SQL = [
  `do $$ begin
     if not exists (select from pg_roles where rolname = 'authenticated') then create role authenticated nologin; end if;
     if not exists (select from pg_roles where rolname = 'anonymous') then create role anonymous nologin; end if;
   end $$`,
  `create schema if not exists auth`,
  // Usage of a schema alone grants nothing: each table, sequence or view needs its own grant.
  `grant usage on schema public to authenticated, anonymous`,
  `grant usage on schema auth to authenticated, anonymous`,
  `create or replace function auth.uid() returns uuid language sql stable as
     $$ select nullif(current_setting('request.jwt.claim.sub', true), '')::uuid $$`,
  `create or replace function auth.email() returns text language sql stable as
     $$ select nullif(current_setting('request.jwt.claim.email', true), '') $$`,
  `create or replace function auth.role() returns text language sql stable as
     $$ select coalesce(nullif(current_setting('request.jwt.claim.role', true), ''), 'anonymous') $$`,
  `create or replace function auth.is_authenticated() returns boolean language sql stable as
     $$ select auth.role() = 'authenticated' $$`,
  `grant execute on all functions in schema auth to authenticated, anonymous`,
  PRIVILEGES_UPGRADE_SQL,
];

/**
 * Relations whose rows row-level security does not guard, with what `anonymous` and `authenticated`
 * may do to them (SELECT, INSERT, UPDATE, DELETE: what the query API runs; a column grant counts, and
 * so does a grant to PUBLIC; nothing counts without USAGE on the schema). Views that run as their
 * caller (`security_invoker`) are left out: the RLS of their tables applies.
 */
export const LINT_SQL = `select n.nspname::text as schema, c.relname::text as name,
    case c.relkind when 'r' then 'table' when 'p' then 'partitioned table' when 'v' then 'view'
                   when 'm' then 'materialized view' when 'f' then 'foreign table' end as kind,
    array(select p from unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE']) as p
           where has_schema_privilege('anonymous', n.oid, 'USAGE')
             and case when p = 'DELETE' then has_table_privilege('anonymous', c.oid, p) else has_any_column_privilege('anonymous', c.oid, p) end)::text[] as anonymous,
    array(select p from unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE']) as p
           where has_schema_privilege('authenticated', n.oid, 'USAGE')
             and case when p = 'DELETE' then has_table_privilege('authenticated', c.oid, p) else has_any_column_privilege('authenticated', c.oid, p) end)::text[] as authenticated
  from pg_class c join pg_namespace n on n.oid = c.relnamespace
 where c.relkind in ('r', 'p', 'v', 'm', 'f') and not c.relrowsecurity
   and n.nspname <> 'information_schema' and n.nspname not like 'pg\_%'
   and not (c.relkind = 'v' and exists (select from unnest(c.reloptions) o
                                          where lower(o) in ('security_invoker=true', 'security_invoker=on', 'security_invoker=1', 'security_invoker=yes')))
 order by 1, 2`;

/** Statements that put a session into an access mode (session-level; the wire path re-runs them on takeover). */
export function sessionInitSql(mode: AccessMode): string[] {
  if (mode.kind === "admin") return [];
  const claim = (name: string, value: string | null) => `select set_config('request.jwt.claim.${name}', ${literal(value ?? "")}, false)`;
  if (mode.kind === "anonymous") return [`set role anonymous`, claim("role", "anonymous")];
  return [`set role authenticated`, claim("sub", mode.userId), claim("email", mode.email), claim("role", "authenticated")];
}

/** The same, scoped to one transaction (the HTTP query API). */
export function transactionInitSql(mode: AccessMode): string[] {
  const init = sessionInitSql(mode).map((s) => s.replace(/^set role /, "set local role ").replace(/, false\)$/, ", true)"));
  // First: SET TRANSACTION must come before any query of the transaction (set_config is one).
  return mode.readOnly ? ["set transaction read only", ...init] : init;
}

/** A SQL string literal; only used for values Kiln itself produced (UUIDs, emails it validated). */
export function literal(v: string): string {
  return `'${v.replace(/'/g, "''")}'`;
}

/**
 * `application_name` selects the access mode: `service_user_access:<user uuid>` runs as that end
 * user under RLS; any other name (`service_full_access`, the default, and whatever psql, pgAdmin or
 * DBeaver set for themselves) runs with full access, keeping the name the client chose. Null for a
 * malformed `service_user_access:` value: a typo there must not quietly become full access.
 */
export function parseAccessMode(applicationName: string): { kind: "admin" } | { kind: "user"; userId: string } | null {
  if (!applicationName.startsWith(USER_ACCESS)) return { kind: "admin" };
  const m = /^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$/.exec(applicationName.slice(USER_ACCESS.length));
  return m ? { kind: "user", userId: m[1]!.toLowerCase() } : null;
}

const USER_ACCESS = "service_user_access:";
