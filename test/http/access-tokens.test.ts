// Project access tokens: every rule and error row of the spec, and the Authentication rules
// for project tokens.
import { describe, expect, test } from "vitest";
import { clearOfWindowEnd, createProject, createToken, eventually, useKiln, withKiln } from "../support/kiln";

describe("project access tokens", () => {
  // Time is Kiln's controllable clock: expiry is reached by moving it forward, never by waiting.
  const k = useKiln({ env: { KILN_ACCESS_TOKEN_LIMIT: "3" }, args: ["--controllable-clock"] });
  /** Kiln's "now" (ms); it runs ahead of the real clock once a test has advanced it. */
  const kilnNow = async () => Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
  const advance = async (seconds: number) => expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);

  test("create returns the secret once (pt-), token_source api; get and list never return it", async () => {
    const p = await createProject(k);
    const r = await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "deploy", scope: "full" } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      project_id: p.id,
      name: "deploy",
      scope: "full",
      status: "active",
      token_source: "api",
      expires_at: null,
      all_time_requests: 0,
    });
    expect(r.body.token).toMatch(/^pt-/);
    expect(r.body.token.startsWith(r.body.token_prefix)).toBe(true);
    const got = await k.api("GET", `/projects/${p.id}/access-tokens/${r.body.id}`);
    expect(got.status).toBe(200);
    expect(got.body.token).toBeUndefined();
    expect(got.body).toHaveProperty("last_used_at", null);
    expect(JSON.stringify(got.body)).not.toContain(r.body.token);
    const list = await k.api("GET", `/projects/${p.id}/access-tokens`);
    expect(list.body).toMatchObject({ page: 1, limit: 10, total: 1, has_more: false });
    expect(JSON.stringify(list.body)).not.toContain(r.body.token);
  });

  test("create validates name, scope and expires_at (future RFC 3339)", async () => {
    const p = await createProject(k);
    const path = `/projects/${p.id}/access-tokens`;
    expect((await k.api("POST", path, { body: { scope: "full" } })).body.error).toContain("'name'");
    expect((await k.api("POST", path, { body: { name: "a", scope: "admin" } })).body.error).toContain("'scope'");
    expect((await k.api("POST", path, { body: { name: "a" } })).status).toBe(400);
    expect((await k.api("POST", path, { body: { name: "a", scope: "full", expires_at: "tomorrow" } })).body.error).toContain("'expires_at'");
    const past = await k.api("POST", path, { body: { name: "a", scope: "full", expires_at: "2020-01-01T00:00:00Z" } });
    expect(past.status).toBe(400);
    expect(past.body.error).toMatch(/future/);
  });

  test("a name is held by unrevoked tokens (409 access_token_name_exists); revoking frees it", async () => {
    const p = await createProject(k);
    const first = await createToken(k, p.id, { name: "ci" });
    const again = await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "ci", scope: "read_only" } });
    expect(again.status).toBe(409);
    expect(again.body).toEqual({ code: "access_token_name_exists" });
    expect((await k.api("DELETE", `/projects/${p.id}/access-tokens/${first.id}`)).status).toBe(204);
    expect((await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "ci", scope: "full" } })).status).toBe(201);
  });

  test("expired tokens still hold their name and turn status expired; they answer 401 like revoked ones", async () => {
    const p = await createProject(k);
    const t = await createToken(k, p.id, { name: "short", expires_at: new Date((await kilnNow()) + 3_600_000).toISOString() });
    expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(200);
    await advance(3540); // a minute before expiry (past the credential cache's TTL) it still works
    expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(200);
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}`)).body.status).toBe("active");
    await advance(61);
    const expired = await k.api("GET", `/projects/${p.id}`, { token: t.token });
    expect(expired.status).toBe(401);
    expect(expired.body).toEqual({ error: "invalid token" });
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}`)).body.status).toBe("expired");
    expect((await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "short", scope: "full" } })).body).toEqual({
      code: "access_token_name_exists",
    });
    // A token revoked before its expiry stays revoked.
    const t2 = await createToken(k, p.id, { name: "revoked-first", expires_at: new Date((await kilnNow()) + 60_000).toISOString() });
    await k.api("DELETE", `/projects/${p.id}/access-tokens/${t2.id}`);
    await advance(61);
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t2.id}`)).body.status).toBe("revoked");
    const revoked = await k.api("GET", `/projects/${p.id}`, { token: t2.token });
    expect(revoked.status).toBe(401);
    expect(revoked.body).toEqual(expired.body);
  });

  test("the per-project cap answers 409 access_token_limit_reached (expired tokens count, revoked do not)", async () => {
    const p = await createProject(k);
    const made = [];
    made.push(await createToken(k, p.id, { expires_at: new Date((await kilnNow()) + 60_000).toISOString() }));
    for (let i = 0; i < 2; i++) made.push(await createToken(k, p.id));
    await advance(61);
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${made[0]!.id}`)).body.status).toBe("expired");
    const over = await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "fourth", scope: "full" } });
    expect(over.status).toBe(409);
    expect(over.body).toEqual({ code: "access_token_limit_reached" });
    await k.api("DELETE", `/projects/${p.id}/access-tokens/${made[1]!.id}`);
    expect((await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "fourth", scope: "full" } })).status).toBe(201);
  });

  test("revoke takes effect at once, is idempotent (204 twice), and 404s for another project's token", async () => {
    const p = await createProject(k);
    const other = await createProject(k);
    const t = await createToken(k, p.id);
    expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(200);
    expect((await k.api("DELETE", `/projects/${p.id}/access-tokens/${t.id}`)).status).toBe(204);
    expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).body).toEqual({ error: "invalid token" });
    expect((await k.api("DELETE", `/projects/${p.id}/access-tokens/${t.id}`)).status).toBe(204);
    const wrong = await k.api("DELETE", `/projects/${other.id}/access-tokens/${t.id}`);
    expect(wrong.status).toBe(404);
    expect(wrong.body).toEqual({ error: "project access token not found" });
    expect((await k.api("GET", `/projects/${other.id}/access-tokens/${t.id}`)).body).toEqual({ error: "project access token not found" });
  });

  test("list: revoked hidden unless include_revoked; search; pagination", async () => {
    const p = await createProject(k);
    const a = await createToken(k, p.id, { name: "alpha-one" });
    await createToken(k, p.id, { name: "beta" });
    await k.api("DELETE", `/projects/${p.id}/access-tokens/${a.id}`);
    const live = await k.api("GET", `/projects/${p.id}/access-tokens`);
    expect(live.body.data.map((t: any) => t.name)).toEqual(["beta"]);
    const all = await k.api("GET", `/projects/${p.id}/access-tokens?include_revoked=true`);
    expect(all.body.total).toBe(2);
    expect(all.body.data.find((t: any) => t.name === "alpha-one").status).toBe("revoked");
    expect((await k.api("GET", `/projects/${p.id}/access-tokens?include_revoked=true&search=ALPHA`)).body.total).toBe(1);
    const paged = await k.api("GET", `/projects/${p.id}/access-tokens?include_revoked=true&limit=1`);
    expect(paged.body).toMatchObject({ total: 2, has_more: true, next: expect.stringContaining("page=2") });
    expect((await k.api("GET", `/projects/${p.id}/access-tokens?include_revoked=maybe`)).status).toBe(400);
  });

  test("a token bound to another project gets 403 on every route of that project", async () => {
    const p = await createProject(k);
    const other = await createProject(k);
    const t = await createToken(k, p.id);
    for (const [m, path] of [
      ["GET", `/projects/${other.id}`],
      ["PATCH", `/projects/${other.id}`],
      ["GET", `/projects/${other.id}/variables`],
      ["GET", `/projects/${other.id}/access-tokens/usage`],
    ] as const) {
      const r = await k.api(m, path, { token: t.token, body: m === "PATCH" ? { name: "x" } : undefined });
      expect(r.status, `${m} ${path}`).toBe(403);
      expect(r.body).toEqual({ error: "project access token is not valid for this project" });
    }
  });

  test("read_only: reads allowed, writes 403 read-only, credential reads 403 full-scope", async () => {
    const p = await createProject(k);
    const ro = await createToken(k, p.id, { scope: "read_only" });
    const as = (m: string, path: string, body?: unknown) => k.api(m, path, { token: ro.token, body });
    expect((await as("GET", `/projects/${p.id}`)).status).toBe(200);
    expect((await as("GET", `/projects/${p.id}/access-tokens/usage`)).status).toBe(200);
    for (const [m, path, body] of [
      ["PATCH", `/projects/${p.id}`, { name: "x" }],
      ["DELETE", `/projects/${p.id}`, undefined],
      ["POST", `/projects/${p.id}/variables`, { name: "A", value: "b" }],
      ["POST", `/projects/${p.id}/service-keys`, { name: "k" }],
      ["POST", `/projects/${p.id}/anon-keys`, { name: "k" }],
    ] as const) {
      const r = await as(m, path, body);
      expect(r.status, `${m} ${path}`).toBe(403);
      expect(r.body).toEqual({ error: "project access token is read-only" });
    }
    for (const path of [`/projects/${p.id}/service-keys`, `/projects/${p.id}/anon-keys`, `/projects/${p.id}/variables`]) {
      const r = await as("GET", path);
      expect(r.status, path).toBe(403);
      expect(r.body.error).toMatch(/credentials.*full-scope/);
    }
  });

  test("project tokens cannot manage tokens or use account-scoped endpoints (403)", async () => {
    const p = await createProject(k);
    const t = await createToken(k, p.id);
    const manage = [
      ["POST", `/projects/${p.id}/access-tokens`, { name: "x", scope: "full" }],
      ["GET", `/projects/${p.id}/access-tokens`, undefined],
      ["GET", `/projects/${p.id}/access-tokens/${t.id}`, undefined],
      ["DELETE", `/projects/${p.id}/access-tokens/${t.id}`, undefined],
    ] as const;
    for (const [m, path, body] of manage) {
      const r = await k.api(m, path, { token: t.token, body });
      expect(r.status, `${m} ${path}`).toBe(403);
      expect(r.body.error).toMatch(/cannot manage project access tokens/);
    }
    expect((await k.api("GET", "/projects", { token: t.token })).status).toBe(403);
    // Still active afterwards: none of that revoked it.
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}`)).body.status).toBe("active");
  });

  test("usage: last_used_at, all_time_requests and daily counts per token and for all tokens", async () => {
    await clearOfWindowEnd(k, 86_400); // the daily counts below are all today's
    const p = await createProject(k);
    const t = await createToken(k, p.id, { name: "busy" });
    const idle = await createToken(k, p.id, { name: "idle" });
    for (let i = 0; i < 5; i++) expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(200);
    const got = await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}`);
    expect(got.body.all_time_requests).toBe(5);
    expect(Date.parse(got.body.last_used_at)).toBeGreaterThan(Date.parse(got.body.created_at) - 1);
    const one = await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}/usage?days=3`, { token: t.token });
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ token_id: t.id, name: "busy", days: 3 });
    expect(one.body.daily).toHaveLength(3);
    const today = new Date(await kilnNow()).toISOString().slice(0, 10); // Kiln's day: earlier tests moved its clock
    expect(one.body.daily[2]).toEqual({ day: today, requests: 6 }); // the usage read itself counts
    expect(one.body.total_requests).toBe(6);
    const all = await k.api("GET", `/projects/${p.id}/access-tokens/usage?days=1`);
    expect(all.body.days).toBe(1);
    const byName = Object.fromEntries(all.body.data.map((u: any) => [u.name, u.total_requests]));
    expect(byName).toEqual({ busy: 6, idle: 0 });
    expect(idle.id).toBeDefined();
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}/usage?days=0`)).status).toBe(400);
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}/usage?days=91`)).status).toBe(400);
    expect((await k.api("GET", `/projects/${p.id}/access-tokens/nope/usage`)).status).toBe(404);
  });
});

describe("tokens of a project being deleted", () => {
  test("token changes answer 409 project_deleting while the deletion runs; its tokens are already revoked", async () => {
    // KILN_FAULTS=project-cleanup-delay:1 holds the first deletion in `deleting` until Kiln's clock moves a minute on.
    await withKiln({ env: { KILN_FAULTS: "project-cleanup-delay:1" }, args: ["--controllable-clock"] }, async (k) => {
      const p = await createProject(k);
      const t = await createToken(k, p.id);
      expect((await k.api("DELETE", `/projects/${p.id}`)).body.status).toBe("deleting");
      expect((await k.api("GET", `/projects/${p.id}`)).body.status).toBe("deleting");
      const create = await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "late", scope: "full" } });
      expect(create.status).toBe(409);
      expect(create.body).toEqual({ code: "project_deleting" });
      const revoke = await k.api("DELETE", `/projects/${p.id}/access-tokens/${t.id}`);
      expect(revoke.body).toEqual({ code: "project_deleting" });
      expect((await k.api("GET", `/projects/${p.id}/access-tokens/${t.id}`)).body.status).toBe("revoked");
      expect((await k.api("GET", `/projects/${p.id}`, { token: t.token })).status).toBe(401);
      // Released by the clock, the deletion finishes.
      expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 61 } })).status).toBe(200);
      await eventually(() => k.api("GET", `/projects/${p.id}`), (r) => r.status === 404 || r.body?.status === "deleted");
    });
  });
});
