// Durable functions benchmark (issue 16, item 8), through the whole HTTP path of a real `kiln start`
// with the controllable clock:
//
// - starts: STARTS executions (default 500) of a one-step durable function started by CONCURRENCY
//   clients (default 8) with a service key on POST /durable-functions/{id}/executions: starts per
//   second (every 202 received), and completions per second (from the first execution's created_at to
//   the last one's finished_at, as the server recorded them) while the starts keep coming;
// - step overhead: a 10-step execution (each step.run does the same small piece of work) against 10
//   sequential invocations of a standard function doing one piece each, and against 1 invocation doing
//   all 10: per step (durable - 10 invocations) / 10 and (durable - 1 invocation) / 10, medians of
//   ROUNDS (default 30). The durable time is the start request's round trip plus created_at to
//   finished_at of the execution (server timestamps, so the client's polling for the end adds
//   nothing); also the step-to-step time inside a running segment (journal write + worker round trip);
// - replay: an execution runs REPLAY_STEPS (default 1,000) trivial steps, then sleeps a minute; the
//   clock is advanced past the sleep and the time from the advance to the execution's completion is
//   measured (a new segment replays the whole journal, then runs one new step). Minus the same with no
//   steps before the sleep: the replay time. Medians of REPLAY_ROUNDS (default 5), alternated.
//
// Run: npm run bench:durable            (embedded profile: PGlite control store)
//      npm run bench:durable -- --postgres   (production profile: a throwaway PostgreSQL started for the run;
//                                              or DATABASE_URL=postgres://... to use that database)
// Targets: step overhead < 2 ms per step; 1,000-step replay < 1 s.
// The load generator is fetch in this process, sharing the machine's cores with Kiln.
import { execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { startPgServer, type PgServer } from "../test/support/postgres-server";
import { pct, startKiln, TOKEN } from "./support";

const STARTS = Number(process.env.STARTS ?? 500);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 8);
const ROUNDS = Number(process.env.ROUNDS ?? 30);
const REPLAY_STEPS = Number(process.env.REPLAY_STEPS ?? 1000);
const REPLAY_ROUNDS = Number(process.env.REPLAY_ROUNDS ?? 5);
const POSTGRES = process.argv.includes("--postgres") || process.env.BENCH_POSTGRES === "1";

/** The same small piece of work in every variant: a few thousand arithmetic operations. */
const WORK = `const work = (i) => { let s = 0; for (let j = 0; j < 20000; j++) s = (s + j * (i + 1)) % 1000003; return s; };`;
const SOURCES = {
  one: `exports.handler = async (e, step) => step.run("only", () => (e && e.i) || 0);`,
  ten: `${WORK}\nexports.handler = async (e, step) => { const out = []; for (let i = 0; i < 10; i++) out.push(await step.run("s" + i, () => work(i))); return out; };`,
  piece: `${WORK}\nexports.handler = async (e) => work(e.i);`,
  all: `${WORK}\nexports.handler = async () => { const out = []; for (let i = 0; i < 10; i++) out.push(work(i)); return out; };`,
  journal: `exports.handler = async (e, step) => { for (let i = 0; i < e.n; i++) await step.run("s" + i, () => i); await step.sleep("nap", e.nap); return step.run("after", () => e.n); };`,
};

