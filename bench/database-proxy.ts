// The production wire proxy's cost (issue 26): pgbench TPC-B and select-only, 8 clients, prepared, as
// the database's tenant role, side by side in one run against a PostgreSQL started for it:
// - direct to PostgreSQL;
// - through PgBouncer in session mode (Debian's pgbouncer, started here on loopback);
// - through Kiln's wire listener with --postgres-url (the production proxy).
// Plaintext on every leg (loopback): what is compared is the proxying, not TLS. ROUNDS rounds,
// interleaved so a load spike on the shared machine hits every path alike; each path's median is
// reported, and Kiln's ratio to PgBouncer (target: >= 90% on both workloads). After the runs the
// TPC-B balance invariant is checked (the sums of branches, tellers and accounts agree).
// Run: npm run bench:database-proxy   (PGBENCH_SECONDS=5, ROUNDS=3, WARMUP_SECONDS=3 by default; needs pgbench,
// PostgreSQL 15's server binaries and pgbouncer: apt-get install postgresql-15 pgbouncer)
import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { tenantRoleName } from "../server/backends/databases/tenant-roles";
import { startPgServer } from "../test/support/postgres-server";
import { BENCH_SECRET_KEY, benchTenantPassword, operatorRole, startKiln, TOKEN } from "./support";
import { freePort } from "../test/support/free-port";

const SECONDS = Number(process.env.PGBENCH_SECONDS ?? 5);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const WARMUP_SECONDS = Number(process.env.WARMUP_SECONDS ?? 3);
const CLIENTS = Number(process.env.CLIENTS ?? 8); // 8 is the target's; CLIENTS=1 shows latency per round trip

for (const tool of ["pgbench", "pgbouncer"])
  if (!Bun.which(tool) && !Bun.which(`/usr/sbin/${tool}`)) {
    console.error(`${tool} is not installed: apt-get install ${tool === "pgbench" ? "postgresql-client-15" : "pgbouncer"}`);
    process.exit(1);
  }


/** CPU seconds (user + system) a process has used so far. */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100; // utime, stime in clock ticks (USER_HZ 100)
}

function pgbench(url: URL, args: string[]): number {
  const env = { ...process.env, PGPASSWORD: decodeURIComponent(url.password), PGSSLMODE: "disable" };
  const out = spawnSync("pgbench", ["-h", url.hostname, "-p", url.port, "-U", decodeURIComponent(url.username), ...args, decodeURIComponent(url.pathname.slice(1))], { env, encoding: "utf8" });
  const m = /tps = ([\d.]+)/.exec(out.stdout);
  if (!m || out.status !== 0) throw new Error(`pgbench ${args.join(" ")} failed: ${out.stderr || out.stdout}`);
  return Number(m[1]);
}

