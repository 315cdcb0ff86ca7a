// kiln/testing (issue 31): the example projects for each JavaScript test runner pass, each starting
// one Kiln through the helper and resetting it between its tests (docs/testing.md).
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, join, resolve } from "node:path";
import { expect, test } from "vitest";

const ROOT = resolve(import.meta.dirname, "../..");
const EXAMPLES = join(ROOT, "docs/examples/testing");
const BIN = join(ROOT, "node_modules/.bin");

function run(cmd: string, args: string[], cwd: string) {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 170_000, env: { ...process.env, PATH: `${BIN}:${process.env.PATH}` } });
  return { status: r.status, out: `${r.stdout}\n${r.stderr}` };
}

/** Node itself: under `bunx --bun` the first `node` on PATH is Bun (a shim in a temporary folder). */
const NODE =
  (process.env.PATH ?? "")
    .split(delimiter)
    .map((d) => join(d, "node"))
    .find((p) => existsSync(p) && spawnSync(p, ["-e", "process.stdout.write(process.versions.bun ? 'bun' : 'node')"], { encoding: "utf8" }).stdout === "node") ?? "node";

const runners: Array<[string, string, string[], string, RegExp]> = [
  ["node:test", NODE, ["--test", "shop.test.mjs"], "node-test", /# pass 2\n# fail 0/],
  ["bun test", join(BIN, "bun"), ["test", "./shop.test.ts"], "bun", /2 pass\s+0 fail/],
  ["vitest", join(BIN, "vitest"), ["run", "--config", "vitest.config.mjs"], "vitest", /Tests\s+.*2 passed/],
  // Jest's native ESM (no transform): the flag is Node's, so Node runs Jest's own entry.
  ["jest", NODE, ["--experimental-vm-modules", join(ROOT, "node_modules/jest/bin/jest.js")], "jest", /Tests:\s+2 passed, 2 total/],
];

for (const [name, cmd, args, dir, passed] of runners) {
  test(`the ${name} example passes: a Kiln per file, reset() between tests, advance("1d")`, { timeout: 180_000 }, () => {
    const r = run(cmd, args, join(EXAMPLES, dir));
    expect(r.out.replace(/\x1b\[[0-9;]*m/g, "")).toMatch(passed);
    expect(r.status, r.out).toBe(0);
  });
}
