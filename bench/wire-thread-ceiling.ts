// What serving the embedded wire endpoint from the database's own thread could gain at most (issue 26
// item 7): Kiln's wire listener and session mux in front of PGlite on its own thread (`PgliteThread`,
// what Kiln runs: every batch crosses main -> database thread -> main) against the same listener and
// mux in front of PGlite in the listener's thread (`InProcessSession`: no hand-over at all, which is
// what a connection served by the database thread, with the mux there, would cost at best). pgbench
// against both, alternating, and pgbench's TPC-B in process on PGlite (one call per statement) as
// issue 26's baseline. No usage accounting, no Kiln HTTP server: only the wire path. Prints, per
// run, this process's CPU per transaction by thread name and the calls into PGlite per transaction.
// What it showed (session 18, load average 3.0-6.2, three runs; docs/databases.md "Performance"):
// B / A: TPC-B -c 8 126-168%, -c 1 152-183%, select-only -c 8 70-105% (on one thread PGlite no
// longer overlaps the socket work); B / in process: TPC-B -c 8 27-42% (27% in the quietest run),
// -c 1 36-62%. So moving the connection to the database thread would not reach issue 26's 60% on
// its own: Kiln's listener + mux cost 60-120 µs of CPU per statement round trip on one thread.
// Run: bun bench/wire-thread-ceiling.ts   (PGBENCH_SECONDS=5, ROUNDS=2; needs pgbench)
//      profile one path: VARIANT=inline BASELINE=off WORKLOADS="TPC-B -c 1" bun --cpu-prof-md --cpu-prof-dir=/tmp/prof bench/wire-thread-ceiling.ts
import { PGlite } from "@electric-sql/pglite";
import { rmSync } from "node:fs";
import { loadavg } from "node:os";
import { InProcessSession, PgliteThread, type PgliteSession } from "../server/backends/databases/pglite-thread";
import { startWireListener, type WireRouter } from "../server/backends/databases/wire/listener";
import { PgliteSessionMux } from "../server/backends/databases/wire/pglite-mux";
import { PGLITE_CONF } from "../server/store/pglite-store";
import { pgliteFileOptions } from "../server/store/pglite-wasm";
import { emptyClusterDir, inProcessPointSelect, inProcessTpcb } from "./pglite-in-process";
import { cpuByThreadName, cpuMs } from "./thread-cpu";

const SECONDS = Number(process.env.PGBENCH_SECONDS ?? 5);
const ROUNDS = Number(process.env.ROUNDS ?? 2);
const PASSWORD = "bench-Pa55word";
const load = () => loadavg().map((l) => l.toFixed(1)).join(" ");



async function pgbench(cs: string, args: string[]): Promise<{ tps: number; transactions: number }> {
  const p = Bun.spawn(["pgbench", ...args, cs], { stdout: "pipe", stderr: "pipe", env: { ...process.env, PGSSLMODE: "disable", PGPASSWORD: PASSWORD } });
  const [out, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text()]);
  if ((await p.exited) !== 0) throw new Error(`pgbench ${args.join(" ")} failed:\n${out}${err}`);
  const tps = Number(/tps = ([\d.]+)/.exec(out)?.[1]);
  const transactions = Number(/number of transactions actually processed: (\d+)/.exec(out)?.[1]);
  return { tps, transactions };
}


