// LockTable.counted: each lease operation counted against the project's quota in the same step as
// the operation (on PostgreSQL, in its statement), done only when the quota allows it. Run against
// the in-memory table, PostgresLockTable on PGlite, and PostgresLockTable on a PostgreSQL server
// through the lock table's own prepared connections (PreparedPostgres, what production uses).
import { randomUUID } from "node:crypto";
import { rmSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startPgServer, type PgServer } from "../support/postgres-server";
import { migrate } from "../../server/store/migrations";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { PostgresStore } from "../../server/store/postgres-store";
import { LOCK_QUOTA_PER_MINUTE, type LockTable } from "../../server/locks/lock-table";
import { MemoryLockTable } from "../../server/locks/memory-lock-table";
import { LOCKS_MIGRATIONS } from "../../server/locks/migrations";
import { PostgresLockTable } from "../../server/locks/postgres-lock-table";
import { PreparedPostgres } from "../../server/locks/prepared-postgres";
import { freshDataDir } from "../support/pglite";

const SEC = 1000;
const MINUTE = Date.UTC(2031, 4, 6, 7, 9, 0);
const uuid = () => randomUUID();
const newProject = () => `prj_${randomUUID().replaceAll("-", "")}`;

const closers: Array<() => Promise<unknown> | unknown> = [];
afterAll(async () => {
  for (const c of closers.reverse()) await c();
});

let pg: Promise<PgServer> | undefined;
async function postgresUrl(): Promise<string> {
  pg ??= (async () => {
    const server = await startPgServer();
    closers.push(() => server.stop());
    const store = new PostgresStore(server.url);
    await migrate(store, LOCKS_MIGRATIONS);
    await store.close();
    return server;
  })();
  return (await pg).url;
}

const backends: Array<{ name: string; open(): Promise<LockTable> }> = [
  { name: "memory", open: async () => new MemoryLockTable() },
  {
    name: "pglite",
    open: async () => {
      const dir = await freshDataDir("kiln-locks-counted-");
      const store = new PgliteStore(await openPglite(dir));
      closers.push(() => rmSync(dir, { recursive: true, force: true }), () => store.close());
      await migrate(store, LOCKS_MIGRATIONS);
      return new PostgresLockTable(store);
    },
  },
  {
    name: "postgres (prepared connections)",
    open: async () => {
      const prepared = new PreparedPostgres(await postgresUrl());
      closers.push(() => prepared.close());
      return new PostgresLockTable(prepared);
    },
  },
];

describe.each(backends)("$name: counted operations", (backend) => {
  let table: LockTable;
  beforeAll(async () => {
    table = await backend.open();
  }, 90_000);

  test("each counts one operation and does it; results are those of the plain operations", async () => {
    const p = newProject();
    const at = MINUTE + 10 * SEC;
    const a = uuid();
    const acquired = await table.counted.acquire(p, "k", a, 30, at);
    expect(acquired.quota).toEqual({ allowed: true, retryAfterSeconds: 50 });
    expect(acquired.result).toMatchObject({ ok: true, expiresAtMs: at + 30 * SEC });
    const token = (acquired.result as { fencingToken: number }).fencingToken;
    expect((await table.counted.acquire(p, "k", uuid(), 30, at)).result).toEqual({ ok: false, code: "lock_held" });
    expect((await table.counted.renew(p, "k", a, 60, at + SEC)).result).toEqual({ ok: true, expiresAtMs: at + 61 * SEC, fencingToken: token });
    expect((await table.counted.renew(p, "k", uuid(), 60, at + SEC)).result).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect((await table.counted.read(p, "k", at + SEC)).result).toEqual({ held: true, expiresAtMs: at + 61 * SEC, fencingToken: token });
    expect((await table.counted.release(p, "k", uuid(), at + SEC)).result).toEqual({ released: false });
    expect((await table.counted.release(p, "k", a, at + SEC)).result).toEqual({ released: true });
    expect((await table.counted.read(p, "k", at + SEC)).result).toEqual({ held: false });
    expect((await table.counted.acquire(p, "k", uuid(), 30, at + SEC)).result).toMatchObject({ ok: true });
    expect((await table.counted.forceRelease(p, "k", at + SEC)).result).toEqual({ released: true });
    expect((await table.counted.forceRelease(p, "k", at + SEC)).result).toEqual({ released: false });
    // Eleven operations so far, counted and plain alike share the window: 589 more are allowed.
    for (let i = 0; i < LOCK_QUOTA_PER_MINUTE - 11; i++) expect((await table.countOperation(p, at + 2 * SEC)).allowed).toBe(true);
    expect(await table.countOperation(p, at + 2 * SEC)).toEqual({ allowed: false, retryAfterSeconds: 48 });
  }, 30_000);

  test("refused by the quota: nothing is done", async () => {
    const p = newProject();
    const at = MINUTE + 20 * SEC;
    const a = uuid();
    expect((await table.counted.acquire(p, "held", a, 60, at)).result).toMatchObject({ ok: true });
    for (let i = 0; i < LOCK_QUOTA_PER_MINUTE - 1; i++) await table.countOperation(p, at);
    const before = await table.read(p, "held", at);

    const refused = [
      await table.counted.acquire(p, "free", uuid(), 30, at),
      await table.counted.acquire(p, "held", a, 300, at),
      await table.counted.renew(p, "held", a, 300, at),
      await table.counted.release(p, "held", a, at),
      await table.counted.forceRelease(p, "held", at),
      await table.counted.read(p, "held", at),
    ];
    for (const r of refused) expect(r).toEqual({ quota: { allowed: false, retryAfterSeconds: 40 }, result: null });
    expect(await table.read(p, "held", at)).toEqual(before);
    expect(await table.read(p, "free", at)).toEqual({ held: false });

    // The next minute counts from zero.
    const next = await table.counted.renew(p, "held", a, 30, MINUTE + 60 * SEC);
    expect(next.quota.allowed).toBe(true);
    expect(next.result).toMatchObject({ ok: true });
  }, 30_000);

  test("concurrent counted operations of one project: exactly 600 done", async () => {
    const p = newProject();
    const at = MINUTE + 30 * SEC;
    const results = await Promise.all(Array.from({ length: 650 }, (_, i) => table.counted.read(p, `k${i % 7}`, at)));
    expect(results.filter((r) => r.quota.allowed && r.result).length).toBe(LOCK_QUOTA_PER_MINUTE);
    expect(results.filter((r) => !r.quota.allowed && r.result === null).length).toBe(50);
  }, 30_000);
});

describe("two instances on one PostgreSQL (prepared connections)", () => {
  test("the quota is shared: counted acquires and releases from both, exactly 600 done", async () => {
    const url = await postgresUrl();
    const [one, two] = [new PreparedPostgres(url), new PreparedPostgres(url)];
    closers.push(() => one.close(), () => two.close());
    const tables = [new PostgresLockTable(one), new PostgresLockTable(two)];
    const p = newProject();
    const at = MINUTE + 5 * SEC;
    const results = await Promise.all(
      Array.from({ length: 700 }, (_, i) => {
        const t = tables[i % 2]!;
        return i % 3 ? t.counted.acquire(p, `k${i}`, uuid(), 30, at) : t.counted.release(p, `k${i - 1}`, uuid(), at);
      }),
    );
    expect(results.filter((r) => r.quota.allowed).length).toBe(LOCK_QUOTA_PER_MINUTE);
    // Every refused acquire left its key free.
    for (const [i, r] of results.entries()) if (i % 3 && !r.quota.allowed) expect(await tables[0]!.read(p, `k${i}`, at)).toEqual({ held: false });
  }, 60_000);
});
