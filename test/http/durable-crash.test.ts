// Durable executions survive kill -9 of Kiln (issue 16, item 2): at the next start every running or
// sleeping execution continues from its last checkpoint, and no completed step body runs again.
// On the PostgreSQL store the new instance takes over once the dead one's lease lapses (2 s here).
import { expect, test } from "vitest";
import { readEvents } from "../../server/logs/sse-reader";
import { tgz } from "../support/functions";
import { createProject, eventually, startKiln, type TestKiln } from "../support/kiln";

const CODE = {
  node: tgz({
    "index.js": `exports.handler = async (event, step) => {
      const first = await step.run("first", () => ({ at: Date.now(), r: Math.random() }));
      const slow = await step.run("slow", async () => { await new Promise((r) => setTimeout(r, 3000)); return "slow done"; });
      await step.sleep("rest", "1h");
      const last = await step.run("last", () => "last");
      return { first, slow, last };
    };`,
  }),
  python: tgz({
    "main.py": `import random, time

def slow():
    time.sleep(6)
    return "slow done"

def handler(event, step):
    first = step.run("first", lambda: {"at": time.time(), "r": random.random()})
    s = step.run("slow", slow)
    step.sleep("rest", "1h")
    last = step.run("last", lambda: "last")
    return {"first": first, "slow": s, "last": last}
`,
  }),
};

const OPTS = { args: ["--controllable-clock"], env: { KILN_DURABLE_LEASE_MS: "2000" } };

async function deploy(k: TestKiln, projectId: string, lang: "node" | "python") {
  const form = new FormData();
  form.set("name", `survivor-${lang}`);
  form.set("runtime", lang === "node" ? "nodejs22.x" : "python3.11");
  form.set("code", new Blob([new Uint8Array(CODE[lang])]), "code.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
  const id = ((await res.json()) as { id: string }).id;
  await eventually(() => k.api("GET", `/projects/${projectId}/durable-functions/${id}`), (r) => r.body.status === "active", 60_000);
  return id;
}

// Both languages on one Kiln, killed once (a kill and a restart cost two Kiln starts): Python's
// execution enters its slow step (6 s) first, Node's (3 s) second, and each is checked to be inside
// it just before the kill (a step that already finished would prove nothing about the checkpoint).
test("node and python: kill -9 mid-step and mid-sleep: both executions continue from their checkpoints after a restart; completed steps never run again", { timeout: 180_000 }, async () => {
  const a = await startKiln(OPTS);
  let b: TestKiln | null = null;
  try {
    const p = await createProject(a);
    const langs = ["python", "node"] as const;
    const fnIds = Object.fromEntries(await Promise.all(langs.map(async (lang) => [lang, await deploy(a, p.id, lang)] as const))) as Record<(typeof langs)[number], string>;
    const exec = (lang: (typeof langs)[number], id: string, k: TestKiln) => k.api("GET", `/projects/${p.id}/durable-functions/${fnIds[lang]}/executions/${id}`);
    const start = async (lang: (typeof langs)[number]) => (await a.api("POST", `/projects/${p.id}/durable-functions/${fnIds[lang]}/executions`, { body: { input: {} } })).body.id as string;

    // Per language, one execution reaches its sleep; the other is killed inside its slow step.
    const runs = await Promise.all(
      langs.map(async (lang) => {
        const sleeper = await start(lang);
        const asleep = (await eventually(() => exec(lang, sleeper, a), (r) => r.body.status === "sleeping", 30_000)).body;
        return { lang, sleeper, asleep };
      }),
    );
    const midSteps: Record<string, string> = {};
    for (const lang of langs) {
      midSteps[lang] = await start(lang);
      await eventually(() => exec(lang, midSteps[lang]!, a), (r) => r.body.steps?.[0]?.status === "completed", 30_000);
    }
    const before: Record<string, any> = {};
    for (const lang of langs) {
      before[lang] = (await exec(lang, midSteps[lang]!, a)).body;
      expect(before[lang].status, lang).toBe("running");
      expect(before[lang].steps.map((s: any) => s.name), lang).toEqual(["first"]);
    }
    a.proc.kill("SIGKILL");
    await new Promise((r) => a.proc.once("exit", r));

    b = await startKiln({ ...OPTS, dataDir: a.dataDir, databaseUrl: a.databaseUrl, env: { ...OPTS.env, KILN_PLATFORM_TOKEN: a.token } });
    // The interrupted ones run their unfinished step again (at least once), then sleep like the others.
    for (const { lang, sleeper } of runs) {
      const resumed = (await eventually(() => exec(lang, midSteps[lang]!, b!), (r) => r.body.status === "sleeping", 60_000)).body;
      expect(resumed.steps.map((s: any) => [s.name, s.status, s.attempts]), lang).toEqual([
        ["first", "completed", 1],
        ["slow", "completed", 1],
        ["rest", "sleeping", 0],
      ]);
      expect(resumed.steps[0].output, lang).toEqual(before[lang].steps[0].output);
      expect((await exec(lang, sleeper, b)).body.status, lang).toBe("sleeping");
    }

    // An hour of platform time later all finish, with the first step's value from before the crash.
    expect((await b.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 3601 } })).status).toBe(200);
    for (const { lang, sleeper, asleep } of runs)
      for (const [id, first] of [
        [midSteps[lang]!, before[lang].steps[0].output],
        [sleeper, asleep.steps[0].output],
      ] as const) {
        const done = (await eventually(() => exec(lang, id, b!), (r) => ["completed", "failed"].includes(r.body.status), 60_000)).body;
        expect(done.status, lang).toBe("completed");
        expect(done.output, lang).toEqual({ first, slow: "slow done", last: "last" });
        expect(done.steps.map((s: any) => [s.name, s.attempts]), lang).toEqual([
          ["first", 1],
          ["slow", 1],
          ["rest", 0],
          ["last", 1],
        ]);
      }
  } finally {
    if (a.proc.exitCode === null && a.proc.signalCode === null) a.proc.kill("SIGKILL");
    await b?.stop();
  }
});