async function main() {
  if (!Bun.which("pgbench")) throw new Error("pgbench not installed");
  const dirs = [await emptyClusterDir("kiln-bench-ceiling-"), await emptyClusterDir("kiln-bench-ceiling-")];
  const sessions: Record<"thread" | "inline", PgliteSession> = {
    thread: await PgliteThread.open(dirs[0]!, PGLITE_CONF),
    inline: new InProcessSession(new PGlite(dirs[1]!, { ...pgliteFileOptions(), postgresqlconf: PGLITE_CONF } as ConstructorParameters<typeof PGlite>[0])),
  };
  await (sessions.inline as InProcessSession).db.waitReady;
  // Calls into PGlite, counted per path: how many hand-overs a transaction costs.
  const calls = { thread: 0, inline: 0 };
  const counted = (name: "thread" | "inline"): PgliteSession => {
    const s = sessions[name];
    return {
      ready: () => s.ready(),
      exec: (bytes) => (calls[name]++, s.exec(bytes)),
      restart: () => s.restart(),
      close: () => s.close(),
      get closed() {
        return s.closed;
      },
    };
  };
  const muxes = { thread: new PgliteSessionMux(counted("thread")), inline: new PgliteSessionMux(counted("inline")) };
  const router: WireRouter = {
    async credentials(user, database) {
      return user === "bench" && (database === "thread" || database === "inline") ? { target: database, password: PASSWORD } : null;
    },
    async open(target, client, control) {
      return muxes[target as "thread" | "inline"].open([], client, control);
    },
  };
  const listener = await startWireListener({ host: "127.0.0.1", port: 0, router });
  const cs = (db: string) => `postgres://bench@127.0.0.1:${listener.port}/${db}`;
  for (const db of ["thread", "inline"]) await pgbench(cs(db), ["-i", "-s", "1", "-q"]);

  const runs: Record<string, { tps: number[]; cpu: number[]; calls: number[] }> = {};
  const record = (key: string, tps: number, cpuUs: number, callsPerTransaction: number) => {
    (runs[key] ??= { tps: [], cpu: [], calls: [] }).tps.push(tps);
    runs[key]!.cpu.push(cpuUs);
    runs[key]!.calls.push(callsPerTransaction);
  };
  console.log(`load before: ${load()}; ${SECONDS} s runs, ${ROUNDS} rounds alternating, plaintext, pgbench -j 2`);
  const all: Record<string, string[]> = {
    "TPC-B -c 8": ["-c", "8", "-j", "2", "-M", "prepared"],
    "TPC-B -c 1": ["-c", "1", "-M", "prepared"],
    "select-only -c 8": ["-c", "8", "-j", "2", "-S", "-M", "prepared"],
  };
  // WORKLOADS="TPC-B -c 1" (comma-separated names) runs only those (e.g. under bun --cpu-prof-md).
  const workloads = Object.fromEntries(Object.entries(all).filter(([name]) => !process.env.WORKLOADS || process.env.WORKLOADS.split(",").includes(name)));
  for (const db of ["thread", "inline"]) await pgbench(cs(db), [...all["TPC-B -c 8"]!, "-T", "2"]); // warm-up
  const baseline = { tpcb: [] as number[], tpcbCpu: [] as number[], select: [] as number[] };
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, args] of Object.entries(workloads))
      for (const db of (r % 2 ? ["inline", "thread"] : ["thread", "inline"]).filter((d) => !process.env.VARIANT || d === process.env.VARIANT)) {
        const c0 = cpuMs();
        const n0 = calls[db as "thread" | "inline"];
        const t0 = cpuByThreadName();
        const { tps, transactions } = await pgbench(cs(db), [...args, "-T", String(SECONDS)]);
        const perThread = [...cpuByThreadName()]
          .map(([thread, ms]) => [thread, ((ms - (t0.get(thread) ?? 0)) * 1000) / transactions] as const)
          .filter(([, us]) => us >= 1)
          .sort((a, b) => b[1] - a[1]);
        console.log(`  ${name}, ${db}: ${tps.toFixed(0)} tps; CPU µs per transaction by thread: ${perThread.map(([t, us]) => `${t} ${us.toFixed(0)}`).join(", ")}`);
        record(`${name} ${db}`, tps, ((cpuMs() - c0) * 1000) / transactions, (calls[db as "thread" | "inline"] - n0) / transactions);
      }
    if (process.env.BASELINE === "off") continue;
    const local = await inProcessTpcb(SECONDS);
    baseline.tpcb.push(local.tps);
    baseline.tpcbCpu.push(local.cpuUsPerTransaction);
    baseline.select.push((await inProcessPointSelect(SECONDS)).raw);
  }
  await listener.close();
  for (const m of Object.values(muxes)) await m.closeAll("bench over");
  for (const s of Object.values(sessions)) await s.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });

  const fmt = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(", ");
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const pc = (a: number[], b: number[]) => `${((sum(a) / sum(b)) * 100).toFixed(0)}%`;
  console.log(`in process on PGlite, per round: TPC-B ${fmt(baseline.tpcb)} tps (${fmt(baseline.tpcbCpu)} µs of CPU a transaction); raw prepared point select ${fmt(baseline.select)}/s`);
  console.log("| workload | A: mux + PGlite on its thread (Kiln today) | B: mux + PGlite in the listener's thread | B / A | A, B / in process | CPU per transaction (this process), A / B | calls into PGlite per transaction, A / B |");
  console.log("|---|---|---|---|---|---|---|");
  for (const name of Object.keys(workloads)) {
    const t = runs[`${name} thread`] ?? { tps: [], cpu: [], calls: [] };
    const i = runs[`${name} inline`] ?? { tps: [], cpu: [], calls: [] };
    const base = name.startsWith("TPC-B") ? baseline.tpcb : baseline.select;
    console.log(`| ${name} | ${fmt(t.tps)} tps | ${fmt(i.tps)} tps | ${pc(i.tps, t.tps)} | ${pc(t.tps, base)}, ${pc(i.tps, base)} | ${fmt(t.cpu)} / ${fmt(i.cpu)} µs | ${t.calls.map((x) => x.toFixed(2)).join(", ")} / ${i.calls.map((x) => x.toFixed(2)).join(", ")} |`);
  }
  console.log(`load after: ${load()}`);
  process.exit(0);
}

await main();
