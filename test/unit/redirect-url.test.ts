import { describe, expect, test } from "vitest";
import { redirectUrlProblem } from "../../server/end-users/redirect-url";

describe("redirect URL rules", () => {
  test.each([
    "https://app.example.com/callback",
    "https://app.example.com/cb?x=1&y=2",
    "http://localhost:3000/cb",
    "http://127.0.0.1:5173/",
    "http://[::1]:8080/x",
    "http://app.localhost/cb",
  ])("accepts %s", (u) => expect(redirectUrlProblem(u)).toBeNull());

  test.each([
    ["javascript:alert(1)", /http or https/],
    ["ftp://example.com/x", /http or https/],
    ["http://example.com/cb", /localhost/],
    ["https://user@example.com/cb", /@/],
    ["https://*.example.com/cb", /wildcard/],
    ["/relative/path", /absolute/],
  ])("refuses %s", (u, why) => expect(redirectUrlProblem(u)).toMatch(why));
});
