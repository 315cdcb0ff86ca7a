// Restores: pre-restore states (spec rule 6's "too many pre-restore states held"), rule 8's 503 when
// whether a restore runs cannot be determined, and point in time on the production engine (WAL archived
// by Kiln with pg_receivewal, base backups with pg_basebackup, recovery of a throwaway copy of the
// server with recovery_target_time), on both engines where they apply, driven by the controllable clock.
import { mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { advance, backup, clockNow, dbPath, itemNames as names, itemsDatabase as setup } from "../support/databases";
import { startPgServer, findPgBin, type PgServer } from "../support/postgres-server";
import { createProject, eventually, startKiln, STORE, useKiln, type TestKiln } from "../support/kiln";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function restore(kiln: TestKiln, projectId: string, body: Record<string, unknown>, timeoutMs = 60_000) {
  const r = await kiln.api("POST", `${dbPath(projectId)}/restores`, { body });
  if (r.status !== 202) throw new Error(`restore: ${r.status} ${r.text}`);
  return (await eventually(() => kiln.api("GET", `${dbPath(projectId)}/restores/${r.body.id}`), (x) => !["pending", "running"].includes(x.body.status), timeoutMs)).body;
}

const preRestore = async (kiln: TestKiln, projectId: string) =>
  ((await kiln.api("GET", `${dbPath(projectId)}/backups`)).body.data as any[]).filter((b) => b.name.startsWith("service-pre-restore-"));

// One Kiln for the pre-restore states and rule 8 (was one each). Its faults make the next two database
// deletes or password resets answer 503 (rule 8's first test takes both); nothing in the pre-restore
// tests deletes a database or resets a password, and the 1 s timeout is of that same check.
const k = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "restore-state-unavailable:2", KILN_RESTORE_STATE_TIMEOUT_MS: "1000" } });

describe("pre-restore states (rule 6)", () => {

  test("each restore keeps the data it replaced as a backup; a fourth while three are held is 409; deleting one or their expiry frees a place", async () => {
    const { project, db, c } = await setup(k);
    await backup(k, project.id, "b1");
    const kept: string[] = [];
    for (const i of [1, 2, 3]) {
      await c.unsafe(`insert into items values (${i + 1}, 'after-${i}')`);
      await advance(k, 1);
      const done = await restore(k, project.id, { backup_name: "b1" });
      expect(done.status).toBe("completed");
      expect(await names(db.connection_string)).toEqual(["before"]);
      const states = await preRestore(k, project.id);
      expect(states).toHaveLength(i);
      const newest = states[0];
      expect(newest).toMatchObject({ source: "scheduled", size_bytes: expect.any(Number) });
      // Kept for the plan's retention (SUPERAGENT: 7 days).
      expect(new Date(newest.expires_at).getTime() - new Date(newest.created_at).getTime()).toBe(7 * 86_400_000);
      kept.push(newest.name);
    }
    expect(new Set(kept).size).toBe(3);
    // They are not manual backups and take no minute of the spacing rule: a minute after b1, seconds
    // after the last pre-restore state, a backup is allowed.
    await advance(k, 58);
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "right-after" } })).status).toBe(201);

    const refused = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    expect(refused.status).toBe(409);
    expect(refused.body.error).toMatch(/too many pre-restore states held: 3 of 3/);
    expect((await k.api("GET", dbPath(project.id))).body.status).toBe("active");

    // A pre-restore state undoes its restore: the third one holds what the third restore replaced.
    expect((await k.api("DELETE", `${dbPath(project.id)}/backups/${kept[0]}`)).status).toBe(200);
    const undo = await restore(k, project.id, { backup_name: kept[2] });
    expect(undo.status).toBe("completed");
    expect(await names(db.connection_string)).toEqual(["before", "after-3"]);
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } })).status).toBe(409);

    // Their retention ends on the platform clock.
    await advance(k, 7 * 86_400 + 120);
    expect(await preRestore(k, project.id)).toEqual([]);
    expect((await restore(k, project.id, { backup_name: "b1" })).status).toBe("completed");
    expect(await preRestore(k, project.id)).toHaveLength(1);
  }, 120_000);

  test("a restore that could not start keeps no pre-restore state", async () => {
    const { project, db } = await setup(k);
    await backup(k, project.id, "b1");
    rmSync(join(k.dataDir, "database-backups", db.id), { recursive: true, force: true });
    expect((await restore(k, project.id, { backup_name: "b1" })).status).toBe("failed");
    expect(await preRestore(k, project.id)).toEqual([]);
  });
});

