// Database branches: copies of a database taken while it serves, with their own credentials, a
// lifetime on the platform clock, reset, reset-password, teardown, per-plan counts, divergence,
// and the branch twin of the query API. Runs on both engines (embedded PGlite, PostgreSQL).
import { chmodSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { itemNames as names } from "../support/databases";
import { connect, withApp } from "../support/database-clients";
import { findPgBin } from "../support/postgres-server";
import { createProject, createToken, eventually, startKiln, removeDir, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });

const advance = async (kiln: TestKiln, seconds: number) => {
  const r = await kiln.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } });
  if (r.status !== 200) throw new Error(`advance: ${r.status} ${r.text}`);
  return new Date(r.body.now).getTime();
};
const clockNow = async (kiln: TestKiln) => new Date((await kiln.api("GET", "/_kiln/clock", { token: null })).body.now).getTime();

async function activeDatabase(kiln: TestKiln, projectId: string, name = "app", token?: string) {
  const r = await kiln.api("POST", `/projects/${projectId}/databases`, { body: { name }, token });
  if (r.status !== 201) throw new Error(`create database: ${r.status} ${r.text}`);
  const d = await eventually(() => kiln.api("GET", `/projects/${projectId}/databases/${r.body.name}`, { token }), (x) => x.body.status !== "provisioning");
  if (d.body.status !== "active") throw new Error(`database ${d.body.status}`);
  return d.body as { id: string; database_name: string; connection_string: string };
}

const branchPath = (projectId: string, db = "app", branch?: string) => `/projects/${projectId}/databases/${db}/branches${branch ? `/${branch}` : ""}`;

/** Creates a branch (202) and waits until it is built. */
async function activeBranch(kiln: TestKiln, projectId: string, name: string, body: Record<string, unknown> = {}, db = "app", token?: string) {
  const r = await kiln.api("POST", branchPath(projectId, db), { body: { name, ...body }, token });
  if (r.status !== 202) throw new Error(`create branch: ${r.status} ${r.text}`);
  return waitActive(kiln, projectId, name, db, token);
}

async function waitActive(kiln: TestKiln, projectId: string, name: string, db = "app", token?: string) {
  const b = await eventually(() => kiln.api("GET", branchPath(projectId, db, name), { token }), (x) => x.body?.status !== "provisioning", 30_000);
  if (b.body.status !== "active") throw new Error(`branch ${b.status} ${b.text}`);
  return b.body as { id: string; name: string; connection_string: string; expires_at: string; ttl_seconds: number; storage_bytes: number; created_at: string };
}

/** A project with an active database holding a table `items`, and a full service key. */
async function setup(kiln: TestKiln = k, token?: string) {
  const project = await createProject(kiln, undefined, token);
  const db = await activeDatabase(kiln, project.id, "app", token);
  const c = connect(db.connection_string);
  await c`create table items (id int primary key, name text not null)`;
  await c`insert into items values (1, 'parent-1'), (2, 'parent-2')`;
  const sk = (await kiln.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "backend" }, token })).body.key as string;
  return { project, db, c, sk };
}


async function refused(url: string): Promise<string> {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 30 });
  try {
    await c`select 1`;
    return "connected";
  } catch (err) {
    return (err as Error).message;
  } finally {
    await c.end({ timeout: 1 }).catch(() => {});
  }
}

