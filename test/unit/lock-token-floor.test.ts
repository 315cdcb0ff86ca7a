// A data dir made by an older Kiln (embedded profile), whose in-memory table drew every project's
// fencing tokens from one counter and kept its ceiling in the control store: the ceiling it left
// is where every project's tokens start now, so no key sees its tokens go down across the upgrade.
import { randomUUID } from "node:crypto";
import { afterAll, describe, expect, test } from "vitest";
import { LOCKS_MIGRATIONS } from "../../server/locks/migrations";
import { MemoryLockTable } from "../../server/locks/memory-lock-table";
import { legacyTokenCeiling } from "../../server/locks/token-floor";
import { migrate } from "../../server/store/migrations";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { freshDataDir } from "../support/pglite";

let store: PgliteStore | undefined;
afterAll(async () => {
  await store?.close();
});

const T0 = Date.UTC(2031, 0, 1);

describe("the older Kiln's fencing-token ceiling", () => {
  test("a fresh store's is 0; one an older Kiln recorded is where every project's tokens start", async () => {
    store = new PgliteStore(await openPglite(await freshDataDir("kiln-token-floor-")));
    await migrate(store, LOCKS_MIGRATIONS);
    expect(await legacyTokenCeiling(store)).toBe(0);
    // What an older Kiln left after a crash: its last reservation.
    await store.query(`insert into lock_token_floor (id, ceiling) values (1, 3000005)`);
    const floor = await legacyTokenCeiling(store);
    expect(floor).toBe(3_000_005);
    const table = new MemoryLockTable({ tokenFloor: floor });
    for (const p of ["p", "q"]) {
      const r = await table.acquire(p, "k", randomUUID(), 30, T0);
      expect(r).toMatchObject({ ok: true, fencingToken: 3_000_006 });
    }
  }, 60_000);
});
