import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { PostgresStore } from "../../server/store/postgres-store";
import { copyText } from "../../server/store/store";
import { pgCopyWriter } from "../../server/backends/logs/pg-copy";
import { parseQuery } from "../../server/logs/query";
import { type StoredLine } from "../../server/backends/logs/log-store";
import { SqlLogStore } from "../../server/backends/logs/sql-store";
import { findPgBin, startPgServer } from "../support/postgres-server";
import { freshDataDir } from "../support/pglite";
import { removeDir } from "../support/dirs";

const dirs: string[] = [];
afterAll(() => dirs.forEach(removeDir));

describe("copyRows (function logs go in with COPY)", () => {
  test("COPY text escapes the format's own characters and writes null as \\N", () => {
    const text = copyText([
      ["a\tb", null, "c\\d\ne\r"],
      ["\\.", "", "x"],
    ]);
    expect(text).toBe(["a\\tb", "\\N", "c\\\\d\\ne\\r"].join("\t") + "\n" + ["\\\\.", "", "x"].join("\t") + "\n");
  });

  test("the embedded store reads back exactly what it was given", async () => {
    const dir = await freshDataDir("kiln-copy-test-");
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

describe("the production log store on a PostgreSQL server", () => {
  // The ingest hands the store a second batch before the first is written; both COPY on the store's
  // one connection, so the store writes them one after the other.
  test("two batches handed over at once are both written, every line searchable", async () => {
    const bin = await findPgBin();
    if (!bin) throw new Error("needs PostgreSQL server binaries (test/support/system-deps.sh installs them)");
    const pg = await startPgServer({ bin });
    const control = new PostgresStore(pg.url);
    const writer = pgCopyWriter(pg.url);
    const logs = new SqlLogStore(control, { owned: false, warn: () => {}, copy: writer.copy, onClose: writer.close });
    try {
      await logs.prepare();
      const t0 = Date.parse("2026-01-01T00:00:00Z");
      const batch = (tag: string, n: number): StoredLine[] =>
        Array.from({ length: n }, (_, i) => ({
          id: `${tag}${String(i).padStart(19 - tag.length, "0")}`,
          project_id: "p1",
          resource_type: "function",
          resource_id: "f1",
          resource_name: "fn",
          stream: "runtime",
          deployment_id: "d1",
          invocation_id: `inv-${tag}`,
          region: "local",
          level: "info",
          structured: false,
          body: `${tag} line ${i}`,
          at: t0 + i,
        }));
      await Promise.all([logs.append(batch("a", 2000)), logs.append(batch("b", 2000)), logs.append(batch("c", 500))]);
      for (const [tag, n] of [["a", 2000], ["b", 2000], ["c", 500]] as const) {
        const found = await logs.search({ projectId: "p1", resourceType: "function", where: parseQuery(`invocation.id:inv-${tag}`), limit: 1000, startMs: t0 });
        expect(found.length).toBe(Math.min(n, 1000));
        expect(found.every((l) => l.body.startsWith(`${tag} line `))).toBe(true);
      }
      expect(await control.query(`select count(*)::int as n from log_lines`)).toEqual([{ n: 4500 }]);
    } finally {
      await logs.close();
      await control.close();
      await pg.stop();
    }
  }, 120_000);
});
