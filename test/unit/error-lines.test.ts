// Every error line Kiln logs says something (issue 25): a thrown value without a message or stack
// used to print "failed (request ...): " and nothing after it.
import { describe, expect, test } from "vitest";
import { describeError } from "../../server/log";

describe("describeError", () => {
  test("an error with a stack: its name, code and message, then the frames", () => {
    const e = Object.assign(new Error("disk full"), { code: "ENOSPC" });
    const text = describeError(e);
    expect(text.split("\n")[0]).toBe("Error (ENOSPC): disk full");
    expect(text).toMatch(/\n\s+at /);
  });

  test("nothing empty: a bare Error, an empty DOMException, an empty string, a plain object", () => {
    const bare = new Error();
    bare.stack = "";
    expect(describeError(bare)).toBe("Error: (no message)");
    expect(describeError(new DOMException("", "AbortError")).split("\n")[0]).toBe("AbortError (20): (no message)");
    expect(describeError("")).toBe("(an empty string was thrown)");
    expect(describeError({ reason: "x" })).toBe(`[object Object] {"reason":"x"}`);
    expect(describeError(null)).toBe("[object Null] null");
  });
});