describe("create, get, list", () => {
  test("202 provisioning without a connection string, then active with the branch's own credentials and the parent's data", async () => {
    const { project, db, c } = await setup();
    const r = await k.api("POST", branchPath(project.id), { body: { name: "feature_1" } });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ name: "feature_1", status: "provisioning", database_id: db.id, project_id: project.id, ttl_seconds: 604_800, storage_bytes: 0 });
    expect(r.body.connection_string).toBeUndefined();
    // Default lifetime: seven days from creation.
    expect(new Date(r.body.expires_at).getTime() - new Date(r.body.created_at).getTime()).toBe(604_800_000);
    const b = await waitActive(k, project.id, "feature_1");
    expect(b.connection_string).toMatch(new RegExp(`^postgres://service_client_${b.id}:[^@]+@127\\.0\\.0\\.1:\\d+/app\\?application_name=service_full_access$`));
    expect(new URL(b.connection_string).password).not.toBe(new URL(db.connection_string).password);
    expect(await names(b.connection_string)).toEqual(["parent-1", "parent-2"]);

    // Writes on either side stay on that side.
    const bc = connect(b.connection_string);
    await bc`insert into items values (3, 'branch-3')`;
    await c`insert into items values (4, 'parent-4')`;
    expect(await names(b.connection_string)).toEqual(["parent-1", "parent-2", "branch-3"]);
    expect(await names(db.connection_string)).toEqual(["parent-1", "parent-2", "parent-4"]);

    // The parent's credentials do not open the branch, nor the branch's the parent.
    const crossed = new URL(b.connection_string);
    crossed.password = new URL(db.connection_string).password;
    expect(await refused(crossed.toString())).toMatch(/password authentication failed/);
    const otherDb = new URL(b.connection_string);
    otherDb.pathname = "/other";
    expect(await refused(otherDb.toString())).toMatch(/password authentication failed/);

    // The list has every branch, without connection strings; the single get has it.
    const list = await k.api("GET", branchPath(project.id));
    expect(list.status).toBe(200);
    expect(list.body.data).toHaveLength(1);
    expect(list.body.data[0]).toMatchObject({ id: b.id, name: "feature_1", status: "active" });
    expect(list.body.data[0].connection_string).toBeUndefined();
  });

  test("name and lifetime rules: 400; duplicate 409; unknown database 404; a database that is not active 409", async () => {
    const { project } = await setup();
    for (const name of ["Upper", "with-hyphen", "x".repeat(65), "", "a b", "ünï"]) {
      const r = await k.api("POST", branchPath(project.id), { body: { name } });
      expect(r.status, name).toBe(400);
    }
    expect((await k.api("POST", branchPath(project.id), { body: {} })).status).toBe(400);
    for (const ttl_seconds of [3599, 2_592_001, 3600.5, "3600", -1])
      expect((await k.api("POST", branchPath(project.id), { body: { name: "ok", ttl_seconds } })).status, String(ttl_seconds)).toBe(400);
    const edge = await k.api("POST", branchPath(project.id), { body: { name: "x".repeat(64), ttl_seconds: 3600 } });
    expect(edge.status).toBe(202);
    expect(new Date(edge.body.expires_at).getTime() - new Date(edge.body.created_at).getTime()).toBe(3_600_000);
    const longest = await k.api("POST", branchPath(project.id), { body: { name: "longest", ttl_seconds: 2_592_000 } });
    expect(longest.status).toBe(202);
    const dup = await k.api("POST", branchPath(project.id), { body: { name: "longest" } });
    expect(dup.status).toBe(409);
    expect(dup.body.error).toMatch(/already exists/);
    expect((await k.api("POST", branchPath(project.id, "nope"), { body: { name: "b" } })).status).toBe(404);
    expect((await k.api("GET", branchPath(project.id, "app", "nope"))).status).toBe(404);
    expect((await k.api("GET", branchPath(project.id, "nope"))).status).toBe(404);
    // A database still provisioning cannot be branched.
    const fresh = await k.api("POST", `/projects/${project.id}/databases`, { body: { name: "fresh" } });
    const early = await k.api("POST", branchPath(project.id, "fresh"), { body: { name: "b" } });
    if (early.status !== 202) {
      expect(early.status).toBe(409);
      expect(early.body.error).toMatch(/cannot be branched now: it is provisioning/);
    }
    await eventually(() => k.api("GET", `/projects/${project.id}/databases/${fresh.body.name}`), (x) => x.body.status === "active");
    await waitActive(k, project.id, "longest");
  });

  test("access: the list is an ordinary read; a branch with its connection string is a credential read; writes need write access", async () => {
    const { project } = await setup();
    await activeBranch(k, project.id, "b1");
    const ro = await createToken(k, project.id, { scope: "read_only" });
    expect((await k.api("GET", branchPath(project.id), { token: ro.token })).status).toBe(200);
    expect((await k.api("GET", branchPath(project.id, "app", "b1"), { token: ro.token })).status).toBe(403);
    expect((await k.api("POST", branchPath(project.id), { token: ro.token, body: { name: "b2" } })).status).toBe(403);
    expect((await k.api("DELETE", branchPath(project.id, "app", "b1"), { token: ro.token })).status).toBe(403);
  });
});

