// Project locks (spec "Lock lease" states, "Project locks" rules 1-7, the lock rows of "Errors" and
// "Limits"), black-box against a real Kiln. Expiry, grace and the quota minute are driven by Kiln's
// controllable clock: no test waits for time to pass.
import { randomUUID } from "node:crypto";
import postgres from "postgres";
import { describe, expect, inject, test } from "vitest";
import { createProject, createToken, removeDir, startKiln, STORE, useCli, useKiln, type ApiResponse, type TestKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });

const uuid = () => randomUUID();
const SEC = 1000;

async function serviceKey(kk: TestKiln, projectId: string, body: Record<string, unknown> = { name: "locks" }): Promise<string> {
  const r = await kk.api("POST", `/projects/${projectId}/service-keys`, { body });
  if (r.status !== 201) throw new Error(`service key: ${r.status} ${r.text}`);
  return r.body.key;
}

/** The lock routes as one credential sees them; every call sends a fresh request id unless told. */
function locksOf(kk: TestKiln, sk: string) {
  const path = (key: string, lease: boolean) => `/locks/${encodeURIComponent(key)}${lease ? "/lease" : ""}`;
  const ids = (lockToken?: string, requestId: string = uuid()): Record<string, string> => ({
    "X-Service-Request-Id": requestId,
    ...(lockToken === undefined ? {} : { "X-Service-Lock-Token": lockToken }),
  });
  return {
    acquire: (key: string, lockToken: string, ttl: unknown, requestId?: string) =>
      kk.api("POST", path(key, true), { token: sk, body: { ttl_seconds: ttl }, headers: ids(lockToken, requestId) }),
    renew: (key: string, lockToken: string, ttl: unknown) => kk.api("PATCH", path(key, true), { token: sk, body: { ttl_seconds: ttl }, headers: ids(lockToken) }),
    release: (key: string, lockToken: string) => kk.api("DELETE", path(key, true), { token: sk, headers: ids(lockToken) }),
    read: (key: string) => kk.api("GET", path(key, false), { token: sk, headers: ids() }),
    force: (key: string) => kk.api("DELETE", path(key, false), { token: sk, headers: ids() }),
  };
}
type Locks = ReturnType<typeof locksOf>;

/** A fresh project (so its quota is untouched) with a full service key. */
async function setup(kk: TestKiln = k) {
  const p = await createProject(kk);
  const sk = await serviceKey(kk, p.id);
  return { p, sk, locks: locksOf(kk, sk) };
}

const clockNow = async (kk: TestKiln = k) => Date.parse((await kk.api("GET", "/_kiln/clock", { token: null })).body.now);
async function advance(kk: TestKiln, seconds: number) {
  const r = await kk.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } });
  expect(r.status).toBe(200);
}
/** Moves the clock to `plusMs` after the start of the next minute (quota windows are fixed UTC minutes). */
async function toNextMinute(kk: TestKiln, plusMs = SEC): Promise<number> {
  const minute = Math.ceil((await clockNow(kk)) / 60_000) * 60_000 + 60_000;
  const r = await kk.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(minute + plusMs).toISOString() } });
  expect(r.status).toBe(200);
  return minute;
}

function token(r: ApiResponse): number {
  if (r.status !== 200) throw new Error(`expected 200, got ${r.status} ${r.text}`);
  expect(Number.isSafeInteger(r.body.fencing_token)).toBe(true);
  return r.body.fencing_token;
}
const expiry = (r: ApiResponse) => Date.parse(r.body.expires_at);

/** Runs `op` and returns its answer with the clock read just before and after it. */
async function timed(kk: TestKiln, op: () => Promise<ApiResponse>) {
  const before = await clockNow(kk);
  const res = await op();
  const after = await clockNow(kk);
  return { res, before, after };
}

