import { createHash } from "node:crypto";
import type { ControlStore, Sql } from "./store";

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
 * advisory lock serialises several Kiln instances (and the log store's own schema, migrated at first
 * use while requests run) against one PostgreSQL database. It is transaction-scoped on purpose: a
 * pooled store runs each query on whichever connection is free, so a session lock
 * (`pg_advisory_lock`) taken by one query and released by the next could be released on another
 * connection (which fails, quietly) and stay held by the first for as long as that connection lives,
 * and every other instance then waits at start behind it.
 *
 * `refuseNewer`: the lists of everything else that records itself in the same `kiln_schema` (the log
 * store's schema in the production profile). An applied id none of them knows was applied by a newer
 * Kiln: this (older) one refuses to run on that schema instead of writing rows it no longer shapes.
 */
export async function migrate(store: ControlStore, migrations: readonly Migration[], opts: { refuseNewer?: readonly Migration[] } = {}): Promise<number> {
  checkList(migrations);
  // The usual start, every migration already applied: one read, no transaction, no lock (an applied
  // migration is never taken back, so nothing can change that answer under us). A store without the
  // table yet (a new PostgreSQL database) fails the read and takes the full path below.
  const recorded = await store.query<{ id: string }>(`select id from kiln_schema`).catch(() => null);
  if (recorded) {
    const ids = new Set(recorded.map((r) => r.id));
    if (migrations.every((m) => ids.has(m.id))) {
      refuseUnknown(ids, migrations, opts.refuseNewer);
      return 0;
    }
  }
  const locked = <T>(fn: (tx: Sql) => Promise<T>) =>
    store.transaction(async (tx) => {
      await tx.query(`select pg_advisory_xact_lock(7420001)`);
      return fn(tx);
    });
  const done = await locked(async (tx) => {
    await tx.query(`create table if not exists kiln_schema (id text primary key, applied_at timestamptz not null default now())`);
    await adoptLegacyVersions(tx);
    return new Set((await tx.query<{ id: string }>(`select id from kiln_schema`)).map((r) => r.id));
  });
  refuseUnknown(done, migrations, opts.refuseNewer);
  let applied = 0;
  for (const m of migrations) {
    if (done.has(m.id)) continue;
    const ran = await locked(async (tx) => {
      // Another instance may have applied it while this one waited for the lock.
      if ((await tx.query(`select 1 from kiln_schema where id = $1`, [m.id])).length) return false;
      for (const stmt of splitStatements(m.sql)) await tx.query(stmt);
      await tx.query(`insert into kiln_schema (id) values ($1)`, [m.id]);
      return true;
    });
    if (ran) applied++;
  }
  return applied;
}

function refuseUnknown(done: Set<string>, migrations: readonly Migration[], refuseNewer: readonly Migration[] | undefined): void {
  if (!refuseNewer) return;
  const known = new Set([...migrations, ...refuseNewer].map((m) => m.id));
  const unknown = [...done].filter((id) => !known.has(id)).sort();
  if (unknown.length)
    throw new Error(
      `the control store was upgraded by a newer Kiln (it has migration${unknown.length > 1 ? "s" : ""} ${unknown.slice(0, 3).join(", ")}${unknown.length > 3 ? ", ..." : ""} that this version does not know): run that version or a newer one on it (docs/production.md, "Upgrades")`,
    );
}

/** Records the legacy numbered migrations of an older store under their area ids (once). */
async function adoptLegacyVersions(tx: Sql): Promise<void> {
  const [legacy] = await tx.query<{ present: boolean }>(`select to_regclass('kiln_migrations') is not null as present`);
  if (!legacy?.present) return;
  const versions = await tx.query<{ version: number }>(`select version from kiln_migrations`);
  for (const { version } of versions) {
    const ids = LEGACY_VERSIONS[version];
    if (!ids) throw new Error(`the control store has legacy migration ${version}, which this Kiln does not know (made by a newer Kiln?)`);
    for (const id of ids) await tx.query(`insert into kiln_schema (id) values ($1) on conflict (id) do nothing`, [id]);
  }
  await tx.query(`drop table kiln_migrations`);
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
