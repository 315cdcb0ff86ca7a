// Log search, live tail and the log store (spec "Log entry and log search result", "Log search"):
// fields, the query grammar, cursors, time bounds, auth, build logs, retention on the platform clock,
// and logs kept by earlier versions (the embedded profile's PGlite log store among them).
import { PGlite } from "@electric-sql/pglite";
import { pg_trgm } from "@electric-sql/pglite/contrib/pg_trgm";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { FileLogStore } from "../../server/backends/logs/file-store";
import { readEvents } from "../../server/logs/sse-reader";
import { deploy, settled, tgz } from "../support/functions";
import { BUN, createProject, createToken, eventually, KILN, removeDir, ROOT, startKiln, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

// `lines`: what to print, each {out: "log"|"error"|"warn"|"raw", text}; "raw" writes to stdout as is.
const CODE = {
  "index.js": `exports.handler = async (e) => {
  for (const l of (e && e.lines) || []) {
    if (l.out === "error") console.error(l.text);
    else if (l.out === "warn") console.warn(l.text);
    else if (l.out === "raw") process.stdout.write(l.text + "\\n");
    else console.log(l.text);
  }
  // {flood: {lines, size}}: that many lines of about \`size\` characters each.
  if (e && e.flood) for (let i = 0; i < e.flood.lines; i++) console.log("flood " + i + " " + "x".repeat(e.flood.size));
  if (e && e.fail) throw new Error("handler failed on purpose");
  return "ok";
};`,
};

const k = useKiln({ args: ["--controllable-clock"] });

async function setup(kk: TestKiln = k, name = "talker") {
  const p = await createProject(kk);
  const key = (await kk.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "k" } })).body.key as string;
  const fn = await settled(kk, p.id, (await deploy(kk, p.id, { name, runtime: "nodejs22.x" }, tgz(CODE))).body.id);
  expect(fn.status).toBe("active");
  const invoke = async (payload: unknown) => {
    const r = await kk.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload } });
    return r.headers.get("x-service-invocation-id")!;
  };
  const search = (body: Record<string, unknown>, token?: string) => kk.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, ...body }, token });
  return { p, fn, key, invoke, search };
}