describe("acquire, renew, release, read, force release", () => {
  test("acquire 200 {expires_at = now + TTL, fencing_token}; read shows the lease; a free lock reads only {held: false}", async () => {
    const { locks } = await setup();
    expect((await locks.read("jobs:nightly")).body).toEqual({ held: false });
    const t = uuid();
    const { res, before, after } = await timed(k, () => locks.acquire("jobs:nightly", t, 30));
    expect(res.status).toBe(200);
    expect(Object.keys(res.body).sort()).toEqual(["expires_at", "fencing_token"]);
    expect(res.body.expires_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(expiry(res)).toBeGreaterThanOrEqual(before + 30 * SEC);
    expect(expiry(res)).toBeLessThanOrEqual(after + 30 * SEC);
    const read = await locks.read("jobs:nightly");
    expect(read.status).toBe(200);
    expect(read.body).toEqual({ held: true, expires_at: res.body.expires_at, fencing_token: res.body.fencing_token });
  });

  test("rule 1: acquire with the same lock token resets the expiry to now + TTL (absolute, not additive; a shorter TTL shortens it), same fencing token", async () => {
    const { locks } = await setup();
    const t = uuid();
    const first = await timed(k, () => locks.acquire("k1", t, 60));
    const f = token(first.res);
    await advance(k, 10);
    const again = await timed(k, () => locks.acquire("k1", t, 60));
    expect(token(again.res)).toBe(f);
    expect(expiry(again.res)).toBeGreaterThanOrEqual(again.before + 60 * SEC);
    expect(expiry(again.res)).toBeLessThanOrEqual(again.after + 60 * SEC);
    // Additive would be the first expiry + 60 s, at least 110 s after the first acquire.
    expect(expiry(again.res)).toBeLessThan(first.before + 100 * SEC);
    const shorter = await timed(k, () => locks.acquire("k1", t, 5));
    expect(token(shorter.res)).toBe(f);
    expect(expiry(shorter.res)).toBeGreaterThanOrEqual(shorter.before + 5 * SEC);
    expect(expiry(shorter.res)).toBeLessThanOrEqual(shorter.after + 5 * SEC);
    expect(expiry(shorter.res)).toBeLessThan(expiry(again.res));
    expect((await locks.read("k1")).body).toEqual({ held: true, expires_at: shorter.res.body.expires_at, fencing_token: f });
    // The lock token is a UUID, compared case-insensitively.
    expect(token(await locks.acquire("k1", t.toUpperCase(), 30))).toBe(f);
  });

  test("rule 2: renew by the owner more than one second before expiry sets the expiry to now + TTL (same token); within the last second → 409 lock_ownership_lost", async () => {
    const { locks } = await setup();
    const t = uuid();
    const f = token(await locks.acquire("k2", t, 10));
    await advance(k, 8);
    const renewed = await timed(k, () => locks.renew("k2", t, 10));
    expect(renewed.res.status).toBe(200);
    expect(renewed.res.body.fencing_token).toBe(f);
    expect(expiry(renewed.res)).toBeGreaterThanOrEqual(renewed.before + 10 * SEC);
    expect(expiry(renewed.res)).toBeLessThanOrEqual(renewed.after + 10 * SEC);
    // A longer TTL on renewal, then a shorter one: each is now + TTL.
    const longer = await timed(k, () => locks.renew("k2", t, 600));
    expect(expiry(longer.res)).toBeGreaterThanOrEqual(longer.before + 600 * SEC);
    const back = await timed(k, () => locks.renew("k2", t, 10));
    expect(expiry(back.res)).toBeLessThanOrEqual(back.after + 10 * SEC);
    // 9 s later at most one second is left: too late.
    await advance(k, 9);
    const late = await locks.renew("k2", t, 10);
    expect(late.status).toBe(409);
    expect(late.body).toEqual({ code: "lock_ownership_lost" });
    // A stranger's renewal, and a renewal of a free lock, are stale owners too.
    expect((await locks.renew("k2", uuid(), 10)).body).toEqual({ code: "lock_ownership_lost" });
    expect((await locks.renew("never-taken", uuid(), 10)).body).toEqual({ code: "lock_ownership_lost" });
  });

  test("rule 3: another lock token gets 409 lock_held while the lease lives; the lease is unchanged", async () => {
    const { locks } = await setup();
    const t = uuid();
    const first = await locks.acquire("k3", t, 30);
    const other = await locks.acquire("k3", uuid(), 30);
    expect(other.status).toBe(409);
    expect(other.body).toEqual({ code: "lock_held" });
    expect((await locks.read("k3")).body).toEqual({ held: true, ...first.body });
  });

  test("a 5 s lease lapses: in the grace second others get lock_held, the owner lock_ownership_lost, and it reads held; then another token takes over with a higher fencing token", async () => {
    const { locks } = await setup();
    const a = uuid();
    const b = uuid();
    const fa = token(await locks.acquire("k4", a, 5));
    await advance(k, 5);
    // Expired, within its grace second: unavailable to everyone (sent at once: the second is wall time too).
    const [other, own, renew, grace] = await Promise.all([locks.acquire("k4", b, 30), locks.acquire("k4", a, 30), locks.renew("k4", a, 30), locks.read("k4")]);
    expect(other.status).toBe(409);
    expect(other.body).toEqual({ code: "lock_held" });
    expect(own.status).toBe(409);
    expect(own.body).toEqual({ code: "lock_ownership_lost" });
    expect(renew.body).toEqual({ code: "lock_ownership_lost" });
    expect(grace.body).toMatchObject({ held: true, fencing_token: fa });
    // Rule 4: one second later the lock reads free, and an acquire succeeds.
    await advance(k, 1);
    expect((await locks.read("k4")).body).toEqual({ held: false });
    const fb = token(await locks.acquire("k4", b, 30));
    expect(fb).toBeGreaterThan(fa);
    // The old owner is stale: renew refused, its release frees nothing, its acquire meets b's lease.
    expect((await locks.renew("k4", a, 30)).body).toEqual({ code: "lock_ownership_lost" });
    expect((await locks.release("k4", a)).status).toBe(204);
    expect((await locks.read("k4")).body).toMatchObject({ held: true, fencing_token: fb });
    expect((await locks.acquire("k4", a, 30)).body).toEqual({ code: "lock_held" });
  });

  test("the owner's release frees the lock (204), and the next holder, the same one included, gets a higher fencing token", async () => {
    const { locks } = await setup();
    const a = uuid();
    const f1 = token(await locks.acquire("k5", a, 30));
    const rel = await locks.release("k5", a);
    expect(rel.status).toBe(204);
    expect(rel.text).toBe("");
    expect((await locks.read("k5")).body).toEqual({ held: false });
    const f2 = token(await locks.acquire("k5", a, 30));
    expect(f2).toBeGreaterThan(f1);
    const b = uuid();
    await locks.release("k5", a);
    const f3 = token(await locks.acquire("k5", b, 30));
    expect(f3).toBeGreaterThan(f2);
  });

  test("release is idempotent: an absent lock, a second release, and a non-owner's release all answer 204; the non-owner's frees nothing", async () => {
    const { locks } = await setup();
    expect((await locks.release("absent", uuid())).status).toBe(204);
    const a = uuid();
    const f = token(await locks.acquire("k6", a, 30));
    expect((await locks.release("k6", uuid())).status).toBe(204);
    expect((await locks.read("k6")).body).toMatchObject({ held: true, fencing_token: f });
    expect((await locks.release("k6", a)).status).toBe(204);
    expect((await locks.release("k6", a)).status).toBe(204);
    expect((await locks.read("k6")).body).toEqual({ held: false });
  });

  test("force release (rule 6) frees the lock whoever holds it, 204 also when absent; the holder learns at its next renewal", async () => {
    const { locks } = await setup();
    expect((await locks.force("absent")).status).toBe(204);
    const a = uuid();
    const f1 = token(await locks.acquire("k7", a, 30));
    const forced = await locks.force("k7");
    expect(forced.status).toBe(204);
    expect(forced.text).toBe("");
    expect((await locks.read("k7")).body).toEqual({ held: false });
    expect((await locks.renew("k7", a, 30)).body).toEqual({ code: "lock_ownership_lost" });
    const f2 = token(await locks.acquire("k7", uuid(), 30));
    expect(f2).toBeGreaterThan(f1);
    expect((await locks.force("k7")).status).toBe(204);
    expect((await locks.force("k7")).status).toBe(204);
  });

  test("rule 5: release, force release and expiry never lower the next fencing token; renewals keep it", async () => {
    const { locks } = await setup();
    const seen: number[] = [];
    const t = uuid();
    seen.push(token(await locks.acquire("k8", t, 30)));
    expect(token(await locks.renew("k8", t, 30))).toBe(seen[0]);
    await locks.release("k8", t);
    seen.push(token(await locks.acquire("k8", uuid(), 30)));
    await locks.force("k8");
    const last = uuid();
    seen.push(token(await locks.acquire("k8", last, 5)));
    await advance(k, 6);
    seen.push(token(await locks.acquire("k8", uuid(), 30)));
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1]!);
  });

  test("projects are isolated: the same key in two projects is two locks", async () => {
    const one = await setup();
    const two = await setup();
    const f1 = token(await one.locks.acquire("shared:name", uuid(), 30));
    const f2 = token(await two.locks.acquire("shared:name", uuid(), 30));
    expect((await one.locks.read("shared:name")).body.fencing_token).toBe(f1);
    expect((await two.locks.read("shared:name")).body.fencing_token).toBe(f2);
    expect((await one.locks.force("shared:name")).status).toBe(204);
    expect((await one.locks.read("shared:name")).body).toEqual({ held: false });
    expect((await two.locks.read("shared:name")).body).toMatchObject({ held: true, fencing_token: f2 });
  });

  test("fencing tokens count per project: another project's acquisitions do not move them", async () => {
    const one = await setup();
    const two = await setup();
    const first = token(await one.locks.acquire("a", uuid(), 30));
    for (let i = 0; i < 5; i++) token(await two.locks.acquire(`b:${i}`, uuid(), 30));
    // One counter for every project would have moved by 5 in between.
    expect(token(await one.locks.acquire("c", uuid(), 30))).toBe(first + 1);
  });

  test("rule 7: a retry under a reused request id is processed normally (repeat safety comes from the lock token)", async () => {
    const { locks } = await setup();
    const t = uuid();
    const rid = uuid();
    const f = token(await locks.acquire("k9", t, 30, rid));
    expect(token(await locks.acquire("k9", t, 30, rid))).toBe(f);
    expect((await locks.acquire("k9", uuid(), 30, rid)).body).toEqual({ code: "lock_held" });
  });
});

