// The log ingest: structured lines and levels, ids in print order, the platform clock's time, and a
// bounded queue that drops (and says so) rather than growing when the store falls behind.
import { describe, expect, test } from "vitest";
import { PlatformClock } from "../../server/clock";
import { classify, LogIngest, lineId } from "../../server/logs/ingest";
import type { LogStore, StoredLine } from "../../server/backends/logs/log-store";
import { TailHub } from "../../server/logs/tail";
import { eventually } from "../support/kiln";

const fn = { id: "f1", name: "hello", project_id: "p1" };
const line = (message: string, level = "info") => ({ level, message, at: Date.now() });

function ingestWith(store: Partial<LogStore>, o: { maxPending?: number; clock?: PlatformClock } = {}) {
  const warnings: string[] = [];
  const clock = o.clock ?? new PlatformClock();
  const ingest = new LogIngest({ store: async () => store as LogStore, clock, tail: new TailHub(), log: { error: () => {}, warn: (m) => warnings.push(m) }, maxPending: o.maxPending });
  return { ingest, warnings };
}

describe("log ingest", () => {
  test("JSON objects with a level or a message are structured, at their own level; anything else is text at the stream's", () => {
    expect(classify('{"level":"ERROR","message":"x"}', "info")).toEqual({ level: "error", structured: true });
    expect(classify(' {"severity":"warning","msg":"x"} ', "info")).toEqual({ level: "warn", structured: true });
    expect(classify('{"level":60}', "info")).toEqual({ level: "fatal", structured: true });
    expect(classify('{"message":"no level"}', "error")).toEqual({ level: "error", structured: true });
    expect(classify('{"just":"data"}', "info")).toEqual({ level: "info", structured: false });
    expect(classify("[1,2]", "info")).toEqual({ level: "info", structured: false });
    expect(classify("{broken", "warn")).toEqual({ level: "warn", structured: false });
    expect(classify("plain", "error")).toEqual({ level: "error", structured: false });
  });

  test("ids are 20 characters and sort in the order lines were recorded within a millisecond", () => {
    const ids = Array.from({ length: 1000 }, () => lineId(1_700_000_000_000));
    expect(ids.every((id) => /^[a-z0-9]{20}$/.test(id))).toBe(true);
    expect([...ids].sort()).toEqual(ids);
    expect(lineId(1_700_000_000_001) > ids[999]!).toBe(true);
  });

  test("lines are stamped on the platform clock, NULs become U+FFFD, and a flush writes everything recorded", async () => {
    const written: StoredLine[] = [];
    const clock = new PlatformClock(() => {}, Date.now() + 86_400_000);
    const { ingest } = ingestWith({ append: async (l) => (written.push(...l), new Map()) }, { clock });
    ingest.invocation(fn, "d1", "local", "inv1", [line("a\u0000b"), line('{"level":"warn","message":"m"}')]);
    await ingest.flush();
    expect(written.map((l) => [l.body, l.level, l.structured])).toEqual([
      ["a\uFFFDb", "info", false],
      ['{"level":"warn","message":"m"}', "warn", true],
    ]);
    // A day ahead of the machine's clock, as the platform clock is.
    expect(written[0]!.at - Date.now()).toBeGreaterThan(86_000_000);
    await ingest.stop();
  });

  test("when the store falls behind, at most maxPending lines wait; the rest are dropped and the project gets a line saying how many", async () => {
    let release = () => {};
    const gate = new Promise<void>((r) => (release = r));
    let taken = () => {};
    const writing = new Promise<void>((r) => (taken = r));
    const written: StoredLine[] = [];
    const { ingest, warnings } = ingestWith(
      {
        append: async (l) => {
          taken();
          await gate;
          written.push(...l);
          return new Map();
        },
      },
      { maxPending: 100 },
    );
    ingest.invocation(fn, "d1", "local", "inv1", Array.from({ length: 60 }, (_, i) => line(`first ${i}`)));
    const stuck = ingest.flush();
    await writing; // the store holds this batch: 100 lines may wait again
    ingest.invocation(fn, "d1", "local", "inv2", Array.from({ length: 150 }, (_, i) => line(`second ${i}`)));
    expect(ingest.counters.dropped).toBe(50);
    release();
    await stuck;
    await ingest.flush();
    expect(written.filter((l) => l.body.startsWith("second"))).toHaveLength(100);
    const notice = written.find((l) => /50 log lines were dropped/.test(l.body));
    expect(notice).toMatchObject({ project_id: "p1", level: "warn", resource_id: "f1" });
    expect(warnings.join("\n")).toMatch(/50 lines of project p1 dropped/);
    await ingest.stop();
  });
});

describe("log ingest: batches to the store", () => {
  const many = (n: number, tag: string) => Array.from({ length: n }, (_, i) => line(`${tag} ${i}`));

  test("a full batch is written before the next tick, and the next is handed over while one is written (never more than two)", async () => {
    const gates: (() => void)[] = [];
    let open = 0;
    let most = 0;
    const written: StoredLine[] = [];
    const { ingest } = ingestWith({
      append: async (l) => {
        open++;
        most = Math.max(most, open);
        await new Promise<void>((r) => gates.push(r));
        open--;
        written.push(...l);
        return new Map();
      },
    });
    // 5,000 lines: batches of 2,000, 2,000 and 1,000; no flush asked for, no tick waited for.
    ingest.invocation(fn, "d1", "local", "inv1", many(5000, "x"));
    // Started at once (within a turn of the event loop), not at the next one-second tick.
    await new Promise((r) => setImmediate(r));
    expect(open).toBeGreaterThanOrEqual(1);
    await eventually(async () => gates.length, (n) => n === 2);
    expect(open).toBe(2);
    while (written.length < 5000) {
      await eventually(async () => gates.length, (n) => n > 0);
      gates.shift()!();
      await new Promise((r) => setImmediate(r));
    }
    expect(most).toBe(2);
    expect(new Set(written.map((l) => l.body)).size).toBe(5000);
    await ingest.stop();
  });

  test("a batch the store refused goes back to the queue and is written by the next write, beside one that was written", async () => {
    let calls = 0;
    const written: StoredLine[] = [];
    const { ingest } = ingestWith({
      append: async (l) => {
        if (++calls === 1) {
          await new Promise((r) => setTimeout(r, 20));
          throw new Error("store down");
        }
        written.push(...l);
        return new Map();
      },
    });
    // 3,000 lines start a write at once: the first batch (2,000) fails after the second (1,000) was handed over.
    ingest.invocation(fn, "d1", "local", "inv1", many(3000, "y"));
    // A flush runs after that write: it finds the refused batch back in the queue and writes it.
    await ingest.flush();
    expect(calls).toBe(3);
    expect(written.map((l) => l.body).sort()).toEqual(many(3000, "y").map((l) => l.message).sort());
    await ingest.stop();
  });
});
