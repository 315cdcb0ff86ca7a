// Database backups (manual and scheduled), the backup schedule, retention and restores, on both
// engines, with time moved by Kiln's controllable clock.
import { readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { activeDatabase, advance, backup, clockNow, dbPath, itemNames as names, itemsDatabase } from "../support/databases";
import { createProject, eventually, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });
const setup = (kiln: TestKiln = k) => itemsDatabase(kiln);

async function waitRestore(kiln: TestKiln, projectId: string, id: string) {
  return (await eventually(() => kiln.api("GET", `${dbPath(projectId)}/restores/${id}`), (x) => !["pending", "running"].includes(x.body.status), 30_000)).body;
}

describe("manual backups", () => {
  test("create is synchronous (201) with a real size; list newest first; get; delete; then 404", async () => {
    const { project, c } = await setup();
    const first = await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "first" } });
    expect(first.status).toBe(201);
    expect(first.body).toEqual({ name: "first", source: "manual", size_bytes: expect.any(Number), expires_at: null, created_at: expect.any(String) });
    expect(first.body.size_bytes).toBeGreaterThan(0);
    // A database with more in it makes a larger backup.
    // Random text (a compressed archive cannot shrink it much): ~7.7 MB as hex, ~3.8 MB as bytes.
    const pad = Array.from({ length: 30 }, () => "md5(random()::text)").join(" || ");
    await c.unsafe(`create table bulk as select g as id, ${pad} as pad from generate_series(1, 8000) g`);
    const second = await backup(k, project.id, "second-one");
    expect(second.size_bytes).toBeGreaterThan(first.body.size_bytes + 3_000_000);
    const list = await k.api("GET", `${dbPath(project.id)}/backups`);
    expect(list.status).toBe(200);
    expect(list.body.data.map((b: any) => b.name)).toEqual(["second-one", "first"]);
    expect((await k.api("GET", `${dbPath(project.id)}/backups/first`)).body).toEqual(first.body);
    expect((await k.api("GET", `${dbPath(project.id)}/backups/none`)).status).toBe(404);
    // Stats count what backups hold.
    const stats = await k.api("GET", `${dbPath(project.id)}/stats`);
    expect(stats.body.backup_storage_bytes).toBe(first.body.size_bytes + second.size_bytes);
    const del = await k.api("DELETE", `${dbPath(project.id)}/backups/first`);
    expect(del.status).toBe(200);
    expect(del.body).toEqual({ status: "deleted", message: expect.any(String) });
    expect((await k.api("GET", `${dbPath(project.id)}/backups/first`)).status).toBe(404);
    expect((await k.api("DELETE", `${dbPath(project.id)}/backups/first`)).status).toBe(404);
    expect((await k.api("GET", `${dbPath(project.id)}/stats`)).body.backup_storage_bytes).toBe(second.size_bytes);
  });

  test("rule 4: 400 invalid or reserved name; 409 duplicate and within a minute of the last; 404 database", async () => {
    const { project } = await setup();
    for (const name of ["Upper", "x".repeat(64), "a b", "", "dot.ted", "service-mine"]) {
      const r = await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name } });
      expect(r.status, name).toBe(400);
    }
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "service-x" } })).body.error).toMatch(/reserved/);
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: `a-${"b".repeat(60)}_` } })).status).toBe(201);
    const soon = await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "soon" } });
    expect(soon.status).toBe(409);
    expect(soon.body.error).toMatch(/less than a minute ago/);
    await advance(k, 50);
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "soon" } })).status).toBe(409);
    await advance(k, 11);
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "soon" } })).status).toBe(201);
    await advance(k, 61);
    const dup = await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "soon" } });
    expect(dup.status).toBe(409);
    expect(dup.body.error).toMatch(/already exists/);
    expect((await k.api("POST", `${dbPath(project.id, "nodb")}/backups`, { body: { name: "x" } })).status).toBe(404);
    expect((await k.api("GET", `${dbPath(project.id, "nodb")}/backups`)).status).toBe(404);
  });

  test("50 manual backups per database; scheduled ones are not counted", async () => {
    const { project } = await setup();
    // One scheduled backup first.
    expect((await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [{ frequency: "daily", hour: 0 }] } })).status).toBe(200);
    await advance(k, 86_400);
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.data.filter((b: any) => b.source === "scheduled")).toHaveLength(1);
    expect((await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [] } })).status).toBe(200);
    for (let i = 0; i < 50; i++) await backup(k, project.id, `m${i}`);
    await advance(k, 61);
    const over = await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "m50" } });
    expect(over.status).toBe(403);
    expect(over.body.error).toMatch(/50 manual backups/);
    expect((await k.api("DELETE", `${dbPath(project.id)}/backups/m0`)).status).toBe(200);
    expect((await k.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "m50" } })).status).toBe(201);
  }, 180_000);
});