describe("rule 8: delete and reset-password answer 503 when whether a restore runs cannot be determined", () => {

  test("a failed read of the restore state: 503 in the spec's error shape, nothing changed; then as usual", async () => {
    const { project, db } = await setup(k);
    const del = await k.api("DELETE", dbPath(project.id));
    expect(del.status).toBe(503);
    expect(del.body).toEqual({ error: expect.stringMatching(/cannot be determined/) });
    const reset = await k.api("POST", `${dbPath(project.id)}/reset-password`);
    expect(reset.status).toBe(503);
    expect(reset.body.error).toMatch(/cannot be determined/);
    const after = await k.api("GET", dbPath(project.id));
    expect(after.body.status).toBe("active");
    expect(after.body.connection_string).toBe(db.connection_string);
    expect((await k.api("POST", `${dbPath(project.id)}/reset-password`)).status).toBe(200);
    expect((await k.api("DELETE", dbPath(project.id))).status).toBe(204);
  });

  test.skipIf(STORE !== "postgres")("production store: the database's state held by another session past the timeout is a 503; released, the calls go through", async () => {
    const { project, db } = await setup(k);
    const store = postgres(k.databaseUrl!, { max: 1, onnotice: () => {} });
    try {
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      const locked = Promise.withResolvers<void>();
      const tx = store.begin(async (t) => {
        await t`select status from databases where id = ${db.id} for update`;
        locked.resolve();
        await held;
      });
      await locked.promise;
      const t0 = Date.now();
      const del = await k.api("DELETE", dbPath(project.id));
      expect(del.status).toBe(503);
      expect(del.body.error).toMatch(/cannot be determined .*held by another operation/);
      expect(Date.now() - t0).toBeLessThan(5000);
      expect((await k.api("POST", `${dbPath(project.id)}/reset-password`)).status).toBe(503);
      release();
      await tx;
      // The control store says the database is restoring, but no restore of it exists: undetermined too.
      await store`update databases set status = 'restoring' where id = ${db.id}`;
      const odd = await k.api("DELETE", dbPath(project.id));
      expect(odd.status).toBe(503);
      expect(odd.body.error).toMatch(/marked restoring, but no restore/);
      await store`update databases set status = 'active' where id = ${db.id}`;
      expect((await k.api("POST", `${dbPath(project.id)}/reset-password`)).status).toBe(200);
      expect((await k.api("DELETE", dbPath(project.id))).status).toBe(204);
    } finally {
      await store.end({ timeout: 1 });
    }
  });
});

describe.skipIf(STORE !== "postgres")("production engine: point in time", () => {
  // A server of its own: the archive and the base backups hold the whole server.
  let pg: PgServer;
  let k: TestKiln;
  beforeAll(async () => {
    pg = await startPgServer();
    k = await startKiln({ args: ["--controllable-clock", "--postgres-url", pg.url], env: { KILN_POSTGRES_PITR: "on" } });
  }, 120_000);
  afterAll(async () => {
    await k?.stop();
    await pg?.stop();
  });

  const windowOf = async (projectId: string) => (await k.api("GET", `${dbPath(projectId)}/backups`)).body.restore_window as { earliest_restore_at: string; latest_restore_at: string } | undefined;
  const windowReaches = (projectId: string, at: number) =>
    eventually(() => windowOf(projectId), (w) => !!w && new Date(w.latest_restore_at).getTime() >= at, 60_000);

  test("restore_to an instant: writes before it survive, writes after it are gone; the window says what is restorable", async () => {
    const { project, db, c } = await setup(k);
    // The window opens once the first base backup of the server is taken and the archive has caught up.
    const w0 = (await eventually(() => windowOf(project.id), (w) => !!w, 90_000))!;
    expect(new Date(w0.earliest_restore_at).getTime()).toBeGreaterThanOrEqual(new Date(db.created_at).getTime());
    expect(new Date(w0.latest_restore_at).getTime()).toBeLessThanOrEqual(await clockNow(k));

    await c`insert into items values (2, 'kept')`;
    await c`update items set name = 'kept-update' where id = 1`;
    // The clock moves while nothing is written: an instant inside the jump means "when the jump happened".
    await sleep(300);
    await advance(k, 10);
    const target = (await clockNow(k)) - 5000;
    await sleep(300);
    await advance(k, 10);
    await c`insert into items values (3, 'gone')`;
    await c`update items set name = 'overwritten' where id = 2`;
    await windowReaches(project.id, await clockNow(k));
    // Outside the window: 400.
    const early = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(new Date(w0.earliest_restore_at).getTime() - 1000).toISOString() } });
    expect(early.status).toBe(400);
    expect(early.body.error).toMatch(/outside the restore window/);
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date((await clockNow(k)) + 60_000).toISOString() } })).status).toBe(400);

    const done = await restore(k, project.id, { restore_to: new Date(target).toISOString() }, 120_000);
    expect(done).toMatchObject({ kind: "point_in_time", status: "completed", restore_to: new Date(target).toISOString(), error: null });
    expect(await names(db.connection_string)).toEqual(["kept-update", "kept"]);
    expect((await k.api("GET", dbPath(project.id))).body.connection_string).toBe(db.connection_string);
    // What it replaced is kept.
    expect(await preRestore(k, project.id)).toHaveLength(1);

    // Without a move of the clock: real time between two writes.
    const c2 = connect(db.connection_string);
    await c2`insert into items values (4, 'second-kept')`;
    await sleep(700);
    const t2 = await clockNow(k);
    await sleep(700);
    await c2`insert into items values (5, 'second-gone')`;
    await c2`delete from items where id = 1`;
    await windowReaches(project.id, await clockNow(k));
    // The earlier restore does not end the history: the server's WAL goes on.
    const second = await restore(k, project.id, { restore_to: new Date(t2).toISOString() }, 120_000);
    expect(second.status).toBe("completed");
    expect(await names(db.connection_string)).toEqual(["kept-update", "kept", "second-kept"]);
    // Even to before the first restore: the state at that instant, from before it.
    const third = await restore(k, project.id, { restore_to: new Date(target).toISOString() }, 120_000);
    expect(third.status).toBe("completed");
    expect(await names(db.connection_string)).toEqual(["kept-update", "kept"]);
  }, 300_000);
});