const bodies = (r: { body: { data: Array<{ body: unknown }> } }) => r.body.data.map((e) => (typeof e.body === "string" ? e.body : JSON.stringify(e.body)));
const advance = async (kk: TestKiln, seconds: number) => expect((await kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);

describe("log search", () => {
  test("entries carry id, timestamp, level, body (text, or the object of a JSON line), resource {type, id, name}, region; newest first", async () => {
    const { fn, invoke, search } = await setup();
    const inv = await invoke({
      lines: [
        { out: "log", text: "plain info line" },
        { out: "error", text: "went to stderr" },
        { out: "warn", text: "a warning" },
        { out: "raw", text: JSON.stringify({ level: "error", message: "card declined", order: 7 }) },
        { out: "raw", text: JSON.stringify({ severity: "WARNING", msg: "slow", ms: 900 }) },
        { out: "raw", text: JSON.stringify({ level: 50, msg: "pino error" }) },
        { out: "raw", text: "{not json" },
        { out: "raw", text: JSON.stringify({ just: "data" }) },
      ],
    });
    const r = await search({ q: `invocation.id:${inv}` });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ limit: 100, has_more: false });
    expect(r.body.next_cursor).toBeUndefined();
    const byBody = new Map<string, any>(r.body.data.map((e: any) => [typeof e.body === "string" ? e.body : e.body.message ?? e.body.msg ?? JSON.stringify(e.body), e]));
    const e = (b: string) => byBody.get(b) as any;
    expect(e("plain info line")).toMatchObject({ level: "info", region: "local", resource: { type: "function", id: fn.id, name: "talker" }, invocation_id: inv });
    expect(e("went to stderr").level).toBe("error");
    expect(e("a warning").level).toBe("warn");
    expect(e("card declined")).toMatchObject({ level: "error", body: { level: "error", message: "card declined", order: 7 } });
    expect(e("slow")).toMatchObject({ level: "warn", body: { severity: "WARNING", msg: "slow", ms: 900 } });
    expect(e("pino error")).toMatchObject({ level: "error", body: { level: 50 } });
    // Not a structured line: broken JSON, and an object with neither level nor message.
    expect(e("{not json")).toMatchObject({ level: "info", body: "{not json" });
    expect(e('{"just":"data"}')).toMatchObject({ level: "info", body: '{"just":"data"}' });
    // The platform's own line about the invocation.
    expect([...byBody.keys()].some((b) => /^invocation .* finished with status 200/.test(b))).toBe(true);
    for (const x of r.body.data) {
      expect(x.id).toMatch(/^[a-z0-9]{20}$/);
      expect(new Date(x.timestamp).toISOString()).toBe(x.timestamp);
    }
    // Newest first: (timestamp, id) descending.
    const keys = r.body.data.map((x: any) => `${x.timestamp} ${x.id}`);
    expect(keys).toEqual([...keys].sort().reverse());
    // Ids are stable: the same search gives the same entries.
    expect((await search({ q: `invocation.id:${inv}` })).body.data).toEqual(r.body.data);
  });

  test("q: free text, quoted phrases, body:, invocation.id:, level: with OR groups, region:, negation", async () => {
    const { invoke, search } = await setup();
    const a = await invoke({ lines: [{ out: "log", text: "payment accepted for order 1" }, { out: "error", text: "Payment FAILED: card declined" }] });
    const b = await invoke({ lines: [{ out: "warn", text: "retrying payment (attempt 2)" }, { out: "log", text: "shipping label printed" }, { out: "log", text: "50% done_ok" }] });
    const q = async (query: string) => bodies(await search({ q: query })).filter((x) => !x.startsWith("invocation ")).sort();
    expect(await q("payment")).toEqual(["Payment FAILED: card declined", "payment accepted for order 1", "retrying payment (attempt 2)"]);
    expect(await q("payment -declined")).toEqual(["payment accepted for order 1", "retrying payment (attempt 2)"]);
    expect(await q('"card declined"')).toEqual(["Payment FAILED: card declined"]);
    expect(await q('body:"order 1"')).toEqual(["payment accepted for order 1"]);
    expect(await q("level:error")).toEqual(["Payment FAILED: card declined"]);
    expect(await q("level:(error OR warn)")).toEqual(["Payment FAILED: card declined", "retrying payment (attempt 2)"]);
    expect(await q("level:warning")).toEqual(["retrying payment (attempt 2)"]);
    expect(await q(`invocation.id:${b} -level:warn`)).toEqual(["50% done_ok", "shipping label printed"]);
    expect(await q(`invocation.id:${a} OR shipping`)).toEqual(["Payment FAILED: card declined", "payment accepted for order 1", "shipping label printed"]);
    expect(await q("NOT region:local")).toEqual([]);
    expect((await q("region:local")).length).toBe(5);
    // LIKE wildcards are literal characters.
    expect(await q("50%")).toEqual(["50% done_ok"]);
    expect(await q("0%_d")).toEqual([]);
    expect(await q("resource.name:talker label")).toEqual(["shipping label printed"]);
    expect(await q("resource.name:other")).toEqual([]);
  });

  test("a syntax error is a 400 naming its position; bad filters are 400s; hostile queries never 500", async () => {
    const { search } = await setup();
    const bad = async (body: Record<string, unknown>, message: RegExp) => {
      const r = await search(body);
      expect(r.status, r.text).toBe(400);
      expect(r.body.error).toMatch(message);
    };
    await bad({ q: "level:(error OR warn" }, /body field 'q': invalid query at position 7: unclosed '\('/);
    await bad({ q: 'payment "card' }, /position 9: unclosed '"'/);
    await bad({ q: "levle:error" }, /position 1: unknown field 'levle'/);
    await bad({ q: "a OR" }, /position 5: expected a term after 'OR'/);
    await bad({ q: "(".repeat(40) + "a" + ")".repeat(40) }, /nests deeper than/);
    await bad({ q: "x".repeat(5000) }, /longer than 4096/);
    await bad({ limit: 0 }, /limit/);
    await bad({ limit: 1001 }, /limit.*at most 1000/);
    await bad({ cursor: "not-a-cursor" }, /cursor/);
    await bad({ start_time: "2030-01-02T00:00:00Z", end_time: "2030-01-01T00:00:00Z" }, /start_time.*after.*end_time/);
    await bad({ start_time: "yesterday" }, /start_time/);
    expect((await k.api("POST", `/projects/${(await createProject(k)).id}/logs/search`, { body: { resource: { type: "database" } } })).status).toBe(400);
    expect((await k.api("POST", `/projects/${(await createProject(k)).id}/logs/search`, { body: {} })).status).toBe(400);
    for (const q of ["'; drop table log_lines; --", "😀 ÄÖ 日本", "%_\\", "$1", "body:\\", ")(", '"', "-", "NOT NOT NOT x"]) expect((await search({ q })).status).toBeLessThan(500);
    // Text PostgreSQL cannot hold is refused like in every other body (a NUL is searched as U+FFFD, as it is stored).
    await bad({ q: "a\u0000b" }, /body field 'q': must not contain a NUL/);
    await bad({ q: "x\uD800" }, /body field 'q'/);
  });

  test("level:(error OR warn) merges the levels newest first across pages, as the full search orders them", async () => {
    const { invoke, search } = await setup();
    const lines = Array.from({ length: 40 }, (_, i) => ({ out: ["error", "warn", "log", "warn"][i % 4]!, text: `mixed ${String(i).padStart(2, "0")}` }));
    const inv = await invoke({ lines });
    const q = `level:(error OR warn) invocation.id:${inv}`;
    const all = (await search({ q, limit: 1000 })).body.data;
    expect(all.map((e: any) => e.level).sort()).toEqual([...Array(10).fill("error"), ...Array(20).fill("warn")]);
    const keys = all.map((e: any) => `${e.timestamp} ${e.id}`);
    expect(keys).toEqual([...keys].sort().reverse());
    // Printed in this order, so newest first is the reverse, whatever the level.
    expect(all.map((e: any) => e.body)).toEqual(lines.filter((l) => l.out !== "log").map((l) => l.text).reverse());
    const paged: string[] = [];
    let cursor: string | undefined;
    for (;;) {
      const r = await search({ q, limit: 7, cursor });
      expect(r.status, r.text).toBe(200);
      paged.push(...r.body.data.map((e: any) => e.id));
      if (!r.body.has_more) break;
      cursor = r.body.next_cursor;
    }
    expect(paged).toEqual(all.map((e: any) => e.id));
  });

  test("limit defaults to 100 (max 1000); cursors page on (timestamp, id) and stay stable while lines are added", async () => {
    const { invoke, search } = await setup();
    const lines = Array.from({ length: 250 }, (_, i) => ({ out: "log", text: `line ${String(i).padStart(3, "0")}` }));
    const inv = await invoke({ lines });
    const first = await search({ q: `invocation.id:${inv}` });
    expect(first.body.data).toHaveLength(100);
    expect(first.body.has_more).toBe(true);
    expect(typeof first.body.next_cursor).toBe("string");
    expect((await search({ q: `invocation.id:${inv}`, limit: 1000 })).body.data).toHaveLength(251);
    // Page through 60 at a time while another invocation adds matching lines (newer ones).
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    for (;;) {
      const r = await search({ q: `invocation.id:${inv} OR "concurrent line"`, limit: 60, cursor });
      expect(r.status, r.text).toBe(200);
      seen.push(...r.body.data.map((e: any) => e.id));
      pages++;
      await invoke({ lines: [{ out: "log", text: "concurrent line" }] });
      if (!r.body.has_more) break;
      cursor = r.body.next_cursor;
    }
    expect(pages).toBe(5);
    expect(new Set(seen).size).toBe(seen.length);
    const all = (await search({ q: `invocation.id:${inv}`, limit: 1000 })).body.data.map((e: any) => e.id);
    expect(seen.filter((id) => all.includes(id))).toEqual(all);
    // A cursor belongs to its search: with other filters it is refused.
    const r = await search({ q: "payment", cursor: first.body.next_cursor });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatch(/cursor.*other filters/);
  });

  test("start_time and end_time are inclusive bounds on the platform clock", async () => {
    const { invoke, search } = await setup();
    const early = await invoke({ lines: [{ out: "log", text: "early" }] });
    await advance(k, 3600);
    const late = await invoke({ lines: [{ out: "log", text: "late" }] });
    const all = (await search({ q: `invocation.id:${early} OR invocation.id:${late}` })).body.data;
    const earlyAt = all.find((e: any) => e.body === "early").timestamp;
    const lateAt = all.find((e: any) => e.body === "late").timestamp;
    // The line's time is the platform clock's: an hour apart.
    expect(Date.parse(lateAt) - Date.parse(earlyAt)).toBeGreaterThanOrEqual(3_600_000);
    expect(bodies(await search({ q: "early OR late", start_time: lateAt }))).toEqual(["late"]);
    expect(bodies(await search({ q: "early OR late", end_time: earlyAt }))).toEqual(["early"]);
    expect(bodies(await search({ q: "early OR late", start_time: earlyAt, end_time: earlyAt }))).toEqual(["early"]);
    expect(bodies(await search({ q: "early OR late", start_time: new Date(Date.parse(earlyAt) + 1).toISOString(), end_time: new Date(Date.parse(lateAt) - 1).toISOString() }))).toEqual([]);
  });

  test("auth: the owner's platform token or any project token (read_only too); keys, end users, other projects and accounts refused", async () => {
    const { p, invoke, search, key } = await setup();
    await invoke({ lines: [{ out: "log", text: "secret-ish" }] });
    const ro = await createToken(k, p.id, { scope: "read_only" });
    expect(bodies(await search({ q: "secret-ish" }, ro.token))).toEqual(["secret-ish"]);
    const other = await createProject(k);
    const otherToken = await createToken(k, other.id);
    expect((await search({}, otherToken.token)).status).toBe(403);
    expect((await search({}, key)).status).toBe(403);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    expect((await search({}, anon)).status).toBe(403);
    expect((await search({}, null as unknown as string)).status).toBe(401);
    const acct = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "superagent" } });
    expect((await search({}, acct.body.platform_token)).status).toBe(404);
    // An end user of the project (signed up with its anon key) cannot read its logs.
    const signup = await k.api("POST", "/auth/signup", { token: anon, body: { email: `u${Date.now()}@example.com`, password: "correct horse battery" } });
    expect(signup.status).toBe(201);
    expect((await search({}, signup.body.access_token)).status).toBe(403);
  });

  test("build logs: resource.deployments.ids (with resource.ids holding the function) gives that deployment's build lines", async () => {
    const { p, fn, search } = await setup();
    const deps = (await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data;
    const dep = deps[0];
    expect(dep.build_log.lines).toBeGreaterThan(0);
    const r = await search({ resource: { type: "function", ids: [fn.id], deployments: { ids: [dep.id] } } });
    expect(r.status).toBe(200);
    expect(r.body.data.length).toBe(dep.build_log.lines);
    expect(bodies(r)).toContain("build succeeded");
    for (const e of r.body.data) expect(e).toMatchObject({ resource: { type: "function", id: fn.id, name: "talker" }, deployment_id: dep.id, invocation_id: null });
    expect(r.body.data[r.body.data.length - 1].timestamp).toBe(dep.build_log.first_at);
    expect(r.body.data[0].timestamp).toBe(dep.build_log.last_at);
    expect(bodies(await search({ resource: { type: "function", ids: [fn.id], deployments: { ids: [dep.id] } }, q: "succeeded" }))).toEqual(["build succeeded"]);
    // Runtime searches do not mix build lines in; another function's id finds nothing.
    expect(bodies(await search({ q: "build succeeded" }))).toEqual([]);
    expect((await search({ resource: { type: "function", ids: ["nope"], deployments: { ids: [dep.id] } } })).body.data).toEqual([]);
  });

  test("resource.type frontend is accepted and empty (no frontends yet); resource.ids narrows to those functions", async () => {
    const { p, fn, invoke, search } = await setup();
    await invoke({ lines: [{ out: "log", text: "from the first" }] });
    const key = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "k2" } })).body.key;
    const second = await settled(k, p.id, (await deploy(k, p.id, { name: "second", runtime: "nodejs22.x" }, tgz(CODE))).body.id);
    await k.api("POST", `/functions/${second.id}/invoke`, { token: key, body: { payload: { lines: [{ out: "log", text: "from the second" }] } } });
    expect((await search({ resource: { type: "frontend" } })).body).toEqual({ data: [], limit: 100, has_more: false });
    expect(bodies(await search({ resource: { type: "function", ids: [fn.id] }, q: "from" }))).toEqual(["from the first"]);
    expect(bodies(await search({ resource: { type: "function", ids: [second.id] }, q: "from" }))).toEqual(["from the second"]);
    expect(bodies(await search({ q: "from" })).sort()).toEqual(["from the first", "from the second"]);
  });
});

