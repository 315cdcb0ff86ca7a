// Logs benchmark: ingest while invoking a function that logs, the invoke throughput cost of
// logging, search p50/p99 over LINES stored lines (default 1,000,000) for a free-text term and for
// level:error, and live-tail delivery latency.
// Run: npm run bench:logs   (DATABASE_URL=postgres://... for the production profile's store)
// Targets: ingest >= 50k lines/s, search p50 < 50 ms over 1M lines, tail delivery < 100 ms.
//
// Ingest: 8 concurrent clients invoke a function that prints PER_INVOCATION lines (random words,
// 2% on stderr, 1 in 2,000 holding a rare term) until LINES lines were logged; the rate counts a
// line once it is stored (searchable): the clock stops when a search, which writes everything
// recorded before it, returns. Throughput cost: the same load against a function that prints
// nothing, 10 lines and 100 lines per invocation. Search: 100 searches each through the HTTP API,
// sequential, after the store holds LINES lines. Tail: a function prints a line carrying Date.now(); the
// latency is the SSE event's arrival minus that instant (one machine, one clock). CPU during ingest:
// per line, from /proc, of Kiln's main thread, its log store thread (the embedded profile's only Bun
// Worker in this run), its other threads (garbage collector, JIT), the function workers, this client
// and (DATABASE_URL on this machine) the PostgreSQL backends serving Kiln: the figure to compare when
// the machine is not quiet.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { pct, startKiln, TOKEN } from "./support";

const LINES = Number(process.env.LINES ?? 1_000_000);
const PER_INVOCATION = Number(process.env.PER_INVOCATION ?? 200);
const CONCURRENCY = 8;

const SOURCE = `
const words = "alpha beta gamma delta order customer payment invoice shipping user session cache miss hit request response timeout retry database query slow fast ok done start finish".split(" ");
const pick = () => words[Math.floor(Math.random() * words.length)];
exports.handler = async (e) => {
  if (e.tail) { console.log("tail-probe " + Date.now()); return "ok"; }
  for (let i = 0; i < e.lines; i++) {
    const line = pick() + " " + pick() + " id=" + Math.floor(Math.random() * 1e6) + " took " + Math.floor(Math.random() * 500) + "ms " + pick() + (Math.random() < 0.0005 ? " zebra-needle" : "");
    if (Math.random() < 0.02) console.error(line); else console.log(line);
  }
  return "ok";
};`;