describe.skipIf(STORE !== "postgres")("production engine: point in time unavailable", () => {
  test("without pg_receivewal and pg_basebackup: no window, restore_to is a 503 naming what is missing", async () => {
    const bin = (await findPgBin())!;
    const only = mkdtempSync(join(tmpdir(), "kiln-pgbin-"));
    for (const tool of ["pg_dump", "pg_restore"]) symlinkSync(join(bin, tool), join(only, tool));
    const k = await startKiln({ args: ["--controllable-clock"], env: { KILN_POSTGRES_PITR: "on", KILN_PG_BIN: only } });
    try {
      const { project } = await setup(k);
      expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeUndefined();
      const r = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(await clockNow(k)).toISOString() } });
      expect(r.status).toBe(503);
      expect(r.body).toEqual({ error: expect.stringMatching(/point-in-time restore is unavailable: .*pg_receivewal/) });
      // Restores from backups still work.
      await backup(k, project.id, "b1");
      expect((await restore(k, project.id, { backup_name: "b1" })).status).toBe("completed");
    } finally {
      await k.stop();
      rmSync(only, { recursive: true, force: true });
    }
  });

  // One server for the next two tests: its pg_hba.conf admits no replication connection, and a role
  // without REPLICATION is refused before that matters (Kiln checks the role first). (Was a server each.)
  let pg: PgServer;
  beforeAll(async () => void (pg = await startPgServer({ noReplication: true })), 120_000);
  afterAll(async () => void (await pg?.stop()));

  test("a server whose pg_hba.conf admits no replication connection: restore_to is a 503 quoting its refusal", async () => {
    const k = await startKiln({ args: ["--controllable-clock", "--postgres-url", pg.url], env: { KILN_POSTGRES_PITR: "on" } });
    try {
      const project = await createProject(k);
      expect((await k.api("POST", `/projects/${project.id}/databases`, { body: { name: "app" } })).status).toBe(201);
      // The 503 comes once pg_receivewal has been refused (at start, within a second or so).
      const r = await eventually(
        async () => k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(await clockNow(k)).toISOString() } }),
        (x) => x.status !== 400,
        30_000,
      );
      expect(r.status).toBe(503);
      expect(r.body.error).toMatch(/refuses Kiln's WAL archive: .*pg_hba\.conf/);
      expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeUndefined();
    } finally {
      await k.stop();
    }
  }, 120_000);

  test("a role without REPLICATION: restore_to is a 503 saying so", async () => {
    const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
    await admin.unsafe(`create role plain login createdb createrole password 'plain-pass'`);
    await admin.end();
    const u = new URL(pg.url);
    u.username = "plain";
    u.password = "plain-pass";
    const k = await startKiln({ args: ["--controllable-clock", "--postgres-url", u.toString()], env: { KILN_POSTGRES_PITR: "on" } });
    try {
      const project = await createProject(k);
      expect((await k.api("POST", `/projects/${project.id}/databases`, { body: { name: "app" } })).status).toBe(201);
      const r = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(await clockNow(k)).toISOString() } });
      expect(r.status).toBe(503);
      expect(r.body.error).toMatch(/lacks REPLICATION/);
    } finally {
      await k.stop();
    }
  }, 120_000);
});
