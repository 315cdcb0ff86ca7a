// Projects: every route, field and rule of the spec's Projects section.
import { describe, expect, test } from "vitest";
import { createProject, createToken, eventually, type TestKiln, useKiln } from "../support/kiln";

/** A fresh account per test keeps listings independent of other tests. */
async function account(k: TestKiln, plan = "superagent"): Promise<string> {
  const r = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan } });
  return r.body.platform_token;
}

describe("projects", () => {
  const k = useKiln({ args: ["--regions", "local,eu-west"] });

  test("create returns 201 with every field; get adds cloud_application_name", async () => {
    const r = await k.api("POST", "/projects", { body: { name: "alpha" } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ name: "alpha", status: "active", all_regions: true, selected_regions: [] });
    expect(Date.parse(r.body.created_at)).not.toBeNaN();
    expect(r.body.updated_at).toBe(r.body.created_at);
    const g = await k.api("GET", `/projects/${r.body.id}`);
    expect(g.status).toBe(200);
    expect(g.body).toMatchObject({ id: r.body.id, name: "alpha", cloud_application_name: expect.any(String) });
  });

  test("create validates name and region policy", async () => {
    expect((await k.api("POST", "/projects", { body: {} })).body.error).toContain("'name'");
    expect((await k.api("POST", "/projects", { body: { name: "" } })).status).toBe(400);
    expect((await k.api("POST", "/projects", { body: { name: "x".repeat(129) } })).status).toBe(400);
    const unknown = await k.api("POST", "/projects", { body: { name: "r", all_regions: false, selected_regions: ["mars"] } });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error).toContain("mars");
    const empty = await k.api("POST", "/projects", { body: { name: "r", all_regions: false } });
    expect(empty.status).toBe(400);
    const both = await k.api("POST", "/projects", { body: { name: "r", all_regions: true, selected_regions: ["local"] } });
    expect(both.status).toBe(400);
    const ok = await k.api("POST", "/projects", { body: { name: "r", all_regions: false, selected_regions: ["eu-west"] } });
    expect(ok.status).toBe(201);
    expect(ok.body).toMatchObject({ all_regions: false, selected_regions: ["eu-west"] });
  });

  test("PATCH updates any subset and returns the project", async () => {
    const p = await createProject(k, "before");
    const r = await k.api("PATCH", `/projects/${p.id}`, { body: { name: "after" } });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ id: p.id, name: "after", all_regions: true });
    const regions = await k.api("PATCH", `/projects/${p.id}`, { body: { all_regions: false, selected_regions: ["local"] } });
    expect(regions.body).toMatchObject({ name: "after", all_regions: false, selected_regions: ["local"] });
    const back = await k.api("PATCH", `/projects/${p.id}`, { body: { all_regions: true } });
    expect(back.body).toMatchObject({ all_regions: true, selected_regions: [] });
    expect((await k.api("PATCH", `/projects/${p.id}`, { body: { name: 5 } })).status).toBe(400);
    expect((await k.api("PATCH", `/projects/nope`, { body: { name: "x" } })).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}`)).body.name).toBe("after");
  });

  test("offset mode: page/limit defaults, total, has_more and next", async () => {
    const t = await account(k);
    for (let i = 1; i <= 12; i++) await createProject(k, `proj-${String(i).padStart(2, "0")}`, t);
    const first = await k.api("GET", "/projects", { token: t });
    expect(first.body).toMatchObject({ page: 1, limit: 10, total: 12, has_more: true, next: "/projects?page=2&limit=10" });
    expect(first.body.data).toHaveLength(10);
    expect(first.body.data[0].name).toBe("proj-12"); // newest first
    const second = await k.api("GET", first.body.next, { token: t });
    expect(second.body).toMatchObject({ page: 2, limit: 10, total: 12, has_more: false });
    expect(second.body.next).toBeUndefined();
    expect(second.body.data.map((p: any) => p.name)).toEqual(["proj-02", "proj-01"]);
    const paged = await k.api("GET", "/projects?page=3&limit=5", { token: t });
    expect(paged.body.data).toHaveLength(2);
    expect((await k.api("GET", "/projects?page=1&limit=100", { token: t })).body.data).toHaveLength(12);
  });

  test("cursor mode: limit alone selects it; next_cursor/prev_cursor walk both ways; offset skips", async () => {
    const t = await account(k);
    for (let i = 1; i <= 7; i++) await createProject(k, `c-${i}`, t);
    const p1 = await k.api("GET", "/projects?limit=3", { token: t });
    expect(p1.status).toBe(200);
    expect(p1.body.page).toBeUndefined();
    expect(p1.body).toMatchObject({ limit: 3, total: 7, has_more: true });
    expect(p1.body.prev_cursor).toBeUndefined();
    expect(p1.body.data.map((p: any) => p.name)).toEqual(["c-7", "c-6", "c-5"]);
    const p2 = await k.api("GET", `/projects?limit=3&cursor=${p1.body.next_cursor}`, { token: t });
    expect(p2.body.data.map((p: any) => p.name)).toEqual(["c-4", "c-3", "c-2"]);
    expect(p2.body.prev_cursor).toBeDefined();
    const p3 = await k.api("GET", `/projects?limit=3&cursor=${p2.body.next_cursor}`, { token: t });
    expect(p3.body.data.map((p: any) => p.name)).toEqual(["c-1"]);
    expect(p3.body.next_cursor).toBeUndefined();
    expect(p3.body.has_more).toBe(false);
    const back = await k.api("GET", `/projects?limit=3&ending_before=${p3.body.prev_cursor}`, { token: t });
    expect(back.body.data.map((p: any) => p.name)).toEqual(["c-4", "c-3", "c-2"]);
    const skipped = await k.api("GET", `/projects?limit=2&cursor=${p1.body.next_cursor}&offset=1`, { token: t });
    expect(skipped.body.data.map((p: any) => p.name)).toEqual(["c-3", "c-2"]);
    // Search is kept across pages and the total is the filtered total.
    const s1 = await k.api("GET", "/projects?limit=1&search=C-", { token: t });
    expect(s1.body.total).toBe(7);
  });

  test("page with cursor or ending_before is a 400; a foreign cursor is a 400", async () => {
    const p = await k.api("GET", "/projects?limit=1");
    const cursor = p.body.next_cursor ?? "eyJ2IjoxfQ";
    expect((await k.api("GET", `/projects?page=1&cursor=${cursor}`)).status).toBe(400);
    expect((await k.api("GET", `/projects?page=2&ending_before=${cursor}`)).status).toBe(400);
    const bad = await k.api("GET", "/projects?cursor=garbage");
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain("cursor");
  });

  test("search is case-insensitive, literal, and at most 256 characters", async () => {
    const t = await account(k);
    await createProject(k, "Billing-API", t);
    await createProject(k, "billing_worker", t);
    await createProject(k, "frontend", t);
    const r = await k.api("GET", "/projects?search=BILLING", { token: t });
    expect(r.body.total).toBe(2);
    expect((await k.api("GET", "/projects?search=_", { token: t })).body.total).toBe(1); // _ is not a wildcard
    expect((await k.api("GET", `/projects?search=${"a".repeat(256)}`, { token: t })).status).toBe(200);
    const long = await k.api("GET", `/projects?search=${"a".repeat(257)}`, { token: t });
    expect(long.status).toBe(400);
    expect(long.body.error).toContain("'search'");
  });

  test("delete is asynchronous: 202 deleting, gone from the list at once, then 404; tokens revoked, keys and variables removed", async () => {
    const t = await account(k);
    const p = await createProject(k, "doomed", t);
    const k2 = { ...k, api: (m: string, path: string, o: any = {}) => k.api(m, path, { token: t, ...o }) } as TestKiln;
    const tok = await createToken(k2, p.id);
    const sk = (await k2.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "worker" } })).body;
    await k2.api("POST", `/projects/${p.id}/variables`, { body: { name: "A", value: "1" } });
    const del = await k2.api("DELETE", `/projects/${p.id}`);
    expect(del.status).toBe(202);
    expect(del.body).toMatchObject({ id: p.id, status: "deleting" });
    expect((await k2.api("GET", "/projects")).body.data.map((x: any) => x.id)).not.toContain(p.id);
    // The project token stops working at once.
    expect((await k.api("GET", `/projects/${p.id}`, { token: tok.token })).status).toBe(401);
    await eventually(() => k2.api("GET", `/projects/${p.id}`), (r) => r.status === 404);
    // Its service key is gone too: it no longer authenticates anywhere.
    expect((await k.api("GET", "/projects", { token: sk.key })).status).toBe(401);
  });

  test("a project token can read and update its project but not list or create projects", async () => {
    const p = await createProject(k);
    const tok = await createToken(k, p.id);
    expect((await k.api("GET", `/projects/${p.id}`, { token: tok.token })).status).toBe(200);
    expect((await k.api("PATCH", `/projects/${p.id}`, { token: tok.token, body: { name: "renamed" } })).status).toBe(200);
    const list = await k.api("GET", "/projects", { token: tok.token });
    expect(list.status).toBe(403);
    expect(list.body.error).toMatch(/account-scoped/);
    expect((await k.api("POST", "/projects", { token: tok.token, body: { name: "x" } })).status).toBe(403);
  });

  // On this file's Kiln (it used to start its own): the projects are in an account of their own, and
  // no test after it uses this Kiln.
  test("an account may create 1,000 projects; the next is 403", async () => {
    const t = await account(k);
    for (let i = 0; i < 1000; i += 50) await Promise.all(Array.from({ length: 50 }, (_, j) => createProject(k, `bulk-${i + j}`, t)));
    const r = await k.api("POST", "/projects", { token: t, body: { name: "one-too-many" } });
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/1000/);
    expect((await k.api("GET", "/projects?limit=1", { token: t })).body.total).toBe(1000);
    // Deleting one frees a place.
    const one = (await k.api("GET", "/projects?limit=1", { token: t })).body.data[0];
    await k.api("DELETE", `/projects/${one.id}`, { token: t });
    await eventually(() => k.api("POST", "/projects", { token: t, body: { name: "replacement" } }), (r) => r.status === 201);
  }, 180_000);
});

describe("failed project deletion", () => {
  // This server injects one cleanup failure (KILN_FAULTS=project-cleanup:1).
  const k = useKiln({ env: { KILN_FAULTS: "project-cleanup:1" } });

  test("a failed deletion cleanup leaves the project failed; deleting again retries it", async () => {
    const t = await account(k);
    const p = await createProject(k, "stubborn", t);
    expect((await k.api("DELETE", `/projects/${p.id}`, { token: t })).status).toBe(202);
    const failed = await eventually(() => k.api("GET", `/projects/${p.id}`, { token: t }), (r) => r.body?.status !== "deleting");
    expect(failed.body.status).toBe("failed");
    // failed projects are listed, so people can see and retry them
    expect((await k.api("GET", "/projects", { token: t })).body.data.map((x: any) => x.id)).toContain(p.id);
    expect((await k.api("DELETE", `/projects/${p.id}`, { token: t })).status).toBe(202);
    await eventually(() => k.api("GET", `/projects/${p.id}`, { token: t }), (r) => r.status === 404);
  });

});