/** PgBouncer in session mode in front of `server` for `database`; as the postgres OS user when root (it refuses to run as root). */
async function startPgBouncer(server: URL, database: string, user: string, password: string): Promise<{ port: number; proc: ChildProcess; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-pgbouncer-"));
  const port = await freePort();
  writeFileSync(join(dir, "userlist.txt"), `"${user}" "${password}"\n`);
  writeFileSync(
    join(dir, "pgbouncer.ini"),
    [
      "[databases]",
      `${database} = host=${server.hostname} port=${server.port} dbname=${database}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      `unix_socket_dir = ${dir}`,
      "auth_type = scram-sha-256",
      `auth_file = ${join(dir, "userlist.txt")}`,
      "pool_mode = session",
      "max_client_conn = 100",
      "default_pool_size = 20",
      `logfile = ${join(dir, "pgbouncer.log")}`,
      "log_connections = 0",
      "log_disconnections = 0",
      "",
    ].join("\n"),
  );
  const root = process.getuid?.() === 0;
  if (root) {
    const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
    const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
    for (const f of [dir, join(dir, "userlist.txt"), join(dir, "pgbouncer.ini")]) chownSync(f, uid, gid);
  }
  const bin = Bun.which("pgbouncer") ?? "/usr/sbin/pgbouncer";
  const proc = spawn(bin, [...(root ? ["-u", "postgres"] : []), join(dir, "pgbouncer.ini")], { stdio: "ignore" });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise<boolean>((r) => {
      const s = Bun.connect({ hostname: "127.0.0.1", port, socket: { open: (s) => (s.end(), r(true)), data() {}, error: () => r(false), connectError: () => r(false) } }).catch(() => r(false));
      void s;
    });
    if (ok) return { port, proc, dir };
    await Bun.sleep(100);
  }
  throw new Error("pgbouncer did not start listening");
}

const pg = await startPgServer();
const dir = mkdtempSync(join(tmpdir(), "kiln-bench-proxy-"));
const { admin, kilnArgs } = await operatorRole(pg.url);
const { url, proc } = await startKiln(dir, kilnArgs, { KILN_SECRET_KEY: BENCH_SECRET_KEY });
let bouncer: { port: number; proc: ChildProcess; dir: string } | null = null;
try {
  const api = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
    return r.json() as Promise<any>;
  };
  const project = await api("POST", "/projects", { name: "proxy-bench" });
  await api("POST", `/projects/${project.id}/databases`, { name: "app" });
  let db: any;
  for (let i = 0; i < 300; i++) {
    db = await api("GET", `/projects/${project.id}/databases/app`);
    if (db.status === "active") break;
    await Bun.sleep(100);
  }
  const kiln = new URL(db.connection_string);
  const role = tenantRoleName(db.id);
  const password = benchTenantPassword(role);
  const direct = new URL(pg.url);
  direct.username = role;
  direct.password = encodeURIComponent(password);
  direct.pathname = `/kiln_${db.id}`;
  bouncer = await startPgBouncer(direct, `kiln_${db.id}`, role, password);
  const viaBouncer = new URL(direct);
  viaBouncer.port = String(bouncer.port);

  // pgbench's tables at scale 1, made through Kiln (the tenant owns them).
  const init = spawnSync("pgbench", ["-i", "-s", "1", "-q", "-h", kiln.hostname, "-p", kiln.port, "-U", decodeURIComponent(kiln.username), decodeURIComponent(kiln.pathname.slice(1))], {
    env: { ...process.env, PGPASSWORD: decodeURIComponent(kiln.password), PGSSLMODE: "disable" },
    encoding: "utf8",
  });
  if (init.status !== 0) throw new Error(`pgbench -i: ${init.stderr}`);

  const base = ["-c", String(CLIENTS), "-j", String(Math.min(2, CLIENTS)), "-M", "prepared", "-T", String(SECONDS)];
  // WORKLOADS=select (or tpcb) runs only that one; an idle interval first gives Kiln's own idle CPU.
  // WORKLOADS=...,nobranch adds pgbench -N (TPC-B without the tellers' and branches' updates): the same
  // round trips per transaction without TPC-B's one hot row at scale 1, whose lock every transaction
  // holds across its last round trips (so TPC-B's rate follows the latency of a round trip through
  // the proxy, where select-only's follows CPU).
  const chosen = process.env.WORKLOADS?.split(",") ?? ["tpcb", "select"];
  const workloads = Object.fromEntries(Object.entries({ tpcb: base, select: ["-S", ...base], nobranch: ["-N", ...base] }).filter(([w]) => chosen.includes(w)));
  const NAMES: Record<string, string> = { tpcb: "TPC-B      ", select: "select-only", nobranch: "TPC-B -N   " };
  const idle0 = cpuSeconds(proc.pid!);
  await Bun.sleep(3000);
  const idleCpu = (cpuSeconds(proc.pid!) - idle0) / 3;
  // PATHS=...,relay adds a bare Bun TCP relay (bench/tcp-relay.ts): the floor for a proxy on this runtime.
  let relay: ChildProcess | null = null;
  const viaRelay = new URL(direct);
  if (process.env.PATHS?.split(",").includes("relay")) {
    const port = await freePort();
    relay = spawn(process.execPath, [join(import.meta.dirname, "tcp-relay.ts"), String(port), direct.port], { stdio: ["ignore", "pipe", "inherit"] });
    await new Promise((r) => relay!.stdout!.once("data", r));
    viaRelay.port = String(port);
  }
  const all = { direct, pgbouncer: viaBouncer, kiln, relay: viaRelay } as const;
  // PATHS=kiln (comma-separated) runs only those, e.g. to profile Kiln alone.
  const only = process.env.PATHS?.split(",") ?? ["direct", "pgbouncer", "kiln"];
  const paths = Object.fromEntries(Object.entries(all).filter(([p]) => only.includes(p)));
  const tps: Record<string, number[]> = {};
  // The proxy's CPU time per transaction (its own process), the cost a busy machine feels.
  const proxyPid: Record<string, number | undefined> = { pgbouncer: bouncer.proc.pid, kiln: proc.pid, relay: relay?.pid };
  const cpu: Record<string, { s: number; tx: number }> = {};
  // Unmeasured warm-up, every path and workload once: Kiln's JIT compiles the proxy's code during its
  // first seconds of traffic (a long-running proxy's steady state is what is compared; PgBouncer, in
  // C, has none), and the server's caches warm for all paths alike. WARMUP_SECONDS=0 skips it.
  if (WARMUP_SECONDS > 0)
    for (const [, args] of Object.entries(workloads))
      for (const [, target] of Object.entries(paths)) pgbench(target, args.map((a, i) => (args[i - 1] === "-T" ? String(WARMUP_SECONDS) : a)));
  for (let round = 0; round < ROUNDS; round++)
    for (const [w, args] of Object.entries(workloads))
      for (const [p, target] of Object.entries(paths)) {
        const pid = proxyPid[p];
        const before = pid ? cpuSeconds(pid) : 0;
        const t = pgbench(target, args);
        (tps[`${p} ${w}`] ??= []).push(t);
        if (pid) {
          const c = (cpu[`${p} ${w}`] ??= { s: 0, tx: 0 });
          c.s += cpuSeconds(pid) - before;
          c.tx += t * SECONDS;
        }
      }
  const usPerTx = (key: string) => (cpu[key] ? ((1e6 * cpu[key]!.s) / cpu[key]!.tx).toFixed(0) : "-");
  // Kiln's share of its own background work (timers, flushes: its idle CPU) during the runs, taken out.
  const kilnBeyondIdle = (key: string) => (cpu[key] ? ((1e6 * (cpu[key]!.s - idleCpu * SECONDS * ROUNDS)) / cpu[key]!.tx).toFixed(0) : "-");
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

  // TPC-B's invariant: every transaction moved the same delta through a branch, a teller and an account
  // (pgbench truncates pgbench_history before each run, so the history holds the last TPC-B run's only).
  const check = postgres(direct.toString(), { max: 1, onnotice: () => {} });
  const [sums] = await check.unsafe(`select (select sum(bbalance) from pgbench_branches)::bigint as b, (select sum(tbalance) from pgbench_tellers)::bigint as t,
      (select sum(abalance) from pgbench_accounts)::bigint as a`);
  await check.end();
  const balanced = sums!.b === sums!.t && sums!.t === sums!.a;

  const load = (await Bun.file("/proc/loadavg").text()).split(" ").slice(0, 3).join(" ");
  console.log(`production wire proxy, ${new Date().toISOString().slice(0, 10)}: pgbench -c ${CLIENTS} -j ${Math.min(2, CLIENTS)} -M prepared, scale 1, ${SECONDS} s runs, ${ROUNDS} rounds (median) after a ${WARMUP_SECONDS} s warm-up per path, load average after ${load}`);
  console.log(`Kiln idle before the runs: ${(100 * idleCpu).toFixed(1)}% of a core`);
  for (const w of Object.keys(workloads)) {
    const [d, b, k] = (["direct", "pgbouncer", "kiln"] as const).map((p) => (tps[`${p} ${w}`] ? median(tps[`${p} ${w}`]!) : NaN));
    const name = NAMES[w]!;
    console.log(
      `${name}: direct ${d!.toFixed(0)} tps, PgBouncer (session) ${b!.toFixed(0)} (${((100 * b!) / d!).toFixed(0)}% of direct), Kiln ${k!.toFixed(0)} (${((100 * k!) / d!).toFixed(0)}% of direct, ${((100 * k!) / b!).toFixed(0)}% of PgBouncer; target >= 90%); proxy CPU per transaction: PgBouncer ${usPerTx(`pgbouncer ${w}`)} µs, Kiln ${usPerTx(`kiln ${w}`)} µs (${kilnBeyondIdle(`kiln ${w}`)} beyond its idle)${relay ? `, bare Bun relay ${usPerTx(`relay ${w}`)} µs (${median(tps[`relay ${w}`]!).toFixed(0)} tps)` : ""}; runs: ${Object.keys(paths).map((p) => tps[`${p} ${w}`]!.map((x) => x.toFixed(0)).join("/")).join(" | ")}`,
    );
  }
  // pgbench -N moves money through accounts only: the sums no longer agree, by design.
  if (workloads.nobranch) console.log("TPC-B balances: not checked (pgbench -N updates accounts only)");
  else {
    console.log(`TPC-B balances after every run: ${balanced ? "consistent" : "INCONSISTENT"} (sums: branches ${sums!.b}, tellers ${sums!.t}, accounts ${sums!.a})`);
    if (!balanced) process.exitCode = 1;
  }
  relay?.kill("SIGTERM");
} finally {
  if (bouncer) {
    bouncer.proc.kill("SIGTERM");
    await new Promise((r) => bouncer!.proc.once("exit", r));
    rmSync(bouncer.dir, { recursive: true, force: true });
  }
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  await admin.end();
  await pg.stop();
  rmSync(dir, { recursive: true, force: true });
}
