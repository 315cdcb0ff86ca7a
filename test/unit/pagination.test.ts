import { describe, expect, test } from "vitest";
import { HttpError } from "../../server/http/errors";
import { decodeCursor, encodeCursor, likePattern, paginated, withQuery } from "../../server/http/pagination";

describe("cursors", () => {
  test("round-trip and are URL-safe", () => {
    const a = { t: "2026-11-21T10:00:00.123Z", id: "abc123" };
    const c = encodeCursor(a);
    expect(c).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(decodeCursor(c)).toEqual(a);
  });
  test("garbage, foreign JSON and bad timestamps are 400s naming the parameter", () => {
    for (const bad of ["garbage", Buffer.from('{"v":2,"t":"x","id":"y"}').toString("base64url"), Buffer.from('{"v":1,"t":"nope","id":"y"}').toString("base64url")]) {
      try {
        decodeCursor(bad, "ending_before");
        expect.unreachable();
      } catch (e) {
        expect(e).toBeInstanceOf(HttpError);
        expect((e as HttpError).status).toBe(400);
        expect((e as HttpError).message).toContain("ending_before");
      }
    }
  });
});

describe("offset envelope", () => {
  test("has_more and next keep the other query parameters", () => {
    const r = paginated([1, 2], { page: 1, limit: 2, total: 5, path: "/x", query: { search: "a b", empty: undefined } });
    expect(r).toEqual({ data: [1, 2], page: 1, limit: 2, total: 5, has_more: true, next: "/x?search=a+b&page=2&limit=2" });
    expect(paginated([1], { page: 3, limit: 2, total: 5, path: "/x" })).toEqual({ data: [1], page: 3, limit: 2, total: 5, has_more: false });
  });
  test("withQuery drops empty values", () => {
    expect(withQuery("/p", { a: "", b: undefined })).toBe("/p");
  });
});

describe("search patterns", () => {
  test("LIKE wildcards are matched literally", () => {
    expect(likePattern("a_b%c\\")).toBe("%a\\_b\\%c\\\\%");
  });
});
