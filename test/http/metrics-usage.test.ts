// Runtime metrics (spec "Metrics query body", "Metrics query result"), project usage ("Project
// usage") and deployments across projects (GET /deployments). Time moves only by Kiln's
// controllable clock: no test waits for a minute to pass.
import { PGlite } from "@electric-sql/pglite";
import { join } from "node:path";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { deploy, settled, tgz } from "../support/functions";
import { createProject, createToken, eventually, removeDir, startKiln, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

// An invocation sleeps `ms` and answers 200, or fails (500) when asked to.
const CODE = {
  "index.js": `exports.handler = async (e) => { if (e && e.ms) await new Promise((r) => setTimeout(r, e.ms)); if (e && e.fail) throw new Error("failing on purpose"); return "ok"; };`,
};

// The metrics backend of this Kiln fails its first read (KILN_FAULTS): the file's first test is the one
// that reads it first and sees the 503.
const k = useKiln({ args: ["--controllable-clock"], env: { KILN_FAULTS: "metrics-backend:1" } });

/** The function once its deployments settled, read with `token` (an account's own platform token). */
async function settledAs(kk: TestKiln, projectId: string, fnId: string, token?: string) {
  if (!token) return settled(kk, projectId, fnId);
  const r = await eventually(
    () => kk.api("GET", `/projects/${projectId}/functions/${fnId}`, { token }),
    (x) => x.body.status !== "provisioning" && !x.body.pending_deployment_id,
    60_000,
  );
  return r.body;
}

async function setup(kk: TestKiln = k, token?: string) {
  const p = await createProject(kk, undefined, token);
  const key = (await kk.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "k" }, token })).body.key as string;
  const fn = await settledAs(kk, p.id, (await deploy(kk, p.id, { name: "timed", runtime: "nodejs22.x" }, tgz(CODE), token)).body.id, token);
  expect(fn.status).toBe("active");
  const invoke = (payload: unknown = {}) => kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload } });
  const query = (body: unknown, tok?: string) => kk.api("POST", `/projects/${p.id}/metrics/query`, { body, token: tok ?? token });
  return { p, fn, key, invoke, query };
}