describe("the absolute deadline", () => {
  test("a lease never outlives its acquisition by more than 90 days: renewals and same-token acquires cannot move it", async () => {
    const { locks } = await setup();
    const t = uuid();
    const first = await locks.acquire("deadline", t, 7_776_000);
    const f = token(first);
    const deadline = expiry(first);
    await advance(k, 10 * 86_400);
    const renewed = await locks.renew("deadline", t, 7_776_000);
    expect(renewed.body).toEqual({ expires_at: first.body.expires_at, fencing_token: f });
    const again = await locks.acquire("deadline", t, 7_776_000);
    expect(again.body).toEqual({ expires_at: first.body.expires_at, fencing_token: f });
    // Shorter TTLs still shorten it.
    const shorter = await timed(k, () => locks.renew("deadline", t, 60));
    expect(expiry(shorter.res)).toBeLessThanOrEqual(shorter.after + 60 * SEC);
    expect(expiry(shorter.res)).toBeLessThan(deadline);
  });
});

describe("validation (400 {error})", () => {
  test("X-Service-Lock-Token and X-Service-Request-Id: missing or not a UUID → 400 naming the header; the lock token only where required", async () => {
    const { sk, locks } = await setup();
    const send = (method: string, path: string, headers: Record<string, string>, body?: unknown) => k.api(method, path, { token: sk, headers, body });
    const body = { ttl_seconds: 30 };
    for (const [method, path] of [["POST", "/locks/h/lease"], ["PATCH", "/locks/h/lease"], ["DELETE", "/locks/h/lease"]] as const) {
      const withBody = method === "DELETE" ? undefined : body;
      const cases: Array<[Record<string, string>, RegExp]> = [
        [{ "X-Service-Request-Id": uuid() }, /missing X-Service-Lock-Token/],
        [{ "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": "not-a-uuid" }, /invalid X-Service-Lock-Token/],
        [{ "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": `${uuid()}0` }, /invalid X-Service-Lock-Token/],
        [{ "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": "00000000-0000-0000-0000-000000000000" }, /X-Service-Lock-Token.*random UUID/],
        [{ "X-Service-Lock-Token": uuid() }, /missing X-Service-Request-Id/],
        [{ "X-Service-Lock-Token": uuid(), "X-Service-Request-Id": "12345" }, /invalid X-Service-Request-Id/],
      ];
      for (const [headers, message] of cases) {
        const r = await send(method, path, headers, withBody);
        expect([method, r.status]).toEqual([method, 400]);
        expect(Object.keys(r.body)).toEqual(["error"]);
        expect([method, r.body.error]).toEqual([method, expect.stringMatching(message)]);
      }
    }
    // Reads and force releases need only the request id; a lock token there is ignored.
    for (const [method, path] of [["GET", "/locks/h"], ["DELETE", "/locks/h"]] as const) {
      const missing = await send(method, path, {});
      expect(missing.status).toBe(400);
      expect(missing.body.error).toMatch(/missing X-Service-Request-Id/);
      expect((await send(method, path, { "X-Service-Request-Id": "nope" })).body.error).toMatch(/invalid X-Service-Request-Id/);
      expect((await send(method, path, { "X-Service-Request-Id": uuid() })).status).toBe(method === "GET" ? 200 : 204);
      expect((await send(method, path, { "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": "junk" })).status).toBe(method === "GET" ? 200 : 204);
    }
    // Nothing refused took the lock.
    expect((await locks.read("h")).body).toEqual({ held: false });
  });

  test("keys: 1-128 of letters, digits, '.', '_', ':', '-'; anything else → 400 on every route", async () => {
    const { locks } = await setup();
    const good = ["a", "A.b_c:d-e", "0123456789", "x".repeat(128), "svc:billing.2024_q1-run"];
    for (const key of good) expect([key, (await locks.acquire(key, uuid(), 30)).status]).toEqual([key, 200]);
    const bad = ["x".repeat(129), "a b", "a/b", "ключ", "a*", "a+b", "a%b", "tab\tkey", "😀", "a@b", "a,b"];
    for (const key of bad) {
      for (const r of [await locks.acquire(key, uuid(), 30), await locks.renew(key, uuid(), 30), await locks.release(key, uuid()), await locks.read(key), await locks.force(key)]) {
        expect([key, r.status]).toEqual([key, 400]);
        expect(r.body.error).toMatch(/key/);
      }
    }
  });

  test("ttl_seconds: an integer from 5 to 7,776,000 (acquire and renew) → else 400 naming it", async () => {
    const { sk, locks } = await setup();
    const t = uuid();
    for (const ttl of [4, 0, -5, 7_776_001, 30.5, "30", null, undefined, true, [30], 1e300]) {
      for (const r of [await locks.acquire("ttl", t, ttl), await locks.renew("ttl", t, ttl)]) {
        expect([ttl, r.status]).toEqual([ttl, 400]);
        expect(r.body.error).toMatch(/ttl_seconds/);
      }
    }
    expect((await locks.read("ttl")).body).toEqual({ held: false });
    const min = await timed(k, () => locks.acquire("ttl", t, 5));
    expect(expiry(min.res)).toBeLessThanOrEqual(min.after + 5 * SEC);
    const max = await timed(k, () => locks.acquire("ttl:max", t, 7_776_000));
    expect(expiry(max.res)).toBeGreaterThanOrEqual(max.before + 7_776_000 * SEC);
    expect((await locks.renew("ttl:max", t, 7_776_000)).status).toBe(200);
    // Malformed JSON is a 400 too.
    const broken = await k.api("POST", "/locks/ttl/lease", { token: sk, body: "{", headers: { "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": t } });
    expect(broken.status).toBe(400);
    expect(broken.body.error).toMatch(/not valid JSON/);
  });
});

