// Durable functions (issue 16, docs/durable-functions.md): the collection, executions with
// journaled steps replayed in fresh segments, sleeps and retries on the platform clock, stop,
// re-run from a step, schedulers, usage and logs. Node, Python and Ruby; both control stores.
import { beforeAll, describe, expect, test } from "vitest";
import { tgz } from "../support/functions";
import { createProject, createToken, eventually, FUNCTION_RUNTIME, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });
// The containers project runs this file to prove durable executions on a container engine: each
// language's journaled steps, sleeps and replays in fresh segments, a stop, lines streamed from a
// running segment, schedulers and usage. What the engine and the language's step library decide
// (parallel steps, retries and their backoff, a replay's order check, credentials, re-runs, retention)
// is the same code whatever runs the worker: those tests run on the process runtime only (suite time).
const NOT_THE_WORKER = FUNCTION_RUNTIME !== "process";

async function deployDurable(kiln: TestKiln, projectId: string, fields: Record<string, string>, code: Buffer, collection = "durable-functions") {
  const form = new FormData();
  for (const [key, v] of Object.entries(fields)) form.set(key, v);
  form.set("code", new Blob([new Uint8Array(code)]), "code.tgz");
  const res = await fetch(`${kiln.url}/projects/${projectId}/${collection}`, { method: "POST", headers: { authorization: `Bearer ${kiln.token}` }, body: form });
  return { status: res.status, body: (await res.json()) as any };
}

async function active(kiln: TestKiln, projectId: string, id: string) {
  const r = await eventually(
    () => kiln.api("GET", `/projects/${projectId}/durable-functions/${id}`),
    (r) => r.body.status !== "provisioning" && !r.body.pending_deployment_id,
    60_000,
  );
  expect(r.body.status).toBe("active");
  return r.body;
}

const advance = async (seconds: number) => expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);

async function settledExecution(projectId: string, fnId: string, id: string, statuses = ["completed", "failed", "stopped"], timeoutMs = 30_000) {
  return (await eventually(() => k.api("GET", `/projects/${projectId}/durable-functions/${fnId}/executions/${id}`), (r) => statuses.includes(r.body?.status), timeoutMs)).body;
}

const NODE_WORKFLOW = `
exports.handler = async (event, step) => {
  const a = await step.run("pick", async () => { console.log("ran pick"); return { n: Math.random(), got: event.x }; });
  await step.sleep("nap", event.nap ?? "1h");
  const b = await step.run("double", () => { console.log("ran double"); return a.got * 2; });
  return { a, b, user: event.__service_auth ?? null };
};`;

const PY_WORKFLOW = `
import random

def handler(event, step):
    a = step.run("pick", lambda: {"n": random.random(), "got": event["x"]})
    step.sleep("nap", "2h")
    b = step.run("double", lambda: a["got"] * 2)
    return {"a": a, "b": b}
`;

const RB_WORKFLOW = `
def handler(event:, step:)
  a = step.run("pick") { { "n" => rand, "got" => event["x"] } }
  step.sleep("nap", "3h")
  b = step.run("double") { a["got"] * 2 }
  { "a" => a, "b" => b }
end
`;

type Lang = "node" | "python" | "ruby";
const RUNTIME: Record<Lang, string> = { node: "nodejs22.x", python: "python3.11", ruby: "ruby3.3" };
const FILE: Record<Lang, string> = { node: "index.js", python: "main.py", ruby: "main.rb" };
// Each workflow's nap, in hours.
const NAP: Record<Lang, number> = { node: 1, python: 2, ruby: 3 };