describe("consistency while the parent serves", () => {
  test("a branch taken during a stream of transfers is one consistent instant of the parent, and the parent kept serving", async () => {
    const { project, db, c } = await setup();
    await c`create table accounts (id int primary key, balance bigint not null)`;
    await c`insert into accounts select g, 1000 from generate_series(1, 2000) g`;
    await c`create table transfers (n bigint generated always as identity primary key, from_id int, to_id int, amount int)`;
    // Some bulk, so the copy takes a while.
    await c`create table filler (id int, pad text)`;
    await c`insert into filler select g, repeat(md5(g::text), 8) from generate_series(1, 40000) g`;
    const writer = connect(db.connection_string);
    let stop = false;
    let done = 0;
    const errors: string[] = [];
    const loop = (async () => {
      while (!stop) {
        const a = 1 + Math.floor(Math.random() * 2000);
        const b = 1 + Math.floor(Math.random() * 2000);
        try {
          await writer.begin(async (tx) => {
            await tx`update accounts set balance = balance - 7 where id = ${a}`;
            await tx`update accounts set balance = balance + 7 where id = ${b}`;
            await tx`insert into transfers (from_id, to_id, amount) values (${a}, ${b}, 7)`;
          });
          done++;
        } catch (err) {
          errors.push((err as Error).message);
        }
      }
    })();
    await eventually(async () => done, (n) => n > 20);
    const before = done;
    const r = await k.api("POST", branchPath(project.id), { body: { name: "snap" } });
    expect(r.status).toBe(202);
    const b = await waitActive(k, project.id, "snap");
    const during = done - before;
    stop = true;
    await loop;
    expect(errors).toEqual([]);
    expect(during).toBeGreaterThan(0);
    const bc = connect(b.connection_string);
    // The branch's first open replays the WAL written during the copy: those pages are the parent's
    // doing, not the branch's, so a connection that reads no table leaves it at 0 bytes of divergence.
    expect((await bc`select 1 as one`)[0]!.one).toBe(1);
    expect((await k.api("GET", branchPath(project.id, "app", "snap"))).body.storage_bytes).toBe(0);
    const [s] = await bc`select sum(balance)::int8 as total, count(*)::int as n from accounts`;
    expect(Number(s!.total)).toBe(2_000_000);
    expect(s!.n).toBe(2000);
    // Every transfer the branch holds is reflected in the balances, and no more.
    const [t] = await bc`select count(*)::int as n from transfers`;
    const [moved] = await bc`select coalesce(sum(abs(balance - 1000)), 0)::int8 as m from accounts`;
    expect(t!.n).toBeGreaterThan(0);
    expect(Number(moved!.m)).toBeLessThanOrEqual(t!.n * 14);
    // Exactly: each account's balance is what the transfers the branch holds made of it.
    const [off] = await bc`select count(*)::int as n from accounts a where balance <> 1000
      - 7 * (select count(*) from transfers where from_id = a.id) + 7 * (select count(*) from transfers where to_id = a.id)`;
    expect(off!.n).toBe(0);
    const [{ n: fill }] = await bc`select count(*)::int as n from filler`;
    expect(fill).toBe(40000);
    // The branch is not the parent: the parent went on writing after it.
    const [p] = await c`select count(*)::int as n from transfers`;
    expect(p!.n).toBeGreaterThanOrEqual(t!.n);
  });
});