describe("credentials: service keys only (full, or scoped with locks.manage)", () => {
  test("no credential 401; platform token, project token, anon key, end-user token and a scoped key without locks.manage 403; with it 200", async () => {
    const p = await createProject(k);
    const full = await serviceKey(k, p.id);
    const scoped = await serviceKey(k, p.id, { name: "locks-only", permissions: ["locks.manage"] });
    const invokeOnly = await serviceKey(k, p.id, { name: "invoke-only", permissions: ["functions.invoke"] });
    const projectToken = (await createToken(k, p.id)).token;
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key as string;
    const signup = await k.api("POST", "/auth/signup", { token: anon, body: { email: `locks-${Date.now()}@example.com`, password: "correct horse battery" } });
    expect(signup.status).toBe(201);
    const user = signup.body.access_token as string;

    const t = uuid();
    const headers = { "X-Service-Request-Id": uuid(), "X-Service-Lock-Token": t };
    const routes: Array<[string, string, unknown]> = [
      ["POST", "/locks/auth/lease", { ttl_seconds: 30 }],
      ["PATCH", "/locks/auth/lease", { ttl_seconds: 30 }],
      ["DELETE", "/locks/auth/lease", undefined],
      ["GET", "/locks/auth", undefined],
      ["DELETE", "/locks/auth", undefined],
    ];
    const refused: Array<[string, string | null, number]> = [
      ["none", null, 401],
      ["unknown", "sk-notarealkeynotarealkeynotarealkey00", 401],
      ["platform", k.token, 403],
      ["project token", projectToken, 403],
      ["anon key", anon, 403],
      ["end user", user, 403],
      ["scoped without locks.manage", invokeOnly, 403],
    ];
    for (const [method, path, body] of routes) {
      for (const [who, cred, status] of refused) {
        const r = await k.api(method, path, { token: cred, headers, body });
        expect([method, path, who, r.status]).toEqual([method, path, who, status]);
        expect(typeof r.body.error).toBe("string");
      }
    }
    expect((await k.api("POST", "/locks/auth/lease", { token: anon, headers, body: { ttl_seconds: 30 } })).body.error).toMatch(/requires a service key/);
    expect((await k.api("POST", "/locks/auth/lease", { token: invokeOnly, headers, body: { ttl_seconds: 30 } })).body.error).toMatch(/locks\.manage/);
    // Nothing refused took the lock; both kinds of service key may.
    const viaScoped = locksOf(k, scoped);
    const viaFull = locksOf(k, full);
    expect((await viaScoped.read("auth")).body).toEqual({ held: false });
    const f = token(await viaScoped.acquire("auth", t, 30));
    expect((await viaFull.read("auth")).body.fencing_token).toBe(f);
    expect((await viaFull.renew("auth", t, 30)).status).toBe(200);
    expect((await viaFull.release("auth", t)).status).toBe(204);
    expect((await viaScoped.force("auth")).status).toBe(204);
  });
});

