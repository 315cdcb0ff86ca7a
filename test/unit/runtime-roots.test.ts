// The runtime-root cache (runtime-sandbox/runtime-roots.ts) without building anything: content
// addressing by recipe, the marker that makes a root whole, list and prune.
import { mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { cachedRoot, howToProvide, listCache, NO_SOURCE, pruneCache, recipeKey, ROOT_RECIPES, rootDir, rootLinks } from "../../runtime-sandbox/runtime-roots";
import { RUNTIME_NAMES, runtimeSource } from "../../runtime-sandbox/runtimes";
import { removeDir } from "../support/dirs";

const cache = mkdtempSync(join(tmpdir(), "kiln-roots-test-"));
afterAll(() => removeDir(cache));

/** A fake finished root: the interpreter file and the marker. */
function fakeRoot(dir: string, name: string, version: string) {
  const r = ROOT_RECIPES[name]!;
  mkdirSync(join(dir, "usr/bin"), { recursive: true });
  writeFileSync(join(dir, r.binary), "");
  symlinkSync("usr/bin", join(dir, "bin"));
  writeFileSync(join(dir, "kiln-root.json"), JSON.stringify({ name, version, binary: r.binary, suite: r.suite, packages: r.packages, bytes: 1234, builtAt: "2026-01-01T00:00:00Z" }));
}

describe("runtime roots", () => {
  test("every runtime name is either a root recipe, Node, or a documented no-source name", () => {
    for (const n of RUNTIME_NAMES) expect(n.startsWith("nodejs") || !!ROOT_RECIPES[n] || !!NO_SOURCE[n], n).toBe(true);
    expect(Object.keys(NO_SOURCE).sort()).toEqual(["python3.10", "python3.12", "ruby4.0"]);
    expect(howToProvide("python3.12")).toContain("--runtime-path python3.12=/path/to/python3.12");
  });

  test("docs/functions.md's runtime table gives each name the source kiln doctor prints", () => {
    const doc = readFileSync(join(import.meta.dirname, "../../docs/functions.md"), "utf8");
    for (const n of RUNTIME_NAMES) {
      const row = doc.split("\n").find((l) => l.startsWith("| ") && l.split("|")[1]!.includes(`\`${n}\``) && l.split("|").length === 7);
      expect(row, n).toBeDefined();
      expect(row!.split("|")[2], n).toContain(`\`${runtimeSource(n)}\``);
    }
  });

  test("the folder is addressed by the recipe: another package list is another folder", () => {
    const r = ROOT_RECIPES["python3.13"]!;
    expect(recipeKey({ ...r, packages: [...r.packages, "extra"] })).not.toBe(recipeKey(r));
    expect(recipeKey({ ...r, suite: "sid" })).not.toBe(recipeKey(r));
    expect(recipeKey({ ...r })).toBe(recipeKey(r));
    expect(rootDir(cache, "python3.13")).toBe(join(cache, "runtimes", `python3.13-${recipeKey(r)}`));
  });

  test("a root counts only with its marker; list shows current and stale ones; prune removes the stale and dead installs", () => {
    const current = rootDir(cache, "python3.13");
    mkdirSync(current, { recursive: true });
    expect(cachedRoot(cache, "python3.13")).toBeNull(); // no marker: half a tree
    fakeRoot(current, "python3.13", "3.13.5");
    expect(cachedRoot(cache, "python3.13")).toMatchObject({ version: "3.13.5", dir: current });
    expect(rootLinks(current)).toEqual([{ dest: "/bin", target: "usr/bin" }]);
    fakeRoot(join(cache, "runtimes", "python3.13-0000000000000000"), "python3.13", "3.13.1");
    mkdirSync(join(cache, "runtimes", "ruby3.3-1111111111111111.tmp-999999999-abcdef"));
    const list = listCache(cache);
    expect(list.find((e) => e.entry === `python3.13-${recipeKey(ROOT_RECIPES["python3.13"]!)}`)).toMatchObject({ current: true, version: "3.13.5", bytes: 1234 });
    expect(list.find((e) => e.entry === "python3.13-0000000000000000")).toMatchObject({ current: false });
    const removed = pruneCache(cache).map((r) => r.entry).sort();
    expect(removed).toEqual(["python3.13-0000000000000000", "ruby3.3-1111111111111111.tmp-999999999-abcdef"]);
    expect(cachedRoot(cache, "python3.13")).not.toBeNull();
    expect(pruneCache(cache, true).map((r) => r.entry)).toEqual([`python3.13-${recipeKey(ROOT_RECIPES["python3.13"]!)}`]);
    expect(listCache(cache)).toEqual([]);
  });
});
