// Snapshots of the whole platform and reset (issue 31, docs/testing.md): a restore brings back every
// kind of state, requests during a restore wait or get 503, and the name/auth/404 rules. The
// production profile (the postgres project) answers 400.
import { randomBytes } from "node:crypto";
import { describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { activeDatabase, itemNames } from "../support/databases";
import { deploy, settled, tgz } from "../support/functions";
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import JSC_OPTIONS from "../../cmd/jsc-options.json";
import { startKiln as startWithSeed } from "../../testing/index.mjs";
import { createProject, eventually, removeDir, ROOT, startKiln, STORE, TEST_SECRET_KEY, useCli, useKiln, type TestKiln } from "../support/kiln";

// --resettable keeps a snapshot at start (a stop, a copy and a start of the state): slower to start.
const k = useKiln({ args: ["--controllable-clock", ...(STORE === "embedded" ? ["--resettable"] : [])], startTimeoutMs: 90_000 });

const cli = useCli(k, { passToken: true });

const clock = async () => (await k.api("GET", "/_kiln/clock", { token: null })).body as { now: string; offset_ms: number };
const advance = async (seconds: number) => expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);
const save = (name: string, token?: string | null) => k.api("POST", "/_kiln/snapshots", { body: { name }, token });
const restore = (name: string, token?: string | null) => k.api("POST", `/_kiln/snapshots/${encodeURIComponent(name)}/restore`, { token });

async function upload(kk: TestKiln, token: string, bucket: string, path: string, text: string) {
  const form = new FormData();
  form.set("file", new Blob([text], { type: "text/plain" }), path);
  const res = await fetch(`${kk.url}/storage/${bucket}/${path}`, { method: "POST", headers: { authorization: `Bearer ${token}`, "x-upsert": "true" }, body: form });
  expect([200, 201]).toContain(res.status);
}
async function download(kk: TestKiln, token: string, bucket: string, path: string) {
  const res = await fetch(`${kk.url}/storage/${bucket}/${path}`, { headers: { authorization: `Bearer ${token}` } });
  return { status: res.status, text: await res.text() };
}

async function deployDurable(kk: TestKiln, projectId: string, name: string, code: Buffer) {
  const form = new FormData();
  form.set("name", name);
  form.set("runtime", "nodejs22.x");
  form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
  const res = await fetch(`${kk.url}/projects/${projectId}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${kk.token}` }, body: form });
  const body = (await res.json()) as any;
  expect(res.status).toBe(201);
  return (await eventually(() => kk.api("GET", `/projects/${projectId}/durable-functions/${body.id}`), (r) => r.body.status !== "provisioning" && !r.body.pending_deployment_id, 60_000)).body;
}

const ECHO = { "index.js": `exports.handler = async (event) => { console.log("INVOKED " + event.mark); return { mark: event.mark }; };` };
const FLOW = { "index.js": `exports.handler = async (event, step) => { await step.sleep("nap", "1h"); return await step.run("done", () => "woke"); };` };

/** A project with a service key, its anon key and a database holding `items` = (1, 'before'). */
async function projectWithItems() {
  const p = await createProject(k);
  const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
  const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
  const db = await activeDatabase(k, p.id);
  const c = connect(db.connection_string);
  await c`create table items (id int primary key, name text not null)`;
  await c`insert into items values (1, 'before')`;
  await c.end({ timeout: 1 });
  return { p, sk, anon, db };
}