describe("quota: 600 lock operations per project per fixed minute", () => {
  test("every request counts (reads, force releases, retries, refused ones); the 601st is 429 with Retry-After and no X-RateLimit headers; other projects are unaffected; the next minute starts over", async () => {
    const minute = await toNextMinute(k);
    const { locks } = await setup();
    const other = await setup();
    const t = uuid();
    const rid = uuid();
    const ops: Array<() => Promise<ApiResponse>> = [];
    const add = (n: number, op: () => Promise<ApiResponse>) => {
      for (let i = 0; i < n; i++) ops.push(op);
    };
    add(1, () => locks.acquire("q", t, 60));
    add(99, () => locks.acquire("q", t, 60, rid)); // retries under one request id
    add(100, () => locks.renew("q", t, 60));
    add(100, () => locks.read("q"));
    add(100, () => locks.force("q:other"));
    add(100, () => locks.acquire("q", uuid(), 60)); // 409 lock_held
    add(50, () => locks.read("bad key")); // 400
    add(50, () => locks.release("q:other", "not-a-uuid")); // 400
    expect(ops).toHaveLength(600);
    const statuses: Record<number, number> = {};
    for (let i = 0; i < ops.length; i += 25) {
      for (const r of await Promise.all(ops.slice(i, i + 25).map((op) => op()))) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    }
    expect(statuses).toEqual({ 200: 300, 204: 100, 409: 100, 400: 100 });

    const { res: over, before, after } = await timed(k, () => locks.read("q"));
    expect(over.status).toBe(429);
    expect(Object.keys(over.body)).toEqual(["error"]);
    expect(over.body.error).toMatch(/quota/);
    // Retry-After: whole seconds to the end of the minute.
    const retryAfter = Number(over.headers.get("retry-after"));
    expect(Number.isInteger(retryAfter)).toBe(true);
    expect(after).toBeLessThan(minute + 60_000);
    expect(retryAfter).toBeGreaterThanOrEqual(Math.ceil((minute + 60_000 - after) / SEC));
    expect(retryAfter).toBeLessThanOrEqual(Math.ceil((minute + 60_000 - before) / SEC));
    for (const h of over.headers.keys()) expect(h).not.toMatch(/^x-ratelimit/i);
    // Counted before anything else: a malformed request and a release are refused the same way.
    expect((await locks.release("bad key", "junk")).status).toBe(429);
    expect((await locks.force("q")).status).toBe(429);
    // The lease was not touched by the refusals; another project has its own 600.
    expect(token(await other.locks.acquire("q", uuid(), 60))).toBeGreaterThan(0);

    await advance(k, retryAfter);
    const next = await locks.read("q");
    expect(next.status).toBe(200);
    expect(next.body).toMatchObject({ held: true });
  });
});

