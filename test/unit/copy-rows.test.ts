import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { openPglite, PgliteStore } from "../../server/store/pglite-store";
import { copyText } from "../../server/store/store";

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
