import { describe, expect, test } from "vitest";
import { FlushLoop } from "../../server/store/flush-loop";

describe("FlushLoop", () => {
  test("a failed write does not stop later ones, and writes never overlap", async () => {
    let running = 0;
    let overlapped = false;
    const outcomes = ["fail", "ok", "ok"];
    const errors: unknown[] = [];
    const loop = new FlushLoop(async () => {
      running++;
      if (running > 1) overlapped = true;
      await new Promise((r) => setTimeout(r, 5));
      running--;
      if (outcomes.shift() === "fail") throw new Error("store down");
    }, (e) => errors.push(e));
    const first = loop.flush();
    const second = loop.flush();
    await expect(first).rejects.toThrow("store down");
    await expect(second).resolves.toBeUndefined();
    await loop.stop();
    expect(overlapped).toBe(false);
    expect(outcomes).toEqual([]);
    expect(errors).toEqual([]);
  });
});
