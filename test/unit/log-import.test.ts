// The move of an earlier version's embedded log store (a PGlite database, `<data-dir>/logs`) into
// the segment files (server/backends/logs/import-pglite-store.ts): every line once, in a move cut short and
// resumed as in one that runs through; the old database removed only once the move is done.
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { FileLogStore } from "../../server/backends/logs/file-store";
import { importPgliteLogStore } from "../../server/backends/logs/import-pglite-store";
import { LogDbThread } from "../../server/backends/logs/log-db";
import { type LogImports, type StoredLine } from "../../server/backends/logs/log-store";
import { SqlLogStore } from "../../server/backends/logs/sql-store";
import { freshDataDir } from "../support/pglite";
import { removeDir } from "../support/dirs";

const root = mkdtempSync(join(tmpdir(), "kiln-log-import-"));
afterAll(() => removeDir(root));
const quiet = { info: () => {}, warn: () => {}, error: () => {} };

/** An old store holding `n` lines a project (an empty cluster, migrated and written as the old Kiln did). */
async function oldStore(projects: string[], n: number): Promise<{ dir: string; lines: StoredLine[] }> {
  const dir = await freshDataDir();
  const db = new LogDbThread(dir);
  const store = new SqlLogStore(db, { owned: true, warn: () => {} });
  await store.prepare();
  const lines: StoredLine[] = [];
  for (const p of projects)
    for (let i = 0; i < n; i++)
      lines.push({ id: `${p}x${String(i).padStart(8, "0")}`, project_id: p, resource_type: "function", resource_id: "f1", resource_name: "fn", stream: i % 10 ? "runtime" : "build", deployment_id: "d1", invocation_id: i % 10 ? "inv" : null, region: "local", level: i % 7 ? "info" : "error", structured: false, body: `old line ${p} ${i}`, at: Date.UTC(2030, 0, 1) + i * 1000 });
  for (let i = 0; i < lines.length; i += 2000) await store.append(lines.slice(i, i + 2000));
  await store.close();
  return { dir, lines };
}

const everyLine = async (files: FileLogStore, projects: string[]) => {
  const out: string[] = [];
  for (const projectId of projects)
    for (const deploymentIds of [undefined, ["d1"]]) out.push(...(await files.search({ projectId, resourceType: "function", deploymentIds, where: null, limit: 100_000 })).map((l) => l.id));
  return out.sort();
};

test("a move cut short after its first batches resumes: every line once, the old database removed at the end", async () => {
  const projects = ["pa", "pb", "pc"];
  // 6,000 lines a project: two batches each (5,000 a batch).
  const { dir, lines } = await oldStore(projects, 6000);
  const files = new FileLogStore(join(root, "segments"));
  files.open();
  // The first run crashes at its fourth batch: its lines written, its position not yet saved.
  let batches = 0;
  const failing: LogImports = {
    importPosition: (s) => files.importPosition(s),
    importBatch: async (s, l, pos) => {
      if (++batches === 4) {
        await files.append(l);
        throw new Error("cut short");
      }
      await files.importBatch(s, l, pos);
    },
  };
  await expect(importPgliteLogStore(dir, failing, quiet)).rejects.toThrow("cut short");
  expect(existsSync(dir)).toBe(true);
  expect((await everyLine(files, projects)).length).toBeLessThan(lines.length);
  expect(await files.importPosition("pglite-log-store")).not.toBeNull();
  // The resumed move writes that batch again: it adds nothing (its lines are found there).
  await importPgliteLogStore(dir, files, quiet);
  expect(existsSync(dir)).toBe(false);
  expect(await everyLine(files, projects)).toEqual(lines.map((l) => l.id).sort());
  expect(await files.importPosition("pglite-log-store")).toBe("done");
  await files.close();
}, 120_000);
