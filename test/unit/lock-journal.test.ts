// The embedded profile's lease journal (LeaseJournal) under the in-memory lock table: every change is
// in the file before it is answered, a reopen without a close (a crash) restores leases, expiries
// and per-project counters, a torn tail is cut off, the file is rewritten as it grows, and acquires
// and renewals wait for the sync while releases do not.
import { randomUUID } from "node:crypto";
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { LeaseJournal, type LeaseLog } from "../../server/locks/lease-journal";
import type { AcquireResult, Lease } from "../../server/locks/lock-table";
import { MemoryLockTable } from "../../server/locks/memory-lock-table";

const T0 = Date.UTC(2031, 4, 6, 7, 8, 0);
const SEC = 1000;
const uuid = () => randomUUID();
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function freshDir(): string {
  const d = mkdtempSync(join(tmpdir(), "kiln-lock-journal-"));
  dirs.push(d);
  return join(d, "locks");
}

function okToken(r: AcquireResult): number {
  if (!r.ok) throw new Error(`expected success, got ${r.code}`);
  return r.fencingToken;
}

/** A table on the journal in `dir` (replayed), as Kiln's start makes it. */
function open(dir: string, opts: { now?: number; compactMinBytes?: number; warn?: (m: string) => void } = {}) {
  const journal = LeaseJournal.open(dir, { nowMs: () => opts.now ?? T0, warn: opts.warn, compactMinBytes: opts.compactMinBytes });
  return { journal, table: new MemoryLockTable({ state: journal.state, log: journal }) };
}

describe("lease journal", () => {
  test("reopened without a close (a crash): held leases with their renewed expiries, freed locks free, every project's tokens continue", async () => {
    const dir = freshDir();
    const { table } = open(dir);
    const a = uuid();
    const ta = okToken(await table.acquire("p", "held", a, 60, T0));
    expect(await table.renew("p", "held", a, 300, T0 + SEC)).toMatchObject({ ok: true, expiresAtMs: T0 + 301 * SEC });
    const b = uuid();
    okToken(await table.acquire("p", "released", b, 60, T0));
    await table.release("p", "released", b, T0);
    okToken(await table.acquire("p", "forced", uuid(), 60, T0));
    await table.forceRelease("p", "forced", T0);
    const tq = okToken(await table.acquire("q", "held", uuid(), 60, T0));
    okToken(await table.acquire("gone", "k", uuid(), 60, T0));
    await table.deleteProject("gone");
    const last = table.lastFencingToken("p");

    // No close: the first table is simply abandoned, as by kill -9.
    const again = open(dir, { now: T0 + 2 * SEC }).table;
    expect(await again.read("p", "held", T0 + 2 * SEC)).toEqual({ held: true, expiresAtMs: T0 + 301 * SEC, fencingToken: ta });
    expect(await again.acquire("p", "held", uuid(), 30, T0 + 2 * SEC)).toEqual({ ok: false, code: "lock_held" });
    expect(await again.renew("p", "held", a, 300, T0 + 3 * SEC)).toEqual({ ok: true, expiresAtMs: T0 + 303 * SEC, fencingToken: ta });
    expect(await again.read("p", "released", T0 + 2 * SEC)).toEqual({ held: false });
    expect(await again.read("p", "forced", T0 + 2 * SEC)).toEqual({ held: false });
    expect(await again.read("q", "held", T0 + 2 * SEC)).toMatchObject({ held: true, fencingToken: tq });
    expect(await again.read("gone", "k", T0 + 2 * SEC)).toEqual({ held: false });
    expect(okToken(await again.acquire("p", "released", uuid(), 30, T0 + 2 * SEC))).toBe(last + 1);
    expect(okToken(await again.acquire("gone", "k", uuid(), 30, T0 + 2 * SEC))).toBe(2);
    // After the renewed expiry and its grace second the lease is anyone's, with the next token.
    expect(okToken(await again.acquire("p", "held", uuid(), 30, T0 + 304 * SEC))).toBe(last + 2);
  });

  test("a clean close and reopen keep the same state; lapsed leases are left out of the rewrite, their projects' counters are not", async () => {
    const dir = freshDir();
    const { table } = open(dir);
    const t1 = okToken(await table.acquire("p", "short", uuid(), 5, T0));
    const t2 = okToken(await table.acquire("p", "long", uuid(), 600, T0));
    await table.close();
    const later = T0 + 60 * SEC;
    const { journal, table: again } = open(dir, { now: later });
    expect(readFileSync(join(dir, "leases.journal"), "utf8")).not.toContain('"short"');
    expect([...journal.state.projects.get("p")!.keys()]).toEqual(["long"]);
    expect(await again.read("p", "long", later)).toMatchObject({ held: true, fencingToken: t2 });
    expect(okToken(await again.acquire("p", "short", uuid(), 5, later))).toBe(Math.max(t1, t2) + 1);
    await again.close();
  });

  test("a torn tail (half a line, then garbage) is cut off with a warning; everything before it is kept", async () => {
    const dir = freshDir();
    const { table } = open(dir);
    const t = okToken(await table.acquire("p", "k", uuid(), 300, T0));
    appendFileSync(join(dir, "leases.journal"), '["L","p","torn","' + "\0".repeat(20) + "\n\0\0\0");
    const warnings: string[] = [];
    const again = open(dir, { warn: (m) => warnings.push(m) }).table;
    expect(warnings).toEqual([expect.stringMatching(/torn tail of 41 bytes/)]);
    expect(await again.read("p", "k", T0)).toMatchObject({ held: true, fencingToken: t });
    expect(await again.read("p", "torn", T0)).toEqual({ held: false });
    // The start's rewrite removed the tail: a third open has nothing to cut.
    const quiet: string[] = [];
    open(dir, { warn: (m) => quiet.push(m) });
    expect(quiet).toEqual([]);
  });

  test("a file that is not a lock journal is refused, not overwritten; a rewrite that never reached its rename is discarded", () => {
    const dir = freshDir();
    open(dir);
    writeFileSync(join(dir, "leases.journal.next"), "half a rewrite");
    open(dir);
    expect(existsSync(join(dir, "leases.journal.next"))).toBe(false);
    writeFileSync(join(dir, "leases.journal"), "something else\n");
    expect(() => open(dir)).toThrow(/not a Kiln lock journal/);
    expect(readFileSync(join(dir, "leases.journal"), "utf8")).toBe("something else\n");
  });

  test("the file is rewritten as it grows: it stays small under churn, and a reopen sees the latest state", async () => {
    const dir = freshDir();
    const { journal, table } = open(dir, { compactMinBytes: 4096 });
    const keep = uuid();
    const kept = okToken(await table.acquire("p", "kept", keep, 600, T0));
    let peak = 0;
    for (let i = 0; i < 300; i++) {
      const t = uuid();
      okToken(await table.acquire("p", `churn:${i}`, t, 30, T0));
      await table.renew("p", "kept", keep, 600, T0 + i);
      await table.release("p", `churn:${i}`, t, T0);
      peak = Math.max(peak, journal.bytes);
    }
    // 300 cycles wrote ~90 KB of records; rewrites kept the file near the threshold.
    expect(peak).toBeLessThan(3 * 4096);
    expect(statSync(join(dir, "leases.journal")).size).toBe(journal.bytes);
    const again = open(dir).table;
    expect(await again.read("p", "kept", T0 + 300)).toEqual({ held: true, expiresAtMs: T0 + 299 + 600 * SEC, fencingToken: kept });
    expect(await again.read("p", "churn:299", T0)).toEqual({ held: false });
    expect(okToken(await again.acquire("p", "new", uuid(), 30, T0))).toBe(kept + 301);
  });

  test("concurrent acquires and renewals all complete (they share syncs) and are all in the file", async () => {
    const dir = freshDir();
    const { table } = open(dir);
    const owners = Array.from({ length: 200 }, () => uuid());
    const tokens = await Promise.all(owners.map((o, i) => table.acquire("p", `k${i}`, o, 60, T0).then(okToken)));
    expect(new Set(tokens).size).toBe(200);
    await Promise.all(owners.map((o, i) => table.renew("p", `k${i}`, o, 120, T0 + SEC)));
    const again = open(dir).table;
    for (let i = 0; i < 200; i += 37) {
      expect(await again.read("p", `k${i}`, T0 + SEC)).toEqual({ held: true, expiresAtMs: T0 + 121 * SEC, fencingToken: tokens[i] });
    }
  });
});