describe("the backing table fails → 503 {error}", () => {
  test("an injected table failure answers 503 lock backend unavailable; the next request works", async () => {
    const kk = await startKiln({ env: { KILN_FAULTS: "lock-backend:2" } });
    try {
      const { locks } = await setup(kk);
      const t = uuid();
      const first = await locks.acquire("f", t, 30);
      expect(first.status).toBe(503);
      expect(first.body).toEqual({ error: "lock backend unavailable" });
      expect((await locks.read("f")).status).toBe(503);
      expect(token(await locks.acquire("f", t, 30))).toBeGreaterThan(0);
      expect(kk.stderr).toMatch(/lock table operation failed.*injected fault: lock-backend/);
    } finally {
      await kk.stop();
      removeDir(kk.dataDir);
    }
  });

  test.skipIf(STORE !== "postgres")("PostgreSQL unreachable: 503 while it is, and lock operations work again once it is back", async () => {
    // Credentials verified before the outage stay cached, so the request gets as far as the lock table.
    const kk = await startKiln({ env: { KILN_CREDENTIAL_CACHE_MS: "600000" } });
    const admin = postgres(inject("pgUrl"), { max: 1, onnotice: () => {} });
    const db = new URL(kk.databaseUrl!).pathname.slice(1);
    try {
      const { locks } = await setup(kk);
      const t = uuid();
      const f = token(await locks.acquire("pg", t, 60));
      await admin.unsafe(`alter database ${db} with allow_connections false`);
      await admin.unsafe(`select pg_terminate_backend(pid) from pg_stat_activity where datname = '${db}' and pid <> pg_backend_pid()`);
      for (const r of [await locks.read("pg"), await locks.renew("pg", t, 60), await locks.acquire("other", uuid(), 60)]) {
        expect(r.status).toBe(503);
        expect(r.body).toEqual({ error: "lock backend unavailable" });
      }
      await admin.unsafe(`alter database ${db} with allow_connections true`);
      const back = await locks.read("pg");
      expect(back.status).toBe(200);
      expect(back.body).toMatchObject({ held: true, fencing_token: f });
    } catch (e) {
      // CI once saw a request reset mid-outage (ECONNRESET): say whether Kiln was still running.
      console.error(`kiln exit ${kk.proc.exitCode} signal ${kk.proc.signalCode}\n${kk.stderr.slice(-3000)}`);
      throw e;
    } finally {
      await admin.unsafe(`alter database ${db} with allow_connections true`).catch(() => {});
      await admin.end();
      await kk.stop();
      removeDir(kk.dataDir);
    }
  });
});

