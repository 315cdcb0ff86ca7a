// The schema is every area's migrations in area order (server/areas.ts). A control store made by the
// previous version (four numbered migrations in kiln_migrations, test/fixtures/previous-version)
// upgrades without loss on both engines, and ends with exactly the schema a new store gets.
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { SCHEMA } from "../../server/areas";
import { LOG_SCHEMA } from "../../server/backends/logs/migrations";
import { LEGACY_VERSIONS, migrate } from "../../server/store/migrations";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { PostgresStore } from "../../server/store/postgres-store";
import type { ControlStore } from "../../server/store/store";
import { freshDataDir } from "../support/pglite";
import { findPgBin, startPgServer, type PgServer } from "../support/postgres-server";

const FIXTURE = readFileSync(join(import.meta.dirname, "../fixtures/previous-version/control-schema.sql"), "utf8");
const cleanup: Array<() => Promise<unknown> | unknown> = [];
afterAll(async () => {
  for (const c of cleanup.reverse()) await c();
});

let pg: PgServer | null = null;
beforeAll(async () => {
  const bin = await findPgBin();
  if (!bin) throw new Error("needs PostgreSQL server binaries (test/support/system-deps.sh installs them)");
  pg = await startPgServer({ bin });
  cleanup.push(() => pg?.stop());
}, 60_000);

let dbCount = 0;
const engines: Record<string, () => Promise<ControlStore>> = {
  embedded: async () => {
    const dir = await freshDataDir("kiln-migrations-");
    const store = new PgliteStore(await openPglite(dir));
    cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
    cleanup.push(() => store.close());
    return store;
  },
  postgres: async () => {
    const name = `migrations_${process.pid}_${dbCount++}`;
    const admin = new PostgresStore(pg!.url);
    await admin.query(`create database ${name}`);
    await admin.close();
    const store = new PostgresStore(pg!.url.replace(/\/postgres$/, `/${name}`));
    cleanup.push(() => store.close());
    return store;
  },
};

async function applyFixture(store: ControlStore) {
  for (const stmt of FIXTURE.replace(/^--.*$/gm, "").split(/;\s*\n/).map((s) => s.trim()).filter(Boolean)) await store.query(stmt);
}

/** Tables, columns, types and nullability: what the schema is, whatever order it was made in. */
async function shape(store: ControlStore) {
  const rows = await store.query<{ t: string; c: string; ty: string; n: string }>(
    `select table_name as t, column_name as c, data_type as ty, is_nullable as n from information_schema.columns
      where table_schema = 'public' order by table_name, column_name`,
  );
  const indexes = await store.query<{ i: string }>(`select indexname as i from pg_indexes where schemaname = 'public' order by indexname`);
  return { columns: rows.map((r) => `${r.t}.${r.c} ${r.ty} ${r.n}`), indexes: indexes.map((r) => r.i) };
}

