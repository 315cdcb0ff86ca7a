// The request gate a snapshot or restore closes (server/http/gate.ts).
import { expect, test } from "vitest";
import { RequestGate } from "../../server/http/gate";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("closing waits for the requests inside; arrivals wait and come in once it opens", async () => {
  const gate = new RequestGate(5_000);
  expect(gate.enter()).toBeNull();
  let closed = false;
  const closing = gate.close(0, 5_000).then((ok) => (closed = ok));
  await sleep(20);
  expect(closed).toBe(false);
  const held = gate.enter();
  expect(held).not.toBeNull();
  gate.leave();
  await closing;
  expect(closed).toBe(true);
  let inside = false;
  void held!.then((v) => (inside = v));
  await sleep(20);
  expect(inside).toBe(false);
  gate.open();
  expect(await held).toBe(true);
  gate.leave();
  // Nothing is counted inside any more: a close with no own request succeeds at once.
  expect(await gate.close(0, 10)).toBe(true);
  gate.open();
});

test("an arrival held past the hold gets false (503) and is never counted inside", async () => {
  const gate = new RequestGate(30);
  expect(await gate.close(0, 10)).toBe(true);
  const held = gate.enter();
  expect(await held).toBe(false);
  gate.open();
  await sleep(10);
  expect(await gate.close(0, 50)).toBe(true);
  gate.open();
});

test("a close that outlasts its timeout opens again and reports false; a pass lets a request through a closed door", async () => {
  const gate = new RequestGate(1_000);
  expect(gate.enter()).toBeNull();
  expect(await gate.close(0, 30)).toBe(false);
  expect(gate.isClosed).toBe(false);
  gate.leave();
  gate.closeNow();
  const pass = gate.pass();
  expect(gate.enter(new Request("http://x/", { headers: { [pass.header]: pass.value } }))).toBeNull();
  expect(gate.enter(new Request("http://x/", { headers: { [pass.header]: "forged" } }))).not.toBeNull();
  pass.done();
  gate.open();
});
