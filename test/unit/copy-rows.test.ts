import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { PostgresStore } from "../../server/store/postgres-store";
import { copyText } from "../../server/store/store";
import { findPgBin, startPgServer } from "../support/postgres-server";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe("copyRows (function logs go in with COPY)", () => {
  test("COPY text escapes the format's own characters and writes null as \\N", () => {
    const text = copyText([
      ["a\tb", null, "c\\d\ne\r"],
      ["\\.", "", "x"],
    ]);
    expect(text).toBe(["a\\tb", "\\N", "c\\\\d\\ne\\r"].join("\t") + "\n" + ["\\\\.", "", "x"].join("\t") + "\n");
  });

  test("the embedded store reads back exactly what it was given", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-copy-test-"));
    dirs.push(dir);
    const store = new PgliteStore(await openPglite(dir));
    try {
      await store.query(`create table t (id text primary key, body text, at timestamptz not null, n integer)`);
      const rows = [
        ["1", "tab\there, newline\nthere, cr\r, backslash \\ and \\N and \\.", "2026-01-02T03:04:05.678Z", "7"],
        ["2", null, "2026-01-02T03:04:05.000Z", null],
        ["3", "unicode ✓ 😀, quotes ' \" and commas ,", "2026-01-02T03:04:06.000Z", "-1"],
        ["4", "", "2026-01-02T03:04:07.000Z", "0"],
      ];
      await store.copyRows("t", ["id", "body", "at", "n"], rows);
      await store.copyRows("t", ["id", "body", "at", "n"], []);
      const back = await store.query(`select id, body, at, n from t order by id`);
      expect(back.map((r) => [r.id, r.body, new Date(r.at).toISOString(), r.n === null ? null : String(r.n)])).toEqual(rows);
    } finally {
      await store.close();
    }
  }, 60_000);
});

describe("copyRows on a PostgreSQL server", () => {
  // The production profile's log ingest COPYs into the control database while requests use the same
  // pool. A query the pool pipelined behind the COPY statement reached the server in COPY mode: the
  // connection died ("protocol synchronization was lost") with the requests on it (500s), and the
  // COPY never settled.
  test("COPYs while every pooled connection is busy with other queries: no query fails, none hangs", async () => {
    const bin = await findPgBin();
    if (!bin) throw new Error("needs PostgreSQL server binaries (test/support/system-deps.sh installs them)");
    const pg = await startPgServer({ bin });
    const store = new PostgresStore(pg.url);
    try {
      await store.query(`create table t (id text, body text)`);
      const errors: string[] = [];
      let busy = true;
      const load = Promise.all(
        Array.from({ length: 20 }, async () => {
          while (busy) await store.query(`select $1::text as x`, ["y"]).catch((e: Error) => errors.push(e.message));
        }),
      );
      for (let i = 0; i < 100; i++) {
        const hung = new Promise<never>((_, fail) => setTimeout(() => fail(new Error(`COPY ${i} did not settle in 5 s`)), 5000).unref());
        await Promise.race([store.copyRows("t", ["id", "body"], [[String(i), "a"], [String(i), null]]), hung]).catch((e: Error) => errors.push(e.message));
      }
      busy = false;
      await load;
      expect(errors).toEqual([]);
      expect(await store.query(`select count(*)::int as n from t`)).toEqual([{ n: 200 }]);
    } finally {
      await store.close();
      await pg.stop();
    }
  }, 120_000);
});
