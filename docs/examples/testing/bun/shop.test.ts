// One Kiln for the file, reset() before each test: run with `bun test` (docs/testing.md).
import { afterAll, beforeAll, beforeEach, expect, test } from "bun:test";
import { startKiln, type RunningKiln } from "kiln/testing";

let kiln: RunningKiln;
beforeAll(async () => {
  kiln = await startKiln({ clock: "controllable" });
}, 60_000);
afterAll(() => kiln?.stop());
// bun test's default timeout is 5 s for hooks and tests; a reset takes longer on a busy machine.
beforeEach(() => kiln.reset(), 60_000);

const api = (path: string, init: RequestInit = {}) =>
  fetch(kiln.url + path, { ...init, headers: { authorization: `Bearer ${kiln.platformToken}`, "content-type": "application/json", ...init.headers } });

test("a test makes a project and gets its keys", async () => {
  expect((await api("/projects", { method: "POST", body: JSON.stringify({ name: "shop" }) })).status).toBe(201);
  expect(await kiln.serviceKey("shop")).toMatch(/^sk-/);
  expect(await kiln.anonKey("shop")).toBeTruthy();
}, 60_000);

test("the next test starts from the state right after start, and moves the clock", async () => {
  expect(((await (await api("/projects")).json()) as { total: number }).total).toBe(0);
  const before = await kiln.advance(0);
  const after = await kiln.advance("1d");
  expect(after.offset_ms - before.offset_ms).toBe(86_400_000);
}, 60_000);