describe("the backup schedule", () => {
  test("GET is empty at first; PUT replaces it wholesale with the plan's retention applied; validation is a 400", async () => {
    const { project } = await setup();
    expect((await k.api("GET", `${dbPath(project.id)}/backup-schedule`)).body).toEqual({ entries: [] });
    const put = await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, {
      body: {
        entries: [
          { frequency: "daily", hour: 3, day: 5 },
          { frequency: "weekly", hour: 0, day: 7, retention_seconds: 3600 },
          { frequency: "monthly", hour: 23, day: 28, retention_seconds: 999_999_999 },
        ],
      },
    });
    expect(put.status).toBe(200);
    const [daily, weekly, monthly] = put.body.entries;
    expect(daily).toMatchObject({ frequency: "daily", hour: 3, retention_seconds: 2_592_000 });
    expect(daily.day).toBeUndefined();
    expect(weekly).toMatchObject({ frequency: "weekly", hour: 0, day: 7, retention_seconds: 3600 });
    expect(monthly).toMatchObject({ frequency: "monthly", hour: 23, day: 28, retention_seconds: 2_592_000 });
    // The next runs fall where the entries say (UTC).
    expect(new Date(daily.next_run_at).getUTCHours()).toBe(3);
    expect(new Date(weekly.next_run_at).getUTCDay()).toBe(0); // Sunday
    expect(new Date(monthly.next_run_at).getUTCDate()).toBe(28);
    const now = await clockNow(k);
    for (const e of put.body.entries) {
      expect(new Date(e.next_run_at).getTime()).toBeGreaterThan(now);
      expect(new Date(e.next_run_at).getUTCMinutes()).toBe(0);
    }
    expect(new Date(daily.next_run_at).getTime() - now).toBeLessThanOrEqual(86_400_000);
    expect((await k.api("GET", `${dbPath(project.id)}/backup-schedule`)).body).toEqual(put.body);
    for (const bad of [
      { frequency: "hourly", hour: 1 },
      { frequency: "daily", hour: 24 },
      { frequency: "daily", hour: -1 },
      { frequency: "daily", hour: 1.5 },
      { frequency: "weekly", hour: 1 },
      { frequency: "weekly", hour: 1, day: 0 },
      { frequency: "weekly", hour: 1, day: 8 },
      { frequency: "monthly", hour: 1 },
      { frequency: "monthly", hour: 1, day: 29 },
      { frequency: "daily", hour: 1, retention_seconds: 0 },
    ]) {
      const r = await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [bad] } });
      expect(r.status, JSON.stringify(bad)).toBe(400);
    }
    // A refused PUT changed nothing; an empty one clears it.
    expect((await k.api("GET", `${dbPath(project.id)}/backup-schedule`)).body.entries).toHaveLength(3);
    expect((await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [] } })).body).toEqual({ entries: [] });
  });

  test("scheduled backups are taken on the platform clock, named by the service, and removed when their retention ends", async () => {
    const { project } = await setup();
    const put = await k.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [{ frequency: "daily", hour: 5, retention_seconds: 7200 }] } });
    const due = new Date(put.body.entries[0].next_run_at).getTime();
    const now = await clockNow(k);
    await advance(k, (due - now) / 1000 - 5);
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.data).toEqual([]);
    await advance(k, 10);
    const list = (await k.api("GET", `${dbPath(project.id)}/backups`)).body.data;
    expect(list).toHaveLength(1);
    const d = new Date(due);
    const stamp = `${d.toISOString().slice(0, 10).replaceAll("-", "")}-0500`;
    expect(list[0]).toMatchObject({ name: `service-daily-${stamp}`, source: "scheduled" });
    expect(list[0].size_bytes).toBeGreaterThan(0);
    expect(new Date(list[0].expires_at).getTime() - new Date(list[0].created_at).getTime()).toBe(7_200_000);
    // The next run is a day later.
    expect(new Date((await k.api("GET", `${dbPath(project.id)}/backup-schedule`)).body.entries[0].next_run_at).getTime()).toBe(due + 86_400_000);
    // Retention: gone two hours later.
    await advance(k, 7100);
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.data).toHaveLength(1);
    await advance(k, 200);
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.data).toEqual([]);
    // Scheduled backups can be deleted by hand.
    await advance(k, (due + 86_400_000 - (await clockNow(k))) / 1000 + 10);
    const next = (await k.api("GET", `${dbPath(project.id)}/backups`)).body.data;
    expect(next).toHaveLength(1);
    expect((await k.api("DELETE", `${dbPath(project.id)}/backups/${next[0].name}`)).status).toBe(200);
  });
});

