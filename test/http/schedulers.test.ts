// Function schedulers (spec "Function schedulers", rules 1-4), driven by Kiln's controllable clock:
// no test here waits for a minute to pass.
import { describe, expect, test } from "vitest";
import { deploy, settled, tgz } from "../support/functions";
import { createProject, eventually, removeDir, startKiln, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

// The function answers "ok", except that an event with `echo` makes it fail with the whole event
// as the error, which the run records: how a test reads exactly what a tick delivered.
const CODE = {
  "index.js": `exports.handler = async (event) => { if (event && event.echo) throw new Error("EVENT " + JSON.stringify(event)); return "ok"; };`,
};

const k = useKiln({ args: ["--controllable-clock"] });

async function setup(kk: TestKiln = k) {
  const p = await createProject(kk);
  const fn = await settled(kk, p.id, (await deploy(kk, p.id, { name: "ticked", runtime: "nodejs22.x" }, tgz(CODE))).body.id);
  expect(fn.status).toBe("active");
  return { p, fn, base: `/projects/${p.id}/functions/${fn.id}/schedulers` };
}
/**
 * Kiln's clock also runs at the real rate, so a real minute boundary could pass between a test's
 * set-up and its advance and fire a tick of its own: each clock-driven test starts 20 s into a minute.
 */
async function alignToMinute(kk: TestKiln): Promise<number> {
  const now = Date.parse((await kk.api("GET", "/_kiln/clock", { token: null })).body.now);
  const target = Math.floor(now / 60_000) * 60_000 + 60_000 + 20_000;
  expect((await kk.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(target).toISOString() } })).status).toBe(200);
  return target;
}
const advance = async (kk: TestKiln, seconds: number) => expect((await kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);
const runsOf = async (kk: TestKiln, base: string, id: string) => (await kk.api("GET", `${base}/${id}/runs?limit=100`)).body.data as any[];
const everyMinute = (extra: Record<string, unknown> = {}) => ({ name: "every-minute", schedule: { kind: "cron", cron_expression: "* * * * *" }, payload: { hello: "world" }, ...extra });

describe("scheduler records", () => {
  test("create 201, get, list (function and project, with function_kind), patch, delete 204 then 404", async () => {
    const { p, fn, base } = await setup();
    const created = await k.api("POST", base, { body: { name: "nightly", enabled: true, schedule: { kind: "cron", cron_expression: "0  3 * * *" }, payload: { job: "report" } } });
    expect(created.status).toBe(201);
    const s = created.body;
    expect(s).toMatchObject({ name: "nightly", enabled: true, function_id: fn.id, function_kind: "standard", schedule: { kind: "cron", cron_expression: "0 3 * * *" }, payload: { job: "report" }, regions: [], region: "local" });
    // The next run is 03:00 UTC after now.
    const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
    const next = Date.parse(s.next_run_at);
    expect(next).toBeGreaterThan(now);
    expect(next - now).toBeLessThanOrEqual(86_400_000);
    expect(new Date(next).toISOString()).toMatch(/T03:00:00\.000Z$/);
    expect((await k.api("GET", `${base}/${s.id}`)).body).toEqual(s);
    const list = await k.api("GET", base);
    expect(list.body).toMatchObject({ data: [s], page: 1, limit: 10, total: 1, has_more: false });
    const all = await k.api("GET", `/projects/${p.id}/schedulers`);
    expect(all.body.data.map((x: any) => [x.id, x.function_kind])).toEqual([[s.id, "standard"]]);

    const patched = await k.api("PATCH", `${base}/${s.id}`, { body: { enabled: false, payload: { job: "other" } } });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ enabled: false, payload: { job: "other" }, next_run_at: null, name: "nightly" });
    expect((await k.api("PATCH", `${base}/${s.id}`, { body: {} })).status).toBe(400);
    expect((await k.api("DELETE", `${base}/${s.id}`)).status).toBe(204);
    expect((await k.api("GET", `${base}/${s.id}`)).status).toBe(404);
    expect((await k.api("DELETE", `${base}/${s.id}`)).status).toBe(404);
    // A scheduler under another function of the project is not found through this one.
    expect((await k.api("GET", `/projects/${p.id}/functions/nope/schedulers`)).status).toBe(404);
  });

  test("rule 1: standard 5-field cron only; rule 2: at most once a minute and at least once every 31 days", async () => {
    const { base } = await setup();
    const refused: Array<[string, RegExp]> = [
      ["*/10 * * * * *", /6 fields.*no seconds field/],
      ["0 0 0 * * * 2030", /7 fields/],
      ["@daily", /descriptors are not supported.*0 0 \* \* \*/],
      ["0 0 ? * *", /'\?'/],
      ["0 0 L * *", /'L'/],
      ["0 0 15W * *", /'W'/],
      ["0 0 * * 5#3", /'#'/],
      ["60 * * * *", /minute.*60/],
      ["0 0 1 1 *", /at least once every 31 days/],
      ["0 0 31 * *", /at least once every 31 days/],
      ["0 0 30 2 *", /never runs/],
      ["", /./],
    ];
    for (const [expr, message] of refused) {
      const res = await k.api("POST", base, { body: { name: `x${Math.random()}`, schedule: { kind: "cron", cron_expression: expr } } });
      expect([expr, res.status]).toEqual([expr, 400]);
      expect(res.body.error).toMatch(/cron_expression/);
      expect([expr, res.body.error]).toEqual([expr, expect.stringMatching(message)]);
    }
    for (const expr of ["0 0 1 * *", "*/5 9-17 * * MON-FRI", "0 0 13 * FRI"])
      expect((await k.api("POST", base, { body: { name: expr, schedule: { kind: "cron", cron_expression: expr } } })).status).toBe(201);
    // A changed schedule goes through the same rules.
    const s = (await k.api("GET", base)).body.data[0];
    expect((await k.api("PATCH", `${base}/${s.id}`, { body: { schedule: { kind: "cron", cron_expression: "@hourly" } } })).status).toBe(400);
  });

  test("bodies: name required and unique per function (409), kind cron, payload an object, regions exactly one deployed region", async () => {
    const { base } = await setup();
    const cron = { kind: "cron", cron_expression: "* * * * *" };
    expect((await k.api("POST", base, { body: { schedule: cron } })).status).toBe(400);
    expect((await k.api("POST", base, { body: { name: "a", schedule: { kind: "rate", cron_expression: "* * * * *" } } })).status).toBe(400);
    expect((await k.api("POST", base, { body: { name: "a", schedule: cron, payload: [1, 2] } })).status).toBe(400);
    const two = await k.api("POST", base, { body: { name: "a", schedule: cron, regions: ["local", "local"] } });
    expect(two.status).toBe(400);
    expect(two.body.error).toMatch(/exactly one/);
    const elsewhere = await k.api("POST", base, { body: { name: "a", schedule: cron, regions: ["mars"] } });
    expect(elsewhere.status).toBe(400);
    expect(elsewhere.body.error).toMatch(/'mars' is not a deployed region/);
    const explicit = await k.api("POST", base, { body: { name: "a", schedule: cron, regions: ["local"] } });
    expect(explicit.status).toBe(201);
    expect(explicit.body).toMatchObject({ regions: ["local"], region: "local" });
    const dup = await k.api("POST", base, { body: { name: "a", schedule: cron } });
    expect(dup.status).toBe(409);
    const cleared = await k.api("PATCH", `${base}/${explicit.body.id}`, { body: { regions: null } });
    expect(cleared.body).toMatchObject({ regions: [], region: "local" });
  });

  test("read-only project tokens may read schedulers but not change them; end-user and anon credentials are refused", async () => {
    const { p, base } = await setup();
    const ro = (await k.api("POST", `/projects/${p.id}/access-tokens`, { body: { name: "ro", scope: "read_only" } })).body.token;
    expect((await k.api("GET", base, { token: ro })).status).toBe(200);
    expect((await k.api("POST", base, { token: ro, body: everyMinute() })).status).toBe(403);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    expect((await k.api("GET", base, { token: anon })).status).toBe(403);
  });
});