describe("leases survive restarts", () => {
  /** Ends Kiln the way `how` says and waits for its exit. */
  async function end(kk: TestKiln, how: "SIGTERM" | "SIGKILL"): Promise<void> {
    if (how === "SIGTERM") {
      expect(await kk.stop()).toBe(0);
      return;
    }
    kk.proc.kill("SIGKILL");
    await new Promise((r) => (kk.proc.exitCode !== null || kk.proc.signalCode !== null ? r(null) : kk.proc.once("exit", r)));
  }

  for (const how of ["SIGTERM", "SIGKILL"] as const) {
    test(`${how}: a lease acquired and renewed just before is still held after the restart: the owner renews it, others get 409 until it expires, then the next holder gets a higher fencing token; no key's fencing token goes back`, async () => {
      const first = await startKiln({ args: ["--controllable-clock"] });
      const { dataDir, databaseUrl } = first;
      let current: TestKiln = first;
      try {
        const { sk, locks } = await setup(first);
        const owner = uuid();
        const f = token(await locks.acquire("held", owner, 60));
        // The renewal moves the expiry: the restart must keep the renewed one.
        const renewed = await locks.renew("held", owner, 300);
        expect(token(renewed)).toBe(f);
        // A key freed before the restart: its next token still rises.
        const freedBy = uuid();
        const g = token(await locks.acquire("freed", freedBy, 60));
        expect((await locks.release("freed", freedBy)).status).toBe(204);
        // Fencing tokens never go back (rule 5 across restarts): a key force-released, other keys
        // of the project drawing from the same counter, the key again.
        const f1 = token(await locks.acquire("restart", uuid(), 30));
        await locks.force("restart");
        for (let i = 0; i < 5; i++) token(await locks.acquire(`restart:${i}`, uuid(), 30));
        const f1b = token(await locks.acquire("restart", uuid(), 30));
        expect(f1b).toBeGreaterThan(f1);
        // The last thing acknowledged before the end: an acquire.
        const lastOwner = uuid();
        const h = token(await locks.acquire("last", lastOwner, 300));
        await end(first, how);

        current = await startKiln({ dataDir, databaseUrl, args: ["--controllable-clock"], env: { KILN_PLATFORM_TOKEN: first.token } });
        const again = locksOf(current, sk);
        // Freed, the key's next token is still higher than any before the end.
        await again.force("restart");
        expect(token(await again.acquire("restart", uuid(), 30))).toBeGreaterThan(f1b);
        expect((await again.read("held")).body).toEqual({ held: true, expires_at: renewed.body.expires_at, fencing_token: f });
        expect((await again.read("last")).body).toMatchObject({ held: true, fencing_token: h });
        expect((await again.read("freed")).body).toEqual({ held: false });
        for (const key of ["held", "last"]) {
          const other = await again.acquire(key, uuid(), 30);
          expect(other.status).toBe(409);
          expect(other.body).toEqual({ code: "lock_held" });
        }
        expect(token(await again.acquire("last", lastOwner, 300))).toBe(h);
        const stillMine = await again.renew("held", owner, 300);
        expect(stillMine.status).toBe(200);
        expect(stillMine.body.fencing_token).toBe(f);
        // Up to the renewed expiry (plus the grace second) nobody else gets it.
        await advance(current, 299);
        expect((await again.acquire("held", uuid(), 30)).body).toEqual({ code: "lock_held" });
        await advance(current, 2);
        expect((await again.read("held")).body).toEqual({ held: false });
        const next = token(await again.acquire("held", uuid(), 30));
        expect(next).toBeGreaterThan(f);
        expect((await again.renew("held", owner, 300)).body).toEqual({ code: "lock_ownership_lost" });
        expect(token(await again.acquire("freed", uuid(), 30))).toBeGreaterThan(g);
      } finally {
        await current.stop();
        removeDir(dataDir);
      }
    });
  }
});