describe("restores", () => {
  test("from a backup: in place, data after the backup discarded, data before intact; connection string unchanged; the state machine", async () => {
    const { project, db, c, } = await setup();
    const sk = (await k.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "svc" } })).body.key as string;
    await c`insert into items values (2, 'also-before')`;
    await backup(k, project.id, "good");
    await c`insert into items values (3, 'after')`;
    await c`update items set name = 'changed' where id = 1`;
    await c`create table later (x int)`;
    const r = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "good" } });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ kind: "snapshot", status: "pending", backup_name: "good", database_id: db.id, project_id: project.id, completed_at: null, error: null });
    const done = await waitRestore(k, project.id, r.body.id);
    expect(done).toMatchObject({ status: "completed", error: null });
    expect(done.completed_at).toEqual(expect.any(String));
    const after = await k.api("GET", dbPath(project.id));
    expect(after.body.status).toBe("active");
    expect(after.body.connection_string).toBe(db.connection_string);
    expect(await names(db.connection_string)).toEqual(["before", "also-before"]);
    const c2 = connect(db.connection_string);
    expect(await c2`select to_regclass('later') as t`).toEqual([{ t: null }]);
    const q = await k.api("POST", "/databases/app/query/select", { token: sk, body: { table: "items" } });
    expect(q.status).toBe(200);
    expect(q.body.count).toBe(2);
    // The history, newest first.
    const r2 = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "good" } });
    await waitRestore(k, project.id, r2.body.id);
    const hist = await k.api("GET", `${dbPath(project.id)}/restores`);
    expect(hist.body.data.map((x: any) => x.id)).toEqual([r2.body.id, r.body.id]);
  });

  test("rule 6: exactly one target (400), restore_to outside the window (400), absent backup (404)", async () => {
    const { project } = await setup();
    await backup(k, project.id, "b");
    const now = await clockNow(k);
    for (const body of [{}, { backup_name: "b", restore_to: new Date(now).toISOString() }])
      expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body })).status, JSON.stringify(body)).toBe(400);
    const outside = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(now + 3_600_000).toISOString() } });
    expect(outside.status).toBe(400);
    expect(outside.body.error).toMatch(/outside the restore window/);
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: "yesterday" } })).status).toBe(400);
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "nope" } })).status).toBe(404);
    expect((await k.api("GET", `${dbPath(project.id)}/restores/nope`)).status).toBe(404);
    expect((await k.api("POST", `${dbPath(project.id, "nodb")}/restores`, { body: { backup_name: "b" } })).status).toBe(404);
  });
});