/** An SSE reader over fetch: events as they arrive. `paused`: nothing is read until `resume()`. */
async function openTail(kk: TestKiln, projectId: string, query: Record<string, string>, token?: string, o: { paused?: boolean } = {}) {
  const ctl = new AbortController();
  const res = await fetch(`${kk.url}/projects/${projectId}/logs/tail?${new URLSearchParams(query)}`, { headers: { authorization: `Bearer ${token ?? kk.token}` }, signal: ctl.signal });
  const events: Array<{ event: string; data: any; id?: string; at: number }> = [];
  const waiters: Array<() => void> = [];
  let resume = () => {};
  const resumed = o.paused ? new Promise<void>((r) => (resume = r)) : Promise.resolve();
  const pump = (async () => {
    if (!res.ok) return;
    await resumed;
    try {
      await readEvents(res, (event, data, id) => {
        events.push({ event, data: JSON.parse(data), id, at: performance.now() });
        for (const w of waiters.splice(0)) w();
      });
    } catch {
      // aborted
    }
  })();
  const until = async (ok: () => boolean, ms = 5000) => {
    const end = performance.now() + ms;
    while (!ok()) {
      if (performance.now() > end) throw new Error(`tail: condition not met; events: ${JSON.stringify(events.map((e) => e.data?.body ?? e.data))}`);
      await new Promise<void>((r) => {
        waiters.push(r);
        setTimeout(r, 50);
      });
    }
  };
  return { res, events, until, resume, ended: pump, close: async () => (ctl.abort(), resume(), await pump) };
}