describe("ticks on the platform clock", () => {
  test("an every-minute scheduler fires 3 times in 3 advanced minutes, with the payload plus __service_schedule", async () => {
    const { fn, base } = await setup();
    await alignToMinute(k);
    const s = (await k.api("POST", base, { body: everyMinute({ payload: { echo: true, hello: "world" } }) })).body;
    await advance(k, 180);
    const runs = await runsOf(k, base, s.id);
    expect(runs).toHaveLength(3);
    // Newest first, one a minute, each on its minute.
    const slots = runs.map((r) => Date.parse(r.scheduled_for)).reverse();
    expect(slots[1]! - slots[0]!).toBe(60_000);
    expect(slots[2]! - slots[1]!).toBe(60_000);
    for (const t of slots) expect(t % 60_000).toBe(0);
    for (const r of runs) {
      expect(r).toMatchObject({ scheduler_id: s.id, status: "failed", region: "local", http_status: 500 });
      expect(r.invocation_id).toMatch(/\w+/);
      const event = JSON.parse(/EVENT (\{.*\})/.exec(r.error)![1]!);
      expect(event).toEqual({ echo: true, hello: "world", __service_schedule: { scheduler_id: s.id, run_id: r.id, region: "local" } });
    }
    const after = (await k.api("GET", `${base}/${s.id}`)).body;
    // last_run_at is when the newest run started: its slot, or a moment after it (the clock keeps
    // running at the real rate while the tick reads it).
    expect(Date.parse(after.last_run_at)).toBe(Date.parse(runs[0].started_at));
    expect(Date.parse(after.last_run_at) - slots[2]!).toBeGreaterThanOrEqual(0);
    expect(Date.parse(after.last_run_at) - slots[2]!).toBeLessThan(5_000);
    expect(Date.parse(after.next_run_at)).toBe(slots[2]! + 60_000);
    void fn;
  });

  test("a run that succeeds is recorded with its duration; a disabled scheduler does not fire; enabled again it counts from now", async () => {
    const { base } = await setup();
    await alignToMinute(k);
    const s = (await k.api("POST", base, { body: everyMinute() })).body;
    await advance(k, 60);
    const [run] = await runsOf(k, base, s.id);
    expect(run).toMatchObject({ status: "succeeded", http_status: 200, error: null });
    expect(run.duration_ms).toBeGreaterThan(0);
    expect(Date.parse(run.finished_at)).toBeGreaterThanOrEqual(Date.parse(run.started_at));
    await k.api("PATCH", `${base}/${s.id}`, { body: { enabled: false } });
    await advance(k, 300);
    expect(await runsOf(k, base, s.id)).toHaveLength(1);
    await alignToMinute(k);
    const again = (await k.api("PATCH", `${base}/${s.id}`, { body: { enabled: true } })).body;
    const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
    expect(Date.parse(again.next_run_at) - now).toBeLessThanOrEqual(60_000);
    await advance(k, 60);
    expect(await runsOf(k, base, s.id)).toHaveLength(2);
  });

  test("a function's deletion removes its schedulers and their runs", async () => {
    const { p, fn, base } = await setup();
    await k.api("POST", base, { body: everyMinute() });
    expect((await k.api("GET", `/projects/${p.id}/schedulers`)).body.total).toBe(1);
    expect((await k.api("DELETE", `/projects/${p.id}/functions/${fn.id}`)).status).toBe(202);
    await eventually(
      () => k.api("GET", `/projects/${p.id}/functions/${fn.id}`),
      (r) => r.status === 404,
    );
    expect((await k.api("GET", `/projects/${p.id}/schedulers`)).body.total).toBe(0);
    await advance(k, 120); // nothing left to fire, and nothing fails
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("kiln schedulers and kiln clock", () => {
  const { json, run } = useCli(k, { passToken: true });
  test("create, list, get, update, runs after kiln clock advance, delete", async () => {
    const { p } = await setup();
    await alignToMinute(k);
    const created = json("schedulers", "create", "nightly", "--project", p.id, "--function", "ticked", "--cron", "*/2 * * * *", "--payload", '{"a":1}');
    expect(created).toMatchObject({ name: "nightly", schedule: { cron_expression: "*/2 * * * *" }, payload: { a: 1 }, enabled: true });
    expect(json("schedulers", "list", "--project", p.id).data.map((s: any) => s.id)).toEqual([created.id]);
    expect(json("schedulers", "get", created.id, "--project", p.id, "--function", "ticked").id).toBe(created.id);
    expect(json("schedulers", "update", created.id, "--project", p.id, "--function", "ticked", "--cron", "* * * * *").schedule.cron_expression).toBe("* * * * *");
    const before = json("clock").now;
    const moved = json("clock", "advance", "2m");
    expect(Date.parse(moved.now) - Date.parse(before)).toBeGreaterThanOrEqual(120_000);
    expect(json("schedulers", "runs", created.id, "--project", p.id, "--function", "ticked").data).toHaveLength(2);
    const bad = run("schedulers", "create", "bad", "--project", p.id, "--function", "ticked", "--cron", "@daily");
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/descriptors are not supported/);
    expect(run("clock", "advance", "soon").err).toMatch(/not a duration/);
    json("schedulers", "delete", created.id, "--project", p.id, "--function", "ticked");
    expect(json("schedulers", "list", "--project", p.id).data).toEqual([]);
  });
});

describe("ticks missed while Kiln was stopped", () => {
  test("at most one catch-up run at the next start, never a burst", async () => {
    const kk = await startKiln({ args: ["--clock-start", "2030-01-01T00:00:30Z"] });
    const dataDir = kk.dataDir;
    const databaseUrl = kk.databaseUrl;
    try {
      const { base } = await setup(kk);
      const s = (await kk.api("POST", base, { body: everyMinute() })).body;
      expect(s.next_run_at).toBe("2030-01-01T00:01:00.000Z");
      await kk.stop();
      // Ten minutes later (ten ticks missed): one run, then the next minute.
      const again = await startKiln({ dataDir, databaseUrl, args: ["--clock-start", "2030-01-01T00:10:30Z"], env: { KILN_PLATFORM_TOKEN: kk.token } });
      try {
        const runs = await eventually(() => runsOf(again, base, s.id), (r) => r.length > 0 && r.every((x) => x.status !== "running"));
        expect(runs).toHaveLength(1);
        expect(runs[0].scheduled_for).toBe("2030-01-01T00:01:00.000Z");
        expect((await again.api("GET", `${base}/${s.id}`)).body.next_run_at).toBe("2030-01-01T00:11:00.000Z");
        await advance(again, 60);
        expect(await runsOf(again, base, s.id)).toHaveLength(2);
      } finally {
        await again.stop();
      }
    } finally {
      await kk.stop();
      removeDir(dataDir);
    }
  });
});

describe.skipIf(STORE !== "postgres")("several instances on one PostgreSQL", () => {
  test("each tick fires exactly once across two instances; when one is killed the other fires the next tick", async () => {
    // Each instance holds its first three claims for 300 ms after reading them due, so both read
    // every tick as due before either claims it: only the claim keeps a tick from running twice.
    const env = { KILN_SCHEDULER_POLL_MS: "50", KILN_FAULTS: "scheduler-claim-delay:3" };
    const a = await startKiln({ args: ["--controllable-clock"], env });
    const b = await startKiln({ dataDir: undefined, databaseUrl: a.databaseUrl, args: ["--controllable-clock"], env: { ...env, KILN_PLATFORM_TOKEN: a.token } });
    try {
      const { base } = await setup(a);
      // Both clocks at the same instant, 20 s into a minute.
      const t = await alignToMinute(a);
      expect((await b.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(t + 50).toISOString() } })).status).toBe(200);
      const s = (await a.api("POST", base, { body: everyMinute() })).body;
      // b learns of the scheduler by polling the shared store (wall time: that is how instances meet).
      await new Promise((r) => setTimeout(r, 500));
      // Both clocks move over the same three minutes at once: both try to claim every tick.
      await Promise.all([advance(a, 180), advance(b, 180)]);
      const runs = await eventually(() => runsOf(a, base, s.id), (r) => r.length >= 3 && r.every((x) => x.status !== "running"));
      expect(runs).toHaveLength(3);
      expect(new Set(runs.map((r) => r.scheduled_for)).size).toBe(3);
      a.proc.kill("SIGKILL");
      await new Promise((r) => a.proc.once("exit", r));
      // b moves to the same instant a had reached, then a minute on.
      await advance(b, 60);
      const after = await eventually(() => runsOf(b, base, s.id), (r) => r.length >= 4 && r.every((x) => x.status !== "running"));
      expect(after).toHaveLength(4);
    } finally {
      await a.stop();
      await b.stop();
    }
  });
});