describe("point in time", () => {
  test.skipIf(STORE === "postgres")("embedded: restore_to an instant keeps what was committed before it and discards what came after", async () => {
    const { project, db, c } = await setup();
    // No backup yet: no window.
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeUndefined();
    await backup(k, project.id, "base");
    const listed = (await k.api("GET", `${dbPath(project.id)}/backups`)).body;
    const now0 = await clockNow(k);
    expect(listed.restore_window).toEqual({ earliest_restore_at: expect.any(String), latest_restore_at: expect.any(String) });
    const earliest = new Date(listed.restore_window.earliest_restore_at).getTime();
    expect(earliest).toBeGreaterThanOrEqual(new Date(listed.data[0].created_at).getTime());
    expect(Math.abs(new Date(listed.restore_window.latest_restore_at).getTime() - now0)).toBeLessThan(5000);

    await advance(k, 10);
    await c`insert into items values (2, 'kept')`;
    await c`update items set name = 'kept-update' where id = 1`;
    // A transaction that begins before the instant and commits after it.
    const across = c.begin(async (tx) => {
      await tx`insert into items values (4, 'committed-after')`;
      await advance(k, 10);
    });
    await across;
    const target = (await clockNow(k)) - 5000;
    await advance(k, 10);
    await c`insert into items values (3, 'gone')`;
    await c`update items set name = 'overwritten' where id = 2`;
    // Before the window's start, or after now: 400.
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(earliest - 1000).toISOString() } })).status).toBe(400);
    expect((await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date((await clockNow(k)) + 60_000).toISOString() } })).status).toBe(400);

    const r = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(target).toISOString() } });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ kind: "point_in_time", status: "pending", restore_to: new Date(target).toISOString() });
    expect(r.body.backup_name).toBeUndefined();
    const done = await waitRestore(k, project.id, r.body.id);
    expect(done).toMatchObject({ status: "completed", error: null });
    expect(await names(db.connection_string)).toEqual(["kept-update", "kept"]);
    // It is writable, and a restore starts a new history: no window until the next backup.
    const c2 = connect(db.connection_string);
    await c2`insert into items values (5, 'new')`;
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeUndefined();
    await backup(k, project.id, "after");
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeDefined();
  });

  // Production point in time is on only with KILN_POSTGRES_PITR=on (database-restores.test.ts tests it).
  test.skipIf(STORE !== "postgres")("production, point in time off (the default): no restore window; restore_to is a 400 saying how to turn it on", async () => {
    const { project } = await setup();
    await backup(k, project.id, "base");
    expect((await k.api("GET", `${dbPath(project.id)}/backups`)).body.restore_window).toBeUndefined();
    const r = await k.api("POST", `${dbPath(project.id)}/restores`, { body: { restore_to: new Date(await clockNow(k)).toISOString() } });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/outside the restore window: there is none .*KILN_POSTGRES_PITR=on/);
  });
});