describe("lifetime on the platform clock", () => {
  test("a branch expires at its ttl: gone from the list, its connections refused", async () => {
    const { project } = await setup();
    const b = await activeBranch(k, project.id, "short", { ttl_seconds: 3600 });
    const bc = connect(b.connection_string);
    expect(await bc`select 1 as x`).toEqual([{ x: 1 }]);
    expect(new Date(b.expires_at).getTime() - new Date(b.created_at).getTime()).toBe(3_600_000);
    // To 10 s before its expiry, counted from the clock now: the clock also runs at the real rate, and
    // the build and the first connection took seconds of it on a loaded runner.
    await advance(k, (new Date(b.expires_at).getTime() - (await clockNow(k))) / 1000 - 10);
    expect((await k.api("GET", branchPath(project.id, "app", "short"))).body.status).toBe("active");
    await advance(k, 20);
    expect((await k.api("GET", branchPath(project.id, "app", "short"))).status).toBe(404);
    expect((await k.api("GET", branchPath(project.id))).body.data).toEqual([]);
    expect(await refused(b.connection_string)).toMatch(/password authentication failed/);
    await expect(bc`select 1`).rejects.toThrow();
  });

  test("PATCH replaces the lifetime and restarts the countdown; a later reset counts the new lifetime again", async () => {
    const { project } = await setup();
    await activeBranch(k, project.id, "ext", { ttl_seconds: 3600 });
    await advance(k, 3000);
    const patched = await k.api("PATCH", branchPath(project.id, "app", "ext"), { body: { ttl_seconds: 7200 } });
    expect(patched.status).toBe(200);
    const now = await clockNow(k);
    expect(patched.body.ttl_seconds).toBe(7200);
    expect(Math.abs(new Date(patched.body.expires_at).getTime() - (now + 7_200_000))).toBeLessThan(5000);
    await advance(k, 3000); // past the first lifetime
    expect((await k.api("GET", branchPath(project.id, "app", "ext"))).body.status).toBe("active");
    // Reset: the remembered 7200 s counted from the reset.
    const reset = await k.api("POST", branchPath(project.id, "app", "ext", ) + "/reset");
    expect(reset.status).toBe(202);
    const resetAt = await clockNow(k);
    expect(reset.body.ttl_seconds).toBe(7200);
    expect(Math.abs(new Date(reset.body.expires_at).getTime() - (resetAt + 7_200_000))).toBeLessThan(5000);
    await waitActive(k, project.id, "ext");
    await advance(k, 7100);
    expect((await k.api("GET", branchPath(project.id, "app", "ext"))).body.status).toBe("active");
    await advance(k, 200);
    expect((await k.api("GET", branchPath(project.id, "app", "ext"))).status).toBe(404);
    // Lifetime rules hold for PATCH too; an absent branch is 404.
    expect((await k.api("PATCH", branchPath(project.id, "app", "ext"), { body: { ttl_seconds: 7200 } })).status).toBe(404);
    await activeBranch(k, project.id, "ext2");
    expect((await k.api("PATCH", branchPath(project.id, "app", "ext2"), { body: { ttl_seconds: 100 } })).status).toBe(400);
    expect((await k.api("PATCH", branchPath(project.id, "app", "ext2"), { body: {} })).status).toBe(400);
  });
});

describe("reset and reset-password", () => {
  test("reset discards the branch's writes and re-forks the parent as it is now; same connection string; 409 unless active", async () => {
    const { project, c } = await setup();
    const b = await activeBranch(k, project.id, "rb");
    const bc = connect(b.connection_string);
    await bc`insert into items values (10, 'branch-only')`;
    await c`insert into items values (11, 'parent-later')`;
    const r = await k.api("POST", `${branchPath(project.id, "app", "rb")}/reset`);
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ status: "provisioning", id: b.id, name: "rb" });
    // A reset while one runs, and a reset of a branch that is not active: 409.
    const again = await k.api("POST", `${branchPath(project.id, "app", "rb")}/reset`);
    if (again.status !== 202) expect(again.status).toBe(409);
    const after = await waitActive(k, project.id, "rb");
    expect(after.connection_string).toBe(b.connection_string);
    expect(await names(after.connection_string)).toEqual(["parent-1", "parent-2", "parent-later"]);
    expect((await k.api("POST", `${branchPath(project.id, "app", "nope")}/reset`)).status).toBe(404);
  });

  test("reset-password: the old branch password opens nothing new, the new one does, the parent is untouched", async () => {
    const { project, db } = await setup();
    const b = await activeBranch(k, project.id, "pw");
    const open = connect(b.connection_string);
    expect(await open`select 1 as x`).toEqual([{ x: 1 }]);
    const r = await k.api("POST", `${branchPath(project.id, "app", "pw")}/reset-password`);
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ role_name: `service_client_${b.id}`, new_password: expect.any(String), message: expect.any(String) });
    expect(new URL(r.body.connection_string).password).toBe(encodeURIComponent(r.body.new_password));
    expect(await refused(b.connection_string)).toMatch(/password authentication failed/);
    expect(await names(r.body.connection_string)).toEqual(["parent-1", "parent-2"]);
    // Open connections continue; the parent's credentials are unchanged.
    expect(await open`select 2 as x`).toEqual([{ x: 2 }]);
    expect(await names(db.connection_string)).toEqual(["parent-1", "parent-2"]);
    expect((await k.api("GET", `/projects/${project.id}/databases/app`)).body.connection_string).toBe(db.connection_string);
    expect((await k.api("GET", branchPath(project.id, "app", "pw"))).body.connection_string).toBe(r.body.connection_string);
  });
});

