import type { Migration } from "../store/migrations";

/**
 * Tables of project locks in the control store. Plain DDL, statements separated by `;` and a
 * newline. Never edit a released migration: add a new one.
 */
export const LOCKS_MIGRATIONS: readonly Migration[] = [
  {
    // Lock leases and the lock operation quota (PostgresLockTable, production profile), and the
    // fencing-token floor of the in-memory table (embedded profile).
    id: "locks/001-leases",
    sql: `
      -- one sequence for every key: tokens rise per key without keeping freed rows
      create sequence lock_fencing_tokens as bigint;
      -- one row per live (or lapsed, not yet swept) lease; release deletes it
      create table lock_leases (
        project_id text not null,
        lock_key text not null,
        holder text,
        fencing_token bigint not null,
        acquired_at timestamptz,
        deadline_at timestamptz,
        expires_at timestamptz,
        primary key (project_id, lock_key)
      );
      create index lock_leases_by_expiry on lock_leases (project_id, expires_at);
      create table lock_quota (
        project_id text not null,
        window_start timestamptz not null,
        count integer not null,
        primary key (project_id, window_start)
      );
      create index lock_quota_by_window on lock_quota (window_start);
      -- embedded profile: no fencing token the in-memory table issued is above this (one row)
      create table lock_token_floor (
        id integer primary key check (id = 1),
        ceiling bigint not null
      );
    `,
  },
  {
    // Fencing tokens per project (both profiles): a project's counter row, drawn under its row lock.
    // Its first value starts above the old shared sequence (no longer drawn), so a key used before
    // this migration never sees its tokens go down. The embedded profile keeps its counters in its
    // lease journal; its old shared floor (lock_token_floor) is likewise where they start.
    id: "locks/002-project-fencing-tokens",
    sql: `
      create table lock_project_tokens (
        project_id text primary key,
        last bigint not null
      );
    `,
  },
];