describe("restores held by a fault until the clock moves", () => {
  const kr = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "restore-start-delay:3,database-provision-delay:1" } });

  test("rule 7: backup and schedule reads answer 409 while the database has no storage yet; schedule PUT 409 (rule 5)", async () => {
    const project = await createProject(kr);
    const created = await kr.api("POST", `/projects/${project.id}/databases`, { body: { name: "app" } });
    expect(created.status).toBe(201);
    expect((await kr.api("GET", dbPath(project.id))).body.status).toBe("provisioning");
    expect((await kr.api("GET", `${dbPath(project.id)}/backups`)).status).toBe(409);
    expect((await kr.api("GET", `${dbPath(project.id)}/backups/x`)).status).toBe(409);
    expect((await kr.api("GET", `${dbPath(project.id)}/backup-schedule`)).status).toBe(409);
    expect((await kr.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [] } })).status).toBe(409);
    expect((await kr.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "x" } })).status).toBe(409);
    expect((await kr.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "x" } })).status).toBe(409);
    await advance(kr, 61);
    await eventually(() => kr.api("GET", dbPath(project.id)), (x) => x.body.status === "active");
    expect((await kr.api("GET", `${dbPath(project.id)}/backups`)).body).toEqual({ data: [] });
  });

  test("while restoring: not connectable and most operations 409; backups and restores stay readable", async () => {
    const { project, db, c } = await setup(kr);
    const sk = (await kr.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "svc" } })).body.key as string;
    await backup(kr, project.id, "b1");
    await c`insert into items values (2, 'after')`;
    const r = await kr.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    expect(r.status).toBe(202);
    const during = await kr.api("GET", dbPath(project.id));
    expect(during.body.status).toBe("restoring");
    expect(during.body.connection_string).toBeUndefined();
    await expect(c`select 1`).rejects.toThrow();
    const fresh = postgres(db.connection_string, { max: 1, onnotice: () => {}, connect_timeout: 30 });
    await expect(fresh`select 1`).rejects.toThrow(/password authentication failed/);
    await fresh.end({ timeout: 1 });
    expect((await kr.api("POST", "/databases/app/query/select", { token: sk, body: { table: "items" } })).status).toBe(409);
    const again = await kr.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    expect(again.status).toBe(409);
    expect(again.body.error).toMatch(/already in progress/);
    expect((await kr.api("DELETE", dbPath(project.id))).status).toBe(409);
    expect((await kr.api("POST", `${dbPath(project.id)}/reset-password`)).status).toBe(409);
    expect((await kr.api("POST", `${dbPath(project.id)}/backups`, { body: { name: "during" } })).status).toBe(409);
    expect((await kr.api("DELETE", `${dbPath(project.id)}/backups/b1`)).status).toBe(409);
    expect((await kr.api("PUT", `${dbPath(project.id)}/backup-schedule`, { body: { entries: [] } })).status).toBe(409);
    expect((await kr.api("POST", `${dbPath(project.id)}/branches`, { body: { name: "br" } })).status).toBe(409);
    // The attempt was held until the clock moved a minute on.
    await advance(kr, 61);
    const done = await waitRestore(kr, project.id, r.body.id);
    expect(done.status).toBe("completed");
    expect(await names(db.connection_string)).toEqual(["before"]);
  });

  test("reads are readable during a restore; a branch cannot be reset while its parent is restored", async () => {
    const { project } = await setup(kr);
    const br = await kr.api("POST", `${dbPath(project.id)}/branches`, { body: { name: "side" } });
    expect(br.status).toBe(202);
    await eventually(() => kr.api("GET", `${dbPath(project.id)}/branches/side`), (x) => x.body.status === "active", 30_000);
    await backup(kr, project.id, "b1");
    const r = await kr.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    expect(r.status).toBe(202);
    expect((await kr.api("GET", `${dbPath(project.id)}/backups`)).status).toBe(200);
    expect((await kr.api("GET", `${dbPath(project.id)}/backups/b1`)).status).toBe(200);
    expect((await kr.api("GET", `${dbPath(project.id)}/backup-schedule`)).status).toBe(200);
    expect((await kr.api("GET", `${dbPath(project.id)}/restores`)).body.data[0]).toMatchObject({ id: r.body.id, status: "pending" });
    expect((await kr.api("GET", `${dbPath(project.id)}/restores/${r.body.id}`)).status).toBe(200);
    const reset = await kr.api("POST", `${dbPath(project.id)}/branches/side/reset`);
    expect(reset.status).toBe(409);
    expect(reset.body.error).toMatch(/being restored/);
    await advance(kr, 61);
    expect((await waitRestore(kr, project.id, r.body.id)).status).toBe("completed");
  });

  test("a restore whose backup vanished ends failed and leaves the database untouched and active", async () => {
    const { project, db } = await setup(kr);
    await backup(kr, project.id, "b1");
    const r = await kr.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    expect(r.status).toBe(202);
    // The backup's files disappear before the attempt runs.
    rmSync(join(kr.dataDir, "database-backups", db.id), { recursive: true, force: true });
    await advance(kr, 61);
    const done = await waitRestore(kr, project.id, r.body.id);
    expect(done.status).toBe("failed");
    expect(done.error).toMatch(/backup no longer exists/);
    expect((await kr.api("GET", dbPath(project.id))).body.status).toBe("active");
    expect(await names(db.connection_string)).toEqual(["before"]);
  });
});