describe("delete", () => {
  test("202 deleting: connections end at once, then 404; the name is free again", async () => {
    const { project } = await setup();
    const b = await activeBranch(k, project.id, "gone");
    const bc = connect(b.connection_string);
    expect(await bc`select 1 as x`).toEqual([{ x: 1 }]);
    const r = await k.api("DELETE", branchPath(project.id, "app", "gone"));
    expect(r.status).toBe(202);
    expect(r.body).toEqual({ status: "deleting", message: expect.any(String) });
    await expect(bc`select 1`).rejects.toThrow();
    expect(await refused(b.connection_string)).toMatch(/password authentication failed/);
    await eventually(() => k.api("GET", branchPath(project.id, "app", "gone")), (x) => x.status === 404);
    expect((await k.api("DELETE", branchPath(project.id, "app", "gone"))).status).toBe(404);
    const again = await activeBranch(k, project.id, "gone");
    expect(again.id).not.toBe(b.id);
  });

  test("deleting the database removes its branches", async () => {
    const { project } = await setup();
    const b = await activeBranch(k, project.id, "child");
    expect((await k.api("DELETE", `/projects/${project.id}/databases/app`)).status).toBe(204);
    expect(await refused(b.connection_string)).toMatch(/password authentication failed/);
    await activeDatabase(k, project.id, "app");
    expect((await k.api("GET", branchPath(project.id))).body.data).toEqual([]);
  });
});

describe("builds held by a fault until the clock moves: teardown in the background, the query API's 409", () => {
  // Each test's first branch build is held (one fault each); the query API's test shares this Kiln
  // rather than starting its own with the same fault.
  const kh = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "branch-build-delay:2" } });

  test("delete while provisioning is allowed; delete is repeatable during teardown; the branch shows deleting until it is gone", async () => {
    const { project } = await setup(kh);
    // The first build is held: the branch stays provisioning.
    const r = await kh.api("POST", branchPath(project.id), { body: { name: "held" } });
    expect(r.status).toBe(202);
    expect((await kh.api("GET", branchPath(project.id, "app", "held"))).body.status).toBe("provisioning");
    expect((await kh.api("PATCH", branchPath(project.id, "app", "held"), { body: { ttl_seconds: 3600 } })).status).toBe(200);
    expect((await kh.api("POST", `${branchPath(project.id, "app", "held")}/reset`)).status).toBe(409);
    expect((await kh.api("POST", `${branchPath(project.id, "app", "held")}/reset-password`)).status).toBe(409);
    const d1 = await kh.api("DELETE", branchPath(project.id, "app", "held"));
    expect(d1.status).toBe(202);
    // Its teardown waits for the held build: deleting, repeatable, listed, name still held.
    const d2 = await kh.api("DELETE", branchPath(project.id, "app", "held"));
    expect(d2.status).toBe(202);
    expect(d2.body.status).toBe("deleting");
    expect((await kh.api("GET", branchPath(project.id, "app", "held"))).body.status).toBe("deleting");
    expect((await kh.api("GET", branchPath(project.id))).body.data.map((b: any) => b.status)).toEqual(["deleting"]);
    expect((await kh.api("POST", branchPath(project.id), { body: { name: "held" } })).status).toBe(409);
    expect((await kh.api("PATCH", branchPath(project.id, "app", "held"), { body: { ttl_seconds: 3600 } })).status).toBe(409);
    await advance(kh, 61);
    await eventually(() => kh.api("GET", branchPath(project.id, "app", "held")), (x) => x.status === 404);
    expect((await kh.api("DELETE", branchPath(project.id, "app", "held"))).status).toBe(404);
  });

  test("a branch that is not active answers 409", async () => {
    const { project, sk } = await setup(kh);
    expect((await kh.api("POST", branchPath(project.id), { body: { name: "slow" } })).status).toBe(202);
    const r = await kh.api("POST", "/databases/app/branches/slow/query/select", { token: sk, body: { table: "items" } });
    expect(r.status).toBe(409);
    expect(r.body.error).toMatch(/provisioning/);
    await advance(kh, 61);
    await waitActive(kh, project.id, "slow");
    const ok = await kh.api("POST", "/databases/app/branches/slow/query/select", { token: sk, body: { table: "items" } });
    expect(ok.status).toBe(200);
  });
});

