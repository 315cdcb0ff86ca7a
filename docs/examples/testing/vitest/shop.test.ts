// One Kiln for the file, reset() before each test: run with `vitest run` (docs/testing.md).
import { afterAll, beforeAll, beforeEach, expect, test } from "vitest";
import { startKiln, type RunningKiln } from "kiln/testing";

let kiln: RunningKiln;
beforeAll(async () => {
  kiln = await startKiln({ clock: "controllable" });
}, 60_000);
afterAll(() => kiln?.stop());
beforeEach(() => kiln.reset());

const api = (path: string, init: RequestInit = {}) =>
  fetch(kiln.url + path, { ...init, headers: { authorization: `Bearer ${kiln.platformToken}`, "content-type": "application/json", ...init.headers } });

test("a test makes a project and gets its keys", async () => {
  expect((await api("/projects", { method: "POST", body: JSON.stringify({ name: "shop" }) })).status).toBe(201);
  expect(await kiln.serviceKey("shop")).toMatch(/^sk-/);
  expect(await kiln.anonKey("shop")).toBeTruthy();
});

test("the next test starts from the state right after start, and moves the clock", async () => {
  expect((await (await api("/projects")).json()).total).toBe(0);
  const before = await kiln.advance(0);
  const after = await kiln.advance("1d");
  expect(after.offset_ms - before.offset_ms).toBe(86_400_000);
});