describe.runIf(STORE === "embedded")("snapshots of the whole platform", () => {
  test("a restore brings back each kind of state: projects, rows, objects, end users, functions and their invocations, schedulers, durable executions, locks, log lines, the clock", async () => {
    // The state before the snapshot.
    const { p, sk, anon, db } = await projectWithItems();
    expect((await k.api("POST", `/projects/${p.id}/storage/buckets`, { body: { name: "docs" } })).status).toBe(201);
    await upload(k, sk, "docs", "a.txt", "version one");
    expect((await k.api("POST", "/auth/signup", { token: anon, body: { email: "alice@example.com", password: "correct horse" } })).status).toBe(201);
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "echo", runtime: "nodejs22.x" }, tgz(ECHO))).body.id);
    expect(fn.status).toBe("active");
    expect((await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { mark: "one" } } })).status).toBe(200);
    const schedulers = `/projects/${p.id}/functions/${fn.id}/schedulers`;
    const sched = await k.api("POST", schedulers, { body: { name: "nightly", enabled: true, schedule: { kind: "cron", cron_expression: "0 3 * * *" }, payload: { mark: "tick" } } });
    expect(sched.status).toBe(201);
    const flow = await deployDurable(k, p.id, "flow", tgz(FLOW));
    const ex = await k.api("POST", `/durable-functions/${flow.id}/executions`, { token: sk, body: { input: {} } });
    expect(ex.status).toBe(202);
    const execution = `/projects/${p.id}/durable-functions/${flow.id}/executions/${ex.body.id}`;
    expect((await eventually(() => k.api("GET", execution), (r) => ["sleeping", "failed", "completed"].includes(r.body.status), 30_000)).body.status).toBe("sleeping");
    const lockToken = crypto.randomUUID();
    const lockHeaders = (t?: string) => ({ "X-Service-Request-Id": crypto.randomUUID(), ...(t ? { "X-Service-Lock-Token": t } : {}) });
    expect((await k.api("POST", "/locks/job/lease", { token: sk, body: { ttl_seconds: 3600 }, headers: lockHeaders(lockToken) })).status).toBe(200);
    const logLines = async () => {
      const r = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, q: "INVOKED" } });
      expect(r.status).toBe(200);
      return (r.body.data as Array<{ body: unknown }>).map((e) => String(e.body)).filter((b) => b.includes("INVOKED")).sort();
    };
    expect(await eventually(logLines, (l) => l.length === 1, 10_000)).toEqual(["INVOKED one"]);
    await advance(600);
    const atSnapshot = await clock();

    const snap = await save("before");
    expect(snap.status).toBe(201);
    expect(Object.keys(snap.body).sort()).toEqual(["created_at", "name", "size_bytes"]);
    expect(snap.body.name).toBe("before");
    expect(snap.body.size_bytes).toBeGreaterThan(0);
    expect(Math.abs(Date.parse(snap.body.created_at) - Date.parse(atSnapshot.now))).toBeLessThan(30_000);

    // Everything changes after it.
    const later = await createProject(k);
    const c2 = connect(db.connection_string);
    await c2`update items set name = 'after' where id = 1`;
    await c2`insert into items values (2, 'added')`;
    await c2.end({ timeout: 1 });
    await upload(k, sk, "docs", "a.txt", "version two");
    await upload(k, sk, "docs", "b.txt", "new object");
    expect((await k.api("POST", "/auth/signup", { token: anon, body: { email: "bob@example.com", password: "correct horse" } })).status).toBe(201);
    const other = await settled(k, p.id, (await deploy(k, p.id, { name: "other", runtime: "nodejs22.x" }, tgz(ECHO))).body.id);
    expect((await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { mark: "two" } } })).status).toBe(200);
    expect(await eventually(logLines, (l) => l.length === 2, 10_000)).toEqual(["INVOKED one", "INVOKED two"]);
    expect((await k.api("DELETE", `${schedulers}/${sched.body.id}`)).status).toBe(204);
    expect((await k.api("DELETE", "/locks/job/lease", { token: sk, headers: lockHeaders(lockToken) })).status).toBeLessThan(300);
    await advance(7200); // the durable execution wakes and completes
    expect((await eventually(() => k.api("GET", execution), (r) => r.body.status === "completed", 30_000)).body.status).toBe("completed");
    expect((await clock()).offset_ms).toBeGreaterThan(atSnapshot.offset_ms + 7_000_000);

    const restored = await restore("before");
    expect(restored.status).toBe(200);
    expect(Object.keys(restored.body).sort()).toEqual(["name", "restored_at"]);
    expect(restored.body.name).toBe("before");

    // Projects: the one made after the snapshot is gone.
    expect((await k.api("GET", `/projects/${later.id}`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}`)).status).toBe(200);
    // A database row, through the same connection string (the wire port is kept).
    expect(await itemNames(db.connection_string)).toEqual(["before"]);
    // Objects.
    expect(await download(k, sk, "docs", "a.txt")).toEqual({ status: 200, text: "version one" });
    expect((await download(k, sk, "docs", "b.txt")).status).toBe(404);
    // End users.
    expect((await k.api("POST", "/auth/signin", { token: anon, body: { email: "alice@example.com", password: "correct horse" } })).status).toBe(200);
    expect((await k.api("POST", "/auth/signin", { token: anon, body: { email: "bob@example.com", password: "correct horse" } })).status).toBe(400);
    // Functions and their invocations (log lines): the later function and invocation are gone, the first still runs.
    expect((await k.api("GET", `/projects/${p.id}/functions/${other.id}`)).status).toBe(404);
    expect(await logLines()).toEqual(["INVOKED one"]);
    const again = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { mark: "three" } } });
    expect([again.status, again.body]).toEqual([200, { mark: "three" }]);
    // The scheduler.
    expect((await k.api("GET", `${schedulers}/${sched.body.id}`)).status).toBe(200);
    // The lock: held again by the same token.
    const lock = await k.api("GET", "/locks/job", { token: sk, headers: lockHeaders() });
    expect(lock.status).toBe(200);
    expect(lock.body).toMatchObject({ held: true, fencing_token: 1 });
    expect((await k.api("POST", "/locks/job/lease", { token: sk, body: { ttl_seconds: 60 }, headers: lockHeaders(crypto.randomUUID()) })).status).toBe(409);
    // The clock: back at the snapshot's offset (the time moved after it is undone).
    const now = await clock();
    expect(now.offset_ms).toBe(atSnapshot.offset_ms);
    // The durable execution sleeps again, and the restored timers wake it when the clock passes its wake time.
    expect((await k.api("GET", execution)).body.status).toBe("sleeping");
    await advance(3700);
    expect((await eventually(() => k.api("GET", execution), (r) => r.body.status === "completed", 30_000)).body.status).toBe("completed");
  }, 240_000);

  test("restores in any order: each snapshot comes back whole after writes, deletes and other snapshots' restores", async () => {
    // A restore puts back only what changed since the snapshot (or since it was last restored); this
    // walks the cases that rule must get right, in the control store and in a database's files.
    const p = await createProject(k);
    const db = await activeDatabase(k, p.id);
    const sql = async (text: string) => {
      const c = connect(db.connection_string);
      await c.unsafe(text);
      await c.end({ timeout: 1 });
    };
    await sql("create table items (id int primary key, name text not null); insert into items values (1, 'a')");
    const projectNames = async () => ((await k.api("GET", "/projects?limit=100")).body.data as Array<{ name: string }>).map((x) => x.name).sort();
    const variables = async () => ((await k.api("GET", `/projects/${p.id}/variables`)).body.data as Array<{ name: string }>).map((v) => v.name).sort();
    const setVar = async (name: string) => {
      const r = await k.api("POST", `/projects/${p.id}/variables`, { body: { name, value: "v" } });
      expect(r.status).toBe(201);
      return r.body.id as string;
    };
    const one = await setVar("ONE");
    const base = await projectNames();
    expect((await save("order-a")).status).toBe(201);

    // Writes after A: a new project, a deleted variable (a delete only), a row changed.
    const x = await createProject(k);
    expect((await k.api("DELETE", `/projects/${p.id}/variables/${one}`)).status).toBe(204);
    await sql("update items set name = 'b' where id = 1");
    expect((await save("order-b")).status).toBe(201);
    await setVar("TWO");
    await sql("insert into items values (2, 'c')");

    // A: X's project and the later rows are gone, the deleted variable is back.
    expect((await restore("order-a")).status).toBe(200);
    expect(await projectNames()).toEqual(base);
    expect(await variables()).toEqual(["ONE"]);
    expect(await itemNames(db.connection_string)).toEqual(["a"]);
    // B, right after A's restore rewrote what B has too.
    expect((await restore("order-b")).status).toBe(200);
    expect(await projectNames()).toEqual([...base, x.name].sort());
    expect(await variables()).toEqual([]);
    expect(await itemNames(db.connection_string)).toEqual(["b"]);
    // A again with nothing written in between, then a write and A once more.
    expect((await restore("order-a")).status).toBe(200);
    expect(await variables()).toEqual(["ONE"]);
    expect((await restore("order-a")).status).toBe(200);
    expect(await projectNames()).toEqual(base);
    await setVar("THREE");
    expect((await restore("order-a")).status).toBe(200);
    expect(await variables()).toEqual(["ONE"]);
    expect(await itemNames(db.connection_string)).toEqual(["a"]);
    for (const n of ["order-a", "order-b"]) expect((await k.api("DELETE", `/_kiln/snapshots/${n}`)).status).toBe(204);
  }, 180_000);

  test("requests during a restore finish first, then wait or get 503 with Retry-After; after it they see the restored state", async () => {
    expect((await save("during")).status).toBe(201);
    const made = await createProject(k);
    const restoring = restore("during");
    const during = await Promise.all(
      Array.from({ length: 6 }, async (_, i) => {
        await new Promise((r) => setTimeout(r, i * 15));
        return k.api("GET", `/projects/${made.id}`);
      }),
    );
    expect((await restoring).status).toBe(200);
    for (const r of during) {
      expect([200, 404, 503]).toContain(r.status);
      if (r.status === 503) expect(r.headers.get("retry-after")).toBe("1");
    }
    expect((await k.api("GET", `/projects/${made.id}`)).status).toBe(404);
    expect((await k.api("DELETE", "/_kiln/snapshots/during")).status).toBe(204);
  }, 120_000);

  test("list, delete 204 then 404, unknown names 404, name rules 400, duplicates 409, platform token only", async () => {
    const name = `s-${randomBytes(3).toString("hex")}`;
    expect((await save(name)).status).toBe(201);
    expect((await save(name)).status).toBe(409);
    const list = await k.api("GET", "/_kiln/snapshots");
    expect(list.status).toBe(200);
    const names = list.body.data.map((s: any) => s.name);
    expect(names).toContain(name);
    expect(names).toContain("start");
    for (const bad of ["", "../x", ".hidden", "a b", "x".repeat(64), "seed", "start"]) {
      const r = await save(bad);
      expect([bad, r.status]).toEqual([bad, 400]);
      expect(r.body.error).toMatch(/name/);
    }
    expect((await restore("nope")).status).toBe(404);
    expect((await k.api("DELETE", "/_kiln/snapshots/nope")).status).toBe(404);
    // Platform token only: none, a wrong one, a project's service key.
    const p = await createProject(k);
    const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    for (const token of [null, "pk-wrong0123456789abcdef", sk]) {
      const refused = token === sk ? [401, 403] : [401];
      for (const r of [
        await save("x", token),
        await k.api("GET", "/_kiln/snapshots", { token }),
        await restore(name, token),
        await k.api("DELETE", `/_kiln/snapshots/${name}`, { token }),
        await k.api("POST", "/_kiln/reset", { token }),
      ])
        expect(refused).toContain(r.status);
    }
    expect((await k.api("DELETE", `/_kiln/snapshots/${name}`)).status).toBe(204);
    expect((await k.api("DELETE", `/_kiln/snapshots/${name}`)).status).toBe(404);
    expect((await k.api("GET", "/_kiln/snapshots")).body.data.map((s: any) => s.name)).not.toContain(name);
    // The reset point cannot be deleted.
    expect((await k.api("DELETE", "/_kiln/snapshots/start")).status).toBe(400);
  }, 120_000);

  test("kiln snapshot save|list|restore|delete and kiln reset", async () => {
    const saved = cli.json("snapshot", "save", "by-cli");
    expect(saved).toMatchObject({ name: "by-cli" });
    expect(cli.json("snapshot", "list").data.map((s: any) => s.name)).toContain("by-cli");
    const made = await createProject(k);
    expect(cli.json("snapshot", "restore", "by-cli")).toMatchObject({ name: "by-cli" });
    expect((await k.api("GET", `/projects/${made.id}`)).status).toBe(404);
    expect(cli.json("snapshot", "delete", "by-cli")).toEqual({ deleted: "by-cli" });
    const gone = cli.run("--json", "snapshot", "restore", "by-cli");
    expect(gone.code).not.toBe(0);
    expect(JSON.parse(gone.err.trim())).toMatchObject({ status: 404 });
    expect(cli.json("reset")).toMatchObject({ name: "start" });
  }, 120_000);

  test("POST /_kiln/reset puts back the state right after start (--resettable)", async () => {
    expect((await save("kept")).status).toBe(201);
    const p = await createProject(k);
    await advance(3600);
    const r = await k.api("POST", "/_kiln/reset");
    expect(r.status).toBe(200);
    expect(r.body.name).toBe("start");
    expect((await k.api("GET", `/projects/${p.id}`)).status).toBe(404);
    expect((await k.api("GET", "/projects")).body.total).toBe(0);
    expect((await clock()).offset_ms).toBe(0);
    // Snapshots survive a reset (they are not part of the state).
    expect((await k.api("GET", "/_kiln/snapshots")).body.data.map((s: any) => s.name)).toContain("kept");
  }, 120_000);
});

// A restore whose changes all belong to areas with a reset hook (server/area.ts) runs under the
// running areas (`Kiln-Restore: in-place`); these check what such hooks could leave behind. The
// tests above change areas without one too (variables, storage, functions), which restarts them all.
describe.runIf(STORE === "embedded")("reset in place (the areas' reset hooks)", () => {
  const lockHeaders = (t?: string) => ({ "X-Service-Request-Id": crypto.randomUUID(), ...(t ? { "X-Service-Lock-Token": t } : {}) });

  test("projects, keys, end users, locks and a database's rows changed after the snapshot are put back in place; the database's open connections are closed, its connection string works", async () => {
    const { p, sk, anon, db } = await projectWithItems();
    expect((await k.api("POST", "/locks/kept/lease", { token: sk, body: { ttl_seconds: 3600 }, headers: lockHeaders(crypto.randomUUID()) })).status).toBe(200);
    expect((await save("in-place")).status).toBe(201);

    // After it: a project, a service key, an end user with a session, a lock, a row (on a connection left open).
    const later = await createProject(k);
    const laterKey = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "later" } })).body.key as string;
    expect((await k.api("POST", "/auth/signup", { token: anon, body: { email: "bob@example.com", password: "correct horse" } })).status).toBe(201);
    const session = await k.api("POST", "/auth/signin", { token: anon, body: { email: "bob@example.com", password: "correct horse" } });
    expect(session.status).toBe(200);
    expect((await k.api("GET", "/auth/user", { token: session.body.access_token, headers: { apikey: anon } })).status).toBe(200);
    expect((await k.api("POST", "/locks/taken/lease", { token: sk, body: { ttl_seconds: 3600 }, headers: lockHeaders(crypto.randomUUID()) })).status).toBe(200);
    const open = connect(db.connection_string);
    await open`insert into items values (2, 'after')`;
    await open`select set_config('kiln.session', 'before the restore', false)`;

    const r = await restore("in-place");
    expect(r.status).toBe(200);
    expect(r.headers.get("kiln-restore")).toBe("in-place");

    expect((await k.api("GET", `/projects/${later.id}`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}`)).status).toBe(200);
    // The key made after it no longer authenticates (no principal is left cached); the one from before does.
    expect((await k.api("GET", "/locks/kept", { token: laterKey, headers: lockHeaders() })).status).toBe(401);
    expect((await k.api("POST", "/auth/signin", { token: anon, body: { email: "bob@example.com", password: "correct horse" } })).status).toBe(400);
    expect((await k.api("GET", "/auth/user", { token: session.body.access_token, headers: { apikey: anon } })).status).toBe(401);
    // The lock taken after it is free, with the fencing counter of the snapshot; the one from before is still held.
    expect((await k.api("GET", "/locks/taken", { token: sk, headers: lockHeaders() })).body.held).toBe(false);
    const kept = await k.api("GET", "/locks/kept", { token: sk, headers: lockHeaders() });
    expect(kept.body).toMatchObject({ held: true, fencing_token: 1 });
    const retaken = await k.api("POST", "/locks/taken/lease", { token: sk, body: { ttl_seconds: 60 }, headers: lockHeaders(crypto.randomUUID()) });
    expect(retaken.status).toBe(200);
    expect(retaken.body.fencing_token).toBe(2);
    // The database: its rows are back; the session open across the restore was closed (its files
    // were put back): the client's next query runs on a new session (postgres.js reconnects), which
    // sees the rows of the snapshot, through the same connection string.
    const [row] = await open`select current_setting('kiln.session', true) as kept, (select count(*)::int from items) as items`;
    expect([row!.kept || null, row!.items]).toEqual([null, 1]);
    await open.end({ timeout: 1 });
    expect(await itemNames(db.connection_string)).toEqual(["before"]);

    // Nothing written since: again in place, and nothing changes.
    const again = await restore("in-place");
    expect([again.status, again.headers.get("kiln-restore")]).toEqual([200, "in-place"]);
    expect(await itemNames(db.connection_string)).toEqual(["before"]);
    expect((await k.api("DELETE", "/_kiln/snapshots/in-place")).status).toBe(204);
  }, 180_000);

  test("a scheduler made after the snapshot no longer fires, a durable execution started after it is gone, and the one from before resumes", async () => {
    const p = await createProject(k);
    const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "echo", runtime: "nodejs22.x" }, tgz(ECHO))).body.id);
    expect(fn.status).toBe("active");
    const flow = await deployDurable(k, p.id, "flow", tgz(FLOW));
    const schedulers = `/projects/${p.id}/functions/${fn.id}/schedulers`;
    const scheduler = (mark: string, cron: string) => k.api("POST", schedulers, { body: { name: mark, enabled: true, schedule: { kind: "cron", cron_expression: cron }, payload: { mark } } });
    expect((await scheduler("hourly-before", "0 * * * *")).status).toBe(201);
    const execution = async () => {
      const ex = await k.api("POST", `/durable-functions/${flow.id}/executions`, { token: sk, body: { input: {} } });
      expect(ex.status).toBe(202);
      const path = `/projects/${p.id}/durable-functions/${flow.id}/executions/${ex.body.id}`;
      expect((await eventually(() => k.api("GET", path), (r) => ["sleeping", "failed", "completed"].includes(r.body.status), 30_000)).body.status).toBe("sleeping");
      return path;
    };
    const before = await execution();
    expect((await save("hooks")).status).toBe(201);

    const after = await scheduler("every-minute-after", "* * * * *");
    expect(after.status).toBe(201);
    const started = await execution();

    const r = await restore("hooks");
    expect([r.status, r.headers.get("kiln-restore")]).toEqual([200, "in-place"]);
    expect((await k.api("GET", `${schedulers}/${after.body.id}`)).status).toBe(404);
    expect((await k.api("GET", started)).status).toBe(404);
    expect((await k.api("GET", before)).body.status).toBe("sleeping");

    // Past the sleep's wake time and an hour of minutes: the execution from before completes, and
    // only the scheduler from before ran the function.
    await advance(3700);
    expect((await eventually(() => k.api("GET", before), (x) => x.body.status === "completed", 30_000)).body.status).toBe("completed");
    const marks = async () => {
      const res = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, q: "INVOKED" } });
      expect(res.status).toBe(200);
      return [...new Set((res.body.data as Array<{ body: unknown }>).map((e) => String(e.body)).filter((b) => b.includes("INVOKED")))].sort();
    };
    expect(await eventually(marks, (m) => m.length > 0, 10_000)).toEqual(["INVOKED hourly-before"]);
    expect((await k.api("DELETE", "/_kiln/snapshots/hooks")).status).toBe(204);
  }, 240_000);
});