describe("live tail", () => {
  test("matching lines arrive as SSE `log` events as they are recorded, well before the store's 1 s flush; others never", async () => {
    const { p, fn, invoke } = await setup();
    const tail = await openTail(k, p.id, { q: "level:error OR keep", ids: fn.id });
    expect(tail.res.status).toBe(200);
    expect(tail.res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const t0 = performance.now();
    const inv = await invoke({ lines: [{ out: "log", text: "keep me" }, { out: "log", text: "drop me" }, { out: "error", text: "an error" }] });
    const answered = performance.now();
    await tail.until(() => tail.events.filter((e) => e.event === "log").length >= 2);
    const logs = tail.events.filter((e) => e.event === "log");
    expect(logs.map((e) => e.data.body)).toEqual(["keep me", "an error"]);
    for (const e of logs) {
      expect(e.data).toMatchObject({ resource: { type: "function", id: fn.id, name: "talker" }, invocation_id: inv, region: "local" });
      expect(e.id).toBe(e.data.id);
      // Lines are published when recorded (before the invocation answers), not after a flush.
      expect(e.at - answered).toBeLessThan(500);
    }
    expect(answered - t0).toBeGreaterThan(0);
    // The same entries as search returns for them.
    const found = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, q: `invocation.id:${inv} (level:error OR keep)` } });
    expect(found.body.data.map((e: any) => e.id).sort()).toEqual(logs.map((e) => e.id).sort());
    await tail.close();
  });

  test("backlog=N sends the newest N stored matching lines first (oldest first), then live ones, none twice", async () => {
    const { p, invoke } = await setup();
    await invoke({ lines: ["one", "two", "three"].map((text) => ({ out: "log", text: `b-${text}` })) });
    const tail = await openTail(k, p.id, { q: "b-", backlog: "2" });
    await tail.until(() => tail.events.length >= 2);
    await invoke({ lines: [{ out: "log", text: "b-four" }] });
    await tail.until(() => tail.events.length >= 3);
    expect(tail.events.map((e) => e.data.body)).toEqual(["b-two", "b-three", "b-four"]);
    await tail.close();
  });

  test("a client that reads slower than lines come is told how many it missed (`event: dropped`) instead of Kiln queueing without bound", async () => {
    const { p, invoke } = await setup();
    const tail = await openTail(k, p.id, { q: "flood" }, undefined, { paused: true });
    expect(tail.res.status).toBe(200);
    // ~23 MB of matching events while the client reads nothing: far beyond the stream's 4 MB queue
    // and what the sockets between hold (~5 MB here).
    const INVOCATIONS = 25;
    const PER = 100;
    for (let i = 0; i < INVOCATIONS; i++) await invoke({ flood: { lines: PER, size: 9000 } });
    tail.resume();
    const count = () => {
      const logs = tail.events.filter((e) => e.event === "log").length;
      const dropped = tail.events.filter((e) => e.event === "dropped").reduce((n, e) => n + e.data.count, 0);
      return { logs, dropped };
    };
    // Every line is either delivered or counted, and the count comes as soon as the client caught
    // up, without waiting for another line.
    await tail.until(() => count().logs + count().dropped === INVOCATIONS * PER, 30_000);
    const { logs, dropped } = count();
    expect(dropped).toBeGreaterThan(0);
    // What reached the client is bounded by the queue (4 MB) and socket buffers, not all that was sent.
    expect(logs * 9000).toBeLessThan(16 * 1024 * 1024);
    // Delivered lines are whole, in order, and the stream goes on after the loss.
    const firstDropped = tail.events.findIndex((e) => e.event === "dropped");
    expect(tail.events.slice(0, firstDropped).every((e) => e.event === "log" && e.data.body.length > 9000)).toBe(true);
    await invoke({ lines: [{ out: "log", text: "flood is over" }] });
    await tail.until(() => tail.events.some((e) => e.event === "log" && e.data.body === "flood is over"));
    expect(count().logs + count().dropped).toBe(INVOCATIONS * PER + 1);
    await tail.close();
  }, 120_000);

  test("the tail takes the search's filters as query parameters: errors are 400s with positions; auth as search", async () => {
    const { p, key } = await setup();
    const bad = await k.api("GET", `/projects/${p.id}/logs/tail?q=${encodeURIComponent("level:(error")}`);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/query field 'q': invalid query at position 7: unclosed '\('/);
    expect((await k.api("GET", `/projects/${p.id}/logs/tail?type=database`)).status).toBe(400);
    expect((await k.api("GET", `/projects/${p.id}/logs/tail?backlog=5000`)).status).toBe(400);
    expect((await k.api("GET", `/projects/${p.id}/logs/tail`, { token: key })).status).toBe(403);
    const ro = await createToken(k, p.id, { scope: "read_only" });
    const t = await openTail(k, p.id, {}, ro.token);
    expect(t.res.status).toBe(200);
    // At most 20 open tails per project; a closed one frees its place.
    const more = [];
    for (let i = 0; i < 19; i++) more.push(await openTail(k, p.id, {}));
    expect(more.every((x) => x.res.status === 200)).toBe(true);
    const refused = await k.api("GET", `/projects/${p.id}/logs/tail`);
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatch(/at most 20 live tails/);
    await t.close();
    const again = await eventually(() => openTail(k, p.id, {}), (x) => x.res.status === 200);
    for (const x of [again, ...more]) await x.close();
  });
});

