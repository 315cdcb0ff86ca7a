import { createHash } from "node:crypto";
import type { ControlStore } from "./store";

/**
 * Schema migrations. Each area keeps its own beside it (`server/<area>/migrations.ts`) with ids
 * `<area>/<nnn>-<what>`; the schema is every area's list in the order of `server/areas.ts`, each
 * list in its own order, and an area's SQL refers only to tables of areas before it. Applied ids are
 * recorded in `kiln_schema`. Never edit a released migration: add a new one. The embedded template
 * data dir is keyed by the fingerprint of the whole list, so a new migration makes a new template.
 */
export interface Migration {
  id: string;
  sql: string;
}

/**
 * Before areas owned their migrations, the schema was four numbered migrations recorded in
 * `kiln_migrations`; each is now the first migration of the areas it created tables for.
 * A store made then is upgraded by recording these ids as applied.
 */
export const LEGACY_VERSIONS: Record<number, string[]> = {
  1: ["accounts/001-accounts-and-platform-tokens", "projects/001-projects", "access-tokens/001-access-tokens", "keys/001-service-and-anon-keys", "variables/001-variables"],
  2: ["end-users/001-users-sessions-signing-keys"],
  3: ["databases/001-databases-and-usage"],
  4: ["functions/001-functions-deployments-logs"],
};

/** Identifies the schema a template data dir was made with. */
export function migrationsFingerprint(migrations: readonly Migration[]): string {
  const h = createHash("sha256");
  for (const m of migrations) h.update(`${m.id}:${m.sql}\0`);
  return h.digest("hex").slice(0, 16);
}

/** Refuses a list with a repeated id or an id outside the naming rule (a programming error). */
function checkList(migrations: readonly Migration[]): void {
  const seen = new Set<string>();
  for (const m of migrations) {
    if (!/^[a-z][a-z0-9-]*\/\d{3}-[a-z0-9-]+$/.test(m.id)) throw new Error(`migration id '${m.id}' is not <area>/<nnn>-<what>`);
    if (seen.has(m.id)) throw new Error(`migration id '${m.id}' appears twice`);
    seen.add(m.id);
  }
}

/**
 * Applies pending migrations in list order, each in its own transaction with its record. An
 * advisory lock serialises several Kiln instances starting against one PostgreSQL server.
 */
export async function migrate(store: ControlStore, migrations: readonly Migration[]): Promise<number> {
  checkList(migrations);
  await store.query(`select pg_advisory_lock(7420001)`);
  try {
    await store.query(`create table if not exists kiln_schema (id text primary key, applied_at timestamptz not null default now())`);
    await adoptLegacyVersions(store);
    const done = new Set((await store.query<{ id: string }>(`select id from kiln_schema`)).map((r) => r.id));
    let applied = 0;
    for (const m of migrations) {
      if (done.has(m.id)) continue;
      await store.transaction(async (tx) => {
        for (const stmt of splitStatements(m.sql)) await tx.query(stmt);
        await tx.query(`insert into kiln_schema (id) values ($1)`, [m.id]);
      });
      applied++;
    }
    return applied;
  } finally {
    await store.query(`select pg_advisory_unlock(7420001)`);
  }
}

/** Records the legacy numbered migrations of an older store under their area ids (once). */
async function adoptLegacyVersions(store: ControlStore): Promise<void> {
  const [legacy] = await store.query<{ present: boolean }>(`select to_regclass('kiln_migrations') is not null as present`);
  if (!legacy?.present) return;
  const versions = await store.query<{ version: number }>(`select version from kiln_migrations`);
  await store.transaction(async (tx) => {
    for (const { version } of versions) {
      const ids = LEGACY_VERSIONS[version];
      if (!ids) throw new Error(`the control store has legacy migration ${version}, which this Kiln does not know (made by a newer Kiln?)`);
      for (const id of ids) await tx.query(`insert into kiln_schema (id) values ($1) on conflict (id) do nothing`, [id]);
    }
    await tx.query(`drop table kiln_migrations`);
  });
}

/**
 * Statements end with `;` at the end of a line; a dollar-quoted body (`$$ ... $$`, for SQL functions)
 * is kept whole whatever it holds. Comment lines are dropped.
 */
export function splitStatements(sql: string): string[] {
  const out: string[] = [];
  let current = "";
  let inBody = false;
  for (const line of sql.split("\n")) {
    if (!inBody && /^\s*--/.test(line)) continue;
    current += `${line}\n`;
    if ((line.match(/\$\$/g) ?? []).length % 2 === 1) inBody = !inBody;
    if (!inBody && /;\s*$/.test(line)) {
      out.push(current.trim().replace(/;$/, ""));
      current = "";
    }
  }
  if (current.trim()) out.push(current.trim().replace(/;$/, ""));
  return out.filter(Boolean);
}