/** A log that records calls and whose syncs finish when the test says. */
function heldLog() {
  const calls: string[] = [];
  const pending: Array<() => void> = [];
  let failPut = false;
  const log: LeaseLog = {
    put: (p: string, k: string, l: Lease) => {
      if (failPut) throw new Error("disk full");
      calls.push(`put ${p} ${k} ${l.fencingToken} ${l.expiresAtMs}`);
    },
    free: (p, k) => void calls.push(`free ${p} ${k}`),
    dropProject: (p) => void calls.push(`drop ${p}`),
    synced: () => new Promise<void>((r) => pending.push(r)),
    close: async () => {},
  };
  return { log, calls, pending, failing: (v: boolean) => (failPut = v) };
}

describe("the in-memory table over its log", () => {
  test("acquires and renewals are answered only after the log's sync; releases are not waited for", async () => {
    const { log, calls, pending } = heldLog();
    const table = new MemoryLockTable({ log });
    const a = uuid();
    let answered = false;
    const acquiring = table.acquire("p", "k", a, 30, T0).then((r) => ((answered = true), r));
    await new Promise((r) => setTimeout(r, 5));
    expect(calls).toEqual([`put p k 1 ${T0 + 30 * SEC}`]);
    expect(answered).toBe(false);
    pending.shift()!();
    expect(okToken(await acquiring)).toBe(1);

    const renewing = table.renew("p", "k", a, 60, T0);
    await new Promise((r) => setTimeout(r, 5));
    expect(calls.at(-1)).toBe(`put p k 1 ${T0 + 60 * SEC}`);
    pending.shift()!();
    expect(await renewing).toMatchObject({ ok: true, expiresAtMs: T0 + 60 * SEC });

    expect(await table.release("p", "k", a, T0)).toEqual({ released: true });
    expect(calls.at(-1)).toBe("free p k");
    expect(pending).toEqual([]);
    // Refused operations record nothing.
    const n = calls.length;
    expect(await table.renew("p", "k", a, 60, T0)).toEqual({ ok: false, code: "lock_ownership_lost" });
    expect(await table.release("p", "k", uuid(), T0)).toEqual({ released: false });
    expect(calls.length).toBe(n);
  });

  test("a change the log cannot record is not made: the lease stays free and no token is used", async () => {
    const { log, pending, failing } = heldLog();
    const table = new MemoryLockTable({ log });
    failing(true);
    await expect(table.acquire("p", "k", uuid(), 30, T0)).rejects.toThrow(/disk full/);
    expect(await table.read("p", "k", T0)).toEqual({ held: false });
    expect(table.lastFencingToken("p")).toBe(0);
    failing(false);
    const acquiring = table.acquire("p", "k", uuid(), 30, T0);
    await new Promise((r) => setTimeout(r, 5));
    pending.shift()!();
    expect(okToken(await acquiring)).toBe(1);
  });
});