describe("per-plan counts, every state included", () => {
  const kp = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "branch-build-fail:1,branch-build-delay:40" } });

  test("HOBBY: 10 branches per database, a failed one counted and holding its name (403 beyond)", async () => {
    const hobby = (await kp.api("POST", "/admin/accounts", { token: kp.adminToken, body: { plan: "hobby" } })).body.platform_token as string;
    const { project } = await setup(kp, hobby);
    // The first build fails (fault): it still counts and holds its name.
    expect((await kp.api("POST", branchPath(project.id), { token: hobby, body: { name: "b0" } })).status).toBe(202);
    await advance(kp, 61);
    const failed = await eventually(() => kp.api("GET", branchPath(project.id, "app", "b0"), { token: hobby }), (x) => x.body.status !== "provisioning");
    expect(failed.body.status).toBe("failed");
    expect(failed.body.connection_string).toBeUndefined();
    expect((await kp.api("POST", branchPath(project.id), { token: hobby, body: { name: "b0" } })).status).toBe(409);
    // The others stay provisioning (their builds are held): provisioning counts too.
    for (let i = 1; i < 10; i++) expect((await kp.api("POST", branchPath(project.id), { token: hobby, body: { name: `b${i}` } })).status).toBe(202);
    const over = await kp.api("POST", branchPath(project.id), { token: hobby, body: { name: "b10" } });
    expect(over.status).toBe(403);
    expect(over.body.error).toMatch(/HOBBY plan allows 10 branches/);
    // Deleting frees a place once it is gone.
    expect((await kp.api("DELETE", branchPath(project.id, "app", "b0"), { token: hobby })).status).toBe(202);
    await eventually(() => kp.api("GET", branchPath(project.id, "app", "b0"), { token: hobby }), (x) => x.status === 404);
    expect((await kp.api("POST", branchPath(project.id), { token: hobby, body: { name: "b10" } })).status).toBe(202);
  });

  test("SUPERAGENT: 25 branches per database (403 beyond); another database has its own count", async () => {
    const { project } = await setup(kp);
    for (let i = 0; i < 25; i++) expect((await kp.api("POST", branchPath(project.id), { body: { name: `s${i}` } })).status).toBe(202);
    const over = await kp.api("POST", branchPath(project.id), { body: { name: "s25" } });
    expect(over.status).toBe(403);
    expect(over.body.error).toMatch(/SUPERAGENT plan allows 25 branches/);
    await activeDatabase(kp, project.id, "other");
    expect((await kp.api("POST", branchPath(project.id, "other"), { body: { name: "s25" } })).status).toBe(202);
  });
});

describe("divergence and stats", () => {
  test("storage_bytes is what the branch changed since the fork; stats list branches most expensive first", async () => {
    const { project, c } = await setup();
    await c`create table big (id int primary key, pad text)`;
    await c`insert into big select g, repeat('p', 200) from generate_series(1, 5000) g`;
    const small = await activeBranch(k, project.id, "small");
    const large = await activeBranch(k, project.id, "large");
    expect(small.storage_bytes).toBe(0);
    expect(large.storage_bytes).toBe(0);
    // The parent's writes are not the branches' divergence.
    await c`update big set pad = repeat('q', 200)`;
    const lc = connect(large.connection_string);
    await lc`insert into big select g, repeat('l', 200) from generate_series(5001, 15000) g`; // ~2.2 MB of rows
    const sc = connect(small.connection_string);
    await sc`update big set pad = 'changed' where id = 1`;
    const gotLarge = (await k.api("GET", branchPath(project.id, "app", "large"))).body.storage_bytes as number;
    const gotSmall = (await k.api("GET", branchPath(project.id, "app", "small"))).body.storage_bytes as number;
    expect(gotLarge).toBeGreaterThan(1_500_000);
    expect(gotSmall).toBeGreaterThan(0);
    expect(gotSmall).toBeLessThan(100_000);
    const stats = await k.api("GET", `/projects/${project.id}/databases/app/stats`);
    expect(stats.status).toBe(200);
    expect(stats.body.branches.map((b: any) => b.name)).toEqual(["large", "small"]);
    expect(stats.body.branches[0]).toEqual({ id: large.id, name: "large", storage_bytes: expect.any(Number) });
    expect(stats.body.branches[0].storage_bytes).toBeGreaterThanOrEqual(gotLarge);
    // The list shows the recorded figure.
    const list = await k.api("GET", branchPath(project.id));
    expect(list.body.data.find((b: any) => b.name === "large").storage_bytes).toBeGreaterThan(1_500_000);
    // A reset discards the divergence.
    expect((await k.api("POST", `${branchPath(project.id, "app", "large")}/reset`)).status).toBe(202);
    expect((await waitActive(k, project.id, "large")).storage_bytes).toBe(0);
  });
});

