import { randomUUID } from "node:crypto";
import { rmSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  LOCK_DEADLINE_MS,
  LOCK_TTL_MAX_SECONDS,
  validateLockKey,
  validateTtlSeconds,
  type AcquireResult,
  type LockTable,
} from "../../server/locks/lock-table";
import { MemoryLockTable } from "../../server/locks/memory-lock-table";
import { LOCKS_MIGRATIONS } from "../../server/locks/migrations";
import { PostgresLockTable } from "../../server/locks/postgres-lock-table";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { PostgresStore } from "../../server/store/postgres-store";
import type { ControlStore } from "../../server/store/store";
import { startPgServer, type PgServer } from "../support/postgres-server";
import { freshDataDir } from "../support/pglite";

// One body of lease rules run against every table: in memory, and PostgresLockTable over the
// embedded engine (PGlite) and over a real PostgreSQL server. Time is always passed in, so the tests
// step it by hand.

const T0 = Date.UTC(2031, 4, 6, 7, 8, 0);
const SEC = 1000;
const DAY = 24 * 3600 * SEC;
const uuid = () => randomUUID();
const newProject = () => `prj_${randomUUID().replaceAll("-", "")}`;

function okToken(r: AcquireResult): number {
  if (!r.ok) throw new Error(`expected success, got ${r.code}`);
  return r.fencingToken;
}

async function migrate(store: ControlStore): Promise<void> {
  for (const m of LOCKS_MIGRATIONS) {
    const statements = m.sql
      .split(/;\s*(?:\n|$)/)
      .map((s) => s.replace(/^\s*--.*$/gm, "").trim())
      .filter(Boolean);
    for (const s of statements) await store.query(s);
  }
}

let pg: Promise<PgServer> | undefined;
let pgMigrated: Promise<void> | undefined;
const stores: ControlStore[] = [];
const dirs: string[] = [];

/** A new connection pool (a "Kiln instance") on the one throwaway server, migrated once. */
async function postgresStore(): Promise<PostgresStore> {
  pg ??= startPgServer();
  const store = new PostgresStore((await pg).url);
  stores.push(store);
  await (pgMigrated ??= migrate(store));
  return store;
}

