import type { Migration } from "../store/migrations";

/** The accounts area's schema. Never edit a released migration: add one. */
export const ACCOUNTS_MIGRATIONS: Migration[] = [
  {
    id: "accounts/001-accounts-and-platform-tokens",
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
    `,
  },
];