const now = async (kk: TestKiln) => Date.parse((await kk.api("GET", "/_kiln/clock", { token: null })).body.now);
const advance = async (kk: TestKiln, seconds: number) => expect((await kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);
/** Moves the clock to 1 s past the next whole minute, so the next few seconds are all in one minute. */
async function startOfMinute(kk: TestKiln) {
  const t = await now(kk);
  await advance(kk, (60_000 - (t % 60_000)) / 1000 + 1);
  return Math.floor((await now(kk)) / 60_000) * 60_000;
}
const all = (window = "1h", group_by?: string) => ({
  time_range: { window },
  queries: ["request_count", "server_error_count", "availability", "p95_latency"].map((metric) => ({ id: metric, metric, ...(group_by ? { group_by } : {}) })),
});
const valueOf = (r: any, id: string) => r.body.results.find((x: any) => x.id === id);

describe("metrics query", () => {
  // First in the file: the file's Kiln fails its first metrics read. (Figures written at a stop and
  // counted after the restart: the retention test, which restarts its Kiln anyway.)
  test("503 when the metrics backend cannot serve; the next read works", async () => {
    const { query, invoke } = await setup();
    await startOfMinute(k);
    await invoke();
    await invoke();
    await advance(k, 60);
    const down = await query(all());
    expect(down.status).toBe(503);
    expect(down.body.error).toMatch(/metrics backend is unavailable/);
    expect(valueOf(await query(all()), "request_count").values[0].value).toBe(2);
  });

  test("counts, server errors, availability and p95 over a window ending at the most recent completed UTC minute", async () => {
    const { invoke, query } = await setup();
    const minute = await startOfMinute(k);
    for (let i = 0; i < 8; i++) expect((await invoke()).status).toBe(200);
    for (let i = 0; i < 2; i++) expect((await invoke({ fail: true })).status).toBeGreaterThanOrEqual(500);
    // The minute they happened in is not complete: not in the window yet.
    const early = await query(all());
    expect(early.status).toBe(200);
    expect(early.body.window.to).toBe(new Date(minute).toISOString());
    for (const r of early.body.results) expect(r).toMatchObject({ data_status: "no_data", values: [] });
    await advance(k, 60);
    const r = await query(all());
    expect(r.body.window).toEqual({ from: new Date(minute + 60_000 - 3_600_000).toISOString(), to: new Date(minute + 60_000).toISOString() });
    expect(r.body.fresh_through).toBe(r.body.window.to);
    expect(Date.parse(r.body.observed_at)).toBeGreaterThanOrEqual(minute + 60_000);
    expect(valueOf(r, "request_count")).toEqual({ id: "request_count", metric: "request_count", unit: "count", data_status: "complete", values: [{ dimensions: {}, value: 10 }] });
    expect(valueOf(r, "server_error_count")).toMatchObject({ unit: "count", data_status: "complete", values: [{ dimensions: {}, value: 2 }] });
    expect(valueOf(r, "availability")).toMatchObject({ unit: "ratio", values: [{ dimensions: {}, value: 0.8 }] });
    const p95 = valueOf(r, "p95_latency");
    expect(p95).toMatchObject({ unit: "ms", data_status: "complete" });
    expect(p95.values[0].value).toBeGreaterThan(0);
    // Another minute on, still in a 30-minute window; 31 minutes on, out of it but in the hour.
    await advance(k, 29 * 60);
    expect(valueOf(await query(all("30m")), "request_count").values[0].value).toBe(10);
    await advance(k, 2 * 60);
    expect(valueOf(await query(all("30m")), "request_count")).toMatchObject({ data_status: "no_data", values: [] });
    expect(valueOf(await query(all("1h")), "request_count").values[0].value).toBe(10);
    expect(valueOf(await query(all("24h")), "request_count").values[0].value).toBe(10);
    expect(valueOf(await query(all("7d")), "request_count").values[0].value).toBe(10);
  });

  test("p95_latency is the 95th percentile of the window's latencies (from histograms), grouped by region or resource_type", async () => {
    const { invoke, query } = await setup();
    await startOfMinute(k);
    // 18 quick invocations and 2 that take 500 ms: the 95th percentile (the 19th of 20) is a slow one.
    for (let i = 0; i < 18; i++) await invoke();
    for (let i = 0; i < 2; i++) await invoke({ ms: 500 });
    await advance(k, 60);
    const r = await query(all("1h", "region"));
    const p95 = valueOf(r, "p95_latency").values;
    expect(p95).toHaveLength(1);
    expect(p95[0].dimensions).toEqual({ region: "local" });
    expect(p95[0].value).toBeGreaterThanOrEqual(450);
    expect(p95[0].value).toBeLessThan(1500);
    expect(valueOf(r, "request_count").values).toEqual([{ dimensions: { region: "local" }, value: 20 }]);
    const byType = await query(all("1h", "resource_type"));
    expect(valueOf(byType, "request_count").values).toEqual([{ dimensions: { resource_type: "function" }, value: 20 }]);
    // 60 quick ones more: the 95th percentile (rank 76 of 80) is a quick one now, even counting a
    // cold start among the first block (moving the clock a minute on lets an idle worker retire).
    await startOfMinute(k);
    for (let i = 0; i < 60; i++) await invoke();
    await advance(k, 60);
    const after = valueOf(await query(all("1h")), "p95_latency").values[0].value;
    expect(after).toBeLessThan(400);
  });

  test("the body is checked: windows, metrics, group_by, at most 10 queries with unique ids; auth as any project read", async () => {
    const { p, key, query } = await setup();
    const bad = async (body: unknown, message: RegExp) => {
      const r = await query(body);
      expect(r.status, r.text).toBe(400);
      expect(r.body.error).toMatch(message);
    };
    await bad({ time_range: { window: "2h" }, queries: [{ id: "a", metric: "request_count" }] }, /window must be one of 30m, 1h, 24h, 7d/);
    await bad({ time_range: { window: "1h" }, queries: [{ id: "a", metric: "cpu" }] }, /metric must be one of/);
    await bad({ time_range: { window: "1h" }, queries: [{ id: "a", metric: "request_count", group_by: "function" }] }, /group_by/);
    await bad({ time_range: { window: "1h" }, queries: [] }, /at least one query/);
    await bad({ time_range: { window: "1h" }, queries: Array.from({ length: 11 }, (_, i) => ({ id: `q${i}`, metric: "request_count" })) }, /at most 10 queries/);
    await bad({ time_range: { window: "1h" }, queries: [{ id: "a", metric: "request_count" }, { id: "a", metric: "availability" }] }, /unique/);
    const ten = { time_range: { window: "1h" }, queries: Array.from({ length: 10 }, (_, i) => ({ id: `q${i}`, metric: "request_count" })) };
    expect((await query(ten)).status).toBe(200);
    const ro = await createToken(k, p.id, { scope: "read_only" });
    expect((await query(ten, ro.token)).status).toBe(200);
    expect((await query(ten, key)).status).toBe(403);
  });

  test.skipIf(STORE !== "postgres")("several instances: partial while another instance's newest minutes may be missing, with fresh_through saying how far", async () => {
    const a = await startKiln({ args: ["--controllable-clock"] });
    const b = await startKiln({ databaseUrl: a.databaseUrl, env: { KILN_PLATFORM_TOKEN: a.token }, args: ["--controllable-clock"] });
    try {
      const { p, invoke } = await setup(a);
      // Both clocks to the start of a minute, together.
      const t = await now(a);
      const step = (60_000 - (t % 60_000)) / 1000 + 1;
      await advance(a, step);
      await advance(b, step + (t - (await now(b))) / 1000);
      await invoke();
      await advance(a, 60);
      const q = (kk: TestKiln) => kk.api("POST", `/projects/${p.id}/metrics/query`, { body: all() });
      const status = (wanted: string) =>
        eventually(
          () => q(a),
          (x) => valueOf(x, "request_count").data_status === wanted,
          5000,
        );
      // b writes every second how far it has written: its clock is a minute behind a's, so a's newest
      // minute may lack b's samples (partial), and fresh_through says up to where all is in.
      const r = await status("partial");
      expect(valueOf(r, "request_count").values).toEqual([{ dimensions: {}, value: 1 }]);
      expect(Date.parse(r.body.fresh_through)).toBeLessThan(Date.parse(r.body.window.to));
      // Once b's clock has moved past a's window and b has written its minutes, a's answer is complete.
      await advance(b, 120);
      await advance(a, 60);
      const later = await status("complete");
      expect(valueOf(later, "request_count").values).toEqual([{ dimensions: {}, value: 1 }]);
      expect(later.body.fresh_through).toBe(later.body.window.to);
    } finally {
      await b.stop();
      await a.stop();
      removeDir(a.dataDir);
      removeDir(b.dataDir);
    }
  });
});

/** A project's per-minute rows (their minutes) and usage counters in the store, read after Kiln stopped. */
async function stored(kk: TestKiln, projectId: string): Promise<{ minutes: string[]; usage_hours: number }> {
  const minutes = "select minute from metric_minutes where project_id = $1 order by minute";
  const usage = "select count(*)::int as n from usage_hours where project_id = $1";
  if (STORE === "embedded") {
    const db = new PGlite(join(kk.dataDir, "control"));
    try {
      const m = (await db.query<{ minute: Date }>(minutes, [projectId])).rows;
      return { minutes: m.map((r) => new Date(r.minute).toISOString()), usage_hours: (await db.query<{ n: number }>(usage, [projectId])).rows[0]!.n };
    } finally {
      await db.close();
    }
  }
  const sql = postgres(kk.databaseUrl!, { max: 1, onnotice: () => {} });
  try {
    const m = (await sql.unsafe(minutes, [projectId])) as unknown as Array<{ minute: Date }>;
    const [u] = (await sql.unsafe(usage, [projectId])) as unknown as Array<{ n: number }>;
    return { minutes: m.map((r) => new Date(r.minute).toISOString()), usage_hours: u!.n };
  } finally {
    await sql.end();
  }
}

describe("metrics retention", () => {
  test("per-minute rows older than KILN_METRICS_RETENTION_DAYS are deleted by an hourly sweep on the platform clock; usage counters stay; the current minute's figures are written at a stop and counted after the restart", async () => {
    const DAY = 86_400;
    const env = { KILN_METRICS_RETENTION_DAYS: "8" };
    const kk = await startKiln({ args: ["--clock-start", "2030-03-01T00:00:00Z"], env });
    let again: TestKiln | undefined;
    try {
      const { p, invoke } = await setup(kk);
      const first = await startOfMinute(kk);
      expect((await invoke()).status).toBe(200);
      await advance(kk, 2 * DAY);
      const second = await startOfMinute(kk);
      expect((await invoke()).status).toBe(200);
      // Half an hour short of 8 days after the first minute: hourly sweeps ran, both minutes are kept.
      await advance(kk, (first + 8 * DAY * 1000 - 30 * 60_000 - (await now(kk))) / 1000);
      const week = await kk.api("POST", `/projects/${p.id}/metrics/query`, { body: all("7d") });
      expect(valueOf(week, "request_count").values).toEqual([{ dimensions: {}, value: 1 }]);
      // A third invocation in the current minute (and hour): held in memory, written at the stop.
      const third = await startOfMinute(kk);
      expect((await invoke()).status).toBe(200);
      const t = await now(kk);
      expect(await kk.stop()).toBe(0);
      expect(await stored(kk, p.id)).toEqual({ minutes: [first, second, third].map((m) => new Date(m).toISOString()), usage_hours: 3 });

      // An hour on (the next sweep), the first minute is older than 8 days: gone; the others stay, and
      // the minute written at the stop is counted as complete.
      again = await startKiln({ dataDir: kk.dataDir, databaseUrl: kk.databaseUrl, args: ["--clock-start", new Date(t).toISOString()], env });
      await advance(again, 3600);
      const day = await again.api("POST", `/projects/${p.id}/metrics/query`, { body: all("24h") });
      expect(valueOf(day, "request_count")).toMatchObject({ data_status: "complete", values: [{ dimensions: {}, value: 1 }] });
      const usage = await again.api("GET", `/projects/${p.id}/usage?month=2030-03`);
      expect(usage.body.metrics[0]).toMatchObject({ metric: "Function Invocations", total: 3, all_time: 3 });
      expect(await again.stop()).toBe(0);
      expect(await stored(kk, p.id)).toEqual({ minutes: [second, third].map((m) => new Date(m).toISOString()), usage_hours: 3 });
    } finally {
      await again?.stop();
      await kk.stop();
      removeDir(kk.dataDir);
    }
  }, 120_000);
});

describe("project usage", () => {
  const cli = useCli(k, { passToken: true });
  test("frontends: each frontend's requests of the month, written hours and the current minute together, most first, named even once deleted", async () => {
    const p = await createProject(k);
    const deployFrontend = async (name: string) => {
      const form = new FormData();
      form.set("name", name);
      form.set("archive", new Blob([new Uint8Array(tgz({ "dist/index.html": `<h1>${name}</h1>` }))]), "site.tgz");
      const res = await fetch(`${k.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
      expect(res.status).toBe(201);
      const id = ((await res.json()) as any).id as string;
      return (await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.body.status === "active" && !r.body.pending_deployment_id, 60_000)).body;
    };
    const a = await deployFrontend("alpha");
    const b = await deployFrontend("beta");
    const hit = async (f: any, n: number) => {
      const u = new URL(f.site_url);
      for (let i = 0; i < n; i++) expect((await fetch(`http://127.0.0.1:${u.port}/`, { headers: { host: u.host } })).status).toBe(200);
    };
    // Mid-month, so the hour moved below stays in it.
    const t = new Date(await now(k));
    const mid = Date.UTC(t.getUTCFullYear(), t.getUTCMonth() + 1, 10, 10, 0, 30);
    expect((await k.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(mid).toISOString() } })).status).toBe(200);
    const month = new Date(mid).toISOString().slice(0, 7);
    await hit(a, 2);
    await hit(b, 5);
    // An hour on: the hourly sweep has written those minutes (usage_frontend_hours); these stay in memory.
    await advance(k, 3600);
    await hit(a, 4);
    const usage = await k.api("GET", `/projects/${p.id}/usage?month=${month}`);
    expect(usage.status).toBe(200);
    expect(usage.body.frontends).toEqual([
      { frontend_id: a.id, frontend_name: "alpha", requests: 6 },
      { frontend_id: b.id, frontend_name: "beta", requests: 5 },
    ]);
    expect(usage.body.metrics[1]).toMatchObject({ metric: "Frontend Requests", total: 11 });
    const printed = cli.run("usage", "--project", p.id, "--month", month);
    expect(printed.code, printed.err).toBe(0);
    expect(printed.out).toMatch(new RegExp(`^alpha\\s+${a.id}\\s+6\\nbeta\\s+${b.id}\\s+5$`, "m"));
    // A deleted frontend's requests stay in the month's usage, under its name.
    expect((await k.api("DELETE", `/projects/${p.id}/frontends/${b.id}`)).status).toBeLessThan(300);
    expect((await k.api("GET", `/projects/${p.id}/usage?month=${month}`)).body.frontends).toEqual(usage.body.frontends);
    // The month before has none.
    const before = new Date(Date.UTC(t.getUTCFullYear(), t.getUTCMonth(), 1)).toISOString().slice(0, 7);
    expect((await k.api("GET", `/projects/${p.id}/usage?month=${before}`)).body).toMatchObject({ month: before, frontends: [] });
  });

  test("Function Invocations are counted at finish into the month's total, all_time, daily and hourly series; the other metrics are zero series", async () => {
    const kk = await startKiln({ args: ["--clock-start", "2030-01-31T22:50:00Z"] });
    try {
      const { p, invoke } = await setup(kk);
      // The deploy took some seconds of the clock: still 31 January, 22:xx.
      for (let i = 0; i < 3; i++) await invoke();
      await invoke({ fail: true });
      const usage = (month?: string) => kk.api("GET", `/projects/${p.id}/usage${month ? `?month=${month}` : ""}`);
      const jan = await usage();
      expect(jan.status).toBe(200);
      expect(jan.body).toMatchObject({ project_id: p.id, month: "2030-01", frontends: [] });
      expect(jan.body.metrics.map((m: any) => m.metric)).toEqual(["Function Invocations", "Frontend Requests", "Durable Executions", "Durable Operations", "Durable Compute (MB-Seconds)"]);
      const fi = jan.body.metrics[0];
      expect(fi).toMatchObject({ total: 4, all_time: 4 });
      expect(fi.daily).toHaveLength(31);
      expect(fi.daily[30]).toEqual({ timestamp: "2030-01-31T00:00:00.000Z", value: 4 });
      expect(fi.daily.slice(0, 30).every((d: any) => d.value === 0)).toBe(true);
      expect(fi.hourly).toHaveLength(31 * 24 - 1);
      expect(fi.hourly[fi.hourly.length - 1]).toEqual({ timestamp: "2030-01-31T22:00:00.000Z", value: 4 });
      for (const m of jan.body.metrics.slice(1)) expect(m).toMatchObject({ total: 0, all_time: 0 });
      expect(jan.body.metrics[4].daily.every((d: any) => d.value === 0)).toBe(true);
      // Into February (UTC): the default month follows the platform clock.
      await kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 2 * 3600 } });
      await invoke();
      await invoke();
      const feb = await usage();
      expect(feb.body.month).toBe("2030-02");
      expect(feb.body.metrics[0]).toMatchObject({ total: 2, all_time: 6 });
      expect(feb.body.metrics[0].daily).toEqual([{ timestamp: "2030-02-01T00:00:00.000Z", value: 2 }]);
      // 22:5x + 2 h: the first hour of February.
      expect(feb.body.metrics[0].hourly).toEqual([{ timestamp: "2030-02-01T00:00:00.000Z", value: 2 }]);
      const janAgain = await usage("2030-01");
      expect(janAgain.body.metrics[0]).toMatchObject({ total: 4, all_time: 6 });
      expect(janAgain.body.metrics[0].hourly).toHaveLength(31 * 24);
      expect((await usage("2029-12")).body.metrics[0]).toMatchObject({ total: 0, all_time: 6, daily: expect.any(Array) });
      // A month not begun yet has no days.
      expect((await usage("2031-01")).body.metrics[0]).toMatchObject({ total: 0, daily: [], hourly: [] });
      for (const bad of ["2030-13", "2030-1", "januar", "0000-01"]) expect((await usage(bad)).status).toBe(400);
    } finally {
      await kk.stop();
      removeDir(kk.dataDir);
    }
  });
});