describe.skipIf(STORE !== "postgres")("live tail across instances", () => {
  test("a tail on one instance gets the lines of invocations another instance on the same PostgreSQL serves, each once", async () => {
    // The file's Kiln is one instance (a Kiln start fewer); a second joins its store.
    const a = k;
    const b = await startKiln({ databaseUrl: a.databaseUrl, env: { KILN_PLATFORM_TOKEN: a.token } });
    try {
      // A function built on each instance (function code lives in an instance's data dir).
      const { p, fn, key } = await setup(a);
      const onB_fn = await settled(b, p.id, (await deploy(b, p.id, { name: "talker-b", runtime: "nodejs22.x" }, tgz(CODE))).body.id);
      expect(onB_fn.status).toBe("active");
      const onA = await openTail(a, p.id, { q: "across OR level:error" });
      const onB = await openTail(b, p.id, { q: "across" });
      const invoke = async (kk: TestKiln, lines: unknown[]) => {
        const r = await kk.api("POST", `/functions/${kk === a ? fn.id : onB_fn.id}/invoke`, { token: key, body: { payload: { lines } } });
        expect(r.status, r.text).toBe(200);
        return r.headers.get("x-service-invocation-id")!;
      };
      // Served by b: a's tail gets the matching lines once b has written them.
      const inv = await invoke(b, [{ out: "log", text: "across one" }, { out: "log", text: "not this" }, { out: "error", text: "an error" }]);
      await onA.until(() => onA.events.length >= 2);
      expect(onA.events.map((e) => e.data.body)).toEqual(["across one", "an error"]);
      for (const e of onA.events) expect(e.data).toMatchObject({ invocation_id: inv, resource: { type: "function", id: onB_fn.id, name: "talker-b" }, region: "local" });
      // Served by a: b's tail gets it.
      await invoke(a, [{ out: "log", text: "across two" }]);
      await invoke(a, [{ out: "log", text: "across three" }]);
      await onB.until(() => onB.events.some((e) => e.data.body === "across three"));
      await onA.until(() => onA.events.some((e) => e.data.body === "across three"));
      // Each line once on each tail: its own instance's lines are not announced back to it.
      expect(onB.events.map((e) => e.data.body)).toEqual(["across one", "across two", "across three"]);
      expect(onA.events.map((e) => e.data.body)).toEqual(["across one", "an error", "across two", "across three"]);
      await onA.close();
      await onB.close();
    } finally {
      await b.stop();
      removeDir(b.dataDir);
    }
  }, 120_000);
});

// One Kiln whose log store fails its first two reads (KILN_FAULTS), then stops with a tail open.
describe("a log store that cannot serve; stopping", () => {
  const kk = useKiln({ env: { KILN_FAULTS: "log-store:2" } });

  test("search answers 503 in the error shape with Retry-After, a tail's backlog says so in an error event; the next reads work", async () => {
    const p = await createProject(kk);
    const search = () => kk.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" } } });
    const failed = await search();
    expect(failed.status).toBe(503);
    expect(failed.body).toEqual({ error: "the log store is unavailable; retry shortly" });
    expect(failed.headers.get("retry-after")).toBe("1");
    const tail = await openTail(kk, p.id, { backlog: "5" });
    expect(tail.res.status).toBe(200);
    await tail.until(() => tail.events.length >= 1);
    expect(tail.events[0]).toMatchObject({ event: "error", data: { error: "the backlog could not be read: the log store is unavailable; retry shortly" } });
    await tail.close();
    const ok = await search();
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ data: [], has_more: false });
  });

  test("an open tail does not hold up a graceful stop: the stream ends and Kiln exits 0", async () => {
    const p = await createProject(kk);
    const tail = await openTail(kk, p.id, {});
    expect(tail.res.status).toBe(200);
    const t0 = performance.now();
    expect(await kk.stop()).toBe(0);
    expect(performance.now() - t0).toBeLessThan(10_000);
    await tail.close();
  });
});

/**
 * Rows of a project left in Kiln's stores: log lines, per-minute metrics and usage counters. Read
 * after Kiln stopped (an embedded database has one user at a time).
 */
async function storedRows(kk: TestKiln, projectId: string): Promise<{ log_lines: number; metric_minutes: number; usage_hours: number; usage_frontend_hours: number }> {
  const count = "select count(*)::int as n from %s where project_id = $1";
  if (STORE === "embedded") {
    // The embedded log store's files, read as Kiln reads them at open.
    const logs = new FileLogStore(join(kk.dataDir, "log-segments"));
    logs.open();
    const control = new PGlite(join(kk.dataDir, "control"));
    try {
      const n = async (db: PGlite, table: string) => (await db.query<{ n: number }>(count.replace("%s", table), [projectId])).rows[0]!.n;
      return { log_lines: logs.lineCount(projectId), metric_minutes: await n(control, "metric_minutes"), usage_hours: await n(control, "usage_hours"), usage_frontend_hours: await n(control, "usage_frontend_hours") };
    } finally {
      await logs.close();
      await control.close();
    }
  }
  const sql = postgres(kk.databaseUrl!, { max: 1, onnotice: () => {} });
  try {
    const n = async (table: string) => ((await sql.unsafe(count.replace("%s", table), [projectId])) as unknown as Array<{ n: number }>)[0]!.n;
    return { log_lines: await n("log_lines"), metric_minutes: await n("metric_minutes"), usage_hours: await n("usage_hours"), usage_frontend_hours: await n("usage_frontend_hours") };
  } finally {
    await sql.end();
  }
}

