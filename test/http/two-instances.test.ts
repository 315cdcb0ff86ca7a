// Production profile, issue 24: two Kiln instances on one PostgreSQL (control store and managed
// databases) and one S3 bucket, load through both, kill -9 of one mid-load. Afterwards, through the
// other: no acknowledged write is lost (variables, objects' bytes, rows, lock leases), and it takes
// over what the dead one was doing: the scheduler's next tick, the durable execution it was running,
// the deployment it was building and the one queued behind it, and the lease held through it once
// that lapses, with a fencing token above every one handed out before.
import { randomBytes, randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { deploy, localServer, npmTarball, tgz } from "../support/functions";
import { createProject, eventually, removeDir, startKiln, STORE, type TestKiln } from "../support/kiln";
import { startS3Server, type S3Server } from "../support/s3-server";

// Short leases so that takeovers come within seconds (wall time): durable executions, scheduler runs,
// running deployments.
const DURABLE_LEASE_MS = 2000;
const SCHEDULER_LEASE_MS = 3000;
const DEPLOY_LEASE_MS = 2000;
const LEASE_TTL_S = 120;

const TICK = tgz({ "index.js": `exports.handler = async (e) => ({ tick: e.n ?? null, at: Date.now() });` });
// The durable handler: a first step, a step that takes a while (wall time: the kill lands in it), an
// hour's sleep on the platform clock, and a last step.
const JOURNEY = tgz({
  "index.js": `exports.handler = async (event, step) => {
    const first = await step.run("first", () => ({ r: Math.random() }));
    const slow = await step.run("slow", async () => { await new Promise((r) => setTimeout(r, event.slow_ms)); return "slow done"; });
    await step.sleep("rest", "1h");
    const last = await step.run("last", () => "last");
    return { first, slow, last };
  };`,
});

describe.skipIf(STORE !== "postgres")("two Kiln instances on one PostgreSQL and one S3, kill -9 of one mid-load", () => {
  let s3: S3Server;
  let s3StartMs = 0;
  // The package registry builds install from, held so that a build stays busy (test/support/functions.ts).
  let reg: Awaited<ReturnType<typeof localServer>>;
  const started: TestKiln[] = [];
  beforeAll(async () => {
    reg = await localServer({ "/slow.tgz": npmTarball("slow", "module.exports = (v) => v + ':built';") });
    const t0 = performance.now();
    s3 = await startS3Server();
    s3StartMs = performance.now() - t0;
  });
  afterAll(async () => {
    reg?.close();
    for (const k of started) {
      await k.stop();
      removeDir(k.dataDir);
    }
    await s3?.stop();
  });

  test("no acknowledged write lost; the survivor takes over schedulers, durable executions, the deployment queue and expired leases; fencing tokens never go back", { timeout: 240_000 }, async () => {
    const bucket = `kiln-two-${randomBytes(6).toString("hex")}`;
    const opts = (databaseUrl?: string, token?: string) => ({
      databaseUrl,
      args: ["--controllable-clock", "--s3-endpoint", s3.endPoint, "--s3-bucket", bucket],
      env: {
        KILN_S3_ACCESS_KEY: s3.accessKey,
        KILN_S3_SECRET_KEY: s3.secretKey,
        KILN_S3_REGION: s3.region,
        KILN_DURABLE_LEASE_MS: String(DURABLE_LEASE_MS),
        KILN_SCHEDULER_LEASE_MS: String(SCHEDULER_LEASE_MS),
        KILN_DEPLOY_LEASE_MS: String(DEPLOY_LEASE_MS),
        KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${reg.port}`,
        ...(token ? { KILN_PLATFORM_TOKEN: token } : {}),
      },
    });
    const t0 = performance.now();
    const a = await startKiln(opts());
    started.push(a);
    const b = await startKiln(opts(a.databaseUrl, a.token));
    started.push(b);
    const startedMs = performance.now() - t0;

    // Each instance has its own controllable clock: both at one instant, 20 s into a minute, so that
    // a 60 s advance crosses exactly one cron minute.
    const clockOf = async (k: TestKiln) => Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
    const setClock = async (k: TestKiln, ms: number) => expect((await k.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(ms).toISOString() } })).status).toBe(200);
    const advance = (k: TestKiln, seconds: number) => k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } });
    const aligned = Math.floor(Math.max(await clockOf(a), await clockOf(b)) / 60_000) * 60_000 + 80_000;
    await setClock(a, aligned);
    await setClock(b, aligned);

    // --- Seeded through A ---------------------------------------------------------------------------
    const p = await createProject(a);
    const sk = (await a.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const fnTick = (await deploy(a, p.id, { name: "tick", runtime: "nodejs22.x" }, TICK)).body;
    await eventually(() => a.api("GET", `/projects/${p.id}/functions/${fnTick.id}`), (r) => r.body.status === "active", 60_000);
    const schedBase = `/projects/${p.id}/functions/${fnTick.id}/schedulers`;
    const sched = (await a.api("POST", schedBase, { body: { name: "minutely", schedule: { kind: "cron", cron_expression: "* * * * *" }, payload: { n: 1 } } })).body;
    const runsOf = async (k: TestKiln) => (await k.api("GET", `${schedBase}/${sched.id}/runs?limit=100`)).body.data as any[];
    // The first tick, through A (B's clock stays behind until A's run is recorded).
    expect((await advance(a, 60)).status).toBe(200);
    const firstRuns = await runsOf(a);
    expect(firstRuns.map((r) => r.status)).toEqual(["succeeded"]);
    await setClock(b, await clockOf(a));

    // A database with a table for the rows.
    const db = await a.api("POST", `/projects/${p.id}/databases`, { body: { name: "app" } });
    expect(db.status, db.text).toBe(201);
    const dbRow = (await eventually(() => a.api("GET", `/projects/${p.id}/databases/app`), (r) => r.body.status !== "provisioning", 30_000)).body;
    expect(dbRow.status).toBe("active");
    const wire = connect(dbRow.connection_string);
    await wire`create table events (id text primary key, via text not null, payload text not null)`;
    await wire.end();

    // A bucket for the objects.
    expect((await a.api("POST", `/projects/${p.id}/storage/buckets`, { body: { name: "load" } })).status).toBe(201);

    // The lease held through A: two minutes on A's clock.
    const lockHeaders = (lockToken?: string) => ({ "x-service-request-id": randomUUID(), ...(lockToken ? { "x-service-lock-token": lockToken } : {}) });
    const acquire = (k: TestKiln, key: string, lockToken: string, ttl: number) => k.api("POST", `/locks/${key}/lease`, { token: sk, body: { ttl_seconds: ttl }, headers: lockHeaders(lockToken) });
    const heldToken = randomUUID();
    const held = await acquire(a, "leader", heldToken, LEASE_TTL_S);
    expect(held.status, held.text).toBe(200);
    // Every fencing token handed out, with whether its acquire ended before the kill or began after it.
    const fencing: Array<{ token: number; before: boolean; after: boolean }> = [{ token: held.body.fencing_token, before: true, after: false }];

    // The durable function, and an execution that will be inside its slow step when A dies, and one
    // asleep for the hour.
    const form = new FormData();
    form.set("name", "journey");
    form.set("runtime", "nodejs22.x");
    form.set("code", new Blob([new Uint8Array(JOURNEY)]), "code.tgz");
    const durable = (await (await fetch(`${a.url}/projects/${p.id}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${a.token}` }, body: form })).json()) as { id: string };
    await eventually(() => a.api("GET", `/projects/${p.id}/durable-functions/${durable.id}`), (r) => r.body.status === "active", 60_000);
    const execPath = (id: string) => `/projects/${p.id}/durable-functions/${durable.id}/executions/${id}`;
    const startExec = async (slowMs: number) => {
      const r = await a.api("POST", `/projects/${p.id}/durable-functions/${durable.id}/executions`, { body: { input: { slow_ms: slowMs } } });
      expect(r.status, r.text).toBe(202);
      return r.body.id as string;
    };
    const sleeper = await startExec(10);
    await eventually(() => a.api("GET", execPath(sleeper)), (r) => r.body.status === "sleeping", 30_000);

    // The deployment queue of a function whose build waits on the (held) registry: one building on A,
    // one queued behind it.
    const slowBuild = (v: string) => tgz({ "index.js": `const slow = require("slow"); exports.handler = async () => slow("${v}");`, "package.json": `{"dependencies":{"slow":"${reg.url}/slow.tgz"}}` });
    reg.hold();
    const building = (await deploy(a, p.id, { name: "builder", runtime: "nodejs22.x" }, slowBuild("first"))).body;
    const deploysOf = async (k: TestKiln) => (await k.api("GET", `/projects/${p.id}/functions/${building.id}/deployments`)).body.data as any[];
    const cutBuild = (await eventually(() => deploysOf(a), (d) => d[0]?.status === "building", 30_000))[0].id as string;
    const buildingSince = performance.now();
    const queued = (await deploy(a, p.id, { name: "builder", runtime: "nodejs22.x" }, slowBuild("second"))).body;
    expect(queued.pending_deployment_id).toEqual(expect.any(String));
    // While A lives it renews its build's lease: past a lease and two of B's sweeps, B leaves it alone.
    await new Promise((r) => setTimeout(r, Math.max(0, buildingSince + DEPLOY_LEASE_MS + 2000 - performance.now())));
    expect((await deploysOf(b)).map((d) => [d.id, d.status])).toEqual([
      [queued.pending_deployment_id, "queued"],
      [cutBuild, "building"],
    ]);

    // --- Load through both, A killed mid-load ---------------------------------------------------------
    const acked = { variables: new Map<string, string>(), objects: new Map<string, Buffer>(), rows: new Map<string, { via: string; payload: string }>() };
    /** Which kinds of write each instance acknowledged (`variable:a`, ...). */
    const kinds = new Set<string>();
    let failed = 0;
    let aDead = false;
    // Writes go on until the kill and for AFTER_KILL more (through B); never more than CAP in all.
    const AFTER_KILL = 160;
    const CAP = 2000;
    let stopAt = CAP;
    let issued = 0;
    const upload = async (k: TestKiln, path: string, bytes: Buffer) => {
      const f = new FormData();
      f.set("file", new Blob([new Uint8Array(bytes)], { type: "application/octet-stream" }), path);
      const res = await fetch(`${k.url}/storage/load/${path}`, { method: "POST", headers: { authorization: `Bearer ${sk}` }, body: f });
      await res.arrayBuffer();
      return res.status;
    };
    const op = async (k: TestKiln, n: number) => {
      const via = k === a ? "a" : "b";
      switch (n % 4) {
        case 0: {
          const name = `V_${n}`;
          const value = randomBytes(12).toString("hex");
          const r = await k.api("POST", `/projects/${p.id}/variables`, { body: { name, value } });
          if (r.status !== 201) throw new Error(`variable: ${r.status} ${r.text}`);
          acked.variables.set(name, value);
          kinds.add(`variable:${via}`);
          return;
        }
        case 1: {
          const path = `o/${n}.bin`;
          const bytes = randomBytes(1024 + (n % 7) * 3000);
          const status = await upload(k, path, bytes);
          if (status !== 200 && status !== 201) throw new Error(`upload: ${status}`);
          acked.objects.set(path, bytes);
          kinds.add(`object:${via}`);
          return;
        }
        case 2: {
          const id = `r${n}`;
          const payload = randomBytes(16).toString("hex");
          const r = await k.api("POST", "/databases/app/query/insert", { token: sk, body: { table: "events", values: { id, via, payload } } });
          if (r.status !== 200 && r.status !== 201) throw new Error(`insert: ${r.status} ${r.text}`);
          expect(r.body.data).toEqual([{ id, via, payload }]);
          acked.rows.set(id, { via, payload });
          kinds.add(`row:${via}`);
          return;
        }
        default: {
          const after = aDead;
          const r = await acquire(k, `job-${n}`, randomUUID(), 60);
          if (r.status !== 200) throw new Error(`lock: ${r.status} ${r.text}`);
          fencing.push({ token: r.body.fencing_token, before: !aDead, after });
          kinds.add(`lease:${via}`);
        }
      }
    };
    const worker = async (w: number) => {
      while (issued < stopAt) {
        const n = issued++;
        const k = aDead || (n + w) % 2 === 0 ? b : a;
        try {
          await op(k, n);
        } catch (e) {
          // Only a write sent to the dying instance may fail (it was never acknowledged).
          if (k !== a) throw e;
          failed++;
        }
      }
    };
    const doing = Promise.all(Array.from({ length: 6 }, (_, w) => worker(w)));

    // 100 writes into the load, an execution starts on A; it is inside its 6-second step (its first
    // step written, nothing after) when A dies.
    await eventually(async () => issued, (n) => n >= 100, 60_000);
    const cut = await startExec(6000);
    const beforeKill = (await eventually(() => a.api("GET", execPath(cut)), (r) => r.body.steps?.[0]?.status === "completed", 30_000)).body;
    const seenAt = performance.now();
    expect(beforeKill.status).toBe("running");
    expect(beforeKill.steps.map((s: any) => s.name)).toEqual(["first"]);
    const ackedAtKill = acked.variables.size + acked.objects.size + acked.rows.size + fencing.length - 1;
    a.proc.kill("SIGKILL");
    const killedAt = performance.now();
    aDead = true;
    const issuedAtKill = issued;
    stopAt = issued + AFTER_KILL;
    await new Promise((r) => a.proc.once("exit", r));
    // Killed within the slow step (started at most when its first step was seen written).
    expect(killedAt - seenAt).toBeLessThan(5000);
    expect(issuedAtKill).toBeLessThan(CAP);
    reg.release();
    await doing;
    const tokens = fencing.map((f) => f.token);
    const fencingAll = Math.max(...tokens);

    // --- Through B: every acknowledged write is there -------------------------------------------------
    const vars = new Map<string, string>();
    for (let page = 1; ; page++) {
      const r = await b.api("GET", `/projects/${p.id}/variables?limit=100&page=${page}`);
      expect(r.status, r.text).toBe(200);
      for (const v of r.body.data) vars.set(v.name, v.value);
      if (r.body.data.length < 100) break;
    }
    for (const [name, value] of acked.variables) expect([name, vars.get(name)]).toEqual([name, value]);
    for (const [path, bytes] of acked.objects) {
      const res = await fetch(`${b.url}/storage/load/${path}`, { headers: { authorization: `Bearer ${sk}` } });
      expect([path, res.status]).toEqual([path, 200]);
      expect(Buffer.from(await res.arrayBuffer()).equals(bytes), path).toBe(true);
    }
    const rows = await b.api("POST", "/databases/app/query/select", { token: sk, body: { table: "events", limit: 1000 } });
    expect(rows.status, rows.text).toBe(200);
    const stored = new Map<string, { via: string; payload: string }>(rows.body.data.map((r: any) => [r.id, { via: r.via, payload: r.payload }]));
    for (const [id, row] of acked.rows) expect([id, stored.get(id)]).toEqual([id, row]);
    // Each kind of write was acknowledged by both instances.
    expect([...kinds].sort()).toEqual(["lease:a", "lease:b", "object:a", "object:b", "row:a", "row:b", "variable:a", "variable:b"]);

    // --- B takes over -------------------------------------------------------------------------------
    // The lease held through A outlives A until its expiry: B reads it and refuses another owner.
    const leaseNow = await b.api("GET", "/locks/leader", { token: sk, headers: lockHeaders() });
    expect(leaseNow.body).toMatchObject({ held: true, fencing_token: held.body.fencing_token });
    expect((await acquire(b, "leader", randomUUID(), 30)).body).toEqual({ code: "lock_held" });

    // The durable execution A was running: B claims it once A's lease lapses, runs the cut step again
    // (never the completed first one), and it sleeps like the other.
    const resumed = (await eventually(() => b.api("GET", execPath(cut)), (r) => r.body.status === "sleeping", 60_000)).body;
    const takeoverMs = performance.now() - killedAt;
    expect(resumed.steps.map((s: any) => [s.name, s.status])).toEqual([
      ["first", "completed"],
      ["slow", "completed"],
      ["rest", "sleeping"],
    ]);
    expect(resumed.steps[0].attempts).toBe(1);
    expect(resumed.steps[0].output).toEqual(beforeKill.steps[0].output);

    // The deployment queue: A's build is failed as interrupted, and the deploy queued behind it is
    // built by B and serves.
    const deploys = await eventually(() => deploysOf(b), (d) => d.every((x) => !["queued", "building"].includes(x.status)), 60_000);
    expect(deploys.map((d) => [d.id, d.status])).toEqual([
      [queued.pending_deployment_id, "succeeded"],
      [cutBuild, "failed"],
    ]);
    expect(deploys[1].error).toMatch(/interrupted/);
    const builder = (await b.api("GET", `/projects/${p.id}/functions/${building.id}`)).body;
    expect(builder.status).toBe("active");
    expect(builder.pending_deployment_id ?? null).toBeNull();
    const invoked = await b.api("POST", `/functions/${building.id}/invoke`, { token: sk, body: {} });
    expect([invoked.status, invoked.body]).toEqual([200, "second:built"]);

    // The scheduler's next tick runs on B (B's clock crosses the next minute), and succeeds.
    expect((await advance(b, 60)).status).toBe(200);
    const runs = await runsOf(b);
    expect(runs.map((r) => r.status)).toEqual(["succeeded", "succeeded"]);
    expect(Date.parse(runs[0].scheduled_for) - Date.parse(runs[1].scheduled_for)).toBe(60_000);
    expect(runs[1].id).toBe(firstRuns[0].id);
    expect((await b.api("PATCH", `${schedBase}/${sched.id}`, { body: { enabled: false } })).status).toBe(200);

    // An hour on B's clock: both executions finish on B, the cut one with its first step's value from
    // before the kill.
    expect((await advance(b, 3601)).status).toBe(200);
    for (const id of [cut, sleeper]) {
      const done = (await eventually(() => b.api("GET", execPath(id)), (r) => ["completed", "failed"].includes(r.body.status), 60_000)).body;
      expect(done).toMatchObject({ status: "completed", output: { slow: "slow done", last: "last" } });
      if (id === cut) expect(done.output.first).toEqual(beforeKill.steps[0].output);
    }

    // The lease held through A lapses on B's clock (moved an hour on), and B's acquire under another
    // lock token succeeds with a fencing token above every one handed out before.
    const mine = randomUUID();
    const taken = await acquire(b, "leader", mine, 30);
    expect(taken.status, taken.text).toBe(200);
    expect(taken.body.fencing_token).toBeGreaterThan(fencingAll);
    // Tokens handed out during the load: all distinct (each a change of hands), and every one drawn
    // through B after the kill above every one acknowledged before it.
    expect(new Set(tokens).size).toBe(tokens.length);
    const before = fencing.filter((f) => f.before).map((f) => f.token);
    const after = fencing.filter((f) => f.after).map((f) => f.token);
    expect(before.length).toBeGreaterThan(5);
    expect(after.length).toBeGreaterThan(5);
    expect(Math.min(...after)).toBeGreaterThan(Math.max(...before));

    console.log(
      `two-instances: S3 server up in ${(s3StartMs / 1000).toFixed(1)} s, two Kilns in ${(startedMs / 1000).toFixed(1)} s; ` +
        `${issued} writes issued (${issuedAtKill} before the kill), ${ackedAtKill} acknowledged at the kill, ${acked.variables.size + acked.objects.size + acked.rows.size + fencing.length - 1} acknowledged in all, ${failed} refused by the dying instance; ` +
        `the cut durable execution sleeping again on B ${(takeoverMs / 1000).toFixed(1)} s after the kill`,
    );
  });
});