describe("durable functions", () => {
  let p: { id: string };
  let sk: string;
  beforeAll(async () => {
    p = await createProject(k);
    sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key;
  });

  for (const lang of ["node", "python", "ruby"] as const) {
    test(`${lang}: steps are journaled, a sleep waits on the platform clock holding no worker, replays never re-run a completed step`, async () => {
      const code = tgz({ [FILE[lang]]: { node: NODE_WORKFLOW, python: PY_WORKFLOW, ruby: RB_WORKFLOW }[lang] });
      const created = await deployDurable(k, p.id, { name: `flow-${lang}`, runtime: RUNTIME[lang] }, code);
      expect(created.status).toBe(201);
      expect(Object.keys(created.body).sort()).toEqual(["created_at", "handler", "id", "name", "runtime", "status", "updated_at"]);
      const fn = await active(k, p.id, created.body.id);
      const started = await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: sk, body: { input: { x: 21 } } });
      expect(started.status).toBe(202);
      expect(Object.keys(started.body).sort()).toEqual(["created_at", "durable_function_id", "id", "status"]);
      expect(started.body).toMatchObject({ durable_function_id: fn.id, status: "queued" });
      const sleeping = await settledExecution(p.id, fn.id, started.body.id, ["sleeping", "failed", "completed"]);
      expect(sleeping.status).toBe("sleeping");
      expect(sleeping.steps.map((s: any) => [s.name, s.type, s.status, s.attempts])).toEqual([
        ["pick", "run", "completed", 1],
        ["nap", "sleep", "sleeping", 0],
      ]);
      const picked = sleeping.steps[0].output;
      expect(picked.got).toBe(21);
      const wake = Date.parse(sleeping.steps[1].wake_at);
      expect(wake - Date.parse(sleeping.steps[1].started_at)).toBe(NAP[lang] * 3_600_000);
      // Not woken early.
      await advance(NAP[lang] * 1800);
      expect((await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}/executions/${started.body.id}`)).body.status).toBe("sleeping");
      await advance(NAP[lang] * 1800 + 1);
      const done = await settledExecution(p.id, fn.id, started.body.id);
      expect(done.status).toBe("completed");
      // The replay returned the journaled value (a re-run would have picked another random number).
      expect(done.output).toMatchObject({ a: picked, b: 42 });
      expect(done.steps.map((s: any) => [s.name, s.status, s.attempts])).toEqual([
        ["pick", "completed", 1],
        ["nap", "completed", 0],
        ["double", "completed", 1],
      ]);
      expect(done.finished_at).not.toBeNull();
      if (lang === "node") {
        // Every segment's lines are in log search under the execution's id; the picked step printed once.
        const search = await eventually(
          () => k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, q: `invocation.id:${started.body.id}`, limit: 1000 } }),
          (r) => r.status === 200 && r.body.data?.some((e: any) => String(e.body).includes("ran double")),
          10_000,
        );
        const bodies = search.body.data.map((e: any) => String(e.body));
        expect(bodies.filter((b: string) => b === "ran pick")).toHaveLength(1);
        expect(bodies.filter((b: string) => b === "ran double")).toHaveLength(1);
        expect(bodies.some((b: string) => b.includes('step "nap" sleeping until'))).toBe(true);
      }
    });
  }

  test.skipIf(NOT_THE_WORKER)("parallel steps, sleepUntil, an unreadable duration (Node); an async Python handler with sleep_until and a coroutine step", async () => {
    const node = await active(
      k,
      p.id,
      (
        await deployDurable(
          k,
          p.id,
          { name: "shapes-node", runtime: "nodejs22.x" },
          tgz({
            "index.js": `exports.handler = async (event, step, context) => {
              const [a, b] = await Promise.all([step.run("a", async () => { await new Promise((r) => setTimeout(r, 30)); return "A"; }), step.run("b", () => "B")]);
              await step.sleepUntil("until", new Date(event.until));
              let bad = null;
              try { await step.sleep("bad", "5 fortnights"); } catch (e) { bad = e.name + ": " + e.message; }
              return { a, b, bad, fn: context.functionName };
            };`,
          }),
        )
      ).body.id,
    );
    const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
    const until = new Date(now + 7_200_000).toISOString();
    const ex = await k.api("POST", `/durable-functions/${node.id}/executions`, { token: sk, body: { input: { until } } });
    const sleeping = await settledExecution(p.id, node.id, ex.body.id, ["sleeping", "failed", "completed"]);
    expect(sleeping.status).toBe("sleeping");
    expect(sleeping.wake_at).toBe(until);
    expect(sleeping.steps.map((x: any) => [x.name, x.status])).toEqual([
      ["a", "completed"],
      ["b", "completed"],
      ["until", "sleeping"],
    ]);
    await advance(7201);
    const done = await settledExecution(p.id, node.id, ex.body.id);
    expect(done.output).toEqual({ a: "A", b: "B", bad: 'TypeError: unknown unit "fortnights" in the sleep duration "5 fortnights"', fn: "shapes-node" });

    const py = await active(
      k,
      p.id,
      (
        await deployDurable(
          k,
          p.id,
          { name: "shapes-py", runtime: "python3.11" },
          tgz({
            "main.py": `import asyncio

async def fetch(n):
    await asyncio.sleep(0.01)
    return n * 10

async def handler(event, step):
    x = await step.run("fetch", lambda: fetch(event["n"]))
    await step.sleep_until("later", event["until"])
    try:
        await step.run("explodes", lambda: 1 / 0, retries=0)
    except Exception as e:
        caught = f"{type(e).__name__}: {e}"
    return {"x": x, "caught": caught}
`,
          }),
        )
      ).body.id,
    );
    const now2 = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
    const ex2 = await k.api("POST", `/durable-functions/${py.id}/executions`, { token: sk, body: { input: { n: 4, until: new Date(now2 + 60_000).toISOString() } } });
    await settledExecution(p.id, py.id, ex2.body.id, ["sleeping"]);
    await advance(61);
    const pdone = await settledExecution(p.id, py.id, ex2.body.id);
    expect(pdone.status, JSON.stringify(pdone)).toBe("completed");
    expect(pdone.output).toEqual({ x: 40, caught: "StepError: division by zero" });
    expect(pdone.steps.map((x: any) => [x.name, x.status, x.error])).toEqual([
      ["fetch", "completed", null],
      ["later", "completed", null],
      ["explodes", "failed", "ZeroDivisionError: division by zero"],
    ]);
  });

  test.skipIf(NOT_THE_WORKER)("the collections are separate: a durable id is 404 under /functions and a standard id 404 under /durable-functions; names are per collection", async () => {
    const std = await deployDurable(k, p.id, { name: "same-name", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 1;" }), "functions");
    expect(std.status).toBe(201);
    const dur = await deployDurable(k, p.id, { name: "same-name", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 1;" }));
    expect(dur.status).toBe(201);
    expect(dur.body.id).not.toBe(std.body.id);
    await active(k, p.id, dur.body.id);
    expect((await k.api("GET", `/projects/${p.id}/functions/${dur.body.id}`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${p.id}/durable-functions/${std.body.id}`)).status).toBe(404);
    expect((await k.api("POST", `/functions/${dur.body.id}/invoke`, { token: sk, body: { payload: {} } })).status).toBe(404);
    expect((await k.api("POST", `/durable-functions/${std.body.id}/executions`, { token: sk, body: { input: {} } })).status).toBe(404);
    const listed = (await k.api("GET", `/projects/${p.id}/durable-functions?limit=100`)).body;
    expect(listed.data.map((f: any) => f.id)).toContain(dur.body.id);
    expect(listed.data.map((f: any) => f.id)).not.toContain(std.body.id);
    expect((await k.api("GET", `/projects/${p.id}/functions?limit=100`)).body.data.map((f: any) => f.id)).not.toContain(dur.body.id);
    // Redeploy: 200; the deployment history.
    expect((await deployDurable(k, p.id, { name: "same-name", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 2;" }))).status).toBe(200);
    const deps = (await k.api("GET", `/projects/${p.id}/durable-functions/${dur.body.id}/deployments`)).body.data;
    expect(deps.length).toBe(2);
    // GET /deployments (across projects) tells the two collections apart.
    const all = (await k.api("GET", `/deployments?project_id=${p.id}&limit=100`)).body.data as Array<{ resource: { type: string; id: string } }>;
    expect(new Set(all.filter((d) => d.resource.id === dur.body.id).map((d) => d.resource.type))).toEqual(new Set(["durable_function"]));
    expect(new Set(all.filter((d) => d.resource.id === std.body.id).map((d) => d.resource.type))).toEqual(new Set(["function"]));
    // Deletion: 202, then 404.
    await active(k, p.id, dur.body.id);
    expect((await k.api("DELETE", `/projects/${p.id}/durable-functions/${dur.body.id}`)).status).toBe(202);
    await eventually(() => k.api("GET", `/projects/${p.id}/durable-functions/${dur.body.id}`), (r) => r.status === 404, 30_000);
  });

  test.skipIf(NOT_THE_WORKER)("who may start: service key and end-user token (identity in __service_auth) on the application route; platform or full project token on the project route; others refused", async () => {
    const fn = await active(k, p.id, (await deployDurable(k, p.id, { name: "who", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (event) => ({ user: event?.__service_auth ?? null, x: event?.x ?? null });` }))).body.id);
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    const user = (await k.api("POST", "/auth/signup", { token: anon, body: { email: `durable-${Date.now()}@example.com`, password: "long enough" } })).body;
    const asUser = await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: user.access_token, body: { input: { x: 1 } } });
    expect(asUser.status).toBe(202);
    const done = await settledExecution(p.id, fn.id, asUser.body.id);
    expect(done.output).toEqual({ x: 1, user: { user_id: user.user.id, email: user.user.email, project_id: p.id, role: "authenticated" } });
    expect((await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: anon, body: { input: {} } })).status).toBe(403);
    expect((await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: null, body: { input: {} } })).status).toBe(401);
    expect((await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: k.token, body: { input: {} } })).status).toBe(403);
    const viaProject = await k.api("POST", `/projects/${p.id}/durable-functions/${fn.id}/executions`, { body: { input: { x: 2 } } });
    expect(viaProject.status).toBe(202);
    expect((await settledExecution(p.id, fn.id, viaProject.body.id)).output).toEqual({ x: 2, user: null });
    const ro = (await createToken(k, p.id, { name: "ro", scope: "read_only" })).token;
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${fn.id}/executions`, { token: ro, body: { input: {} } })).status).toBe(403);
    expect((await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}/executions/${viaProject.body.id}`, { token: ro })).status).toBe(200);
    expect((await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: sk, body: "not json" })).status).toBe(400);
    // The list, newest first, filtered by status.
    const list = (await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}/executions?status=completed`)).body;
    expect(list.total).toBe(2);
    expect(list.data[0].id).toBe(viaProject.body.id);
    expect((await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}/executions?status=bogus`)).status).toBe(400);
    expect((await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}/executions/nope`)).status).toBe(404);
  });

  const FLAKY = {
    node: tgz({
      "index.js": `exports.handler = async (event, step) => {
        if (event.catch) {
          try { await step.run("doomed", () => { throw new TypeError("nope"); }, { retries: 0 }); } catch (e) { return { caught: e.name + ": " + e.message }; }
        }
        return step.run("always-fails", () => { throw new Error("broken " + Date.now()); }, { retries: 2 });
      };`,
    }),
    python: tgz({
      "main.py": `import time

def doomed():
    raise TypeError("nope")

def broken():
    raise RuntimeError(f"broken {time.time_ns()}")

def handler(event, step):
    if event.get("catch"):
        try:
            step.run("doomed", doomed, retries=0)
        except Exception as e:
            return {"caught": f"{e.type}: {e}"}
    return step.run("always-fails", broken, retries=2)
`,
    }),
    ruby: tgz({
      "main.rb": `def handler(event:, step:, context:)
  if event["catch"]
    begin
      step.run("doomed", retries: 0) { raise TypeError, "nope" }
    rescue KilnBootstrap::StepError => e
      return { "caught" => "#{e.type}: #{e.message}" }
    end
  end
  step.run("always-fails", retries: 2) { raise "broken #{Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)}" }
end
`,
    }),
  };

  for (const lang of ["node", "python", "ruby"] as const) {
    test.skipIf(NOT_THE_WORKER)(`${lang}: a failing step retries with backoff on the platform clock, then its error reaches the handler; uncaught it fails the execution`, async () => {
      const fn = await active(k, p.id, (await deployDurable(k, p.id, { name: `flaky-${lang}`, runtime: RUNTIME[lang] }, FLAKY[lang])).body.id);
      const caught = await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: sk, body: { input: { catch: true } } });
      const c = await settledExecution(p.id, fn.id, caught.body.id);
      expect(c.status).toBe("completed");
      expect(c.output).toEqual({ caught: "TypeError: nope" });
      expect(c.steps[0]).toMatchObject({ name: "doomed", status: "failed", attempts: 1, error: "TypeError: nope" });

      const failing = await k.api("POST", `/durable-functions/${fn.id}/executions`, { token: sk, body: { input: {} } });
      const url = `/projects/${p.id}/durable-functions/${fn.id}/executions/${failing.body.id}`;
      // (The clock also runs at the real rate, so a loaded machine may reach a 1 s backoff by itself.)
      let e = (await eventually(() => k.api("GET", url), (r) => r.body.steps?.[0]?.attempts >= 1 && r.body.status !== "running", 30_000)).body;
      if (e.steps[0].status === "retrying" && e.steps[0].attempts === 1) {
        expect(e.status).toBe("queued");
        // The first retry waits 1 s of platform time from the failure.
        expect(Date.parse(e.steps[0].wake_at) - Date.parse(e.steps[0].started_at)).toBeGreaterThanOrEqual(1000);
        expect(e.wake_at).toBe(e.steps[0].wake_at);
      }
      // Each retry waits on the platform clock (1 s, then 2 s); moving it runs them.
      for (let i = 0; i < 10 && e.status !== "failed"; i++) {
        await advance(2);
        e = (await eventually(() => k.api("GET", url), (r) => r.body.status !== "running", 30_000)).body;
      }
      e = await settledExecution(p.id, fn.id, failing.body.id);
      expect(e.status).toBe("failed");
      expect(e.steps[0]).toMatchObject({ status: "failed", attempts: 3 });
      expect(e.error).toMatch(lang === "node" ? /^Error: broken \d+$/ : /^StepError: broken \d+$/);
      expect(e.steps[0].error).toMatch(lang === "node" ? /^Error: broken \d+$/ : /^RuntimeError: broken \d+$/);
      if (lang === "ruby") {
        // Each failed attempt's backtrace is in the execution's lines, as Ruby prints it.
        const search = await eventually(
          () => k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, q: `invocation.id:${failing.body.id}`, limit: 1000 } }),
          (r) => r.status === 200 && r.body.data?.filter((l: any) => /broken \d+ \(RuntimeError\)/.test(String(l.body))).length >= 3,
          10_000,
        );
        expect(search.body.data.map((l: any) => String(l.body)).find((b: string) => /broken \d+ \(RuntimeError\)/.test(b))).toMatch(/^\/var\/task\/main\.rb:9:in .*block in .*handler'?: broken \d+ \(RuntimeError\)\n\tfrom /);
      }
    });
  }

  const DRIFT = {
    node: [
      `exports.handler = async (event, step) => { await step.run("one", () => 1); await step.sleep("wait", "10m"); return step.run("two", () => 2); };`,
      `exports.handler = async (event, step) => { await step.run("renamed", () => 1); await step.sleep("wait", "10m"); return 3; };`,
    ],
    python: [
      `def handler(event, step):\n    step.run("one", lambda: 1)\n    step.sleep("wait", "10m")\n    return step.run("two", lambda: 2)\n`,
      `def handler(event, step):\n    step.sleep("one", "1m")\n    step.sleep("wait", "10m")\n    return 3\n`,
    ],
    ruby: [
      `def handler(event:, step:)\n  step.run("one") { 1 }\n  step.sleep("wait", "10m")\n  step.run("two") { 2 }\nend\n`,
      `def handler(event:, step:)\n  step.run("uno") { 1 }\n  step.sleep("wait", "10m")\n  3\nend\n`,
    ],
  };
  for (const lang of ["node", "python", "ruby"] as const) {
    test.skipIf(NOT_THE_WORKER)(`${lang}: a replay that asks for steps in another order fails the execution with a clear error`, async () => {
      const file = FILE[lang];
      const runtime = RUNTIME[lang];
      const id = (await deployDurable(k, p.id, { name: `drift-${lang}`, runtime }, tgz({ [file]: DRIFT[lang][0]! }))).body.id;
      await active(k, p.id, id);
      const ex = await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions`, { body: { input: {} } });
      await settledExecution(p.id, id, ex.body.id, ["sleeping"]);
      expect((await deployDurable(k, p.id, { name: `drift-${lang}`, runtime }, tgz({ [file]: DRIFT[lang][1]! }))).status).toBe(200);
      await active(k, p.id, id);
      await advance(600);
      const e = await settledExecution(p.id, id, ex.body.id);
      expect(e.status).toBe("failed");
      expect(e.error).toBe(
        {
          node: 'non-deterministic replay: step 1 was run "one" when the execution first ran, and is now run "renamed"',
          python: 'non-deterministic replay: step 1 was run "one" when the execution first ran, and is now sleep "one"',
          ruby: 'non-deterministic replay: step 1 was run "one" when the execution first ran, and is now run "uno"',
        }[lang],
      );
    });
  }

  test("stop: a sleeping execution stops and never wakes; stopping a finished one is 409", async () => {
    const id = (await deployDurable(k, p.id, { name: "stoppable", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (e, step) => { await step.sleep("long", "1d"); return step.run("after", () => "woke"); };` }))).body.id;
    await active(k, p.id, id);
    const ex = await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: {} } });
    await settledExecution(p.id, id, ex.body.id, ["sleeping"]);
    const stopped = await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}/stop`);
    expect(stopped.status).toBe(200);
    expect(stopped.body).toMatchObject({ id: ex.body.id, status: "stopped" });
    expect(stopped.body.finished_at).not.toBeNull();
    await advance(86_401);
    const e = (await k.api("GET", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}`)).body;
    expect(e.status).toBe("stopped");
    expect(e.steps.map((s: any) => s.name)).toEqual(["long"]);
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}/stop`)).status).toBe(409);

    // A running one: its step finishes, but nothing after the stop is written and nothing more runs.
    const busy = (
      await deployDurable(
        k,
        p.id,
        { name: "busy", runtime: "nodejs22.x" },
        tgz({ "index.js": `exports.handler = async (e, step) => { await step.run("one", () => 1); await step.run("slow", () => new Promise((r) => setTimeout(() => r(2), 1500))); return step.run("three", () => 3); };` }),
      )
    ).body.id;
    await active(k, p.id, busy);
    const run = await k.api("POST", `/durable-functions/${busy}/executions`, { token: sk, body: { input: {} } });
    await eventually(() => k.api("GET", `/projects/${p.id}/durable-functions/${busy}/executions/${run.body.id}`), (r) => r.body.steps?.length === 1, 30_000);
    const computeNow = async () => (await k.api("GET", `/projects/${p.id}/usage`)).body.metrics.find((m: any) => m.metric === "Durable Compute (MB-Seconds)").total as number;
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${busy}/executions/${run.body.id}/stop`)).body.status).toBe("stopped");
    const atStop = await computeNow();
    await new Promise((r) => setTimeout(r, 2500)); // the slow step's own 1.5 s (wall time inside the worker)
    const after = (await k.api("GET", `/projects/${p.id}/durable-functions/${busy}/executions/${run.body.id}`)).body;
    expect(after.status).toBe("stopped");
    expect(after.steps.map((x: any) => x.name)).toEqual(["one"]);
    // The segment that ran on after the stop still counts: at least its 1.5 s at the function's memory.
    await eventually(computeNow, (c) => c - atStop >= 1.5 * 256 * 0.9, 20_000);

    // Deleting the function stops its unfinished executions, each counted once into usage.
    const executionsNow = async () => (await k.api("GET", `/projects/${p.id}/usage`)).body.metrics.find((m: any) => m.metric === "Durable Executions").total as number;
    const sleeper = await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: {} } });
    await settledExecution(p.id, id, sleeper.body.id, ["sleeping"]);
    const before = await executionsNow();
    expect((await k.api("DELETE", `/projects/${p.id}/durable-functions/${id}`)).status).toBe(202);
    expect(await eventually(executionsNow, (n) => n !== before)).toBe(before + 1);
  });

  test("lines stream: what a running execution prints between its steps is searchable while it runs, not only when its segment ends (Python)", async () => {
    // Up to 10 s of the handler's own (wall) time between two steps; the lines show up within the
    // ingest's one-second batching. Before issue 24 they waited in memory for the segment's end.
    const code = tgz({
      "main.py": `import time

def handler(event, step):
    step.run("first", lambda: 1)
    for i in range(200):
        print(f"py tick {i}", flush=True)
        time.sleep(0.05)
    step.run("after", lambda: 2)
    return "done"
`,
    });
    const id = (await deployDurable(k, p.id, { name: "ticker-py", runtime: "python3.11" }, code)).body.id;
    await active(k, p.id, id);
    const ex = (await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: {} } })).body.id as string;
    const search = (q: string) => k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [id] }, q: `invocation.id:${ex} ${q}`, limit: 1000 } });
    const found = await eventually(() => search("tick"), (r) => r.body.data?.length > 0, 8_000);
    const exec = (await k.api("GET", `/projects/${p.id}/durable-functions/${id}/executions/${ex}`)).body;
    expect(exec.status).toBe("running");
    expect(exec.steps.map((s: any) => [s.name, s.status])).toEqual([["first", "completed"]]);
    // Part of the lines, in print order, while the handler is still printing the rest.
    const ticks = found.body.data.map((e: any) => e.body).reverse();
    expect(ticks.length).toBeLessThan(200);
    expect(ticks).toEqual(ticks.map((_: unknown, i: number) => `py tick ${i}`));
    // Kiln's own line about the step is there too, as it happened.
    expect((await search(`"step \\"first\\" completed"`)).body.data).toHaveLength(1);
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex}/stop`)).status).toBe(200);
  });

  test.skipIf(NOT_THE_WORKER)("re-run from a step: a new execution reuses the journal before it and runs the rest again", async () => {
    const id = (
      await deployDurable(
        k,
        p.id,
        { name: "rerunnable", runtime: "nodejs22.x" },
        tgz({ "index.js": `exports.handler = async (e, step) => { const a = await step.run("a", () => Math.random()); const b = await step.run("b", () => Math.random()); const c = await step.run("c", () => a + b); return { a, b, c }; };` }),
      )
    ).body.id;
    await active(k, p.id, id);
    const ex = await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: { keep: "me" } } });
    const first = await settledExecution(p.id, id, ex.body.id);
    const again = await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}/rerun`, { body: { from_step: "b" } });
    expect(again.status).toBe(202);
    expect(again.body.id).not.toBe(ex.body.id);
    const second = await settledExecution(p.id, id, again.body.id);
    expect(second.status).toBe("completed");
    expect(second.rerun_of).toBe(ex.body.id);
    expect(second.input).toEqual({ keep: "me" });
    expect(second.output.a).toBe(first.output.a);
    expect(second.output.b).not.toBe(first.output.b);
    expect(second.output.c).toBe(second.output.a + second.output.b);
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}/rerun`, { body: { from_step: "zzz" } })).status).toBe(400);
    expect((await k.api("POST", `/projects/${p.id}/durable-functions/${id}/executions/${ex.body.id}/rerun`, { body: {} })).status).toBe(400);
  });

  test.skipIf(NOT_THE_WORKER)("finished executions are kept 30 days (KILN_DURABLE_RETENTION_DAYS), then removed with their journals; unfinished ones stay", async () => {
    const id = (await deployDurable(k, p.id, { name: "kept", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (e, step) => { await step.run("a", () => 1); if (e.nap) await step.sleep("nap", "40d"); return "done"; };` }))).body.id;
    await active(k, p.id, id);
    const done = (await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: {} } })).body.id;
    const napping = (await k.api("POST", `/durable-functions/${id}/executions`, { token: sk, body: { input: { nap: true } } })).body.id;
    await settledExecution(p.id, id, done);
    await settledExecution(p.id, id, napping, ["sleeping"]);
    const get = (eid: string) => k.api("GET", `/projects/${p.id}/durable-functions/${id}/executions/${eid}`);
    await advance(29 * 86_400);
    expect((await get(done)).body.status).toBe("completed");
    await advance(2 * 86_400);
    expect((await get(done)).status).toBe(404);
    expect((await get(napping)).body).toMatchObject({ status: "sleeping", steps: [{ name: "a" }, { name: "nap" }] });
    const list = (await k.api("GET", `/projects/${p.id}/durable-functions/${id}/executions`)).body;
    expect(list.data.map((e: any) => e.id)).toEqual([napping]);
  });

  test("schedulers on durable functions start executions with the payload plus __service_schedule; usage counts executions, steps and compute at finish", async () => {
    const q = await createProject(k);
    const id = (await deployDurable(k, q.id, { name: "ticked", runtime: "nodejs22.x" }, tgz({ "index.js": `exports.handler = async (e, step) => { await step.run("one", () => 1); await step.run("two", () => 2); return e; };` }))).body.id;
    await active(k, q.id, id);
    const s = await k.api("POST", `/projects/${q.id}/durable-functions/${id}/schedulers`, { body: { name: "every-minute", enabled: true, schedule: { kind: "cron", cron_expression: "* * * * *" }, payload: { hello: "tick" } } });
    expect(s.status).toBe(201);
    expect(s.body.function_kind).toBe("durable");
    const all = (await k.api("GET", `/projects/${q.id}/schedulers`)).body;
    expect(all.data.map((x: any) => [x.id, x.function_kind])).toContainEqual([s.body.id, "durable"]);
    expect((await k.api("GET", `/projects/${q.id}/functions/${id}/schedulers`)).status).toBe(404);
    await advance(61);
    const executions = `/projects/${q.id}/durable-functions/${id}/executions`;
    await eventually(() => k.api("GET", `${executions}?status=completed`), (r) => r.body.total >= 1, 30_000);
    // No tick may start another execution while usage and executions are compared: the platform clock
    // also runs at the real rate and can cross the next minute meanwhile. Then every one has finished.
    expect((await k.api("PATCH", `/projects/${q.id}/durable-functions/${id}/schedulers/${s.body.id}`, { body: { enabled: false } })).status).toBe(200);
    const settled = (await eventually(() => k.api("GET", executions), (r) => r.body.data.every((x: any) => x.status === "completed"), 30_000)).body;
    const list = (await k.api("GET", `${executions}?status=completed`)).body;
    expect(list.total).toBe(settled.total);
    const e = (await k.api("GET", `/projects/${q.id}/durable-functions/${id}/executions/${list.data[0].id}`)).body;
    expect(e.output.hello).toBe("tick");
    expect(e.output.__service_schedule).toBeTruthy();
    const usage = (await k.api("GET", `/projects/${q.id}/usage`)).body;
    const metric = (name: string) => usage.metrics.find((m: any) => m.metric === name);
    expect(metric("Durable Executions").total).toBe(list.total);
    expect(metric("Durable Operations").total).toBe(2 * list.total);
    expect(metric("Durable Compute (MB-Seconds)").total).toBeGreaterThan(0);
    expect(metric("Function Invocations").total).toBe(0);
  });
});
