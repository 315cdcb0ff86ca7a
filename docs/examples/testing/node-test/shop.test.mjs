// One Kiln for the file, reset() before each test: run with `node --test` (docs/testing.md).
import assert from "node:assert/strict";
import { after, before, beforeEach, test } from "node:test";
import { startKiln } from "kiln/testing";

let kiln;
before(async () => {
  kiln = await startKiln({ clock: "controllable" });
});
after(() => kiln?.stop());
beforeEach(() => kiln.reset());

const api = (path, init = {}) =>
  fetch(kiln.url + path, { ...init, headers: { authorization: `Bearer ${kiln.platformToken}`, "content-type": "application/json", ...init.headers } });

test("a test makes a project and gets its keys", async () => {
  assert.equal((await api("/projects", { method: "POST", body: JSON.stringify({ name: "shop" }) })).status, 201);
  assert.match(await kiln.serviceKey("shop"), /^sk-/);
  assert.ok(await kiln.anonKey("shop"));
});

test("the next test starts from the state right after start, and moves the clock", async () => {
  assert.equal((await (await api("/projects")).json()).total, 0);
  const start = await kiln.advance(0);
  const later = await kiln.advance("1d");
  assert.equal(later.offset_ms - start.offset_ms, 86_400_000);
});