describe("the branch query API", () => {
  test("service key and end-user token as on the parent; anon keys refused; a missing branch reads as a missing database", async () => {
    const { project, c, sk } = await setup();
    await c`alter table items add column owner uuid`;
    await c`alter table items enable row level security`;
    await c`create policy own on items to authenticated using (owner = auth.uid())`;
    await c`grant select on items to authenticated, anonymous`;
    const user = await k.api("POST", "/auth/signup", {
      token: (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key,
      body: { email: `u${Date.now()}@example.com`, password: "long enough password" },
    });
    const userToken = user.body.access_token as string;
    const userId = user.body.user.id as string;
    await c`update items set owner = ${userId} where id = 1`;
    const b = await activeBranch(k, project.id, "q");
    const bc = connect(b.connection_string);
    await bc`insert into items (id, name) values (5, 'branch-5')`;

    const q = (branch: string, op: string, body: unknown, token: string | null, db = "app") =>
      k.api("POST", `/databases/${db}/branches/${branch}/query/${op}`, { token, body });
    const all = await q("q", "select", { table: "items", order: [{ column: "id", ascending: true }] }, sk);
    expect(all.status).toBe(200);
    expect(all.body.data.map((r: any) => r.name)).toEqual(["parent-1", "parent-2", "branch-5"]);
    expect(all.headers.get("x-service-compute-ms")).not.toBeNull();
    const mine = await q("q", "select", { table: "items" }, userToken);
    expect(mine.status).toBe(200);
    expect(mine.body.data.map((r: any) => r.name)).toEqual(["parent-1"]);
    const ins = await q("q", "insert", { table: "items", values: { id: 6, name: "via-api" } }, sk);
    expect(ins.status).toBe(200);
    expect(await names(b.connection_string)).toContain("via-api");
    expect(await names((await k.api("GET", `/projects/${project.id}/databases/app`)).body.connection_string)).not.toContain("via-api");

    const anonKey = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key;
    const anon = await q("q", "select", { table: "items" }, anonKey);
    expect(anon.status).toBe(403);
    expect(anon.body.error).toMatch(/anon keys are not accepted on branches/);
    expect(anon.headers.get("x-service-proxy-ms")).not.toBeNull();
    expect((await q("q", "select", { table: "items" }, null)).status).toBe(401);
    expect((await q("q", "select", { table: "items" }, k.token)).status).toBe(403);
    const missingBranch = await q("nope", "select", { table: "items" }, sk);
    const missingDb = await q("q", "select", { table: "items" }, sk, "nodb");
    expect(missingBranch.status).toBe(404);
    expect(missingBranch.body).toEqual(missingDb.body);
    expect(missingBranch.body).toEqual({ error: "database not found" });
    expect((await q("q", "select", { table: "no_table" }, sk)).status).toBe(400);

    // The wire endpoint of a branch runs RLS as a user too.
    const asUser = connect(withApp(b.connection_string, `service_user_access:${userId}`));
    expect((await asUser`select name from items`).map((r) => r.name)).toEqual(["parent-1"]);
  });
});

// The production engine copies with pg_dump and pg_restore; KILN_PG_BIN names the only folder it looks in.
// One Kiln for both tests (was one each): its folder is empty for the first, and the second puts a
// pg_dump that fails into it (a failed look-up is not kept: the next copy looks again).
describe.skipIf(STORE !== "postgres")("production engine: the copy's tools", () => {
  let tools = "";
  let kb: TestKiln;
  beforeAll(async () => {
    tools = mkdtempSync(join(tmpdir(), "kiln-pgbin-"));
    kb = await startKiln({ env: { KILN_PG_BIN: tools } });
  });
  afterAll(async () => {
    await kb?.stop();
    if (kb) removeDir(kb.dataDir);
    if (tools) removeDir(tools);
  });

  test("503 on the production engine without pg_dump; backups and restores too", async () => {
    const { project } = await setup(kb);
    const r = await kb.api("POST", branchPath(project.id), { body: { name: "b" } });
    expect(r.status).toBe(503);
    expect(r.body.error).toMatch(/branching is unavailable: .*pg_dump/);
    expect((await kb.api("GET", branchPath(project.id))).body.data).toEqual([]);
    const b = await kb.api("POST", `/projects/${project.id}/databases/app/backups`, { body: { name: "x" } });
    expect(b.status).toBe(503);
    // Restores (rule 6's 503): the database stays as it is.
    const r2 = await kb.api("POST", `/projects/${project.id}/databases/app/restores`, { body: { backup_name: "x" } });
    expect(r2.status).toBe(503);
    expect(r2.body).toEqual({ error: expect.stringMatching(/restores are unavailable: .*pg_dump/) });
    expect((await kb.api("GET", `/projects/${project.id}/databases/app`)).body.status).toBe("active");
  });

  test("a pg_dump that fails after writing the whole dump fails the branch (the pipe's status is pg_dump's too); the parent is untouched", async () => {
    const bin = (await findPgBin())!;
    symlinkSync(join(bin, "pg_restore"), join(tools, "pg_restore"));
    // The real dump, complete (pg_restore alone would take it), then a failure.
    writeFileSync(join(tools, "pg_dump"), `#!/bin/sh\n"${join(bin, "pg_dump")}" "$@" || exit $?\necho "pg_dump: error: injected failure" >&2\nexit 3\n`);
    chmodSync(join(tools, "pg_dump"), 0o755);
    const { project, db } = await setup(kb);
    expect((await kb.api("POST", branchPath(project.id), { body: { name: "piped" } })).status).toBe(202);
    const b = await eventually(() => kb.api("GET", branchPath(project.id, "app", "piped")), (x) => x.body.status !== "provisioning", 30_000);
    expect(b.body.status).toBe("failed");
    expect(b.body.connection_string).toBeUndefined();
    expect(kb.stderr).toMatch(/pg_dump \| pg_restore failed \(3\): .*injected failure/s);
    expect(await names(db.connection_string)).toEqual(["parent-1", "parent-2"]);
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("the CLI", () => {
  const { run, json } = useCli(k, { passToken: true });

  test("kiln db branch create|list|get|extend|reset|reset-password|delete and db query --branch", async () => {
    const { project, sk } = await setup();
    const created = json("db", "branch", "create", "app", "cli_b", "--project", project.id, "--ttl", "2h", "--wait");
    expect(created).toMatchObject({ name: "cli_b", status: "active", ttl_seconds: 7200 });
    expect(created.connection_string).toMatch(/^postgres:\/\/service_client_/);
    expect(json("db", "branch", "list", "app", "--project", project.id).data.map((b: any) => b.name)).toEqual(["cli_b"]);
    expect(json("db", "branch", "get", "app", "cli_b", "--project", project.id).id).toBe(created.id);
    const extended = json("db", "branch", "extend", "app", "cli_b", "--project", project.id, "--ttl", "1d");
    expect(extended.ttl_seconds).toBe(86_400);
    const bad = run("db", "branch", "extend", "app", "cli_b", "--project", project.id, "--ttl", "10m");
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/3600/);
    const rows = json("db", "query", "app", "select", "--branch", "cli_b", "--key", sk, "--table", "items");
    expect(rows.count).toBe(2);
    expect(json("db", "branch", "reset", "app", "cli_b", "--project", project.id, "--wait").status).toBe("active");
    expect(json("db", "branch", "reset-password", "app", "cli_b", "--project", project.id).role_name).toBe(`service_client_${created.id}`);
    const table = run("db", "branch", "list", "app", "--project", project.id);
    expect(table.out).toMatch(/cli_b\s+active/);
    expect(run("db", "branch", "delete", "app", "cli_b", "--project", project.id).out).toMatch(/being deleted/);
  });
});
