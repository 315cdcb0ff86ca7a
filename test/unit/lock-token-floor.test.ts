// The embedded profile's fencing-token floor (FencedMemoryTable) on a real PGlite control store:
// tokens never go down across a clean restart or a crash, reservations are topped up in the
// background, and a failing store is reported without failing the acquire.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { migrate } from "../../server/store/migrations";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { LOCKS_MIGRATIONS } from "../../server/locks/migrations";
import { FencedMemoryTable, TOKEN_RESERVATION } from "../../server/locks/token-floor";
import { freshDataDir } from "../support/pglite";

// One PGlite for the file; each test starts from an empty floor table.
let shared: Promise<PgliteStore> | undefined;
beforeAll(async () => void (await store()), 60_000);
afterAll(async () => {
  await (await shared)?.close();
});

async function store(): Promise<PgliteStore> {
  shared ??= (async () => {
    const s = new PgliteStore(await openPglite(await freshDataDir("kiln-token-floor-")));
    await migrate(s, LOCKS_MIGRATIONS);
    return s;
  })();
  const s = await shared;
  await s.query(`delete from lock_token_floor`);
  return s;
}

const T0 = Date.UTC(2031, 0, 1);
const stored = async (s: PgliteStore) => Number((await s.query(`select ceiling::text as c from lock_token_floor`))[0]!.c);

let keys = 0;
async function acquireMany(f: FencedMemoryTable, n: number): Promise<number[]> {
  const tokens: number[] = [];
  for (let i = 0; i < n; i++) {
    const r = await f.table.acquire("prj", `k${++keys}`, randomUUID(), 30, T0);
    if (!r.ok) throw new Error(r.code);
    f.issued();
    tokens.push(r.fencingToken);
  }
  return tokens;
}

describe("FencedMemoryTable", () => {
  test("a fresh store: tokens start at 1, and one reservation is recorded before the first acquire", async () => {
    const s = await store();
    const f = await FencedMemoryTable.open(s, (e) => { throw e; });
    expect(await stored(s)).toBe(TOKEN_RESERVATION);
    expect(await acquireMany(f, 3)).toEqual([1, 2, 3]);
    await f.close();
    expect(await stored(s)).toBe(3);
  });

  test("a clean close records the last token: the next start continues right after it", async () => {
    const s = await store();
    const a = await FencedMemoryTable.open(s, (e) => { throw e; }, 10);
    await acquireMany(a, 4);
    await a.close();
    const b = await FencedMemoryTable.open(s, (e) => { throw e; }, 10);
    expect(await acquireMany(b, 1)).toEqual([5]);
    await b.close();
  });

  test("a crash (no close): the next start begins above every token issued, reservations topped up as they are used", async () => {
    const s = await store();
    const a = await FencedMemoryTable.open(s, (e) => { throw e; }, 10);
    expect(a.recordedCeiling).toBe(10);
    const issued: number[] = [];
    for (let i = 0; i < 5; i++) {
      issued.push(...(await acquireMany(a, 7)));
      await a.settled();
      // Whatever was issued, the store's record is above it.
      expect(await stored(s)).toBeGreaterThanOrEqual(Math.max(...issued));
    }
    expect(a.recordedCeiling).toBeGreaterThan(35);
    // "Crash": a new table on the same store, the old one never closed.
    const b = await FencedMemoryTable.open(s, (e) => { throw e; }, 10);
    const [next] = await acquireMany(b, 1);
    expect(next).toBeGreaterThan(Math.max(...issued));
    await b.close();
  });

  test("a failing store write is reported and does not fail acquires; the next acquire tries again", async () => {
    const s = await store();
    const errors: unknown[] = [];
    const f = await FencedMemoryTable.open(s, (e) => errors.push(e), 4);
    await s.query(`alter table lock_token_floor rename to lock_token_floor_gone`);
    await acquireMany(f, 3);
    await f.settled();
    expect(errors.length).toBe(1);
    expect(f.recordedCeiling).toBe(4);
    await s.query(`alter table lock_token_floor_gone rename to lock_token_floor`);
    await acquireMany(f, 1);
    await f.settled();
    expect(f.recordedCeiling).toBe(4 + 4);
    expect(await stored(s)).toBe(8);
    await f.close();
  });
});