describe("the log store", () => {
  // One Kiln for these two (a start each before): the retention test moves its clock 45 h, and the
  // deletion test, which reads the stores once Kiln has stopped, stops it.
  describe("retention, then a project's deletion", () => {
    const kk = useKiln({ args: ["--controllable-clock"], env: { KILN_LOG_RETENTION_DAYS: "1" } });

    test("retention: lines older than KILN_LOG_RETENTION_DAYS are deleted by an hourly cleanup on the platform clock", async () => {
      const { invoke, search } = await setup(kk);
      await invoke({ lines: [{ out: "log", text: "old line" }] });
      await advance(kk, 20 * 3600);
      await invoke({ lines: [{ out: "log", text: "new line" }] });
      expect(bodies(await search({ q: "line" })).sort()).toEqual(["new line", "old line"]);
      // 23 h after the first line: still within the day.
      await advance(kk, 3 * 3600);
      expect(bodies(await search({ q: "line" })).sort()).toEqual(["new line", "old line"]);
      // Past 24 h (and the next hourly sweep): the old line is gone, the new one stays.
      await advance(kk, 2 * 3600);
      expect(bodies(await search({ q: "line" }))).toEqual(["new line"]);
      await advance(kk, 20 * 3600);
      expect(bodies(await search({ q: "line" }))).toEqual([]);
    });

    test("deleting a project removes its log lines, metrics and usage; its search, tail and metrics then 404, its open tails end; other projects keep theirs", async () => {
      const ids = { doomed: "", kept: "" };
      try {
        const doomed = await setup(kk, "doomed");
        const kept = await setup(kk, "kept");
        ids.doomed = doomed.p.id;
        ids.kept = kept.p.id;
        await doomed.invoke({ lines: [{ out: "log", text: "doomed line" }] });
        await kept.invoke({ lines: [{ out: "log", text: "kept line" }] });
        // And one request to a static site of each (usage per frontend).
        for (const p of [doomed.p, kept.p]) {
          const form = new FormData();
          form.set("name", "site");
          form.set("archive", new Blob([new Uint8Array(tgz({ "dist/index.html": "<h1>site</h1>" }))]), "site.tgz");
          const created = (await (await fetch(`${kk.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${kk.token}` }, body: form })).json()) as any;
          const f = (await eventually(() => kk.api("GET", `/projects/${p.id}/frontends/${created.id}`), (r) => r.body.status === "active", 60_000)).body;
          const u = new URL(f.site_url);
          expect((await fetch(`http://127.0.0.1:${u.port}/`, { headers: { host: u.host } })).status).toBe(200);
        }
        // An hour on: both projects' minutes are complete, and the hourly metrics sweep wrote them to the store.
        await advance(kk, 3600);
        expect(bodies(await doomed.search({ q: "line" }))).toEqual(["doomed line"]);
        const metrics = (id: string) => kk.api("POST", `/projects/${id}/metrics/query`, { body: { time_range: { window: "24h" }, queries: [{ id: "n", metric: "request_count" }] } });
        expect((await metrics(doomed.p.id)).body.results[0].values).toEqual([{ dimensions: {}, value: 2 }]);
        const tail = await openTail(kk, doomed.p.id, {});
        expect(tail.res.status).toBe(200);

        expect((await kk.api("DELETE", `/projects/${doomed.p.id}`)).status).toBe(202);
        await eventually(() => kk.api("GET", `/projects/${doomed.p.id}`), (r) => r.status === 404);
        // Its open tail ended with the project.
        await Promise.race([tail.ended, new Promise((_, fail) => setTimeout(() => fail(new Error("the deleted project's tail is still open")), 5000))]);
        expect((await doomed.search({})).status).toBe(404);
        expect((await metrics(doomed.p.id)).status).toBe(404);
        expect((await kk.api("GET", `/projects/${doomed.p.id}/usage`)).status).toBe(404);
        const t = await fetch(`${kk.url}/projects/${doomed.p.id}/logs/tail`, { headers: { authorization: `Bearer ${kk.token}` }, signal: AbortSignal.timeout(5000) });
        expect(t.status).toBe(404);
        await t.body?.cancel();
        // The other project is untouched.
        expect(bodies(await kept.search({ q: "line" }))).toEqual(["kept line"]);
        expect((await metrics(kept.p.id)).body.results[0].values).toEqual([{ dimensions: {}, value: 2 }]);
        await tail.close();
      } finally {
        expect(await kk.stop()).toBe(0);
      }
      try {
        // Nothing of the deleted project is left in the stores; the other project's rows are there.
        expect(await storedRows(kk, ids.doomed)).toEqual({ log_lines: 0, metric_minutes: 0, usage_hours: 0, usage_frontend_hours: 0 });
        const other = await storedRows(kk, ids.kept);
        expect(other.log_lines).toBeGreaterThanOrEqual(2);
        // A function's minute and a frontend's; Function Invocations and Frontend Requests.
        expect(other.metric_minutes).toBe(2);
        expect(other.usage_hours).toBe(2);
        expect(other.usage_frontend_hours).toBe(1);
      } finally {
        removeDir(kk.dataDir);
      }
    }, 120_000);
  });

  test("a log store made before segments (one row per line, a trigram index) is upgraded in place: its lines stay searchable with every filter, count in build summaries, and go by retention and with their project", async () => {
    const kk = await startKiln({ args: ["--controllable-clock"], env: { KILN_LOG_RETENTION_DAYS: "1" } });
    let again: TestKiln | undefined;
    try {
      const { p, fn, search } = await setup(kk, "upgraded");
      const dep = (await kk.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data[0];
      const now = Date.parse((await kk.api("GET", "/_kiln/clock", { token: null })).body.now);
      expect(await kk.stop()).toBe(0);

      // What the previous version's log store held: its schema (logs/001 and the pg_trgm index) and
      // 300 invocation lines from 30 to 20 hours ago (every 10th an error), 3 build lines.
      const old = [
        `create table if not exists kiln_schema (id text primary key, applied_at timestamptz not null default now())`,
        `create table log_lines (id text not null, project_id text not null, resource_type text not null, resource_id text not null, resource_name text not null,
           stream text not null, deployment_id text, invocation_id text, region text not null, level text not null, structured boolean not null, body text not null, at timestamptz not null)`,
        `create index log_lines_newest on log_lines (project_id, at desc, id desc)`,
        `create index log_lines_levels on log_lines (project_id, level, at desc, id desc) where level <> 'info'`,
        `create index log_lines_builds on log_lines (deployment_id, at, id) where stream = 'build'`,
        `create table log_imports (source text primary key, position text not null)`,
        `insert into kiln_schema (id) values ('logs/001-log-lines')`,
        `create extension if not exists pg_trgm`,
        `create index log_lines_body_trgm on log_lines using gin (body gin_trgm_ops)`,
      ];
      const rows = [
        ...Array.from({ length: 300 }, (_, i) => ({
          id: `0old${String(i).padStart(16, "0")}`,
          stream: "runtime",
          invocation_id: "oldinv",
          level: i % 10 === 0 ? "error" : "info",
          body: `old line ${String(i).padStart(3, "0")}`,
          at: new Date(now - 30 * 3_600_000 + i * 120_000).toISOString(),
        })),
        ...[1, 2, 3].map((i) => ({ id: `0oldbuild${i}00000000000`, stream: "build", invocation_id: null, level: "info", body: `old build ${i}`, at: new Date(now - 21 * 3_600_000 + i).toISOString() })),
      ].map((r) => ({ ...r, project_id: p.id, resource_type: "function", resource_id: fn.id, resource_name: "upgraded", deployment_id: dep.id, region: "local", structured: false }));
      const insert = `insert into log_lines select * from jsonb_populate_recordset(null::log_lines, $1::text::jsonb)`;
      if (STORE === "embedded") {
        // The previous version's data dir: its log store was this PGlite database, no segment files.
        removeDir(join(kk.dataDir, "log-segments"));
        removeDir(join(kk.dataDir, "logs"));
        const db = new PGlite(join(kk.dataDir, "logs"), { extensions: { pg_trgm } });
        for (const q of old) await db.query(q);
        await db.query(insert, [JSON.stringify(rows)]);
        await db.close();
      } else {
        const sql = postgres(kk.databaseUrl!, { max: 1, onnotice: () => {} });
        await sql.unsafe(`drop table if exists log_lines, log_imports, log_segments, log_tails; drop sequence if exists log_segment_batches; delete from kiln_schema where id like 'logs/%'`);
        for (const q of old) await sql.unsafe(q);
        await sql.unsafe(insert, [JSON.stringify(rows)]);
        await sql.end();
      }

      again = await startKiln({ dataDir: kk.dataDir, databaseUrl: kk.databaseUrl, args: ["--clock-start", new Date(now).toISOString()], env: { KILN_LOG_RETENTION_DAYS: "1" } });
      const a = again;
      const find = (body: Record<string, unknown>) => a.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, ...body } });
      const key = (await a.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "k2" } })).body.key;
      await a.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { lines: [{ out: "log", text: "new line after the upgrade" }] } } });
      // Old and new lines in one newest-first order, with free text, phrases, levels and invocation ids.
      const all = await find({ q: "line -invocation", limit: 1000 });
      expect(all.status, all.text).toBe(200);
      expect(bodies(all)[0]).toBe("new line after the upgrade");
      expect(bodies(all).slice(1)).toEqual(rows.filter((r) => r.stream === "runtime").map((r) => r.body).reverse());
      // The embedded profile's PGlite log store was moved (at the store's first use) into the segment files, then removed.
      if (STORE === "embedded") expect(existsSync(join(kk.dataDir, "logs"))).toBe(false);
      expect(bodies(await find({ q: '"old line 12"' }))).toEqual(["old line 129", "old line 128", "old line 127", "old line 126", "old line 125", "old line 124", "old line 123", "old line 122", "old line 121", "old line 120"]);
      expect(bodies(await find({ q: "level:error old", limit: 1000 }))).toHaveLength(30);
      expect((await find({ q: "invocation.id:oldinv" })).body.data).toHaveLength(100);
      // Paging through them: every line once, in order.
      const paged: string[] = [];
      let cursor: string | undefined;
      do {
        const r = await find({ q: "old line", limit: 70, cursor });
        paged.push(...bodies(r));
        cursor = r.body.next_cursor;
      } while (cursor);
      expect(paged).toEqual(bodies(all).slice(1));
      // Old build lines: found by deployment and counted in the deployment history.
      expect(bodies(await find({ resource: { type: "function", ids: [fn.id], deployments: { ids: [dep.id] } }, q: "old build" }))).toEqual(["old build 3", "old build 2", "old build 1"]);
      const history = (await a.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data[0];
      expect(history.build_log.lines).toBe(3);
      // Retention: an hour on, lines older than a day (those from before 23 h ago) are gone, the rest stay.
      expect((await a.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 3600 } })).status).toBe(200);
      // The sweep ran an hour after the start, which was a little after `now` (the clock also runs).
      const later = Date.parse((await a.api("GET", "/_kiln/clock", { token: null })).body.now);
      const runtime = rows.filter((r) => r.stream === "runtime");
      const left = bodies(await find({ q: "old line", limit: 1000 }));
      const must = runtime.filter((r) => Date.parse(r.at) >= later - 86_400_000).map((r) => r.body);
      const may = runtime.filter((r) => Date.parse(r.at) >= now + 3_600_000 - 86_400_000).map((r) => r.body);
      expect(must.length).toBeGreaterThan(50);
      expect(may.length).toBeLessThan(150);
      expect(left.length).toBeGreaterThanOrEqual(must.length);
      expect(left).toEqual(may.reverse().slice(0, left.length));
      // The project's deletion takes its old lines too.
      expect((await a.api("DELETE", `/projects/${p.id}`)).status).toBe(202);
      await eventually(() => a.api("GET", `/projects/${p.id}`), (r) => r.status === 404);
      expect(await a.stop()).toBe(0);
      expect((await storedRows(a, p.id)).log_lines).toBe(0);
    } finally {
      await again?.stop();
      await kk.stop();
      removeDir(kk.dataDir);
    }
  }, 180_000);

  /** The Kiln the kill -9 test leaves running for the next one. */
  let carried: TestKiln | undefined;

  test("kill -9 while lines are being written: the next start reads the store, keeps every line searched before, and new lines are searchable", async () => {
    const kk = await startKiln();
    let again: TestKiln | undefined;
    try {
      const { p, fn, invoke, search } = await setup(kk, "crashy");
      // A first burst, written and searched.
      await Promise.all(Array.from({ length: 8 }, () => invoke({ flood: { lines: 250, size: 40 } })));
      const before = await search({ q: "flood", limit: 1000 });
      expect(before.status).toBe(200);
      expect(before.body.data).toHaveLength(1000);
      const seen: string[] = before.body.data.map((e: any) => e.id);
      // A second burst, killed while its lines are being written.
      const burst = Array.from({ length: 24 }, () => invoke({ flood: { lines: 2000, size: 40 } }).catch(() => null));
      await new Promise((r) => setTimeout(r, 400));
      kk.proc.kill("SIGKILL");
      await new Promise((r) => (kk.proc.exitCode !== null || kk.proc.signalCode !== null ? r(null) : kk.proc.once("exit", r)));
      await Promise.all(burst);

      again = await startKiln({ dataDir: kk.dataDir, databaseUrl: kk.databaseUrl });
      const a = again;
      const find = (body: Record<string, unknown>) => a.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, ...body } });
      const all: string[] = [];
      let cursor: string | undefined;
      do {
        const r = await find({ q: "flood", limit: 1000, cursor });
        expect(r.status, r.text).toBe(200);
        all.push(...r.body.data.map((e: any) => e.id));
        cursor = r.body.next_cursor;
      } while (cursor);
      // Nothing searched before the crash is lost, nothing is there twice.
      expect(new Set(all).size).toBe(all.length);
      const found = new Set(all);
      expect(seen.filter((id) => !found.has(id))).toEqual([]);
      // The store takes new lines after the crash, and finds them.
      const key = (await a.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "after" } })).body.key;
      expect((await a.api("POST", `/functions/${fn.id}/invoke`, { token: key, body: { payload: { lines: [{ out: "log", text: "after the crash" }] } } })).status).toBe(200);
      expect(bodies(await find({ q: '"after the crash"' }))).toEqual(["after the crash"]);
      // The next test goes on with this Kiln (a start fewer).
      carried = again;
      again = undefined;
    } finally {
      if (again || !carried) {
        await again?.stop();
        removeDir(kk.dataDir);
      }
    }
  }, 180_000);

  test("lines survive a restart; logs kept by the previous version (function_logs, function_build_logs) are moved in and stay searchable", async () => {
    // The Kiln the kill -9 test restarted, on a project of its own (or a new one, had that test failed).
    const kk = carried ?? (await startKiln());
    carried = undefined;
    const { p, fn, invoke, search } = await setup(kk, "legacy");
    const inv = await invoke({ lines: [{ out: "log", text: "before the restart" }] });
    const dep = (await kk.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data[0];
    const builds = (await search({ resource: { type: "function", ids: [fn.id], deployments: { ids: [dep.id] } } })).body.data.length;
    expect(await kk.stop()).toBe(0);
    // What the previous version wrote: rows in the control store's function_logs / function_build_logs.
    const at = new Date(Date.now() - 60_000).toISOString();
    const rows = [
      ["0legacyline000000001", "an old invocation line", "info"],
      ["0legacyline000000002", JSON.stringify({ level: "error", message: "an old structured line" }), "info"],
    ];
    if (STORE === "embedded") {
      const db = new PGlite(join(kk.dataDir, "control"));
      for (const [id, body, level] of rows)
        await db.query(`insert into function_logs (id, project_id, function_id, deployment_id, invocation_id, region, level, body, at) values ($1, $2, $3, $4, 'oldinv', 'local', $5, $6, $7)`, [
          id,
          p.id,
          fn.id,
          dep.id,
          level,
          body,
          at,
        ]);
      await db.query(`insert into function_build_logs (deployment_id, seq, at, level, line) values ($1, 0, $2, 'info', 'an old build line'), ($1, 1, $2, 'error', 'an old build error')`, [dep.id, at]);
      await db.close();
    } else {
      const sql = postgres(kk.databaseUrl!, { max: 1, onnotice: () => {} });
      for (const [id, body, level] of rows)
        await sql`insert into function_logs (id, project_id, function_id, deployment_id, invocation_id, region, level, body, at) values (${id!}, ${p.id}, ${fn.id}, ${dep.id}, 'oldinv', 'local', ${level!}, ${body!}, ${at})`;
      await sql`insert into function_build_logs (deployment_id, seq, at, level, line) values (${dep.id}, 0, ${at}, 'info', 'an old build line'), (${dep.id}, 1, ${at}, 'error', 'an old build error')`;
      await sql.end();
    }
    const again = await startKiln({ dataDir: kk.dataDir, databaseUrl: kk.databaseUrl });
    try {
      const find = (body: Record<string, unknown>) => again.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, ...body } });
      expect(bodies(await find({ q: `invocation.id:${inv} restart` }))).toEqual(["before the restart"]);
      // Build lines are moved before Kiln listens; invocation lines in the background.
      const history = (await again.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data[0];
      expect(history.build_log.lines).toBe(builds + 2);
      const b = await find({ resource: { type: "function", ids: [fn.id], deployments: { ids: [dep.id] } }, q: "old build" });
      expect(b.body.data.map((e: any) => [e.body, e.level])).toEqual([
        ["an old build error", "error"],
        ["an old build line", "info"],
      ]);
      const old = await eventually(
        () => find({ q: "invocation.id:oldinv" }),
        (r) => r.body.data.length === 2,
      );
      expect(old.body.data.map((e: any) => [e.id, e.level, e.body])).toEqual([
        ["0legacyline000000002", "error", { level: "error", message: "an old structured line" }],
        ["0legacyline000000001", "info", "an old invocation line"],
      ]);
      expect(old.body.data[0]).toMatchObject({ resource: { type: "function", id: fn.id, name: "legacy" }, region: "local", deployment_id: dep.id });
      // Moved, not copied: a third start finds them once.
      expect(await again.stop()).toBe(0);
      const third = await startKiln({ dataDir: kk.dataDir, databaseUrl: kk.databaseUrl });
      try {
        const r = await third.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, q: "old" } });
        expect(r.body.data.map((e: any) => e.body), JSON.stringify(r.body.data)).toHaveLength(2);
        const hist = (await third.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data[0];
        expect(hist.build_log.lines).toBe(builds + 2);
      } finally {
        await third.stop();
      }
    } finally {
      await again.stop();
      removeDir(kk.dataDir);
    }
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("kiln logs", () => {
  const cli = useCli(k, { passToken: true });

  test("prints matching lines oldest first; --follow prints stored lines, then new ones as they come", async () => {
    const { p, invoke } = await setup(k, "clilogs");
    await invoke({ lines: [{ out: "log", text: "cli first" }, { out: "error", text: "cli second" }, { out: "raw", text: JSON.stringify({ level: "warn", message: "cli third" }) }] });
    const r = cli.run("logs", "--project", p.id, "--function", "clilogs", "-q", "cli");
    expect(r.code, r.err).toBe(0);
    const lines = r.out.trim().split("\n");
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(/^\S+Z {2}info {3}clilogs {2}cli first$/);
    expect(lines[1]).toMatch(/error {2}clilogs {2}cli second$/);
    expect(lines[2]).toMatch(/warn {3}clilogs {2}\{"level":"warn","message":"cli third"\}$/);
    expect(cli.json("logs", "--project", p.id, "-q", "level:error cli").data.map((e: any) => e.body)).toEqual(["cli second"]);
    const bad = cli.run("logs", "--project", p.id, "-q", "(cli");
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/400 .*position 1: unclosed '\('/);

    const child = spawn(BUN, [KILN, "--url", k.url, "--token", k.token, "logs", "--project", p.id, "--follow", "--limit", "1", "-q", "cli"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout!.on("data", (d) => (out += d));
    try {
      await eventually(async () => out, (o) => o.includes("cli third"), 15_000);
      await invoke({ lines: [{ out: "log", text: "cli live one" }] });
      await eventually(async () => out, (o) => o.includes("cli live one"), 15_000);
      expect(out).not.toContain("cli first");
    } finally {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGINT");
      expect(await exited).toBe(0);
    }
  });
});