describe.skipIf(STORE !== "postgres")("several instances on one PostgreSQL", () => {
  test("racing acquire/release loops from two instances: at most one holder at a time, fencing tokens strictly rising; the quota is shared", async () => {
    const a = await startKiln({ args: ["--controllable-clock"] });
    const b = await startKiln({ databaseUrl: a.databaseUrl, args: ["--controllable-clock"], env: { KILN_PLATFORM_TOKEN: a.token } });
    try {
      // Both clocks at the same instant, early in a minute, so one quota window covers the test.
      const target = Math.ceil(Math.max(await clockNow(a), await clockNow(b)) / 60_000) * 60_000 + 60_000 + SEC;
      for (const kk of [a, b]) expect((await kk.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(target).toISOString() } })).status).toBe(200);
      const p = await createProject(a);
      const sk = await serviceKey(a, p.id);
      const viaA = locksOf(a, sk);
      const viaB = locksOf(b, sk);

      let holders = 0;
      let lastToken = 0;
      let acquired = 0;
      let ops = 0;
      const worker = async (mine: Locks, theirs: Locks, attempts: number) => {
        const t = uuid();
        for (let i = 0; i < attempts; i++) {
          const r = await mine.acquire("race", t, 30);
          ops++;
          if (r.status === 409) {
            expect(r.body).toEqual({ code: "lock_held" });
            continue;
          }
          const f = token(r);
          holders++;
          expect(holders).toBe(1);
          expect(f).toBeGreaterThan(lastToken);
          lastToken = f;
          acquired++;
          // While we hold it, the other instance reads our lease.
          const seen = await theirs.read("race");
          ops++;
          expect(seen.body).toMatchObject({ held: true, fencing_token: f });
          holders--;
          expect((await mine.release("race", t)).status).toBe(204);
          ops++;
        }
      };
      await Promise.all([worker(viaA, viaB, 40), worker(viaB, viaA, 40), worker(viaA, viaB, 40), worker(viaB, viaA, 40)]);
      expect(acquired).toBeGreaterThanOrEqual(10);
      expect(ops).toBeLessThanOrEqual(480);

      // The two instances share the project's 600: whatever is left, split between them, then 429 on both.
      const left = 600 - ops;
      const reads = await Promise.all(Array.from({ length: left }, (_, i) => (i % 2 ? viaA : viaB).read("race")));
      expect(reads.every((r) => r.status === 200)).toBe(true);
      for (const via of [viaA, viaB]) {
        const over = await via.read("race");
        expect(over.status).toBe(429);
        expect(Number(over.headers.get("retry-after"))).toBeGreaterThan(0);
      }
    } finally {
      await a.stop();
      await b.stop();
      removeDir(a.dataDir);
      removeDir(b.dataDir);
    }
  });
});

// The CLI is a client of the routes this file tests on both stores: its commands run on the embedded project only
// (as cli.test.ts does; vitest.config.ts).
describe.skipIf(STORE === "postgres")("kiln locks", () => {
  const { json, run } = useCli(k);
  test("acquire (generating a lock token), get, renew, release, force-release; errors name the problem", async () => {
    const p = await createProject(k);
    const sk = await serviceKey(k, p.id);
    const key = ["--service-key", sk];
    const got = json("locks", "acquire", "cli:job", "--ttl", "30", ...key);
    expect(got).toMatchObject({ key: "cli:job", lock_token: expect.stringMatching(/^[0-9a-f-]{36}$/), fencing_token: expect.any(Number), expires_at: expect.any(String) });
    expect(json("locks", "get", "cli:job", ...key)).toEqual({ held: true, expires_at: got.expires_at, fencing_token: got.fencing_token });
    const renewed = json("locks", "renew", "cli:job", "--lock-token", got.lock_token, "--ttl", "2m", ...key);
    expect(renewed.fencing_token).toBe(got.fencing_token);
    expect(Date.parse(renewed.expires_at)).toBeGreaterThan(Date.parse(got.expires_at));
    const held = run("locks", "acquire", "cli:job", "--ttl", "30", ...key);
    expect(held.code).not.toBe(0);
    expect(held.err).toMatch(/409 lock_held/);
    json("locks", "release", "cli:job", "--lock-token", got.lock_token, ...key);
    expect(json("locks", "get", "cli:job", ...key)).toEqual({ held: false });
    const mine = uuid();
    expect(json("locks", "acquire", "cli:job", "--ttl", "30", "--lock-token", mine, ...key).lock_token).toBe(mine);
    const human = run("locks", "get", "cli:job", ...key);
    expect(human.out).toMatch(/held\s+true/);
    json("locks", "force-release", "cli:job", ...key);
    expect(json("locks", "get", "cli:job", ...key)).toEqual({ held: false });
    expect(run("locks", "get", "cli:job").err).toMatch(/service key/);
    expect(run("locks", "acquire", "cli:job", "--ttl", "3", ...key).err).toMatch(/ttl_seconds/);
    expect(run("locks", "get", "bad key", ...key).err).toMatch(/400.*key/);
  });
});
