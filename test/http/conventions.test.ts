// HTTP conventions shared by every route: error shapes, validation messages, service headers,
// CLI version handling, credential failures and their rationing, the admin route.
import { describe, expect, test } from "vitest";
import { createProject, secret, useKiln, withKiln } from "../support/kiln";
import { rawRequest } from "../support/raw-http";

describe("HTTP conventions", () => {
  const k = useKiln({ args: ["--min-cli-version", "0.0.5"], env: { KILN_FAULTS: "credential-store:1" } });

  test("a failed credential check is a 500 'failed to validate token', never a 401", async () => {
    // The first lookup fails by injection (KILN_FAULTS=credential-store:1).
    const r = await k.api("GET", "/projects");
    expect(r.status).toBe(500);
    expect(r.body).toEqual({ error: "failed to validate token" });
    expect((await k.api("GET", "/projects")).status).toBe(200);
  });

  test("unknown routes are 404 in the error shape, with the service headers", async () => {
    const r = await k.api("GET", "/no/such/route");
    expect(r.status).toBe(404);
    expect(r.body).toEqual({ error: expect.stringContaining("/no/such/route") });
    expect(r.headers.get("x-service-version")).toMatch(/^local-\d+\.\d+\.\d+/);
    expect(r.headers.get("x-service-region")).toBe("local");
  });

  test("a known path with a method it does not have is 405 with Allow, in the error shape; OPTIONS preflight stays where it was", async () => {
    const p = await createProject(k);
    const cases: [string, string, string][] = [
      ["PUT", "/projects", "GET, HEAD, POST"],
      ["DELETE", "/projects", "GET, HEAD, POST"],
      ["OPTIONS", "/projects", "GET, HEAD, POST"],
      ["POST", `/projects/${p.id}`, "GET, HEAD, PATCH, DELETE"],
      ["DELETE", `/projects/${p.id}/variables`, "GET, HEAD, POST"],
      ["PATCH", `/projects/${p.id}/access-tokens/abc`, "GET, HEAD, DELETE"],
      // `{path+}` routes: every object method but PATCH, which only `.../visibility` has.
      ["PATCH", "/storage/bucket/a/b.txt", "GET, HEAD, POST, PUT, DELETE"],
      ["POST", "/healthz", "GET, HEAD"],
    ];
    for (const [method, path, allow] of cases) {
      const r = await k.api(method, path);
      expect(r.status, `${method} ${path}`).toBe(405);
      expect(r.headers.get("allow"), `${method} ${path}`).toBe(allow);
      expect(r.body).toEqual({ error: `method ${method} is not allowed on ${path}; allowed: ${allow}` });
      expect(r.headers.get("x-service-version")).toMatch(/^local-/);
    }
    // The method the path has still reaches its route; an unknown path is still a 404.
    expect((await k.api("PATCH", "/storage/bucket/a/b.txt/visibility", { token: null, body: { is_public: true } })).status).toBe(401);
    expect((await k.api("DELETE", "/no/such/route")).status).toBe(404);
    // The RPC invocation route's CORS preflight answers as before (204, no credential).
    const pre = await k.api("OPTIONS", "/functions/nofunction/invoke", { token: null, headers: { origin: "http://localhost:3000", "access-control-request-method": "POST" } });
    expect(pre.status).toBe(204);
    expect(pre.headers.get("access-control-allow-methods")).toBe("POST, OPTIONS");
  });

  test("a method Kiln has no route for is 501 in the error shape, not a dropped connection", async () => {
    for (const method of ["PROPFIND", "QUERY", "MKCOL", "TRACE", "M-SEARCH"]) {
      const r = await rawRequest(k.url, method, "/projects", { headers: { authorization: `Bearer ${k.token}` } });
      expect(r.status, method).toBe(501);
      expect(r.body).toEqual({ error: `method ${method} is not supported` });
      expect(r.headers["x-service-version"]).toMatch(/^local-/);
    }
    // Function addresses are routed by host first: their own answer, whatever the method or path.
    const p = await createProject(k);
    for (const [method, path] of [
      ["PROPFIND", "/x"],
      ["GET", "/a/%2e%2e/b"],
      ["DELETE", "/a/"],
    ]) {
      const r = await rawRequest(k.url, method!, path!, { headers: { host: `nofunction.${p.id}.fn.localhost` } });
      expect(r.status, `${method} ${path}`).toBe(404);
      expect(r.body).toEqual({ error: "function not found" });
    }
  });

  test("validation errors are 400 and name the field", async () => {
    const r = await k.api("POST", "/projects", { body: { name: 42 } });
    expect(r.status).toBe(400);
    expect(r.body.error).toContain("'name'");
    const q = await k.api("GET", "/projects?page=0");
    expect(q.status).toBe(400);
    expect(q.body.error).toContain("'page'");
    const lim = await k.api("GET", "/projects?page=1&limit=101");
    expect(lim.status).toBe(400);
    expect(lim.body.error).toContain("'limit'");
  });

  test("malformed JSON is a 400, not a 500", async () => {
    const r = await k.api("POST", "/projects", { body: "{not json" });
    expect(r.status).toBe(400);
    expect(r.body).toEqual({ error: "request body is not valid JSON" });
  });

  test("a NUL character in a field, a path segment or a query value is a 400 naming it, not a 500", async () => {
    const body = await k.api("POST", "/projects", { body: '{"name":"a\\u0000b"}' });
    expect(body.status).toBe(400);
    expect(body.body.error).toBe("invalid request: body field 'name': must not contain a NUL character (\\u0000)");
    const path = await k.api("GET", "/projects/ab%00cd");
    expect(path.status).toBe(400);
    expect(path.body.error).toMatch(/path field 'projectId': must not contain a NUL/);
    const query = await k.api("GET", "/projects?name=%00");
    expect([200, 400]).toContain(query.status); // 400 when the route takes that query field
    expect(query.status).not.toBe(500);
    // Nothing was created by the refused request.
    expect((await k.api("GET", "/projects")).body.data.some((p: any) => p.name.includes("\u0000"))).toBe(false);
  });

  test("missing and unknown credentials are 401 in the error shape", async () => {
    const none = await k.api("GET", "/projects", { token: null });
    expect(none.status).toBe(401);
    expect(typeof none.body.error).toBe("string");
    const bad = await k.api("GET", "/projects", { token: "pk-doesnotexist00000000000000" });
    expect(bad.status).toBe(401);
    expect(bad.body).toEqual({ error: "invalid token" });
  });

  test("CLI versions: older than the minimum is 426, older than the latest gets an upgrade hint", async () => {
    const old = await k.api("GET", "/projects", { headers: { "X-Service-CLI-Version": "0.0.4" } });
    expect(old.status).toBe(426);
    expect(old.body.error).toContain("0.0.5");
    expect(old.headers.get("x-service-cli-instruction")).toBe("require_version_upgrade");
    const older = await k.api("GET", "/projects", { headers: { "X-Service-CLI-Version": "0.0.9" } });
    expect(older.status).toBe(200);
    expect(older.headers.get("x-service-cli-instruction")).toBe("suggestion_version_upgrade");
    const current = await k.api("GET", "/projects", { headers: { "X-Service-CLI-Version": "99.0.0" } });
    expect(current.status).toBe(200);
    expect(current.headers.get("x-service-cli-instruction")).toBeNull();
    const none = await k.api("GET", "/projects");
    expect(none.status).toBe(200);
    expect(none.headers.get("x-service-cli-instruction")).toBeNull();
  });

  test("the controllable clock is off unless asked for", async () => {
    expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 5 } })).status).toBe(404);
    expect((await k.api("GET", "/_kiln/clock", { token: null })).status).toBe(404);
  });

  test("project management endpoints send no rate-limit headers", async () => {
    const r = await k.api("GET", "/projects");
    expect(r.headers.get("x-ratelimit-limit")).toBeNull();
  });

  test("admin accounts: 401 with a wrong admin token, 201 with the right one; each account sees only its own projects", async () => {
    expect((await k.api("POST", "/admin/accounts", { token: "nope", body: { plan: "hobby" } })).status).toBe(401);
    const bad = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "gold" } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain("'plan'");
    const r = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } });
    expect(r.status).toBe(201);
    expect(r.body).toEqual({ id: expect.any(String), plan: "hobby", platform_token: expect.stringMatching(/^pk-/) });
    const mine = await createProject(k, "default-account-project");
    const other = r.body.platform_token;
    expect((await k.api("GET", "/projects", { token: other })).body.total).toBe(0);
    // Another account's project is simply not found.
    expect((await k.api("GET", `/projects/${mine.id}`, { token: other })).status).toBe(404);
    expect((await k.api("DELETE", `/projects/${mine.id}`, { token: other })).status).toBe(404);
    expect((await k.api("GET", `/projects/${mine.id}`)).status).toBe(200);
  });

  test("hobby accounts cannot restrict regions (403); superagent accounts can", async () => {
    const hobby = (await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } })).body.platform_token;
    const r = await k.api("POST", "/projects", { token: hobby, body: { name: "x", all_regions: false, selected_regions: ["local"] } });
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/SUPERAGENT/);
    const ok = await k.api("POST", "/projects", { body: { name: "x", all_regions: false, selected_regions: ["local"] } });
    expect(ok.status).toBe(201);
    expect(ok.body.selected_regions).toEqual(["local"]);
  });
});

describe("admin routes without KILN_ADMIN_TOKEN", () => {
  test("every /admin route answers 404", async () => {
    await withKiln({ env: { KILN_ADMIN_TOKEN: "" } }, async (k) => {
      const r = await k.api("POST", "/admin/accounts", { token: "anything", body: { plan: "hobby" } });
      expect(r.status).toBe(404);
      expect(typeof r.body.error).toBe("string");
    });
  });
});

describe("rationing unrecognized credentials", () => {
  test("repeated unknown credentials from one address get 429 with Retry-After; valid tokens are never limited", async () => {
    await withKiln({ env: { KILN_AUTH_FAILURE_LIMIT: "5" } }, async (k) => {
      for (let i = 0; i < 5; i++) expect((await k.api("GET", "/projects", { token: secret("pk") })).status).toBe(401);
      const limited = await k.api("GET", "/projects", { token: secret("pt") });
      expect(limited.status).toBe(429);
      expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0);
      expect(typeof limited.body.error).toBe("string");
      for (let i = 0; i < 20; i++) expect((await k.api("GET", "/projects")).status).toBe(200);
    });
  });
});
