// The embedded profile's log store (server/backends/logs/file-store.ts): every search answers as a full scan
// of the lines would (bloom filters and level lists never hide a match, the newest-first walk stops
// only when the answer is final), across reopening; a crash's torn index tail is cut and later
// writes stay readable; retention trims and drops exactly the older lines and deletes emptied day
// files; a project's deletion removes its folder; imports skip what they wrote; hostile text
// round-trips.
import { appendFileSync, existsSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync, truncateSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { bloomHas, bloomOf, FileLogStore } from "../../server/backends/logs/file-store";
import { parseQuery, toPredicate } from "../../server/logs/query";
import { newerFirst, type LineQuery, type StoredLine } from "../../server/backends/logs/log-store";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
function newDir(): string {
  const d = mkdtempSync(join(tmpdir(), "kiln-log-files-"));
  dirs.push(d);
  return d;
}
function open(dir: string): FileLogStore {
  const s = new FileLogStore(dir);
  s.open();
  return s;
}

// A seeded generator, so a failure is reproducible.
let seed = 42;
const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
const pick = <T>(a: readonly T[]): T => a[Math.floor(rand() * a.length)]!;
const WORDS = ["alpha", "beta", "gamma", "Payment", "timeout", "zebra-needle", "ünïcödé", "a%b_c", "quote\"d", "back\\slash", "x"];
const DAY = 86_400_000;
const T0 = Date.UTC(2030, 0, 1, 20);
let n = 0;

function line(over: Partial<StoredLine> = {}): StoredLine {
  const at = over.at ?? T0 + Math.floor(rand() * 3 * DAY);
  const id = `${at.toString(36).padStart(9, "0")}${(n++).toString(36).padStart(6, "0")}`;
  const stream = over.stream ?? (rand() < 0.1 ? "build" : "runtime");
  return {
    id,
    project_id: pick(["p1", "p2"]),
    resource_type: "function",
    resource_id: pick(["f1", "f2", "f3"]),
    resource_name: pick(["one", "two"]),
    stream,
    deployment_id: stream === "build" ? pick(["d1", "d2"]) : pick(["d1", null]),
    invocation_id: stream === "build" ? null : pick(["i1", "i2", "i3", "i4"]),
    region: pick(["local", "eu"]),
    level: pick(["info", "info", "info", "error", "warn", "debug"]),
    structured: false,
    body: Array.from({ length: 1 + Math.floor(rand() * 4) }, () => pick(WORDS)).join(" "),
    at,
    ...over,
  };
}

/** What a search must answer: every line, filtered, newest first. */
function reference(all: readonly StoredLine[], q: LineQuery): StoredLine[] {
  const match = q.where ? toPredicate(q.where) : () => true;
  const stream = q.deploymentIds?.length ? "build" : "runtime";
  const beforeAt = q.before ? Date.parse(q.before.at) : undefined;
  return all
    .filter(
      (l) =>
        l.project_id === q.projectId &&
        l.resource_type === q.resourceType &&
        l.stream === stream &&
        (!q.deploymentIds?.length || q.deploymentIds.includes(l.deployment_id!)) &&
        (!q.resourceIds?.length || q.resourceIds.includes(l.resource_id)) &&
        (q.startMs === undefined || l.at >= q.startMs) &&
        (q.endMs === undefined || l.at <= q.endMs) &&
        (beforeAt === undefined || l.at < beforeAt || (l.at === beforeAt && l.id < q.before!.id)) &&
        match(l),
    )
    .sort(newerFirst)
    .slice(0, q.limit);
}

const QUERIES = ["", "payment", "level:error", "level:(error OR warn) -alpha", "zebra-needle", '"gamma beta"', "invocation.id:i2 timeout", "region:eu -level:info", "absentword", "x", "ünïcödé", "a%b_c", "back\\\\slash", "-timeout"];

function queries(): LineQuery[] {
  const out: LineQuery[] = [];
  for (const projectId of ["p1", "p2", "p3"])
    for (const q of QUERIES) {
      const where = parseQuery(q);
      out.push({ projectId, resourceType: "function", where, limit: 50 });
      out.push({ projectId, resourceType: "function", where, limit: 1000, resourceIds: ["f2"] });
      out.push({ projectId, resourceType: "function", where, limit: 7, startMs: T0 + DAY, endMs: T0 + 2 * DAY });
      out.push({ projectId, resourceType: "function", where, limit: 30, deploymentIds: ["d2"] });
    }
  return out;
}

/** Every query, then pages of the first through cursors, equal to the reference. */
function expectAnswers(s: FileLogStore, all: readonly StoredLine[]) {
  return (async () => {
    for (const q of queries()) expect((await s.search(q)).map((l) => l.id), JSON.stringify(q)).toEqual(reference(all, q).map((l) => l.id));
    const q: LineQuery = { projectId: "p1", resourceType: "function", where: parseQuery("level:(error OR warn)"), limit: 13 };
    const paged: string[] = [];
    let before: LineQuery["before"];
    for (;;) {
      const page = await s.search({ ...q, before });
      paged.push(...page.map((l) => l.id));
      if (page.length < q.limit) break;
      const last = page[page.length - 1]!;
      before = { at: new Date(last.at).toISOString(), id: last.id };
    }
    expect(paged).toEqual(reference(all, { ...q, limit: 1e9 }).map((l) => l.id));
  })();
}

/** A store in a new folder holding `batches` batches of 500 random lines (some older than the last). */
async function filled(batches: number): Promise<{ dir: string; s: FileLogStore; all: StoredLine[] }> {
  const dir = newDir();
  const s = open(dir);
  const all: StoredLine[] = [];
  for (let b = 0; b < batches; b++) {
    const batch = Array.from({ length: 500 }, () => line());
    all.push(...batch);
    await s.append(batch);
  }
  return { dir, s, all };
}

/** Closed and opened again: the same answers, and the lines counted as kept. */
async function expectAfterReopen(s: FileLogStore, dir: string, kept: readonly StoredLine[]) {
  await s.close();
  const again = open(dir);
  await expectAnswers(again, kept);
  expect(again.lineCount("p1") + again.lineCount("p2")).toBe(kept.length);
  await again.close();
}

describe("the segment-file log store", () => {
  test("bloom filters never rule out a key they hold", () => {
    const keys = Array.from({ length: 3000 }, (_, i) => (i % 2 ? -1 - i * 7919 : i * 104729) | 0);
    for (const size of [0, 1, 5, 64, 600, 3000]) {
      const b = bloomOf(keys.slice(0, size));
      for (const k of keys.slice(0, size)) expect(bloomHas(b, k)).toBe(true);
    }
    // And rule out most others (about 1% pass).
    const b = bloomOf(keys.slice(0, 600));
    const passed = keys.slice(600).filter((k) => bloomHas(b, k)).length;
    expect(passed).toBeLessThan(2400 * 0.03);
  });

  test("searches answer as a full scan would: filters, levels, terms, time bounds, cursors; out-of-order batches; after reopening", async () => {
    // Lines of random times: some batches hold older lines than the last (a clock set back, an import).
    const { dir, s, all } = await filled(12);
    await expectAnswers(s, all);
    await expectAfterReopen(s, dir, all);
  });

  test("hostile text round-trips exactly: newlines, quotes, backslashes, separators, long lines", async () => {
    const dir = newDir();
    const s = open(dir);
    const bodies = ["a\nb\r\nc", '{"level":"error","message":"x\\"y"}', "tab\there", "\u2028\u2029", "emoji 😀 and \u0000?".replace("\u0000", "\uFFFD"), "x".repeat(16_000), ""];
    const lines = bodies.map((body, i) => line({ project_id: "p1", stream: "runtime", body, at: T0 + i, structured: i === 1 }));
    await s.append(lines);
    await s.close();
    const again = open(dir);
    const got = await again.search({ projectId: "p1", resourceType: "function", where: null, limit: 100 });
    expect(got).toEqual([...lines].sort(newerFirst));
    await again.close();
  });

  test("a crash's torn index tail is cut at open: the batches before it stay, later writes are readable", async () => {
    const dir = newDir();
    const s = open(dir);
    const a = Array.from({ length: 300 }, (_, i) => line({ project_id: "p1", stream: "runtime", at: T0 + i }));
    await s.append(a);
    const index = join(dir, "p1", "index");
    const afterA = statSync(index).size;
    const b = Array.from({ length: 300 }, (_, i) => line({ project_id: "p1", stream: "runtime", at: T0 + 1000 + i }));
    await s.append(b);
    await s.close();
    // The crash: B's index records half written; stray bytes at a data file's end (a data write without its index).
    truncateSync(index, afterA + Math.floor((statSync(index).size - afterA) / 2));
    const day = readdirSync(join(dir, "p1")).find((f) => f.endsWith(".seg"))!;
    appendFileSync(join(dir, "p1", day), "garbage without an index record");
    const again = open(dir);
    const q: LineQuery = { projectId: "p1", resourceType: "function", where: null, limit: 1000 };
    expect((await again.search(q)).map((l) => l.id)).toEqual([...a].sort(newerFirst).map((l) => l.id));
    const c = Array.from({ length: 50 }, (_, i) => line({ project_id: "p1", stream: "runtime", at: T0 + 5000 + i }));
    await again.append(c);
    await again.close();
    const third = open(dir);
    expect((await third.search(q)).map((l) => l.id)).toEqual([...a, ...c].sort(newerFirst).map((l) => l.id));
    await third.close();
  });

  test("retention: exactly the lines older than the cutoff go (counted), build summaries follow, emptied day files are deleted; it holds after reopening", async () => {
    const { dir, s, all } = await filled(6);
    const days = () => readdirSync(join(dir, "p1")).filter((f) => f.endsWith(".seg")).sort();
    expect(days().length).toBeGreaterThanOrEqual(3);
    const cutoff = T0 + DAY + 12_345;
    const older = all.filter((l) => l.at < cutoff).length;
    expect(await s.removeOlderThan(cutoff)).toBe(older);
    expect(await s.removeOlderThan(cutoff)).toBe(0);
    const kept = all.filter((l) => l.at >= cutoff);
    await expectAnswers(s, kept);
    // The first day's file had only older lines: gone.
    expect(days()[0]! > "20300101.seg").toBe(true);
    const summary = (lines: StoredLine[], d: string) => {
      const b = lines.filter((l) => l.stream === "build" && l.deployment_id === d).sort((x, y) => x.at - y.at);
      return b.length ? { lines: b.length, first_at: new Date(b[0]!.at).toISOString(), last_at: new Date(b[b.length - 1]!.at).toISOString() } : undefined;
    };
    const sums = await s.buildSummaries(["d1", "d2", "d9"]);
    expect(sums.get("d1")).toEqual(summary(kept, "d1"));
    expect(sums.get("d2")).toEqual(summary(kept, "d2"));
    expect(sums.has("d9")).toBe(false);
    await expectAfterReopen(s, dir, kept);
  });

  test("a project's deletion removes its folder (also when cut short) and leaves the others", async () => {
    const dir = newDir();
    const s = open(dir);
    const all = Array.from({ length: 1000 }, () => line());
    await s.append(all);
    await s.removeProject("p1");
    expect(existsSync(join(dir, "p1"))).toBe(false);
    expect(readdirSync(dir).filter((f) => f.startsWith("."))).toEqual([]);
    const rest = all.filter((l) => l.project_id !== "p1");
    await expectAnswers(s, rest);
    await s.close();
    // A deletion cut short after its rename: the folder goes at the next open.
    renameSync(join(dir, "p2"), join(dir, ".deleted-p2-x"));
    const again = open(dir);
    expect(readdirSync(dir).filter((f) => f.startsWith("."))).toEqual([]);
    await expectAnswers(again, []);
    expect(again.lineCount("p1") + again.lineCount("p2")).toBe(0);
    await again.close();
  });

  test("thousands of projects hold no descriptor each: open files stay bounded", async () => {
    const dir = newDir();
    const s = open(dir);
    const fds = () => readdirSync("/proc/self/fd").length;
    const before = fds();
    for (let i = 0; i < 1500; i++) await s.append([line({ project_id: `proj${i}`, stream: "runtime", at: T0 + i * 60_000 })]);
    expect(fds() - before).toBeLessThanOrEqual(64 + 4);
    const q: LineQuery = { projectId: "proj1499", resourceType: "function", where: null, limit: 10 };
    expect(await s.search(q)).toHaveLength(1);
    await s.close();
    const again = open(dir);
    expect(await again.search(q)).toHaveLength(1);
    expect(fds() - before).toBeLessThanOrEqual(4);
    await again.close();
  });

  test("imports: a batch written again after a crash (position not saved) adds nothing; positions persist", async () => {
    const dir = newDir();
    const s = open(dir);
    const batch = Array.from({ length: 400 }, () => line());
    await s.importBatch("old", batch, "pos-1");
    await s.importBatch("old", batch, "pos-1");
    expect(await s.importPosition("old")).toBe("pos-1");
    expect(await s.importPosition("other")).toBeNull();
    await s.close();
    const again = open(dir);
    expect(await again.importPosition("old")).toBe("pos-1");
    expect(again.lineCount("p1") + again.lineCount("p2")).toBe(batch.length);
    await expectAnswers(again, batch);
    await again.close();
  });
});