describe("restore attempts that fail", () => {
  // One Kiln whose first 4 restore attempts fail (was two Kilns, restore-fail:3 and :1): all 3 attempts
  // of the first test's restore, then the first attempt of the second test's (its retry completes). The
  // order of these two tests matters; the history test's restores end before an attempt is made (their
  // backup vanished), so they take none.
  const kf = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "restore-fail:4" } });

  test("the last failed attempt exhausts it and leaves the database failed", async () => {
    const { project } = await setup(kf);
    await backup(kf, project.id, "b1");
    const r = await kf.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    const seen: string[] = [];
    let lastUpdate = r.body.updated_at;
    for (let i = 0; i < 3; i++) {
      // Attempt i+1 is over: it ran (updated since the last look, on a clock moved 11 s on) and no longer runs.
      const x = await eventually(
        () => kf.api("GET", `${dbPath(project.id)}/restores/${r.body.id}`),
        (x) => x.body.updated_at !== lastUpdate && x.body.status !== "running",
      );
      lastUpdate = x.body.updated_at;
      seen.push(x.body.status);
      await advance(kf, 11);
    }
    expect(seen).toEqual(["pending", "pending", "exhausted"]);
    const done = await waitRestore(kf, project.id, r.body.id);
    expect(done.status).toBe("exhausted");
    expect(done.error).toMatch(/restore-fail/);
    expect((await kf.api("GET", dbPath(project.id))).body.status).toBe("failed");
    // A failed database takes no new restore.
    expect((await kf.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } })).status).toBe(409);
  });

  test("a failed attempt with tries left goes back to pending with its error, then completes", async () => {
    const { project, db, c } = await setup(kf);
    await backup(kf, project.id, "b1");
    await c`insert into items values (2, 'after')`;
    const r = await kf.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
    const retry = await eventually(() => kf.api("GET", `${dbPath(project.id)}/restores/${r.body.id}`), (x) => x.body.status === "pending" && x.body.error !== null);
    expect(retry.body.error).toMatch(/restore-fail/);
    expect((await kf.api("GET", dbPath(project.id))).body.status).toBe("restoring");
    await advance(kf, 11);
    const done = await waitRestore(kf, project.id, r.body.id);
    expect(done.status).toBe("completed");
    expect(done.error).toMatch(/restore-fail/);
    expect(await names(db.connection_string)).toEqual(["before"]);
  });

  test("the history keeps the 50 newest", async () => {
    const { project, db } = await setup(kf);
    await backup(kf, project.id, "b1");
    // Restores of a vanished backup end at once (failed, database untouched): cheap to make 51 of.
    rmSync(join(kf.dataDir, "database-backups", db.id), { recursive: true, force: true });
    const ids: string[] = [];
    for (let i = 0; i < 51; i++) {
      const r = await kf.api("POST", `${dbPath(project.id)}/restores`, { body: { backup_name: "b1" } });
      expect(r.status).toBe(202);
      ids.push(r.body.id);
      expect((await waitRestore(kf, project.id, r.body.id)).status).toBe("failed");
    }
    const hist = (await kf.api("GET", `${dbPath(project.id)}/restores`)).body.data.map((x: any) => x.id);
    expect(hist).toHaveLength(50);
    expect(hist).toEqual(ids.slice(1).reverse());
    expect((await kf.api("GET", `${dbPath(project.id)}/restores/${ids[0]}`)).status).toBe(404);
  }, 120_000);
});

