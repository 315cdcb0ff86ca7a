import type { WireBackend, WireClient, WireControl } from "./wire/listener";

/**
 * Who a statement runs as. `admin` is the service role: it owns the tables and bypasses row-level
 * security. `user` and `anonymous` run as the `authenticated` / `anonymous` roles with the request
 * claims set, so RLS policies and the auth.* helpers see that user.
 */
export type AccessMode =
  | { kind: "admin" }
  | { kind: "user"; userId: string; email: string | null }
  | { kind: "anonymous" };

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
  close(): Promise<void>;
}

/** The SQL that makes a fresh database a Kiln database: roles, grants and the auth.* helpers. */
export const DATABASE_SETUP_SQL = [
  `do $$ begin
     if not exists (select from pg_roles where rolname = 'authenticated') then create role authenticated nologin; end if;
     if not exists (select from pg_roles where rolname = 'anonymous') then create role anonymous nologin; end if;
   end $$`,
  `create schema if not exists auth`,
  `grant usage on schema public to authenticated, anonymous`,
  `grant usage on schema auth to authenticated, anonymous`,
  // Tables the service role creates are usable by end users; row-level security decides which rows.
  `alter default privileges in schema public grant all on tables to authenticated, anonymous`,
  `alter default privileges in schema public grant all on sequences to authenticated, anonymous`,
  `alter default privileges in schema public grant execute on functions to authenticated, anonymous`,
  `create or replace function auth.uid() returns uuid language sql stable as
     $$ select nullif(current_setting('request.jwt.claim.sub', true), '')::uuid $$`,
  `create or replace function auth.email() returns text language sql stable as
     $$ select nullif(current_setting('request.jwt.claim.email', true), '') $$`,
  `create or replace function auth.role() returns text language sql stable as
     $$ select coalesce(nullif(current_setting('request.jwt.claim.role', true), ''), 'anonymous') $$`,
  `create or replace function auth.is_authenticated() returns boolean language sql stable as
     $$ select auth.role() = 'authenticated' $$`,
  `grant execute on all functions in schema auth to authenticated, anonymous`,
];

/** Statements that put a session into an access mode (session-level; the wire path re-runs them on takeover). */
export function sessionInitSql(mode: AccessMode): string[] {
  if (mode.kind === "admin") return [];
  const claim = (name: string, value: string | null) => `select set_config('request.jwt.claim.${name}', ${literal(value ?? "")}, false)`;
  if (mode.kind === "anonymous") return [`set role anonymous`, claim("role", "anonymous")];
  return [`set role authenticated`, claim("sub", mode.userId), claim("email", mode.email), claim("role", "authenticated")];
}

/** The same, scoped to one transaction (the HTTP query API). */
export function transactionInitSql(mode: AccessMode): string[] {
  return sessionInitSql(mode).map((s) => s.replace(/^set role /, "set local role ").replace(/, false\)$/, ", true)"));
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
