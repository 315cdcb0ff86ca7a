// `kiln durable` (issue 16, item 7): deploy from a folder or an archive, list, get, deployments,
// delete; start (the project route, with the CLI's token), the executions list and filter, one
// execution with its steps, --watch following it live until it finishes (sleeps woken by the
// controllable clock, never wall time), --wait, stop and rerun, against a real Kiln.
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { tgz } from "../support/functions";
import { BUN, KILN, ROOT, createProject, eventually, removeDir, useCli, useKiln } from "../support/kiln";

const k = useKiln({ args: ["--controllable-clock"] });
const { run, json, configDir } = useCli(k, { passToken: true });
const dir = mkdtempSync(join(tmpdir(), "kiln-durable-cli-"));
afterAll(() => removeDir(dir));

/** A folder holding `files` (path → content). */
function folder(name: string, files: Record<string, string>): string {
  const root = join(dir, name);
  for (const [p, c] of Object.entries(files)) {
    mkdirSync(join(root, p, ".."), { recursive: true });
    writeFileSync(join(root, p), c);
  }
  return root;
}

/** The CLI running in the background (a --watch), its output so far, and how it ended. */
function background(...args: string[]) {
  const proc = spawn(BUN, [KILN, "--url", k.url, "--token", k.token, ...args], {
    cwd: ROOT,
    env: { ...process.env, KILN_CONFIG_DIR: configDir, KILN_URL: k.url, KILN_TOKEN: undefined, KILN_PROJECT: undefined } as NodeJS.ProcessEnv,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => (err += d));
  const exited = new Promise<{ code: number | null; signal: string | null }>((ok) => proc.once("exit", (code, signal) => ok({ code, signal })));
  return {
    proc,
    out: () => out,
    err: () => err,
    exited,
    /** Resolves once the output so far satisfies `ok`. */
    until: (ok: (out: string) => boolean, ms = 30_000) =>
      eventually(async () => out, (o) => ok(o) || proc.exitCode !== null, ms).then((o) => {
        if (!ok(o)) throw new Error(`kiln ${args.join(" ")} ended (${proc.exitCode}) before the expected output:\n${o}\n${err}`);
        return o;
      }),
  };
}

const advance = async (seconds: number) => expect((await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } })).status).toBe(200);

/** Polls `kiln durable execution` (JSON) until its status is one of `statuses`. */
const executionIn = (project: string, fn: string, id: string, statuses: string[]) =>
  eventually(async () => json("durable", "execution", fn, id, "--project", project), (e) => statuses.includes(e.status), 30_000);

/** The last drawing of a live execution view (the output of a pipe holds one block per change). */
const lastDrawing = (out: string) => out.slice(out.lastIndexOf("execution  "));

const WORKFLOW = `
exports.handler = async (event, step) => {
  const a = await step.run("pick", async () => ({ n: Math.random(), got: event.x }));
  await step.sleep("nap", event.nap ?? "1h");
  const b = await step.run("double", () => a.got * 2);
  return { a, b };
};`;