describe.runIf(STORE === "embedded")("snapshots across a restart", () => {
  test("a snapshot taken while the control store stays open is restored by a later Kiln on the same data dir, then again", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "kiln-test-"));
    try {
      const first = await startKiln({ dataDir });
      let kept: { id: string };
      try {
        kept = await createProject(first);
        expect((await first.api("POST", "/_kiln/snapshots", { body: { name: "across" } })).status).toBe(201);
      } finally {
        await first.stop();
      }
      const second = await startKiln({ dataDir });
      try {
        const later = await createProject(second);
        // The first restore of this process reads the snapshot's files; the second its image in memory.
        for (let i = 0; i < 2; i++) {
          const r = await second.api("POST", "/_kiln/snapshots/across/restore");
          expect(r.status).toBe(200);
          expect((await second.api("GET", `/projects/${kept.id}`)).status).toBe(200);
          expect((await second.api("GET", `/projects/${later.id}`)).status).toBe(404);
          await createProject(second);
        }
      } finally {
        await second.stop();
      }
    } finally {
      removeDir(dataDir);
    }
  }, 180_000);
});

const FIXTURES = join(ROOT, "test/fixtures");

async function callApi(url: string, token: string, method: string, path: string, body?: unknown) {
  const res = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let parsed: any = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {}
  return { status: res.status, headers: res.headers, body: parsed, text };
}