const median = (xs: number[]) => pct(xs, 50);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function archive(source: string): Uint8Array<ArrayBuffer> {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-durable-src-"));
  try {
    writeFileSync(join(dir, "index.js"), source);
    execFileSync("tar", ["-czf", join(dir, "code.tgz"), "-C", dir, "index.js"]);
    return new Uint8Array(readFileSync(join(dir, "code.tgz")));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-durable-"));
  let pg: PgServer | null = null;
  let kiln: { url: string; proc: ChildProcess } | null = null;
  const lines: string[] = [];
  try {
    let databaseUrl = process.env.DATABASE_URL;
    if (POSTGRES && !databaseUrl) {
      pg = await startPgServer();
      const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
      await sql.unsafe("create database kiln_bench_durable");
      await sql.end();
      const u = new URL(pg.url);
      u.pathname = "/kiln_bench_durable";
      databaseUrl = u.toString();
    }
    const profile = databaseUrl ? "production profile (PostgreSQL control store)" : "embedded profile (PGlite control store)";
    kiln = await startKiln(dir, ["--controllable-clock", ...(databaseUrl ? ["--database-url", databaseUrl, "--postgres-url", databaseUrl] : [])]);
    const { url } = kiln;

    const call = async (method: string, path: string, body?: unknown, token: string | null = TOKEN) => {
      const headers: Record<string, string> = {};
      if (token) headers.authorization = `Bearer ${token}`;
      if (body !== undefined) headers["content-type"] = "application/json";
      const res = await fetch(url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
      const text = await res.text();
      if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
      return text ? JSON.parse(text) : undefined;
    };
    const project = await call("POST", "/projects", { name: "bench-durable" });
    const sk = (await call("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key as string;
    const base = `/projects/${project.id}`;

    /** Deploys to `collection` and waits until the function is active. */
    const deploy = async (collection: "functions" | "durable-functions", name: string, source: string) => {
      const form = new FormData();
      form.set("name", name);
      form.set("runtime", "nodejs22.x");
      form.set("code", new Blob([archive(source)]), "code.tgz");
      let fn = await (await fetch(`${url}${base}/${collection}`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form })).json() as any;
      while (fn.status === "provisioning" || fn.pending_deployment_id) {
        await sleep(20);
        fn = await call("GET", `${base}/${collection}/${fn.id}`);
      }
      if (fn.status !== "active") throw new Error(`deploy ${name}: ${JSON.stringify(fn)}`);
      return fn.id as string;
    };
    const [oneId, tenId, pieceId, allId, journalId] = [
      await deploy("durable-functions", "one", SOURCES.one),
      await deploy("durable-functions", "ten", SOURCES.ten),
      await deploy("functions", "piece", SOURCES.piece),
      await deploy("functions", "all", SOURCES.all),
      await deploy("durable-functions", "journal", SOURCES.journal),
    ];
    const start = (fnId: string, input: unknown) => call("POST", `/durable-functions/${fnId}/executions`, { input }, sk) as Promise<{ id: string }>;
    const execution = (fnId: string, id: string) => call("GET", `${base}/durable-functions/${fnId}/executions/${id}`);
    /** Polls the list (summaries: no steps, so a long journal costs the server nothing per poll), then reads the execution once. */
    const until = async (fnId: string, id: string, statuses: string[], everyMs: number) => {
      for (;;) {
        const summary = (await call("GET", `${base}/durable-functions/${fnId}/executions?limit=10`)).data.find((x: { id: string }) => x.id === id);
        if (!summary) throw new Error(`execution ${id} is not among the newest`);
        if (statuses.includes(summary.status)) return execution(fnId, id);
        if (summary.status === "failed" || summary.status === "stopped") throw new Error(`execution ${id} ${summary.status}: ${summary.error}`);
        await sleep(everyMs);
      }
    };
    const invoke = (fnId: string, payload: unknown) => call("POST", `/functions/${fnId}/invoke`, { payload }, sk);
    const ms = (iso: string) => Date.parse(iso);

    // --- starts and completions per second ----------------------------------------------------
    for (let i = 0; i < 20; i++) await until(oneId, (await start(oneId, { i })).id, ["completed"], 10); // warm worker, JIT
    const ids: string[] = [];
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < STARTS) {
          next++;
          ids.push((await start(oneId, { i: next })).id);
        }
      }),
    );
    const startSeconds = (performance.now() - t0) / 1000;
    const want = new Set(ids);
    for (;;) {
      const r = await call("GET", `${base}/durable-functions/${oneId}/executions?status=completed&limit=1`);
      if (r.total >= STARTS + 20) break;
      const failed = await call("GET", `${base}/durable-functions/${oneId}/executions?status=failed&limit=1`);
      if (failed.total) throw new Error(`an execution failed: ${JSON.stringify(failed.data[0])}`);
      await sleep(100);
    }
    const finished: { created: number; finished: number }[] = [];
    for (let page = 1; finished.length < STARTS; page++) {
      const r = await call("GET", `${base}/durable-functions/${oneId}/executions?page=${page}&limit=100`);
      if (!r.data.length) break;
      for (const e of r.data) if (want.has(e.id)) finished.push({ created: ms(e.created_at), finished: ms(e.finished_at) });
    }
    const span = (Math.max(...finished.map((e) => e.finished)) - Math.min(...finished.map((e) => e.created))) / 1000;
    const latency = finished.map((e) => e.finished - e.created);

    // --- step overhead --------------------------------------------------------------------------
    for (let i = 0; i < 5; i++) await until(tenId, (await start(tenId, {})).id, ["completed"], 20);
    for (let i = 0; i < 20; i++) await invoke(pieceId, { i }), await invoke(allId, {});
    const durable: number[] = [];
    const stepGap: number[] = [];
    const tenCalls: number[] = [];
    const oneCall: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const s0 = performance.now();
      const { id } = await start(tenId, {});
      const post = performance.now() - s0;
      const e = await until(tenId, id, ["completed"], 20);
      durable.push(post + ms(e.finished_at) - ms(e.created_at));
      stepGap.push((ms(e.steps[9].finished_at) - ms(e.steps[0].finished_at)) / 9);
      const c0 = performance.now();
      for (let i = 0; i < 10; i++) await invoke(pieceId, { i });
      tenCalls.push(performance.now() - c0);
      const a0 = performance.now();
      await invoke(allId, {});
      oneCall.push(performance.now() - a0);
    }

    // --- replay of a long journal ----------------------------------------------------------------
    // Sleeps of a minute: a longer advance lets the platform clock drop the project's variables
    // snapshot (idle 5 minutes of platform time), and the reload retires the warm workers, so every
    // wake would pay a cold start (measured separately below).
    const wakeToEnd = async (n: number, napSeconds = 60) => {
      const { id } = await start(journalId, { n, nap: `${napSeconds}s` });
      const asleep = await until(journalId, id, ["sleeping"], 100);
      const writing = ms(asleep.steps[n].started_at) - ms(asleep.created_at);
      const w0 = performance.now();
      await call("POST", "/_kiln/clock/advance", { seconds: napSeconds + 1 }, null);
      const done = await until(journalId, id, ["completed"], 5);
      const elapsed = performance.now() - w0;
      if (done.output !== n || done.steps.length !== n + 2) throw new Error(`replay of ${n}: ${JSON.stringify(done).slice(0, 300)}`);
      return { elapsed, writing };
    };
    await wakeToEnd(0);
    await wakeToEnd(10);
    const replay: number[] = [];
    const baseline: number[] = [];
    const writing: number[] = [];
    for (let round = 0; round < REPLAY_ROUNDS; round++) {
      const long = await wakeToEnd(REPLAY_STEPS);
      replay.push(long.elapsed);
      writing.push(long.writing);
      baseline.push((await wakeToEnd(0)).elapsed);
    }
    // The same wake with no journal after an hour's sleep (a 3,601 s advance) instead of a minute's.
    const hourWake: number[] = [];
    for (let round = 0; round < REPLAY_ROUNDS; round++) hourWake.push((await wakeToEnd(0, 3600)).elapsed);

    const f = (x: number) => x.toFixed(2);
    const d = median(durable);
    const t = median(tenCalls);
    const o = median(oneCall);
    lines.push(
      `${profile}, ${availableParallelism()} cores`,
      `starts: ${STARTS} executions by ${CONCURRENCY} concurrent clients (service key, POST /durable-functions/{id}/executions): ${(STARTS / startSeconds).toFixed(0)} starts/s`,
      `completions (one-step executions, while the starts came in): ${(STARTS / span).toFixed(0)} executions/s (first created_at to last finished_at ${span.toFixed(2)} s); start to finish p50 ${latency.length ? median(latency).toFixed(0) : "?"} ms, p99 ${latency.length ? pct(latency, 99).toFixed(0) : "?"} ms`,
      `step overhead, medians of ${ROUNDS}: 10-step execution ${f(d)} ms (start round trip + created_at to finished_at), 10 invocations ${f(t)} ms, 1 invocation doing all 10 ${f(o)} ms`,
      `  per step vs 10 invocations: ${f((d - t) / 10)} ms   (target < 2 ms)`,
      `  per step vs 1 invocation:   ${f((d - o) / 10)} ms`,
      `  step to step inside a running segment (journal write + worker round trip): p50 ${f(median(stepGap))} ms`,
      `replay of a ${REPLAY_STEPS}-step journal, medians of ${REPLAY_ROUNDS}: clock advance to completion ${median(replay).toFixed(0)} ms vs ${median(baseline).toFixed(0)} ms with no journal: replay ${(median(replay) - median(baseline)).toFixed(0)} ms   (target < 1000 ms)`,
      `  (the first run writing that journal: ${median(writing).toFixed(0)} ms, ${f(median(writing) / REPLAY_STEPS)} ms per step)`,
      `  wake with no journal after a 1 min sleep ${median(baseline).toFixed(0)} ms, after a 1 h sleep ${median(hourWake).toFixed(0)} ms`,
    );
  } finally {
    if (kiln && kiln.proc.exitCode === null && kiln.proc.signalCode === null) {
      kiln.proc.kill("SIGTERM");
      await new Promise((r) => kiln!.proc.once("exit", r));
    }
    await pg?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  for (const l of lines) console.log(l);
}

await main();