describe.each(Object.keys(engines))("migrations on the %s engine", (engine) => {
  test("a store made by the previous version upgrades without loss, to the schema a new store gets", async () => {
    const old = await engines[engine]!();
    await applyFixture(old);
    const at = new Date().toISOString();
    await old.query(`insert into accounts (id, plan, created_at) values ('acct', 'superagent', $1)`, [at]);
    await old.query(`insert into projects (id, account_id, name, status, all_regions, created_at, updated_at) values ('proj', 'acct', 'kept', 'active', true, $1, $1)`, [at]);
    await old.query(
      `insert into functions (id, project_id, name, status, is_public, invocation_mode, http_auth_mode, runtime, handler, created_at, updated_at)
       values ('fn', 'proj', 'hello', 'active', false, 'rpc', 'required', 'nodejs22.x', 'handler', $1, $1)`,
      [at],
    );
    await old.query(`insert into function_deployments (id, function_id, project_id, kind, status, created_at) values ('dep', 'fn', 'proj', 'deploy', 'succeeded', $1)`, [at]);

    const legacyIds = Object.values(LEGACY_VERSIONS).flat();
    expect(await migrate(old, SCHEMA)).toBe(SCHEMA.length - legacyIds.length);
    const applied = (await old.query<{ id: string }>(`select id from kiln_schema order by id`)).map((r) => r.id);
    expect(applied).toEqual(SCHEMA.map((m) => m.id).sort());
    expect((await old.query(`select to_regclass('kiln_migrations') is null as gone`))[0]!.gone).toBe(true);
    // The rows survive; the new column is there, empty.
    expect(await old.query(`select name from projects`)).toEqual([{ name: "kept" }]);
    expect(await old.query(`select id, batch_id from function_deployments`)).toEqual([{ id: "dep", batch_id: null }]);
    expect(await migrate(old, SCHEMA)).toBe(0);

    const fresh = await engines[engine]!();
    expect(await migrate(fresh, SCHEMA)).toBe(SCHEMA.length);
    expect(await shape(old)).toEqual(await shape(fresh));
  }, 180_000); // two full migrations: seconds to tens of seconds on a loaded 2-core runner

  test("an unknown legacy version (a store from a newer Kiln) is refused, not guessed at", async () => {
    const store = await engines[engine]!();
    await applyFixture(store);
    await store.query(`insert into kiln_migrations (version, name) values (99, 'future')`);
    await expect(migrate(store, SCHEMA)).rejects.toThrow(/legacy migration 99/);
  }, 60_000);

  test("a schema a newer Kiln migrated is refused at start, naming what it does not know; the log store's ids are known", async () => {
    const store = await engines[engine]!();
    expect(await migrate(store, SCHEMA, { refuseNewer: LOG_SCHEMA })).toBe(SCHEMA.length);
    await store.query(`insert into kiln_schema (id) values ($1)`, [LOG_SCHEMA[0]!.id]);
    expect(await migrate(store, SCHEMA, { refuseNewer: LOG_SCHEMA })).toBe(0);
    await store.query(`insert into kiln_schema (id) values ('storage/999-from-the-future')`);
    await expect(migrate(store, SCHEMA, { refuseNewer: LOG_SCHEMA })).rejects.toThrow(/upgraded by a newer Kiln \(it has migration storage\/999-from-the-future/);
  }, 60_000);
});

describe("the schema list", () => {
  test("ids are unique, named <area>/<nnn>-<what>, and each area's are in order", () => {
    const ids = SCHEMA.map((m) => m.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const id of ids) expect(id).toMatch(/^[a-z][a-z0-9-]*\/\d{3}-[a-z0-9-]+$/);
    const byArea = new Map<string, string[]>();
    for (const id of ids) byArea.set(id.split("/")[0]!, [...(byArea.get(id.split("/")[0]!) ?? []), id]);
    for (const list of byArea.values()) expect(list).toEqual([...list].sort());
  });
});

describe("migrations on a PostgreSQL database several Kiln instances share", () => {
  // The log store migrates its schema in the control database at first use, while requests keep the
  // pool busy, so its queries ran on whichever connection was free. A session-level lock taken on one
  // connection and released on another stayed held, and another instance then waited at start for as
  // long as the first instance's connection lived (under load: for good).
  test("a migration whose queries land on different pooled connections leaves no lock behind: another instance migrates at once", async () => {
    const name = `migrations_${process.pid}_${dbCount++}`;
    const admin = new PostgresStore(pg!.url);
    await admin.query(`create database ${name}`);
    await admin.close();
    const url = pg!.url.replace(/\/postgres$/, `/${name}`);
    // A pool at its least convenient: each query or transaction on the other of two connections.
    const connections = [new PostgresStore(url), new PostgresStore(url)];
    for (const c of connections) cleanup.push(() => c.close());
    let turn = 0;
    const next = () => connections[turn++ % 2]!;
    const pool: ControlStore = {
      kind: "postgres",
      query: (text, params) => next().query(text, params),
      transaction: (fn) => next().transaction(fn),
      copyRows: (table, columns, rows) => next().copyRows(table, columns, rows),
      close: async () => {},
    };
    expect(await migrate(pool, SCHEMA)).toBe(SCHEMA.length);
    expect(await migrate(pool, [...SCHEMA, { id: "extra/001-t", sql: "create table extra_t (id int);" }])).toBe(1);
    expect(await pool.query(`select pid from pg_locks where locktype = 'advisory'`)).toEqual([]);
    const other = new PostgresStore(url);
    cleanup.push(() => other.close());
    const waited = new Promise<string>((ok) => setTimeout(() => ok("still waiting after 5 s"), 5000).unref());
    expect(await Promise.race([migrate(other, SCHEMA).then((n) => `applied ${n}`), waited])).toBe("applied 0");
  }, 60_000);
});