describe("GET /deployments", () => {
  test("every deployment of the caller's projects, newest first, in the spec's envelope; a project token sees its own project only", async () => {
    // An account of its own, so no other test's projects are in the list.
    const acct = (await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "superagent" } })).body;
    const a = await setup(k, acct.platform_token);
    const redeployed = await settledAs(k, a.p.id, (await deploy(k, a.p.id, { name: "timed", runtime: "nodejs22.x" }, tgz(CODE), acct.platform_token)).body.id, acct.platform_token);
    const b = await setup(k, acct.platform_token);
    const list = await k.api("GET", "/deployments", { token: acct.platform_token });
    expect(list.status).toBe(200);
    expect(list.body).toMatchObject({ page: 1, limit: 10, total: 3, has_more: false });
    const ids = list.body.data.map((d: any) => [d.project_id, d.resource.id]);
    expect(ids).toEqual([
      [b.p.id, b.fn.id],
      [a.p.id, redeployed.id],
      [a.p.id, a.fn.id],
    ]);
    expect(list.body.data[0]).toMatchObject({ resource: { type: "function", id: b.fn.id, name: "timed" }, kind: "deploy", status: "succeeded", runtime: "nodejs22.x", error: null });
    const times = list.body.data.map((d: any) => d.created_at);
    expect(times).toEqual([...times].sort().reverse());
    const paged = await k.api("GET", "/deployments?limit=2", { token: acct.platform_token });
    expect(paged.body).toMatchObject({ total: 3, has_more: true, next: "/deployments?page=2&limit=2" });
    expect((await k.api("GET", paged.body.next, { token: acct.platform_token })).body.data.map((d: any) => d.id)).toEqual([list.body.data[2].id]);
    expect((await k.api("GET", `/deployments?project_id=${a.p.id}`, { token: acct.platform_token })).body.total).toBe(2);
    // A project token: its project's deployments only; another project of the account is refused.
    const t = (await k.api("POST", `/projects/${a.p.id}/access-tokens`, { token: acct.platform_token, body: { name: "ro", scope: "read_only" } })).body;
    const mine = await k.api("GET", "/deployments", { token: t.token });
    expect(mine.status).toBe(200);
    expect(mine.body.data.map((d: any) => d.project_id)).toEqual([a.p.id, a.p.id]);
    expect((await k.api("GET", `/deployments?project_id=${b.p.id}`, { token: t.token })).status).toBe(403);
    // Other accounts, keys and end users see nothing of it.
    expect((await k.api("GET", "/deployments")).body.data.some((d: any) => d.project_id === a.p.id)).toBe(false);
    expect((await k.api("GET", "/deployments", { token: a.key })).status).toBe(403);
    expect((await k.api("GET", "/deployments", { token: null })).status).toBe(401);
    expect((await k.api("GET", "/deployments?limit=101", { token: acct.platform_token })).status).toBe(400);
    // A deleted project's deployments leave the list.
    expect((await k.api("DELETE", `/projects/${b.p.id}`, { token: acct.platform_token })).status).toBe(202);
    expect((await k.api("GET", "/deployments", { token: acct.platform_token })).body.total).toBe(2);
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("kiln metrics, kiln usage, kiln deployments", () => {
  const cli = useCli(k, { passToken: true });

  test("print the routes' figures as tables, and their JSON with --json", async () => {
    const { p, fn, invoke } = await setup();
    await startOfMinute(k);
    await invoke();
    await invoke({ fail: true });
    await advance(k, 60);
    const m = cli.run("metrics", "--project", p.id, "--group-by", "region");
    expect(m.code, m.err).toBe(0);
    // Values carry their unit (the CLI's one grammar): counts bare, ratios in %, latencies in ms.
    expect(m.out).toMatch(/^request_count\s+complete\s+region=local\s+2$/m);
    expect(m.out).toMatch(/^server_error_count\s+complete\s+region=local\s+1$/m);
    expect(m.out).toMatch(/^availability\s+complete\s+region=local\s+50 %$/m);
    expect(cli.json("metrics", "--project", p.id, "--metric", "request_count", "--window", "30m").results[0].values[0].value).toBe(2);
    const bad = cli.run("metrics", "--project", p.id, "--window", "2h");
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/400 .*window/);
    const u = cli.run("usage", "--project", p.id);
    expect(u.code, u.err).toBe(0);
    expect(u.out).toMatch(/^Function Invocations\s+2\s+2$/m);
    expect(u.out).toMatch(/^Durable Compute \(MB-Seconds\)\s+0\s+0$/m);
    expect(cli.json("usage", "--project", p.id).metrics[0].total).toBe(2);
    const d = cli.json("deployments", "--project", p.id);
    expect(d.data.map((x: any) => x.resource.id)).toEqual([fn.id]);
    expect(cli.run("deployments", "--project", p.id).out).toMatch(new RegExp(`^\\S+\\s+${p.id}\\s+timed\\s+deploy\\s+succeeded`, "m"));
  });
});
