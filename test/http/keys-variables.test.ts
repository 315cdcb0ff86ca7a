// Service keys and anon keys (Kiln's contract shapes) and project variables.
import { describe, expect, test } from "vitest";
import { createProject, createToken, eventually, useKiln } from "../support/kiln";

describe("service keys", () => {
  const k = useKiln();

  test("create: full role without permissions, scoped with them; the secret (sk-) appears only in the create response", async () => {
    const p = await createProject(k);
    const full = await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } });
    expect(full.status).toBe(201);
    expect(full.body).toMatchObject({ name: "backend", permissions: null, key: expect.stringMatching(/^sk-/) });
    expect(full.body.key.startsWith(full.body.key_prefix)).toBe(true);
    const scoped = await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "locker", permissions: ["locks.manage"] } });
    expect(scoped.body.permissions).toEqual(["locks.manage"]);
    const list = await k.api("GET", `/projects/${p.id}/service-keys`);
    expect(list.status).toBe(200);
    expect(list.body.data.map((x: any) => x.name)).toEqual(["backend", "locker"]);
    expect(JSON.stringify(list.body)).not.toContain(full.body.key);
    const one = await k.api("GET", `/projects/${p.id}/service-keys/${full.body.id}`);
    expect(one.body.key).toBeUndefined();
  });

  test("unknown permissions and bad names are 400s naming the field", async () => {
    const p = await createProject(k);
    const bad = await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "x", permissions: ["db.drop"] } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain("permissions");
    expect(bad.body.error).toContain("db.drop");
    expect((await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "" } })).body.error).toContain("'name'");
  });

  test("PATCH renames and rescopes (null restores the full role); DELETE 204 then 404; a deleted key stops authenticating", async () => {
    const p = await createProject(k);
    const key = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "a", permissions: ["functions.invoke"] } })).body;
    const up = await k.api("PATCH", `/projects/${p.id}/service-keys/${key.id}`, { body: { name: "b", permissions: null } });
    expect(up.status).toBe(200);
    expect(up.body).toMatchObject({ name: "b", permissions: null });
    // A service key is a credential of the project, but not for management routes.
    const mgmt = await k.api("GET", `/projects/${p.id}`, { token: key.key });
    expect(mgmt.status).toBe(403);
    expect((await k.api("DELETE", `/projects/${p.id}/service-keys/${key.id}`)).status).toBe(204);
    expect((await k.api("DELETE", `/projects/${p.id}/service-keys/${key.id}`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}`, { token: key.key })).status).toBe(401);
  });

  test("a full project token may manage keys; keys of another project are 404", async () => {
    const p = await createProject(k);
    const other = await createProject(k);
    const t = await createToken(k, p.id);
    const made = await k.api("POST", `/projects/${p.id}/service-keys`, { token: t.token, body: { name: "via-token" } });
    expect(made.status).toBe(201);
    expect((await k.api("GET", `/projects/${other.id}/service-keys/${made.body.id}`)).status).toBe(404);
    expect((await k.api("DELETE", `/projects/${other.id}/service-keys/${made.body.id}`)).status).toBe(404);
  });
});

describe("anon keys", () => {
  const k = useKiln();

  test("every project is created with an anon key named default, permissions []", async () => {
    const p = await createProject(k);
    const r = await k.api("GET", `/projects/${p.id}/anon-keys`);
    expect(r.status).toBe(200);
    expect(r.body.data).toEqual([{ id: expect.any(String), name: "default", key: expect.stringMatching(/^ak-/), permissions: [], created_at: expect.any(String) }]);
  });

  test("create with permissions, list includes the key, delete 204 then 404", async () => {
    const p = await createProject(k);
    const r = await k.api("POST", `/projects/${p.id}/anon-keys`, { body: { name: "public", permissions: ["functions.invoke"] } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ name: "public", permissions: ["functions.invoke"], key: expect.stringMatching(/^ak-/) });
    const list = await k.api("GET", `/projects/${p.id}/anon-keys`);
    expect(list.body.data.map((x: any) => x.key)).toContain(r.body.key);
    expect((await k.api("POST", `/projects/${p.id}/anon-keys`, { body: { name: "x", permissions: ["nope"] } })).status).toBe(400);
    expect((await k.api("DELETE", `/projects/${p.id}/anon-keys/${r.body.id}`)).status).toBe(204);
    expect((await k.api("DELETE", `/projects/${p.id}/anon-keys/${r.body.id}`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data.map((x: any) => x.name)).toEqual(["default"]);
  });

  test("an anon key cannot manage its project", async () => {
    const p = await createProject(k);
    const key = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    expect((await k.api("GET", `/projects/${p.id}`, { token: key })).status).toBe(403);
    expect((await k.api("GET", "/projects", { token: key })).status).toBe(403);
  });
});

describe("variables", () => {
  const k = useKiln();

  test("POST creates with status provisioning, which becomes active after propagation", async () => {
    const p = await createProject(k);
    const r = await k.api("POST", `/projects/${p.id}/variables`, { body: { name: "API_URL", value: "https://x" } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ project_id: p.id, name: "API_URL", value: "https://x", status: "provisioning" });
    expect(r.body.current_sync_id).toEqual(expect.any(String));
    const active = await eventually(() => k.api("GET", `/projects/${p.id}/variables/${r.body.id}`), (x) => x.body.status === "active");
    expect(active.body.current_sync_id).toBe(r.body.current_sync_id);
  });

  test("names are environment names, unique per project (409); values at most 64 KiB", async () => {
    const p = await createProject(k);
    const path = `/projects/${p.id}/variables`;
    expect((await k.api("POST", path, { body: { name: "1BAD", value: "x" } })).body.error).toContain("'name'");
    expect((await k.api("POST", path, { body: { name: "A-B", value: "x" } })).status).toBe(400);
    expect((await k.api("POST", path, { body: { name: "A" } })).body.error).toContain("'value'");
    expect((await k.api("POST", path, { body: { name: "BIG", value: "x".repeat(64 * 1024 + 1) } })).status).toBe(400);
    expect((await k.api("POST", path, { body: { name: "A", value: "1" } })).status).toBe(201);
    const dup = await k.api("POST", path, { body: { name: "A", value: "2" } });
    expect(dup.status).toBe(409);
    expect(dup.body).toEqual({ code: "variable_name_exists" });
  });

  test("list (paginated), get by id or name, PATCH starts a new sync, DELETE 204 then 404", async () => {
    const p = await createProject(k);
    const path = `/projects/${p.id}/variables`;
    for (const n of ["B", "A", "C"]) await k.api("POST", path, { body: { name: n, value: n.toLowerCase() } });
    const list = await k.api("GET", `${path}?limit=2`);
    expect(list.body).toMatchObject({ page: 1, limit: 2, total: 3, has_more: true });
    expect(list.body.data.map((v: any) => v.name)).toEqual(["A", "B"]);
    const byName = await k.api("GET", `${path}/A`);
    expect(byName.body.value).toBe("a");
    const upd = await k.api("PATCH", `${path}/${byName.body.id}`, { body: { value: "new" } });
    expect(upd.status).toBe(200);
    expect(upd.body).toMatchObject({ value: "new", status: "provisioning" });
    expect(upd.body.current_sync_id).not.toBe(byName.body.current_sync_id);
    await eventually(() => k.api("GET", `${path}/A`), (x) => x.body.status === "active");
    expect((await k.api("PATCH", `${path}/A`, { body: { name: "B" } })).body).toEqual({ code: "variable_name_exists" });
    expect((await k.api("DELETE", `${path}/A`)).status).toBe(204);
    expect((await k.api("GET", `${path}/A`)).status).toBe(404);
    expect((await k.api("DELETE", `${path}/A`)).status).toBe(404);
  });

  test("values are credential reads: a full project token reads them, a read-only one may not", async () => {
    const p = await createProject(k);
    await k.api("POST", `/projects/${p.id}/variables`, { body: { name: "SECRET", value: "s3" } });
    const full = await createToken(k, p.id, { scope: "full" });
    const ro = await createToken(k, p.id, { scope: "read_only" });
    expect((await k.api("GET", `/projects/${p.id}/variables/SECRET`, { token: full.token })).body.value).toBe("s3");
    const denied = await k.api("GET", `/projects/${p.id}/variables/SECRET`, { token: ro.token });
    expect(denied.status).toBe(403);
    expect(denied.text).not.toContain("s3");
  });
});
