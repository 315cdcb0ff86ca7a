import type { Migration } from "../store/migrations";

/** The secrets area's schema. Never edit a released migration: add one. */
export const SECRETS_MIGRATIONS: Migration[] = [
  {
    id: "secrets/001-key-check",
    sql: `
      -- A value encrypted with the instance secret key at the first start, and the secret columns
      -- already encrypted (server/secrets/store-secrets.ts). One row.
      create table if not exists kiln_secret_key_check (
        id integer primary key check (id = 1),
        check_value text not null,
        encrypted_columns jsonb not null,
        updated_at timestamptz not null default now()
      );
    `,
  },
];