// Issue 24: a durable execution's lines reach the log store as they are printed, not when its
// segment ends, so a kill -9 of Kiln mid-segment loses no more of them than of any function's lines
// (the ingest writes every second). The handler prints between two steps for up to 20 s of its own
// (wall) time; lines the live tail showed 2.5 s or more before the kill must be in the store after
// the restart, found by the next instance.
const TICKER = tgz({
  "index.js": `exports.handler = async (event, step) => {
    await step.run("first", () => 1);
    for (let i = 0; i < 400; i++) { console.log("tick " + i); await new Promise((r) => setTimeout(r, 50)); }
    await step.run("after", () => 2);
    return "done";
  };`,
});

/** The live tail's lines as they arrive, with when (performance.now()) each arrived. */
async function tailLines(k: TestKiln, projectId: string, q: string) {
  const ctl = new AbortController();
  const res = await fetch(`${k.url}/projects/${projectId}/logs/tail?${new URLSearchParams({ q })}`, { headers: { authorization: `Bearer ${k.token}` }, signal: ctl.signal });
  expect(res.status).toBe(200);
  const lines: Array<{ id: string; body: string; at: number }> = [];
  void (async () => {
    try {
      await readEvents(res, (event, data) => {
        if (event !== "log") return;
        const e = JSON.parse(data);
        lines.push({ id: e.id, body: String(e.body), at: performance.now() });
      });
    } catch {
      // aborted, or Kiln was killed
    }
  })();
  return { lines, close: () => ctl.abort() };
}

test("kill -9 while a durable execution prints between steps: its lines were in the live tail as printed, and those printed before the kill are in the store after the restart", { timeout: 180_000 }, async () => {
  const a = await startKiln(OPTS);
  let b: TestKiln | null = null;
  try {
    const p = await createProject(a);
    const form = new FormData();
    form.set("name", "ticker");
    form.set("runtime", "nodejs22.x");
    form.set("code", new Blob([new Uint8Array(TICKER)]), "code.tgz");
    const fnId = (await (await fetch(`${a.url}/projects/${p.id}/durable-functions`, { method: "POST", headers: { authorization: `Bearer ${a.token}` }, body: form })).json()).id as string;
    await eventually(() => a.api("GET", `/projects/${p.id}/durable-functions/${fnId}`), (r) => r.body.status === "active", 60_000);
    const tail = await tailLines(a, p.id, "tick");
    const id = (await a.api("POST", `/projects/${p.id}/durable-functions/${fnId}/executions`, { body: { input: {} } })).body.id as string;

    // The first tick shows up while the segment still runs (before the fix: only at its end, 20 s on).
    await eventually(async () => tail.lines.length, (n) => n > 0, 15_000);
    const first = tail.lines[0]!.at;
    await eventually(async () => tail.lines.at(-1)!.at, (at) => at - first >= 4000, 15_000);
    const exec = (await a.api("GET", `/projects/${p.id}/durable-functions/${fnId}/executions/${id}`)).body;
    expect(exec.status).toBe("running");
    expect(exec.steps.map((s: any) => s.name)).toEqual(["first"]);
    const killedAt = performance.now();
    a.proc.kill("SIGKILL");
    await new Promise((r) => a.proc.once("exit", r));
    tail.close();
    const due = tail.lines.filter((l) => l.at <= killedAt - 2500);
    expect(due.length).toBeGreaterThan(5);
    expect(tail.lines.every((l) => l.body.startsWith("tick "))).toBe(true);

    b = await startKiln({ ...OPTS, dataDir: a.dataDir, databaseUrl: a.databaseUrl, env: { ...OPTS.env, KILN_PLATFORM_TOKEN: a.token } });
    const stored = new Set<string>();
    let cursor: string | undefined;
    do {
      const r = await b.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function" }, q: `invocation.id:${id} tick`, limit: 1000, cursor } });
      expect(r.status, r.text).toBe(200);
      for (const e of r.body.data) stored.add(e.id);
      cursor = r.body.next_cursor;
    } while (cursor);
    expect(due.filter((l) => !stored.has(l.id)).map((l) => l.body)).toEqual([]);
  } finally {
    if (a.proc.exitCode === null && a.proc.signalCode === null) a.proc.kill("SIGKILL");
    await b?.stop();
  }
});