/** CPU seconds (user + system) so far of Kiln's threads by name, of its function workers, of this client and of PostgreSQL backends (`pgPids`). */
function cpuNow(kilnPid: number, pgPids: number[] = []): Map<string, number> {
  const out = new Map<string, number>();
  const ticks = (stat: string) => {
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100;
  };
  const add = (k: string, v: number) => out.set(k, (out.get(k) ?? 0) + v);
  try {
    for (const t of readdirSync(`/proc/${kilnPid}/task`)) {
      const name = readFileSync(`/proc/${kilnPid}/task/${t}/comm`, "utf8").trim();
      const v = ticks(readFileSync(`/proc/${kilnPid}/task/${t}/stat`, "utf8"));
      add(t === String(kilnPid) ? "kiln main thread" : name === "Worker" ? "kiln log store thread" : "kiln other threads (GC, JIT)", v);
    }
    // Descendants: the sandboxes and the function workers in them.
    const parent = new Map<number, number>();
    for (const d of readdirSync("/proc")) {
      if (!/^\d+$/.test(d)) continue;
      try {
        const st = readFileSync(`/proc/${d}/stat`, "utf8");
        parent.set(Number(d), Number(st.slice(st.lastIndexOf(")") + 2).split(" ")[1]));
      } catch {}
    }
    const under = (pid: number) => {
      for (let p = parent.get(pid); p !== undefined && p > 1; p = parent.get(p)) if (p === kilnPid) return true;
      return false;
    };
    for (const pid of parent.keys()) if (under(pid)) try { add("function workers", ticks(readFileSync(`/proc/${pid}/stat`, "utf8"))); } catch {}
    add("bench client", ticks(readFileSync(`/proc/self/stat`, "utf8")));
    for (const pid of pgPids) try { add("postgres backends", ticks(readFileSync(`/proc/${pid}/stat`, "utf8"))); } catch {}
  } catch {
    // not Linux
  }
  return out;
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-logs-"));
  const { url, proc } = await startKiln(dir, process.env.DATABASE_URL ? ["--database-url", process.env.DATABASE_URL] : []);
  const api = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return JSON.parse(text);
  };
  const project = await api("POST", "/projects", { name: "bench-logs" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key;
  const src = mkdtempSync(join(tmpdir(), "kiln-bench-src-"));
  writeFileSync(join(src, "index.js"), SOURCE);
  execFileSync("tar", ["-czf", join(src, "code.tgz"), "-C", src, "index.js"]);
  const form = new FormData();
  form.set("name", "logger");
  form.set("runtime", "nodejs22.x");
  form.set("code", new Blob([new Uint8Array(readFileSync(join(src, "code.tgz")))]), "code.tgz");
  let fn = (await (await fetch(`${url}/projects/${project.id}/functions`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` }, body: form })).json()) as any;
  while (fn.status === "provisioning") {
    await new Promise((r) => setTimeout(r, 20));
    fn = await api("GET", `/projects/${project.id}/functions/${fn.id}`);
  }
  if (fn.status !== "active") throw new Error(`deploy failed: ${JSON.stringify(fn)}`);
  const invokeUrl = `${url}/functions/${fn.id}/invoke`;
  const invoke = async (payload: unknown) => {
    const r = await fetch(invokeUrl, { method: "POST", headers: { authorization: `Bearer ${sk}`, "content-type": "application/json" }, body: JSON.stringify({ payload }) });
    await r.text();
    if (!r.ok) throw new Error(`invoke: ${r.status}`);
  };
  const search = (body: Record<string, unknown>) => api("POST", `/projects/${project.id}/logs/search`, { resource: { type: "function" }, ...body });

  // Throughput of invocations by how much they log (the finish line Kiln adds is there every time).
  const load = async (lines: number, seconds: number) => {
    let done = 0;
    const end = performance.now() + seconds * 1000;
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < end) {
        await invoke({ lines });
        done++;
      }
    }));
    return done / seconds;
  };
  await load(0, 3); // warm-up: every worker started, JIT warm
  const rps: Record<number, number> = {};
  // 100 lines an invocation for 1.5 s stays under the ingest buffer (nothing dropped, nothing waits).
  for (const [lines, seconds] of [[0, 5], [10, 5], [100, 1.5]] as const) {
    rps[lines] = await load(lines, seconds);
    await search({ limit: 1 }); // the lines of one round are stored before the next
  }

  // Ingest: rounds of at most 150,000 lines (under the ingest buffer's 200,000, so none is dropped),
  // each ended by a search, which returns once every line recorded before it is stored. The rate is
  // lines stored over the whole time: logging and storing overlap within a round (writes every second).
  let logged = 0;
  let invocations = 0;
  let producing = 0;
  // The production profile's database: its backends (Kiln's connections) on this machine, when it is local.
  const pg = process.env.DATABASE_URL ? postgres(process.env.DATABASE_URL, { max: 1, onnotice: () => {} }) : null;
  const backends = async () => (pg ? (await pg`select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`).map((r) => Number(r.pid)) : []);
  const pgPids = await backends();
  const cpu0 = cpuNow(proc.pid!, pgPids);
  const t0 = performance.now();
  while (logged < LINES) {
    const round = Math.min(150_000, LINES - logged);
    let inRound = 0;
    const r0 = performance.now();
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (inRound < round) {
        inRound += PER_INVOCATION + 1;
        invocations++;
        await invoke({ lines: PER_INVOCATION });
      }
    }));
    producing += performance.now() - r0;
    logged += inRound;
    await search({ limit: 1 });
  }
  const stored = performance.now();
  const cpu1 = cpuNow(proc.pid!, pgPids);
  const pgAfter = await backends();
  await pg?.end();
  const ingestRate = logged / ((stored - t0) / 1000);
  const producedRate = logged / (producing / 1000);
  const dropped = (await search({ q: '"log lines were dropped"', limit: 1000 })).data.length;

  // Search over the stored lines.
  const timed = async (body: Record<string, unknown>, n = 100) => {
    const ms: number[] = [];
    let found = 0;
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      found = (await search(body)).data.length;
      ms.push(performance.now() - t);
    }
    return { p50: pct(ms, 50), p99: pct(ms, 99), found };
  };
  await timed({ q: "payment" }, 10); // warm-up
  const rare = await timed({ q: "zebra-needle" });
  const common = await timed({ q: "payment" });
  const errors = await timed({ q: "level:error" });
  const errorsAndTerm = await timed({ q: "level:error timeout" });
  const absent = await timed({ q: "qwertyuiop" }, 20);
  const paged = await timed({ q: "level:(error OR warn) -payment", limit: 1000 }, 20);

  // Tail delivery: SSE event arrival minus the instant the function printed the line.
  const ctl = new AbortController();
  const res = await fetch(`${url}/projects/${project.id}/logs/tail?q=tail-probe`, { headers: { authorization: `Bearer ${TOKEN}` }, signal: ctl.signal });
  const latencies: number[] = [];
  const waiting: { wake: (() => void) | null } = { wake: null };
  void (async () => {
    const reader = res.body!.getReader();
    const dec = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        const now = Date.now();
        buf += dec.decode(value, { stream: true });
        for (const m of buf.matchAll(/tail-probe (\d+)/g)) latencies.push(now - Number(m[1]));
        buf = buf.slice(buf.lastIndexOf("\n\n") + 2);
        waiting.wake?.();
      }
    } catch {
      // aborted
    }
  })();
  for (let i = 0; i < 100; i++) {
    const seen = new Promise<void>((r) => (waiting.wake = r));
    await invoke({ tail: true });
    await seen;
  }
  ctl.abort();

  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
  rmSync(src, { recursive: true, force: true });

  const f = (x: number) => x.toFixed(1);
  const profile = process.env.DATABASE_URL ? "production profile (PostgreSQL)" : "embedded profile (segment-file log store on its own thread)";
  console.log(`logs benchmark, ${profile}, ${CONCURRENCY} concurrent clients`);
  console.log(`invoke throughput by lines logged per invocation: 0 -> ${rps[0]!.toFixed(0)}/s, 10 -> ${rps[10]!.toFixed(0)}/s (${f((1 - rps[10]! / rps[0]!) * 100)}% less), 100 -> ${rps[100]!.toFixed(0)}/s (${f((1 - rps[100]! / rps[0]!) * 100)}% less)`);
  console.log(`ingest: ${logged} lines from ${invocations} invocations of ${PER_INVOCATION} lines: logged at ${producedRate.toFixed(0)} lines/s while invoking, stored at ${ingestRate.toFixed(0)} lines/s overall (target >= 50000); ${dropped ? "some lines DROPPED" : "none dropped"}`);
  const cpuRows = [...cpu1].map(([k, v]) => [k, v - (cpu0.get(k) ?? 0)] as const).filter(([, v]) => v > 0);
  const cpuTotal = cpuRows.reduce((n, [, v]) => n + v, 0);
  if (cpuRows.length)
    console.log(
      `   CPU during ingest (${f((stored - t0) / 1000)} s${pgAfter.some((x) => !pgPids.includes(x)) ? "; some PostgreSQL backends started meanwhile are not counted" : ""}): ${cpuRows.map(([k, v]) => `${k} ${f(v)} s (${f((v / logged) * 1e6)} µs/line)`).join(", ")}; all ${f(cpuTotal)} s = ${f((cpuTotal / logged) * 1e6)} µs a line`,
    );
  const row = (name: string, r: { p50: number; p99: number; found: number }) => console.log(`search ${name}: p50 ${f(r.p50)} ms  p99 ${f(r.p99)} ms  (${r.found} entries)`);
  row(`free text, rare term ("zebra-needle", 1 line in 2,000) over ${logged} lines`, rare);
  row(`free text, common term ("payment")`, common);
  row(`level:error (2% of lines)`, errors);
  row(`level:error timeout`, errorsAndTerm);
  row(`absent term (every line ruled out by the index)`, absent);
  row(`level:(error OR warn) -payment, limit 1000`, paged);
  console.log(`   (target: search p50 < 50 ms over 1M lines)`);
  console.log(`tail delivery (print -> SSE event), 100 lines: p50 ${pct(latencies, 50)} ms  p99 ${pct(latencies, 99)} ms  (target < 100 ms)`);
}

await main();
