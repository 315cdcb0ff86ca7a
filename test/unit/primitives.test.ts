import { describe, expect, test } from "vitest";
import { resolveConfig, takeFault } from "../../server/config";
import { compareVersions, judgeCliVersion, parseVersion } from "../../server/http/cli-version";
import { FixedWindowLimiter } from "../../server/http/rate-limit";
import { createHash } from "node:crypto";
import { hashSecret, newId, newSecret, newTimeOrderedId, secretPrefix } from "../../server/ids";

describe("ids and secrets", () => {
  test("ids are DNS-safe and unique", () => {
    const ids = new Set(Array.from({ length: 1000 }, newId));
    expect(ids.size).toBe(1000);
    for (const id of ids) expect(id).toMatch(/^[a-z0-9]{20}$/);
  });
  test("time-ordered ids have the same shape and sort by creation time", async () => {
    const first = Array.from({ length: 500 }, newTimeOrderedId);
    await new Promise((r) => setTimeout(r, 5));
    const later = newTimeOrderedId();
    expect(new Set(first).size).toBe(500);
    for (const id of [...first, later]) expect(id).toMatch(/^[a-z0-9]{20}$/);
    for (const id of first) expect(id < later).toBe(true);
  });
  test("secrets carry their kind; only a stable hash is stored", () => {
    const s = newSecret("pt");
    expect(s).toMatch(/^pt-[A-Za-z0-9]{40}$/);
    expect(hashSecret(s)).toBe(hashSecret(s));
    expect(hashSecret(s)).not.toContain(s.slice(3));
    expect(hashSecret(s)).toMatch(/^[0-9a-f]{64}$/);
    // Stored hashes must not change with the implementation.
    for (const x of [s, "sk-abc", "pt-ÄÖü€😀"]) expect(hashSecret(x)).toBe(createHash("sha256").update(x).digest("hex"));
    expect(s.startsWith(secretPrefix(s))).toBe(true);
    expect(secretPrefix(s).length).toBeLessThan(s.length / 2);
  });
});

describe("CLI versions", () => {
  test("parse and compare", () => {
    expect(parseVersion("v1.2.3-beta")).toEqual([1, 2, 3]);
    expect(parseVersion("latest")).toBeNull();
    expect(compareVersions([1, 10, 0], [1, 9, 9])).toBe(1);
  });
  test("verdicts", () => {
    expect(judgeCliVersion(null, "1.0.0", "0.5.0")).toBe("ok");
    expect(judgeCliVersion("0.4.9", "1.0.0", "0.5.0")).toBe("require_upgrade");
    expect(judgeCliVersion("0.5.0", "1.0.0", "0.5.0")).toBe("suggest_upgrade");
    expect(judgeCliVersion("1.0.0", "1.0.0", "0.5.0")).toBe("ok");
    expect(judgeCliVersion("garbage", "1.0.0", "0.5.0")).toBe("ok");
  });
});

describe("fixed-window limiter", () => {
  test("allows the limit per window, then refuses with the time to the window's end", () => {
    let now = 60_000 * 10 + 15_000;
    const l = new FixedWindowLimiter(3, 60_000, () => now);
    expect([l.hit("a"), l.hit("a"), l.hit("a")].every((r) => r.allowed)).toBe(true);
    const over = l.hit("a");
    expect(over.allowed).toBe(false);
    expect(over.retryAfterSeconds).toBe(45);
    expect(l.hit("b").allowed).toBe(true);
    now += 45_000; // next window
    expect(l.hit("a").allowed).toBe(true);
  });
});

describe("configuration", () => {
  test("defaults follow the contract", () => {
    const c = resolveConfig({}, {});
    expect(c).toMatchObject({ host: "127.0.0.1", port: 7070, plan: "superagent", regions: ["local"], ephemeral: false });
    expect(c.dataDir.endsWith("/.kiln")).toBe(true);
  });
  test("flags beat environment; bad values are refused", () => {
    expect(resolveConfig({ port: "0" }, { KILN_PORT: "9" }).port).toBe(0);
    expect(() => resolveConfig({ port: "99999" }, {})).toThrow(/--port/);
    expect(() => resolveConfig({}, { KILN_PLATFORM_TOKEN: "nope" })).toThrow(/KILN_PLATFORM_TOKEN/);
    expect(resolveConfig({ regions: "a, b,a" }, {}).regions).toEqual(["a", "b"]);
  });
  test("faults are taken once each", () => {
    const c = resolveConfig({}, { KILN_FAULTS: "x:2,y" });
    expect([takeFault(c, "x"), takeFault(c, "x"), takeFault(c, "x"), takeFault(c, "y"), takeFault(c, "z")]).toEqual([true, true, false, true, false]);
  });
});