afterAll(async () => {
  for (const s of stores) await s.close().catch(() => {});
  await (await pg)?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Backend {
  name: string;
  open(): Promise<{ table: LockTable; store?: ControlStore }>;
}

const backends: Backend[] = [
  { name: "memory", open: async () => ({ table: new MemoryLockTable() }) },
  {
    name: "pglite",
    open: async () => {
      const dir = await freshDataDir("kiln-locks-test-");
      dirs.push(dir);
      const store = new PgliteStore(await openPglite(dir));
      stores.push(store);
      await migrate(store);
      return { table: new PostgresLockTable(store), store };
    },
  },
  {
    name: "postgres",
    open: async () => {
      const store = await postgresStore();
      return { table: new PostgresLockTable(store), store };
    },
  },
];

describe("lock keys and TTLs", () => {
  test("keys are 1-128 characters of letters, digits, '.', '_', ':' and '-'", () => {
    for (const ok of ["a", "Z9", "jobs.nightly:eu-1_x", "x".repeat(128)]) expect(validateLockKey(ok)).toBeNull();
    expect(validateLockKey("")).toMatch(/empty/);
    expect(validateLockKey("x".repeat(129))).toMatch(/128/);
    for (const bad of ["a/b", "a b", "é", "a\n", "a*", "a%2F"]) expect(validateLockKey(bad)).toMatch(/letters, digits/);
  });

  test("TTL is an integer from 5 s to 90 days", () => {
    for (const ok of [5, 60, LOCK_TTL_MAX_SECONDS]) expect(validateTtlSeconds(ok)).toBeNull();
    for (const bad of [4, 0, -5, LOCK_TTL_MAX_SECONDS + 1, 5.5, NaN, Infinity]) expect(validateTtlSeconds(bad)).not.toBeNull();
    expect(LOCK_TTL_MAX_SECONDS * SEC).toBe(90 * DAY);
  });
});

describe.each(backends)("$name lock table", (backend) => {
  let table: LockTable;
  let store: ControlStore | undefined;
  beforeAll(async () => {
    ({ table, store } = await backend.open());
  }, 90_000);
  afterAll(async () => {
    await table?.close();
  });

  test("free → acquire takes the lock with a new fencing token; read shows the lease", async () => {
    const p = newProject();
    const a = uuid();
    expect(await table.read(p, "k", T0)).toEqual({ held: false });
    const r = await table.acquire(p, "k", a, 30, T0);
    expect(r).toEqual({ ok: true, expiresAtMs: T0 + 30 * SEC, fencingToken: expect.any(Number) });
    const token = okToken(r);
    expect(Number.isSafeInteger(token) && token > 0).toBe(true);
    expect(await table.read(p, "k", T0 + SEC)).toEqual({ held: true, expiresAtMs: T0 + 30 * SEC, fencingToken: token });
  });

  test("acquire with the same lock token resets the expiry to now + TTL (absolute, may shorten) and keeps the token", async () => {
    const p = newProject();
    const a = uuid();
    const token = okToken(await table.acquire(p, "k", a, 60, T0));
    expect(await table.acquire(p, "k", a, 5, T0 + 10 * SEC)).toEqual({ ok: true, expiresAtMs: T0 + 15 * SEC, fencingToken: token });
    expect(await table.read(p, "k", T0 + 11 * SEC)).toEqual({ held: true, expiresAtMs: T0 + 15 * SEC, fencingToken: token });
    expect(await table.acquire(p, "k", a, 100, T0 + 12 * SEC)).toEqual({ ok: true, expiresAtMs: T0 + 112 * SEC, fencingToken: token });
    // Not additive: the same request again lands on the same expiry.
    expect(await table.acquire(p, "k", a, 100, T0 + 12 * SEC)).toEqual({ ok: true, expiresAtMs: T0 + 112 * SEC, fencingToken: token });
  });

  test("another lock token gets lock_held while the lease lives, and the lease is unchanged", async () => {
    const p = newProject();
    const a = uuid();
    const token = okToken(await table.acquire(p, "k", a, 10, T0));
    for (const at of [T0, T0 + 5 * SEC, T0 + 10 * SEC - 1]) {
      expect(await table.acquire(p, "k", uuid(), 30, at)).toEqual({ ok: false, code: "lock_held" });
    }
    expect(await table.read(p, "k", T0 + 9 * SEC)).toEqual({ held: true, expiresAtMs: T0 + 10 * SEC, fencingToken: token });
  });

  test("renew by the owner more than one second before expiry sets the expiry to now + TTL, same token", async () => {
    const p = newProject();
    const a = uuid();
    const token = okToken(await table.acquire(p, "k", a, 30, T0));
    // 1001 ms left: allowed; a TTL shorter than what is left shortens the lease.
    expect(await table.renew(p, "k", a, 5, T0 + 28_999)).toEqual({ ok: true, expiresAtMs: T0 + 33_999, fencingToken: token });
    expect(await table.renew(p, "k", a, 60, T0 + 30 * SEC)).toEqual({ ok: true, expiresAtMs: T0 + 90 * SEC, fencingToken: token });
    expect(await table.read(p, "k", T0 + 31 * SEC)).toEqual({ held: true, expiresAtMs: T0 + 90 * SEC, fencingToken: token });
  });

  test("renew at or within the last second, by a stale token, or of a free lock → lock_ownership_lost", async () => {
    const p = newProject();
    const a = uuid();
    const token = okToken(await table.acquire(p, "k", a, 10, T0));
    const lost = { ok: false, code: "lock_ownership_lost" };
    expect(await table.renew(p, "k", a, 30, T0 + 9 * SEC)).toEqual(lost);
    expect(await table.renew(p, "k", a, 30, T0 + 9_500)).toEqual(lost);
    expect(await table.renew(p, "k", uuid(), 30, T0)).toEqual(lost);
    expect(await table.read(p, "k", T0 + 9_600)).toEqual({ held: true, expiresAtMs: T0 + 10 * SEC, fencingToken: token });
    expect(await table.renew(p, "never-taken", a, 30, T0)).toEqual(lost);
    await table.release(p, "k", a, T0 + 9_700);
    expect(await table.renew(p, "k", a, 30, T0 + 9_800)).toEqual(lost);
  });

  test("a lapsed own lease in its grace second: own acquire and renew → lock_ownership_lost, others → lock_held, read still held", async () => {
    const p = newProject();
    const a = uuid();
    const token = okToken(await table.acquire(p, "k", a, 5, T0));
    const expiry = T0 + 5 * SEC;
    for (const at of [expiry, expiry + 500, expiry + 999]) {
      expect(await table.acquire(p, "k", a, 30, at)).toEqual({ ok: false, code: "lock_ownership_lost" });
      expect(await table.renew(p, "k", a, 30, at)).toEqual({ ok: false, code: "lock_ownership_lost" });
      expect(await table.acquire(p, "k", uuid(), 30, at)).toEqual({ ok: false, code: "lock_held" });
      expect(await table.read(p, "k", at)).toEqual({ held: true, expiresAtMs: expiry, fencingToken: token });
    }
  });

  test("after expiry plus one second anyone may acquire, the old owner included, with a higher fencing token", async () => {
    const p = newProject();
    const a = uuid();
    const b = uuid();
    const ta = okToken(await table.acquire(p, "own", a, 5, T0));
    const tb = okToken(await table.acquire(p, "other", b, 5, T0));
    const free = T0 + 6 * SEC;
    expect(await table.read(p, "own", free)).toEqual({ held: false });
    expect(await table.read(p, "other", free)).toEqual({ held: false });

    const again = await table.acquire(p, "own", a, 20, free);
    expect(again).toMatchObject({ ok: true, expiresAtMs: free + 20 * SEC });
    expect(okToken(again)).toBeGreaterThan(ta);

    const c = uuid();
    const taken = await table.acquire(p, "other", c, 20, free);
    expect(taken).toMatchObject({ ok: true, expiresAtMs: free + 20 * SEC });
    expect(okToken(taken)).toBeGreaterThan(tb);
    // The previous owner has lost it for good.
    expect(await table.renew(p, "other", b, 20, free + SEC)).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect(await table.acquire(p, "other", b, 20, free + SEC)).toEqual({ ok: false, code: "lock_held" });
  });

  test("release, force release and expiry free the lock and never lower the next fencing token", async () => {
    const p = newProject();
    const a = uuid();
    let now = T0;
    const t1 = okToken(await table.acquire(p, "k", a, 30, now));
    expect(await table.release(p, "k", a, (now += SEC))).toEqual({ released: true });
    expect(await table.read(p, "k", now)).toEqual({ held: false });

    // Same lock token after a release: a new lease, so a new token.
    const t2 = okToken(await table.acquire(p, "k", a, 30, (now += SEC)));
    expect(t2).toBeGreaterThan(t1);
    expect(await table.forceRelease(p, "k", (now += SEC))).toEqual({ released: true });
    expect(await table.read(p, "k", now)).toEqual({ held: false });

    const t3 = okToken(await table.acquire(p, "k", uuid(), 5, (now += SEC)));
    expect(t3).toBeGreaterThan(t2);
    now += 6 * SEC;
    const t4 = okToken(await table.acquire(p, "k", uuid(), 5, now));
    expect(t4).toBeGreaterThan(t3);
    // Renewals and same-token retries keep it.
    const d = uuid();
    await table.forceRelease(p, "k", now);
    const t5 = okToken(await table.acquire(p, "k", d, 30, now));
    expect(t5).toBeGreaterThan(t4);
    expect(await table.renew(p, "k", d, 30, now + SEC)).toMatchObject({ fencingToken: t5 });
    expect(await table.acquire(p, "k", d, 30, now + 2 * SEC)).toMatchObject({ fencingToken: t5 });
  });

  test("fencing tokens count per project: refused and same-token acquires draw none, other projects move nothing", async () => {
    const p = newProject();
    const q = newProject();
    const a = uuid();
    const first = okToken(await table.acquire(p, "k", a, 30, T0));
    expect(await table.acquire(p, "k", uuid(), 30, T0)).toEqual({ ok: false, code: "lock_held" });
    expect(okToken(await table.acquire(p, "k", a, 60, T0))).toBe(first);
    expect(okToken(await table.renew(p, "k", a, 60, T0))).toBe(first);
    for (let i = 0; i < 5; i++) okToken(await table.acquire(q, `k${i}`, uuid(), 30, T0));
    expect(okToken(await table.acquire(p, "other", uuid(), 30, T0))).toBe(first + 1);
    // Freed and lapsed keys continue the project's count.
    await table.release(p, "k", a, T0);
    expect(okToken(await table.acquire(p, "k", uuid(), 5, T0))).toBe(first + 2);
    expect(okToken(await table.acquire(p, "k", uuid(), 30, T0 + 6 * SEC))).toBe(first + 3);
  });

  test.skipIf(backend.name === "memory")("a store whose shared sequence an older Kiln drew from: every project's tokens start above it", async () => {
    const [{ last }] = await store!.query<{ last: string }>(`select (select case when is_called then last_value else 0 end from lock_fencing_tokens)::text as last`);
    const old = Number(last) + 1000;
    await store!.query(`select setval('lock_fencing_tokens', $1::bigint)`, [old]);
    expect(okToken(await table.acquire(newProject(), "k", uuid(), 30, T0))).toBe(old + 1);
  });

  test("the owner's release in the grace second frees the lock at once", async () => {
    const p = newProject();
    const a = uuid();
    const ta = okToken(await table.acquire(p, "k", a, 5, T0));
    const inGrace = T0 + 5_500;
    expect(await table.release(p, "k", a, inGrace)).toEqual({ released: true });
    expect(await table.read(p, "k", inGrace)).toEqual({ held: false });
    expect(okToken(await table.acquire(p, "k", uuid(), 5, inGrace))).toBeGreaterThan(ta);
  });

  test("a stale lock token cannot release a newer lease; a non-owner's release is a no-op", async () => {
    const p = newProject();
    const a = uuid();
    const b = uuid();
    await table.acquire(p, "k", a, 5, T0);
    const later = T0 + 6 * SEC;
    const tb = okToken(await table.acquire(p, "k", b, 30, later));
    expect(await table.release(p, "k", a, later + SEC)).toEqual({ released: false });
    expect(await table.release(p, "k", uuid(), later + SEC)).toEqual({ released: false });
    expect(await table.read(p, "k", later + 2 * SEC)).toEqual({ held: true, expiresAtMs: later + 30 * SEC, fencingToken: tb });
    expect(await table.renew(p, "k", b, 30, later + 3 * SEC)).toEqual({ ok: true, expiresAtMs: later + 33 * SEC, fencingToken: tb });
    expect(await table.acquire(p, "k", a, 30, later + 3 * SEC)).toEqual({ ok: false, code: "lock_held" });
  });

  test("release and force release of an absent (or already reclaimable) lock succeed without effect", async () => {
    const p = newProject();
    expect(await table.release(p, "nothing", uuid(), T0)).toEqual({ released: false });
    expect(await table.forceRelease(p, "nothing", T0)).toEqual({ released: false });
    const a = uuid();
    await table.acquire(p, "old", a, 5, T0);
    expect(await table.forceRelease(p, "old", T0 + 6 * SEC)).toEqual({ released: false });
    await table.acquire(p, "old2", a, 5, T0);
    expect(await table.release(p, "old2", a, T0 + 6 * SEC)).toEqual({ released: false });
    expect(await table.read(p, "old2", T0 + 6 * SEC)).toEqual({ held: false });
  });

  test("force release frees whoever holds the lock", async () => {
    const p = newProject();
    const a = uuid();
    const ta = okToken(await table.acquire(p, "k", a, 60, T0));
    expect(await table.forceRelease(p, "k", T0 + SEC)).toEqual({ released: true });
    // The previous holder finds out at its next renewal.
    expect(await table.renew(p, "k", a, 60, T0 + 2 * SEC)).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect(okToken(await table.acquire(p, "k", uuid(), 60, T0 + 2 * SEC))).toBeGreaterThan(ta);
  });

  test("locks are scoped per project: the same key in two projects is two locks", async () => {
    const p1 = newProject();
    const p2 = newProject();
    const a = uuid();
    const b = uuid();
    const t1 = okToken(await table.acquire(p1, "shared", a, 30, T0));
    const t2 = okToken(await table.acquire(p2, "shared", b, 30, T0));
    expect(await table.acquire(p2, "shared", a, 30, T0)).toEqual({ ok: false, code: "lock_held" });
    expect(await table.renew(p2, "shared", a, 30, T0)).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect(await table.release(p2, "shared", a, T0)).toEqual({ released: false });
    expect(await table.read(p2, "shared", T0)).toEqual({ held: true, expiresAtMs: T0 + 30 * SEC, fencingToken: t2 });
    expect(await table.forceRelease(p1, "shared", T0 + SEC)).toEqual({ released: true });
    expect(await table.read(p1, "shared", T0 + SEC)).toEqual({ held: false });
    expect(await table.read(p2, "shared", T0 + SEC)).toEqual({ held: true, expiresAtMs: T0 + 30 * SEC, fencingToken: t2 });
    // Each project counts its own tokens: both are their project's first.
    expect(t2).toBe(t1);
  });

  test("a lease never outlives its acquisition by more than 90 days, whatever renewals and retries ask", async () => {
    const p = newProject();
    const a = uuid();
    const MAX = LOCK_TTL_MAX_SECONDS;
    const deadline = T0 + LOCK_DEADLINE_MS;
    const token = okToken(await table.acquire(p, "k", a, MAX, T0));
    const at = (ms: number) => ({ ok: true, expiresAtMs: ms, fencingToken: token });
    expect(await table.read(p, "k", T0)).toEqual({ held: true, expiresAtMs: deadline, fencingToken: token });
    expect(await table.renew(p, "k", a, MAX, T0 + 10 * DAY)).toEqual(at(deadline));
    // A same-token retry keeps the original acquisition instant.
    expect(await table.acquire(p, "k", a, MAX, T0 + 20 * DAY)).toEqual(at(deadline));
    expect(await table.renew(p, "k", a, 5, T0 + 30 * DAY)).toEqual(at(T0 + 30 * DAY + 5 * SEC));
    expect(await table.renew(p, "k", a, 60 * 24 * 3600, T0 + 30 * DAY + SEC)).toEqual(at(T0 + 90 * DAY));
    expect(await table.renew(p, "k", a, MAX, deadline - 1001)).toEqual(at(deadline));
    expect(await table.acquire(p, "k", a, 3600, deadline - 1001)).toEqual(at(deadline));
    expect(await table.renew(p, "k", a, MAX, deadline - 1000)).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect(await table.acquire(p, "k", a, MAX, deadline - 500)).toEqual(at(deadline));
    expect(await table.acquire(p, "k", a, MAX, deadline)).toEqual({ ok: false, code: "lock_ownership_lost" });
    // Reclaiming after the grace second is a new acquisition with its own deadline.
    const fresh = await table.acquire(p, "k", a, MAX, deadline + SEC);
    expect(fresh).toMatchObject({ ok: true, expiresAtMs: deadline + SEC + LOCK_DEADLINE_MS });
    expect(okToken(fresh)).toBeGreaterThan(token);
  });

  test("bad keys and TTLs are refused before anything is stored", async () => {
    const p = newProject();
    await expect(table.acquire(p, "k", uuid(), 4, T0)).rejects.toThrow(RangeError);
    await expect(table.acquire(p, "k", uuid(), LOCK_TTL_MAX_SECONDS + 1, T0)).rejects.toThrow(RangeError);
    await expect(table.renew(p, "k", uuid(), 4, T0)).rejects.toThrow(RangeError);
    await expect(table.acquire(p, "a/b", uuid(), 30, T0)).rejects.toThrow(RangeError);
    await expect(table.read(p, "", T0)).rejects.toThrow(RangeError);
    expect(await table.read(p, "k", T0)).toEqual({ held: false });
    expect(await table.acquire(p, "k", uuid(), 5, T0)).toMatchObject({ ok: true, expiresAtMs: T0 + 5 * SEC });
  });

  test("quota: 600 operations per project per fixed UTC minute, then Retry-After to the minute's end", async () => {
    const p = newProject();
    const minute = Date.UTC(2031, 4, 6, 7, 9, 0);
    // Starting mid-minute: the window is the calendar minute, not 60 s from the first operation.
    for (let i = 0; i < 600; i++) {
      const r = await table.countOperation(p, minute + 30 * SEC + i * 10);
      if (!r.allowed) throw new Error(`operation ${i + 1} refused`);
    }
    expect(await table.countOperation(p, minute + 45_200)).toEqual({ allowed: false, retryAfterSeconds: 15 });
    expect(await table.countOperation(p, minute + 59_999)).toEqual({ allowed: false, retryAfterSeconds: 1 });
    expect(await table.countOperation(newProject(), minute + 50 * SEC)).toMatchObject({ allowed: true });
    expect(await table.countOperation(p, minute + 60 * SEC)).toMatchObject({ allowed: true });
    expect(await table.countOperation(p, minute + 61 * SEC)).toMatchObject({ allowed: true });
  });

  test("deleting a project drops its leases; its keys start over with higher tokens", async () => {
    const p = newProject();
    const other = newProject();
    const t1 = okToken(await table.acquire(p, "k", uuid(), 60, T0));
    const t2 = okToken(await table.acquire(other, "k", uuid(), 60, T0));
    await table.deleteProject(p);
    expect(await table.read(p, "k", T0 + SEC)).toEqual({ held: false });
    expect(await table.read(other, "k", T0 + SEC)).toEqual({ held: true, expiresAtMs: T0 + 60 * SEC, fencingToken: t2 });
    expect(okToken(await table.acquire(p, "k", uuid(), 60, T0 + SEC))).toBeGreaterThan(t1);
  });

  test.skipIf(backend.name === "memory")("lapsed lease rows are swept by later new leases of the project", async () => {
    const p = newProject();
    const rows = async () => Number((await store!.query(`select count(*)::int as n from lock_leases where project_id = $1`, [p]))[0]!.n);
    for (let i = 0; i < 20; i++) await table.acquire(p, `old-${i}`, uuid(), 5, T0);
    expect(await rows()).toBe(20);
    for (let i = 0; i < 4; i++) await table.acquire(p, `new-${i}`, uuid(), 60, T0 + 6 * SEC);
    expect(await rows()).toBe(4);
    expect(await table.read(p, "new-3", T0 + 7 * SEC)).toMatchObject({ held: true });
  });
});

describe("memory lock table", () => {
  test("each project's first fencing token is tokenFloor + 1 (an older Kiln's shared floor); lastFencingToken is per project", async () => {
    const t = new MemoryLockTable({ tokenFloor: 41 });
    expect(t.lastFencingToken("p")).toBe(41);
    expect(okToken(await t.acquire("p", "a", uuid(), 30, T0))).toBe(42);
    expect(okToken(await t.acquire("p", "b", uuid(), 30, T0))).toBe(43);
    expect(okToken(await t.acquire("q", "a", uuid(), 30, T0))).toBe(42);
    expect(t.lastFencingToken("p")).toBe(43);
    expect(t.lastFencingToken("q")).toBe(42);
    expect(() => new MemoryLockTable({ tokenFloor: -1 })).toThrow(RangeError);
  });

  test("memory stays bounded by live leases: freed locks keep nothing, lapsed ones are swept", async () => {
    const t = new MemoryLockTable();
    const a = uuid();
    for (let i = 0; i < 100; i++) {
      await t.acquire("p", `k${i}`, a, 30, T0);
      await t.release("p", `k${i}`, a, T0);
    }
    expect(t.leaseCount).toBe(0);
    for (let i = 0; i < 5000; i++) await t.acquire(`p${i % 7}`, `k${i}`, a, 5, T0 + i * 10);
    // Everything acquired more than 6 s before the last one has been reclaimable at some sweep.
    expect(t.leaseCount).toBeLessThan(2048);
    const last = okToken(await t.acquire("p0", "k0", a, 5, T0 + 100 * SEC));
    expect(last).toBe(t.lastFencingToken("p0"));
  });
});

describe("PostgreSQL lock table shared by two Kiln instances", () => {
  let one: PostgresLockTable;
  let two: PostgresLockTable;
  beforeAll(async () => {
    const s1 = await postgresStore();
    const s2 = await postgresStore();
    one = new PostgresLockTable(s1);
    two = new PostgresLockTable(s2);
  }, 90_000);

  test("racing acquirers: at most one holder at any time, and fencing tokens strictly rise", async () => {
    const p = newProject();
    const now = T0;
    let holders = 0;
    let overlaps = 0;
    const seen: number[] = [];
    const worker = async (table: LockTable) => {
      const me = uuid();
      let wins = 0;
      for (let i = 0; i < 60; i++) {
        const r = await table.acquire(p, "hot", me, 60, now);
        if (!r.ok) {
          expect(r.code).toBe("lock_held");
          continue;
        }
        if (holders !== 0) overlaps++;
        holders++;
        seen.push(r.fencingToken);
        wins++;
        // Hold it across a round trip of the other instance's kind.
        expect(await table.renew(p, "hot", me, 60, now)).toMatchObject({ ok: true, fencingToken: r.fencingToken });
        expect(await table.acquire(p, "hot", me, 60, now)).toMatchObject({ ok: true, fencingToken: r.fencingToken });
        holders--;
        expect(await table.release(p, "hot", me, now)).toEqual({ released: true });
      }
      return wins;
    };
    const wins = await Promise.all([one, two, one, two, one, two, one, two].map(worker));
    expect(overlaps).toBe(0);
    expect(seen.length).toBe(wins.reduce((a, b) => a + b, 0));
    expect(seen.length).toBeGreaterThanOrEqual(8);
    for (let i = 1; i < seen.length; i++) expect(seen[i]!).toBeGreaterThan(seen[i - 1]!);
  }, 60_000);

  test("racing takeovers of a lapsed lease: exactly one wins", async () => {
    const p = newProject();
    const old = okToken(await one.acquire(p, "k", uuid(), 5, T0));
    const after = T0 + 6 * SEC;
    const results = await Promise.all(Array.from({ length: 16 }, (_, i) => (i % 2 ? one : two).acquire(p, "k", uuid(), 30, after)));
    const winners = results.filter((r) => r.ok);
    expect(winners.length).toBe(1);
    expect(okToken(winners[0]!)).toBeGreaterThan(old);
    expect(results.filter((r) => !r.ok).every((r) => !r.ok && r.code === "lock_held")).toBe(true);
  }, 30_000);

  test("the quota is shared: 700 concurrent operations from two instances, exactly 600 allowed", async () => {
    const p = newProject();
    const at = Date.UTC(2031, 4, 6, 7, 20, 5);
    const results = await Promise.all(Array.from({ length: 700 }, (_, i) => (i % 2 ? one : two).countOperation(p, at + i)));
    expect(results.filter((r) => r.allowed).length).toBe(600);
    expect(results.filter((r) => !r.allowed).every((r) => r.retryAfterSeconds === 55)).toBe(true);
  }, 30_000);
});
