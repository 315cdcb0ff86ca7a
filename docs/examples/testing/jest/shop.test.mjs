// One Kiln for the file, reset() before each test: run with Jest's native ESM support,
// `node --experimental-vm-modules node_modules/jest/bin/jest.js` (docs/testing.md).
import { afterAll, beforeAll, beforeEach, expect, test } from "@jest/globals";
import { startKiln } from "kiln/testing";

let kiln;
beforeAll(async () => {
  kiln = await startKiln({ clock: "controllable" });
}, 60_000);
afterAll(() => kiln?.stop());
beforeEach(() => kiln.reset());

const api = (path, init = {}) =>
  fetch(kiln.url + path, { ...init, headers: { authorization: `Bearer ${kiln.platformToken}`, "content-type": "application/json", ...init.headers } });

test("a test makes a project and gets its keys", async () => {
  expect((await api("/projects", { method: "POST", body: JSON.stringify({ name: "shop" }) })).status).toBe(201);
  expect(await kiln.serviceKey("shop")).toMatch(/^sk-/);
  expect(await kiln.anonKey("shop")).toBeTruthy();
});

test("the next test starts from the state right after start, and moves the clock", async () => {
  expect((await (await api("/projects")).json()).total).toBe(0);
  const start = await kiln.advance(0);
  const later = await kiln.advance("1d");
  expect(later.offset_ms - start.offset_ms).toBe(86_400_000);
});