describe("plans", () => {
  test("HOBBY: 403 on every backup, schedule and restore route, reads included", async () => {
    const hobby = (await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } })).body.platform_token as string;
    const project = await createProject(k, undefined, hobby);
    await activeDatabase(k, project.id, "app", hobby);
    const calls: [string, string, unknown?][] = [
      ["GET", "/backups"],
      ["POST", "/backups", { name: "x" }],
      ["GET", "/backups/x"],
      ["DELETE", "/backups/x"],
      ["GET", "/backup-schedule"],
      ["PUT", "/backup-schedule", { entries: [] }],
      ["GET", "/restores"],
      ["POST", "/restores", { backup_name: "x" }],
      ["GET", "/restores/x"],
    ];
    for (const [method, path, body] of calls) {
      const r = await k.api(method, `${dbPath(project.id)}${path}`, { token: hobby, body });
      expect(r.status, `${method} ${path}`).toBe(403);
      expect(r.body.error).toMatch(/HOBBY/);
    }
  });
});

describe("storage", () => {
  test("backups live under the data dir and go with their database", async () => {
    const { project, db } = await setup();
    await backup(k, project.id, "b1");
    expect(readdirSync(join(k.dataDir, "database-backups", db.id))).toHaveLength(1);
    expect((await k.api("DELETE", dbPath(project.id))).status).toBe(204);
    expect(() => readdirSync(join(k.dataDir, "database-backups", db.id))).toThrow();
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("the CLI", () => {
  const { run, json } = useCli(k, { passToken: true });

  test("kiln db backup create|list|schedule|delete and kiln db restore --backup", async () => {
    const { project, db, c } = await setup();
    await advance(k, 61);
    expect(json("db", "backup", "create", "app", "cli-1", "--project", project.id)).toMatchObject({ name: "cli-1", source: "manual" });
    await c`insert into items values (2, 'after')`;
    expect(json("db", "backup", "list", "app", "--project", project.id).data.map((b: any) => b.name)).toEqual(["cli-1"]);
    const sched = json("db", "backup", "schedule", "app", "--project", project.id, "--entry", "daily@3", "weekly@0:sun/7d", "monthly@23:28");
    expect(sched.entries.map((e: any) => [e.frequency, e.hour, e.day ?? null, e.retention_seconds])).toEqual([
      ["daily", 3, null, 2_592_000],
      ["weekly", 0, 7, 604_800],
      ["monthly", 23, 28, 2_592_000],
    ]);
    expect(json("db", "backup", "schedule", "app", "--project", project.id).entries).toHaveLength(3);
    expect(json("db", "backup", "schedule", "app", "--project", project.id, "--clear").entries).toEqual([]);
    expect(run("db", "backup", "schedule", "app", "--project", project.id, "--entry", "hourly@3").code).not.toBe(0);
    const restored = json("db", "restore", "app", "--project", project.id, "--backup", "cli-1");
    expect(restored).toMatchObject({ status: "completed", kind: "snapshot", backup_name: "cli-1" });
    expect(await names(db.connection_string)).toEqual(["before"]);
    expect(json("db", "restores", "app", "--project", project.id).data[0].id).toBe(restored.id);
    expect(run("db", "restore", "app", "--project", project.id).code).not.toBe(0);
    expect(run("db", "backup", "delete", "app", "cli-1", "--project", project.id).out).toMatch(/deleted/);
  });
});
