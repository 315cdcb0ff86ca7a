import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { BACKGROUND_NICE, backgroundPriority } from "../../server/backends/databases/background-priority";
import { EmbeddedEngine } from "../../server/backends/databases/embedded";
import { removeDir } from "../support/dirs";

const dirs: string[] = [];
afterAll(() => dirs.forEach(removeDir));

function engine(o: { maxOpen: number; memoryBudgetMb: number; snapshotReplayLimitBytes?: number }) {
  const dir = mkdtempSync(join(tmpdir(), "kiln-engine-test-"));
  dirs.push(dir);
  return new EmbeddedEngine({ dir, idleCloseMs: 60_000, idleInTransactionTimeoutMs: 60_000, ...o });
}

const admin = { kind: "admin" } as const;

describe("embedded engine: instances open lazily and close least recently used", () => {
  test("never more than maxOpen open; a closed database reopens with its data", async () => {
    const e = engine({ maxOpen: 2, memoryBudgetMb: 100_000 });
    try {
      for (const id of ["a", "b", "c"]) {
        await e.create(id);
        await e.run(id, admin, `create table t (v text)`, []);
        await e.run(id, admin, `insert into t values ($1)`, [id]);
        expect(e.openCount()).toBeLessThanOrEqual(2);
      }
      expect(e.openCount()).toBe(2);
      // "a" was closed to make room; it comes back with its row.
      expect((await e.run("a", admin, `select v from t`, [])).rows).toEqual([{ v: "a" }]);
      expect(e.openCount()).toBe(2);
    } finally {
      await e.close();
    }
  }, 60_000);

  test("a memory budget closes idle instances before opening another", async () => {
    // A budget below zero: whatever the process holds, it is over, so each open closes the others.
    const e = engine({ maxOpen: 10, memoryBudgetMb: -1_000_000 });
    try {
      for (const id of ["x", "y", "z"]) {
        await e.create(id);
        await e.run(id, admin, `select 1`, []);
      }
      expect(e.openCount()).toBe(1);
    } finally {
      await e.close();
    }
  }, 60_000);
});

describe("embedded engine: a fork is a snapshot of the live database", () => {
  const redo = async (e: EmbeddedEngine, id: string) => (await e.run(id, admin, `select redo_lsn::text as r from pg_control_checkpoint()`, [])).rows[0]!.r as string;
  const fill = async (e: EmbeddedEngine, id: string) => {
    await e.run(id, admin, `create table t (id int primary key, pad text)`, []);
    await e.run(id, admin, `insert into t select g, repeat(md5(g::text), 16) from generate_series(1, 4000) g`, []);
  };

  test("no checkpoint is forced: the copy starts at the last one and replays the WAL since", async () => {
    const e = engine({ maxOpen: 4, memoryBudgetMb: 100_000 });
    try {
      await e.create("p");
      await fill(e, "p");
      const before = await redo(e, "p");
      await e.fork("p", "c");
      // The parent's session was not held for a checkpoint.
      expect(await redo(e, "p")).toBe(before);
      expect((await e.run("c", admin, `select count(*)::int as n, sum(length(pad))::int as b from t`, [])).rows).toEqual([{ n: 4000, b: 4000 * 512 }]);
    } finally {
      await e.close();
    }
  }, 60_000);

  test("past the replay limit a checkpoint is taken first, and the copy is as complete", async () => {
    const e = engine({ maxOpen: 4, memoryBudgetMb: 100_000, snapshotReplayLimitBytes: 256 * 1024 });
    try {
      await e.create("p");
      await fill(e, "p");
      const before = await redo(e, "p");
      await e.fork("p", "c");
      expect(await redo(e, "p")).not.toBe(before);
      expect((await e.run("c", admin, `select count(*)::int as n, sum(length(pad))::int as b from t`, [])).rows).toEqual([{ n: 4000, b: 4000 * 512 }]);
    } finally {
      await e.close();
    }
  }, 60_000);
});

describe("copies and page hashing run at a lower CPU priority", () => {
  test("the prefix runs a process at nice 10, in the normal scheduling class (never SCHED_IDLE: waited-for work must not starve)", async () => {
    const prefix = await backgroundPriority();
    expect(prefix).toEqual(["nice", "-n", String(BACKGROUND_NICE)]);
    const out = await new Response(Bun.spawn([...prefix, "cat", "/proc/self/sched", "/proc/self/stat"], { stdout: "pipe" }).stdout).text();
    const policy = Number(/^policy\s*:\s*(\d+)/m.exec(out)?.[1]);
    const nice = Number(out.slice(out.lastIndexOf(")") + 2).split(" ")[16]);
    expect(policy).toBe(0); // SCHED_OTHER
    const stat = readFileSync("/proc/self/stat", "utf8");
    const own = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
    expect(nice).toBe(Math.min(19, own + BACKGROUND_NICE));
    // Asked again: the same answer, no new check.
    expect(await backgroundPriority()).toBe(prefix);
  });
});