describe("kiln durable", () => {
  test("deploy a folder and an archive, list, get by name and id, deployments, redeploy, start --wait (Python), delete; errors", { timeout: 180_000 }, async () => {
    const p = await createProject(k);
    const src = folder("echo", { "index.js": `exports.handler = async (event, step) => ({ echoed: await step.run("echo", () => event) });`, "node_modules/junk/index.js": "x" });
    const fn = json("durable", "deploy", src, "--project", p.id, "--name", "echo", "--runtime", "nodejs22.x", "--wait");
    expect(fn).toMatchObject({ name: "echo", status: "active", runtime: "nodejs22.x", handler: "handler" });
    expect(fn.pending_deployment_id).toBeUndefined();
    // Only the durable collection has it.
    expect((await k.api("GET", `/projects/${p.id}/durable-functions/${fn.id}`)).body.name).toBe("echo");
    expect((await k.api("GET", `/projects/${p.id}/functions/${fn.id}`)).status).toBe(404);

    const table = run("durable", "list", "--project", p.id);
    expect(table.code, table.err).toBe(0);
    expect(table.out).toMatch(/^ID\s+NAME\s+STATUS\s+RUNTIME\s+HANDLER\s+UPDATED_AT\n/);
    expect(table.out).toMatch(new RegExp(`${fn.id}\\s+echo\\s+active\\s+nodejs22\\.x\\s+handler`));
    expect(json("durable", "list", "--project", p.id).data.map((f: any) => f.id)).toEqual([fn.id]);
    expect(json("durable", "get", "echo", "--project", p.id)).toMatchObject({ id: fn.id, status: "active" });
    expect(json("durable", "get", fn.id, "--project", p.id).name).toBe("echo");
    expect(run("durable", "get", "echo", "--project", p.id).out).toMatch(/^id\s+\S+\nname\s+echo\n/);

    // A new deployment of the same name: the same function, two deployments.
    const again = json("durable", "deploy", src, "--project", p.id, "--name", "echo", "--runtime", "nodejs22.x", "--wait");
    expect(again).toMatchObject({ id: fn.id, status: "active" });
    const deployments = json("durable", "deployments", "echo", "--project", p.id).data;
    expect(deployments.map((d: any) => d.status)).toEqual(["succeeded", "succeeded"]);
    expect(run("durable", "deployments", "echo", "--project", p.id).out).toMatch(/^ID\s+KIND\s+STATUS/);

    // The folder went without node_modules: the execution runs, and its output is the input.
    const done = json("durable", "start", "echo", "--project", p.id, "--input", '{"hello":"world"}', "--wait", "--interval", "100");
    expect(done).toMatchObject({ durable_function_id: fn.id, status: "completed", output: { echoed: { hello: "world" } }, input: { hello: "world" } });
    expect(done.steps).toMatchObject([{ name: "echo", type: "run", status: "completed", attempts: 1, output: { hello: "world" } }]);

    // An archive, Python, a named handler.
    const archive = join(dir, "py.tgz");
    writeFileSync(archive, tgz({ "main.py": `def run(event, step):\n    a = step.run("one", lambda: event["x"] + 1)\n    b = step.run("two", lambda: a * 10)\n    return {"a": a, "b": b}\n` }));
    const py = json("durable", "deploy", archive, "--project", p.id, "--name", "py", "--runtime", "python3.11", "--handler", "run", "--wait");
    expect(py).toMatchObject({ name: "py", status: "active", runtime: "python3.11", handler: "run" });
    const human = run("durable", "start", "py", "--project", p.id, "--input", '{"x":4}', "--wait", "--interval", "100");
    expect(human.code, human.err).toBe(0);
    expect(human.out).toMatch(/^status\s+completed$/m);
    expect(human.out).toMatch(/^output\s+\{"a":5,"b":50\}$/m);
    expect(human.out).toMatch(/^#\s+STEP\s+TYPE\s+STATUS\s+ATTEMPTS\s+STARTED\s+FINISHED\s+TOOK\s+OUTPUT \/ ERROR$/m);
    expect(human.out).toMatch(/^1\s+one\s+run\s+completed\s+1\s+\S+Z\s+\S+Z\s+\d+ ms\s+5$/m);
    expect(human.out).toMatch(/^2\s+two\s+run\s+completed\s+1\s+\S+Z\s+\S+Z\s+\d+ ms\s+50$/m);

    // Errors: one line, with the status.
    expect(run("durable", "list").err).toMatch(/--project/);
    expect(run("durable", "get", "nope", "--project", p.id).err.trim()).toBe("kiln: 404 durable function not found");
    const badName = run("durable", "deploy", src, "--project", p.id, "--name", "Bad_Name", "--runtime", "nodejs22.x");
    expect(badName.code).toBe(1);
    expect(badName.err.trim()).toMatch(/^kiln: 400 .*'name'/);
    const badInput = run("durable", "start", "echo", "--project", p.id, "--input", "{nope");
    expect(badInput.code).toBe(1);
    expect(badInput.err).toMatch(/--input must be JSON/);
    expect(json("durable", "executions", "echo", "--project", p.id).total).toBe(1);

    // Delete: 202 with the function deleting, then gone.
    const deleted = run("durable", "delete", "py", "--project", p.id);
    expect(deleted.code, deleted.err).toBe(0);
    expect(deleted.out.trim()).toBe("Deleting py (deleting)");
    await eventually(async () => run("durable", "get", "py", "--project", p.id), (r) => r.code === 1, 30_000);
    expect(run("durable", "get", py.id, "--project", p.id).err.trim()).toBe("kiln: 404 durable function not found");
    expect(json("durable", "list", "--project", p.id).data.map((f: any) => f.name)).toEqual(["echo"]);
  });

  test("start, the executions list and its status filter, an execution's steps, and --watch until it completes after a clock advance", { timeout: 180_000 }, async () => {
    const p = await createProject(k);
    const fn = json("durable", "deploy", folder("flow", { "index.js": WORKFLOW }), "--project", p.id, "--name", "flow", "--runtime", "nodejs22.x", "--wait");
    const started = json("durable", "start", "flow", "--project", p.id, "--input", '{"x":21}');
    expect(Object.keys(started).sort()).toEqual(["created_at", "durable_function_id", "id", "status"]);
    expect(started).toMatchObject({ durable_function_id: fn.id, status: "queued" });
    const id = started.id as string;

    const sleeping = await executionIn(p.id, "flow", id, ["sleeping", "failed", "completed"]);
    expect(sleeping.status).toBe("sleeping");
    expect(sleeping.steps.map((s: any) => [s.name, s.type, s.status, s.attempts])).toEqual([
      ["pick", "run", "completed", 1],
      ["nap", "sleep", "sleeping", 0],
    ]);
    const picked = sleeping.steps[0].output;
    expect(picked.got).toBe(21);
    expect(Date.parse(sleeping.steps[1].wake_at) - Date.parse(sleeping.steps[1].started_at)).toBe(3_600_000);
    // The same, by function id, from `executions <fn> <id>`.
    expect(json("durable", "executions", fn.id, id, "--project", p.id)).toEqual(sleeping);

    // As a table: the fields, then a row per step with status, attempts, times and output.
    const shown = run("durable", "execution", "flow", id, "--project", p.id);
    expect(shown.code, shown.err).toBe(0);
    expect(shown.out).toMatch(new RegExp(`^execution\\s+${id}$`, "m"));
    expect(shown.out).toMatch(new RegExp(`^function\\s+flow \\(${fn.id}\\)$`, "m"));
    expect(shown.out).toContain(`status       sleeping (until ${sleeping.wake_at})`);
    expect(shown.out).toMatch(/^input\s+\{"x":21\}$/m);
    expect(shown.out).toContain(`1  pick  run    completed  1         ${sleeping.steps[0].started_at}  ${sleeping.steps[0].finished_at}`);
    expect(shown.out).toContain(JSON.stringify(picked));
    expect(shown.out).toMatch(new RegExp(`^2\\s+nap\\s+sleep\\s+sleeping\\s+-\\s+${sleeping.steps[1].started_at}\\s+-\\s+-\\s+until ${sleeping.steps[1].wake_at}$`, "m"));

    // The list, newest first, and its filter.
    const second = json("durable", "start", "flow", "--project", p.id, "--input", '{"x":1,"nap":"2d"}');
    await executionIn(p.id, "flow", second.id, ["sleeping"]);
    const list = json("durable", "executions", "flow", "--project", p.id);
    expect(list.total).toBe(2);
    expect(list.data.map((e: any) => [e.id, e.status])).toEqual([
      [second.id, "sleeping"],
      [id, "sleeping"],
    ]);
    expect(list.data[0].steps).toBeUndefined();
    const listTable = run("durable", "executions", "flow", "--project", p.id, "--limit", "1");
    expect(listTable.out).toMatch(/^ID\s+STATUS\s+CREATED_AT\s+FINISHED_AT\s+WAKE_AT\s+ERROR\n/);
    expect(listTable.out).toMatch(new RegExp(`^${second.id}\\s+sleeping\\s+\\S+\\s+-\\s+\\S+Z\\s+-$`, "m"));
    expect(listTable.out).not.toContain(id);
    expect(listTable.out).toContain("(1 of 2; see more with --page / --limit)");
    expect(json("durable", "executions", "flow", "--project", p.id, "--page", "2", "--limit", "1").data.map((e: any) => e.id)).toEqual([id]);
    expect(json("durable", "executions", "flow", "--project", p.id, "--status", "completed").total).toBe(0);
    expect(run("durable", "executions", "flow", "--project", p.id, "--status", "bogus").err).toMatch(/--status must be one of queued, running, sleeping/);
    expect(run("durable", "execution", "flow", "nope", "--project", p.id).err.trim()).toBe("kiln: 404 execution not found");

    // --watch: shows the sleeping execution, stays while the platform clock has not reached the end
    // of the sleep, and ends by itself once the execution completes after the clock moves past it.
    const watch = background("durable", "executions", "flow", id, "--project", p.id, "--watch", "--interval", "100");
    await watch.until((o) => /^2\s+nap\s+sleep\s+sleeping/m.test(o));
    await advance(1800);
    await new Promise((r) => setTimeout(r, 1000));
    expect(watch.proc.exitCode).toBeNull();
    await advance(1801);
    expect(await watch.exited).toEqual({ code: 0, signal: null });
    const final = lastDrawing(watch.out());
    expect(final).toMatch(/^status\s+completed$/m);
    expect(final).toContain(`output       ${JSON.stringify({ a: picked, b: 42 })}`);
    expect(final).toMatch(/^1\s+pick\s+run\s+completed\s+1\s/m);
    expect(final).toMatch(/^2\s+nap\s+sleep\s+completed\s+-\s+\S+Z\s+\S+Z\s+1h\s+-$/m);
    expect(final).toMatch(/^3\s+double\s+run\s+completed\s+1\s+\S+Z\s+\S+Z\s+\d+ ms\s+42$/m);
    // A drawing per change: the first one was the sleeping execution, none repeats the one before.
    const drawings = watch.out().split(/\n(?=execution  )/);
    expect(drawings[0]).toMatch(/^status\s+sleeping/m);
    for (let i = 1; i < drawings.length; i++) expect(drawings[i]).not.toBe(drawings[i - 1]);

    const done = json("durable", "execution", "flow", id, "--project", p.id);
    expect(done).toMatchObject({ status: "completed", output: { a: picked, b: 42 } });
    expect(done.steps.map((s: any) => [s.name, s.status])).toEqual([
      ["pick", "completed"],
      ["nap", "completed"],
      ["double", "completed"],
    ]);
    expect(json("durable", "executions", "flow", "--project", p.id, "--status", "completed").data.map((e: any) => e.id)).toEqual([id]);
    expect(json("durable", "executions", "flow", "--project", p.id, "--status", "sleeping").data.map((e: any) => e.id)).toEqual([second.id]);

    // --watch of a finished execution draws it once and ends.
    const once = run("durable", "execution", "flow", id, "--project", p.id, "--watch");
    expect(once.code, once.err).toBe(0);
    expect(once.out.match(/^execution {2}/gm)).toHaveLength(1);
  });

  test("start --watch --json: a JSON line per change until the execution ends; --wait and --watch exit 1 when it fails", { timeout: 180_000 }, async () => {
    const p = await createProject(k);
    json("durable", "deploy", folder("flow2", { "index.js": WORKFLOW }), "--project", p.id, "--name", "flow", "--runtime", "nodejs22.x", "--wait");
    const watch = background("--json", "durable", "start", "flow", "--project", p.id, "--input", '{"x":2,"nap":"10m"}', "--watch", "--interval", "100");
    await watch.until((o) => o.split("\n").some((l) => l && JSON.parse(l).status === "sleeping"));
    await advance(601);
    expect(await watch.exited).toEqual({ code: 0, signal: null });
    const lines = watch.out().trim().split("\n").map((l) => JSON.parse(l));
    expect(new Set(lines.map((l) => l.id)).size).toBe(1);
    const last = lines.at(-1);
    expect(last).toMatchObject({ status: "completed", input: { x: 2, nap: "10m" }, output: { a: { got: 2 }, b: 4 } });
    expect(last.steps.map((s: any) => s.name)).toEqual(["pick", "nap", "double"]);
    expect(lines.map((l) => l.status)).toContain("sleeping");
    for (let i = 1; i < lines.length; i++) expect(lines[i]).not.toEqual(lines[i - 1]);

    json("durable", "deploy", folder("broken", { "index.js": `exports.handler = async (e, step) => step.run("boom", () => { throw new RangeError("bad " + e.n); }, { retries: 0 });` }), "--project", p.id, "--name", "broken", "--runtime", "nodejs22.x", "--wait");
    const failed = run("durable", "start", "broken", "--project", p.id, "--input", '{"n":7}', "--wait", "--interval", "100");
    expect(failed.code).toBe(1);
    expect(failed.out).toMatch(/^status\s+failed$/m);
    expect(failed.out).toMatch(/^error\s+RangeError: bad 7$/m);
    expect(failed.out).toMatch(/^1\s+boom\s+run\s+failed\s+1\s+\S+Z\s+\S+Z\s+\d+ ms\s+RangeError: bad 7$/m);
    const watched = run("--json", "durable", "start", "broken", "--project", p.id, "--input", '{"n":8}', "--watch", "--interval", "100");
    expect(watched.code).toBe(1);
    expect(JSON.parse(watched.out.trim().split("\n").at(-1)!)).toMatchObject({ status: "failed", error: "RangeError: bad 8" });
  });

  test("stop a sleeping execution (409 once finished); rerun from a step reuses the journal before it; the list --watch runs until Ctrl-C", { timeout: 180_000 }, async () => {
    const p = await createProject(k);
    json("durable", "deploy", folder("stoppable", { "index.js": `exports.handler = async (e, step) => { await step.sleep("long", "1d"); return step.run("after", () => "woke"); };` }), "--project", p.id, "--name", "stoppable", "--runtime", "nodejs22.x", "--wait");
    const ex = json("durable", "start", "stoppable", "--project", p.id);
    await executionIn(p.id, "stoppable", ex.id, ["sleeping"]);
    const stopped = run("durable", "stop", "stoppable", ex.id, "--project", p.id);
    expect(stopped.code, stopped.err).toBe(0);
    expect(stopped.out).toMatch(/^status\s+stopped$/m);
    expect(stopped.out).toMatch(/^finished_at\s+\S+Z$/m);
    await advance(86_401);
    const after = json("durable", "execution", "stoppable", ex.id, "--project", p.id);
    expect(after).toMatchObject({ id: ex.id, status: "stopped", input: null });
    expect(after.steps.map((s: any) => s.name)).toEqual(["long"]);
    const again = run("durable", "stop", "stoppable", ex.id, "--project", p.id);
    expect(again.code).toBe(1);
    expect(again.err.trim()).toBe("kiln: 409 the execution has already finished (status stopped)");
    expect(json("durable", "executions", "stoppable", "--project", p.id, "--status", "stopped").data.map((e: any) => e.id)).toEqual([ex.id]);

    json("durable", "deploy", folder("rerunnable", { "index.js": `exports.handler = async (e, step) => { const a = await step.run("a", () => Math.random()); const b = await step.run("b", () => Math.random()); const c = await step.run("c", () => a + b); return { a, b, c, keep: e.keep }; };` }), "--project", p.id, "--name", "rerunnable", "--runtime", "nodejs22.x", "--wait");
    const first = json("durable", "start", "rerunnable", "--project", p.id, "--input", '{"keep":"me"}', "--wait", "--interval", "100");
    expect(first.status).toBe("completed");
    const rerun = json("durable", "rerun", "rerunnable", first.id, "--project", p.id, "--from-step", "b");
    expect(Object.keys(rerun).sort()).toEqual(["created_at", "durable_function_id", "id", "status"]);
    expect(rerun.id).not.toBe(first.id);
    const second = await executionIn(p.id, "rerunnable", rerun.id, ["completed", "failed"]);
    expect(second).toMatchObject({ status: "completed", rerun_of: first.id, input: { keep: "me" } });
    expect(second.output.a).toBe(first.output.a);
    expect(second.output.b).not.toBe(first.output.b);
    expect(second.output.c).toBe(second.output.a + second.output.b);
    expect(second.output.keep).toBe("me");
    // With --wait, printed for people once finished.
    const third = run("durable", "rerun", "rerunnable", first.id, "--project", p.id, "--from-step", "c", "--wait", "--interval", "100");
    expect(third.code, third.err).toBe(0);
    expect(third.out).toMatch(new RegExp(`^rerun_of\\s+${first.id}$`, "m"));
    expect(third.out).toMatch(new RegExp(`^1\\s+a\\s+run\\s+completed\\s+1\\s+.*${String(first.output.a).replace(".", "\\.")}$`, "m"));
    expect(run("durable", "rerun", "rerunnable", first.id, "--project", p.id, "--from-step", "zzz").err.trim()).toBe('kiln: 400 invalid request: body field \'from_step\': the execution has no step named "zzz"');
    expect(run("durable", "rerun", "rerunnable", first.id, "--project", p.id).err).toMatch(/--from-step/);

    // The list live: drawn, then redrawn when an execution appears, until Ctrl-C (exit 0).
    const live = background("durable", "executions", "rerunnable", "--project", p.id, "--watch", "--interval", "100");
    await live.until((o) => o.includes(rerun.id));
    const late = json("durable", "start", "rerunnable", "--project", p.id, "--input", '{"keep":"late"}');
    await live.until((o) => new RegExp(`^${late.id}\\s+completed`, "m").test(o));
    live.proc.kill("SIGINT");
    expect(await live.exited).toEqual({ code: 0, signal: null });
    expect(live.out().split("\n\n").length).toBeGreaterThanOrEqual(2);
  });
});