describe.runIf(STORE === "embedded")("seeds", () => {
  test("kiln start --seed applies projects, their manifest, SQL, end users, objects and functions; reset puts the seed back", async () => {
    // Through kiln/testing's startKiln (its seed option), which waits longer for a start than
    // test/support's 30 s: a seeded start builds a function and keeps the seed snapshot.
    // kiln/testing gives its Kiln the fixture's JavaScriptCore thresholds (cmd/jsc-options.json) when the
    // caller set none: this process has them (vitest.config.ts), so one is taken away for the start.
    const [jscKey, jscValue] = Object.entries(JSC_OPTIONS)[0]!;
    const had = process.env[jscKey];
    delete process.env[jscKey];
    let seeded: Awaited<ReturnType<typeof startWithSeed>>;
    try {
      seeded = await startWithSeed({ seed: join(FIXTURES, "seed/kiln.seed.yaml"), startTimeoutMs: 120_000, env: { KILN_SECRET_KEY: TEST_SECRET_KEY } });
    } finally {
      if (had !== undefined) process.env[jscKey] = had;
    }
    const s = { url: seeded.url, api: (method: string, path: string, o: { token?: string; body?: unknown } = {}) => callApi(seeded.url, o.token ?? seeded.platformToken, method, path, o.body) } as unknown as TestKiln;
    try {
      // Kiln hides its /proc entries from its own uid (hideOwnProcEntries); root (the CI runner) reads them.
      if (process.getuid?.() === 0) expect(readFileSync(`/proc/${seeded.pid}/environ`, "utf8").split("\0")).toContain(`${jscKey}=${jscValue}`);
      const projects = (await s.api("GET", "/projects")).body.data;
      expect(projects.map((p: any) => p.name)).toEqual(["shop"]);
      const id = projects[0].id;
      const sk = (await s.api("POST", `/projects/${id}/service-keys`, { body: { name: "t" } })).body.key;
      const anon = (await s.api("GET", `/projects/${id}/anon-keys`)).body.data[0].key;
      const db = (await s.api("GET", `/projects/${id}/databases/app`)).body;
      expect(await itemNames(db.connection_string)).toEqual(["seeded one", "seeded two"]);
      expect((await s.api("POST", "/auth/signin", { token: anon, body: { email: "alice@example.com", password: "correct horse" } })).status).toBe(200);
      expect(await download(s, sk, "files", "readme.txt")).toEqual({ status: 200, text: "readme text\n" });
      expect(await download(s, sk, "files", "docs/guide.txt")).toEqual({ status: 200, text: "nested text\n" });
      const fns = (await s.api("GET", `/projects/${id}/functions`)).body.data;
      expect(fns.map((f: any) => [f.name, f.status])).toEqual([["hello", "active"]]);
      const inv = await s.api("POST", `/functions/${fns[0].id}/invoke`, { token: sk, body: { payload: {} } });
      expect([inv.status, inv.body]).toEqual([200, { greeting: "hi" }]);
      expect(JSON.stringify((await s.api("GET", `/projects/${id}/variables`)).body)).toContain("GREETING");
      expect((await s.api("GET", "/_kiln/snapshots")).body.data.map((x: any) => x.name)).toEqual(["seed"]);

      const c = connect(db.connection_string);
      await c`delete from items`;
      await c.end({ timeout: 1 });
      const extra = await createProject(s);
      const r = await s.api("POST", "/_kiln/reset");
      expect([r.status, r.body.name]).toEqual([200, "seed"]);
      expect(await itemNames(db.connection_string)).toEqual(["seeded one", "seeded two"]);
      expect((await s.api("GET", `/projects/${extra.id}`)).status).toBe(404);
    } finally {
      await seeded.stop();
    }
  }, 240_000);

  test("a bad seed stops the start with the file, the line and the problem, and leaves no state", async () => {
    const bad: Array<[string, RegExp]> = [
      [join(FIXTURES, "seed-bad-yaml.yaml"), /seed-bad-yaml\.yaml:6: projects\.0\.databases\.0\.sql\.0: no such file does-not-exist\.sql/],
      [join(FIXTURES, "seed-bad-field.yaml"), /seed-bad-field\.yaml:5: projects\.0\.users\.0\.email: .*email/i],
      [join(FIXTURES, "seed-bad-sql/kiln.seed.yaml"), /sql\/bad\.sql:3: .*syntax error/],
    ];
    for (const [file, message] of bad) {
      const dataDir = mkdtempSync(join(tmpdir(), "kiln-test-"));
      try {
        const err = await startKiln({ dataDir, args: ["--seed", file], startTimeoutMs: 90_000 }).then(
          () => null,
          (e: Error) => e.message,
        );
        expect(err).toMatch(message);
        // Nothing half-seeded: no control store, no databases.
        expect(existsSync(join(dataDir, "control")) || existsSync(join(dataDir, "databases")), readdirSync(dataDir).join(",")).toBe(false);
      } finally {
        removeDir(dataDir);
      }
    }
  }, 240_000);
});

describe.runIf(STORE === "postgres")("the production profile", () => {
  test("snapshots and reset answer 400 saying why", async () => {
    for (const r of [await save("x"), await k.api("GET", "/_kiln/snapshots"), await restore("x"), await k.api("DELETE", "/_kiln/snapshots/x"), await k.api("POST", "/_kiln/reset")]) {
      expect(r.status).toBe(400);
      expect(r.body.error).toMatch(/embedded profile/);
    }
  });
});
