// Starts a real `kiln start` process for black-box tests and speaks HTTP to it.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import postgres from "postgres";
import { afterAll, beforeAll, inject } from "vitest";
import { removeDir } from "./dirs";

export const ROOT = resolve(import.meta.dirname, "../..");
export const BUN = join(ROOT, "node_modules/.bin/bun");
export const KILN = join(ROOT, "cmd/kiln.ts");
/**
 * KILN_TEST_BINARY=dist/kiln runs every Kiln and CLI call of the black-box files with the compiled
 * binary (docs/binary.md) instead of Bun on cmd/kiln.ts.
 */
export const TEST_BINARY = process.env.KILN_TEST_BINARY ? resolve(process.env.KILN_TEST_BINARY) : undefined;

/** Which control store this vitest project tests: `embedded` (PGlite) or `postgres`. */
export const STORE = (process.env.KILN_TEST_STORE ?? "embedded") as "embedded" | "postgres";
/** Where storage objects live: files in the data dir, or the s3 project's S3 server. */
export const BLOBS = (process.env.KILN_TEST_BLOBS ?? "filesystem") as "filesystem" | "s3";
export const FUNCTION_RUNTIME = (process.env.KILN_TEST_FUNCTION_RUNTIME ?? "process") as "process" | "docker";

export interface KilnOptions {
  env?: Record<string, string | undefined>;
  args?: string[];
  dataDir?: string;
  /** Keep the database across restarts (postgres store). */
  databaseUrl?: string;
  /** The managed databases' server as Kiln's role sees it (postgres store; the test server's superuser by default). */
  postgresUrl?: string;
  /** Do not set KILN_PLATFORM_TOKEN (let Kiln generate one). */
  generatedToken?: boolean;
  /** How long to wait for "Kiln listening" (default 30 s); a --resettable or --seed start does more. */
  startTimeoutMs?: number;
  /** A command that runs Kiln (its argv follows), e.g. a mount namespace hiding host tools. */
  wrap?: string[];
  /** Run this compiled Kiln (dist/kiln, test/http/binary.test.ts) instead of Bun on cmd/kiln.ts. */
  binary?: string;
  /** The process's working directory (the repository by default). */
  cwd?: string;
}

export interface ApiResponse<T = any> {
  status: number;
  headers: Headers;
  body: T;
  text: string;
}

export interface TestKiln {
  url: string;
  token: string;
  adminToken: string;
  dataDir: string;
  databaseUrl?: string;
  stdout: string;
  stderr: string;
  proc: ChildProcess;
  api<T = any>(method: string, path: string, opts?: { token?: string | null; body?: unknown; headers?: Record<string, string> }): Promise<ApiResponse<T>>;
  /** SIGTERM and wait; resolves with the exit code. */
  stop(): Promise<number | null>;
}

/**
 * The instance secret key of every Kiln a test file starts (unless the test gives its own): two Kilns
 * on one PostgreSQL store, or a restart on a kept data dir, must share it. Not a secret: tests only. A test
 * that gives KILN_SECRET_KEY_FILE sets KILN_SECRET_KEY: undefined.
 */
export const TEST_SECRET_KEY = "A10Qdl2DbSyR4A9D78mjIiBjC4ESFKdOQSkd6ZRimKI=";

export function secret(prefix: string): string {
  return `${prefix}-${randomBytes(24).toString("hex")}`;
}

/** A fresh, empty database on the test PostgreSQL server. */
export async function freshDatabase(): Promise<string> {
  const admin = inject("pgUrl");
  const name = `kiln_${randomBytes(6).toString("hex")}`;
  const sql = postgres(admin, { max: 1, onnotice: () => {} });
  await sql.unsafe(`create database ${name}`);
  await sql.end();
  const u = new URL(admin);
  u.pathname = `/${name}`;
  return u.toString();
}

/**
 * `env` for a Kiln whose memory a test measures: Bun's allocator as Kiln runs for users, handing freed
 * pages back to the kernel (vitest.config.ts turns that off for the suite's short-lived processes).
 */
export const PRODUCT_ALLOCATOR: Record<string, string | undefined> = { MIMALLOC_PURGE_DELAY: undefined };

export async function startKiln(opts: KilnOptions = {}): Promise<TestKiln> {
  const dataDir = opts.dataDir ?? mkdtempSync(join(tmpdir(), "kiln-test-"));
  if (basename(dataDir).startsWith("kiln-test-")) madeDirs.add(dataDir);
  const databaseUrl = opts.databaseUrl ?? (STORE === "postgres" ? await freshDatabase() : undefined);
  const token = opts.generatedToken ? "" : (opts.env?.KILN_PLATFORM_TOKEN ?? secret("pk"));
  const adminToken = opts.env?.KILN_ADMIN_TOKEN ?? secret("admin");
  // The postgres project runs the production profile: control store and managed databases on PostgreSQL.
  const production = databaseUrl ? ["--database-url", databaseUrl, "--postgres-url", opts.postgresUrl ?? inject("pgUrl")] : [];
  // The containers project runs every function in a container on the engine its global setup provides.
  const containers = FUNCTION_RUNTIME === "docker" ? ["--function-runtime", "docker", "--docker-host", inject("dockerHost")] : [];
  // The s3 project keeps storage objects on the S3 server its global setup provides, a bucket per Kiln.
  const s3 = BLOBS === "s3" ? ["--s3-endpoint", inject("s3").endPoint, "--s3-bucket", `kiln-test-${randomBytes(6).toString("hex")}`] : [];
  const args = [KILN, "start", "--port", "0", "--pg-port", "0", "--data-dir", dataDir, ...production, ...containers, ...s3, ...(opts.args ?? [])];
  const env: Record<string, string | undefined> = {
    ...process.env,
    KILN_VALIDATE_RESPONSES: "1",
    KILN_LOG: "quiet",
    KILN_SECRET_KEY: TEST_SECRET_KEY,
    KILN_ADMIN_TOKEN: adminToken,
    KILN_PLATFORM_TOKEN: token || undefined,
    ...(BLOBS === "s3" ? { KILN_S3_ACCESS_KEY: inject("s3").accessKey, KILN_S3_SECRET_KEY: inject("s3").secretKey, KILN_S3_REGION: inject("s3").region } : {}),
    ...opts.env,
  };
  for (const k of Object.keys(env)) if (env[k] === undefined) delete env[k];
  const binary = opts.binary ?? TEST_BINARY;
  const argv = [...(opts.wrap ?? []), ...(binary ? [binary, ...args.slice(1)] : [BUN, ...args])];
  const proc = spawn(argv[0]!, argv.slice(1), { cwd: opts.cwd ?? ROOT, env: env as NodeJS.ProcessEnv, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  proc.stderr!.on("data", (d) => (stderr += d));
  const url = await new Promise<string>((ok, fail) => {
    const wait = opts.startTimeoutMs ?? 30_000;
    // A Kiln that did not start in time is killed: left running, it would listen later with nobody to stop
    // it (seen on a loaded machine: orphaned Kilns after such failures, each holding its data dir and CPU).
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      fail(new Error(`kiln did not start in ${wait / 1000} s\n${stdout}\n${stderr}`));
    }, wait);
    proc.stdout!.on("data", (d) => {
      stdout += d;
      const m = /Kiln listening on (http:\/\/\S+)/.exec(stdout);
      if (m) {
        clearTimeout(timer);
        ok(m[1]!);
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`kiln exited with ${code} before listening\n${stdout}\n${stderr}`));
    });
  });
  const platformToken = token || /(pk-[A-Za-z0-9]+)/.exec(stdout)?.[1] || "";
  const k: TestKiln = {
    url,
    token: platformToken,
    adminToken,
    dataDir,
    databaseUrl,
    get stdout() {
      return stdout;
    },
    get stderr() {
      return stderr;
    },
    proc,
    async api(method, path, o = {}) {
      const headers: Record<string, string> = { ...o.headers };
      const bearer = o.token === undefined ? platformToken : o.token;
      if (bearer !== null) headers.authorization = `Bearer ${bearer}`;
      let body: string | undefined;
      if (o.body !== undefined) {
        body = typeof o.body === "string" ? o.body : JSON.stringify(o.body);
        headers["content-type"] ??= "application/json";
      }
      // A Kiln that stops answering fails the call with what it printed, not a silent test timeout.
      let res: Response, text: string;
      try {
        res = await fetch(url + path, { method, headers, body, signal: AbortSignal.timeout(API_TIMEOUT_MS) });
        text = await res.text();
      } catch (err) {
        if ((err as Error)?.name !== "TimeoutError") throw err;
        throw new Error(`${method} ${path}: no answer in ${API_TIMEOUT_MS / 1000} s\n${stderr.slice(-4000)}`);
      }
      let parsed: any = text;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {}
      return { status: res.status, headers: res.headers, body: parsed, text };
    },
    stop() {
      return stopProcess(proc, () => stderr);
    },
  };
  running.add(k);
  proc.once("exit", () => running.delete(k));
  return k;
}

/** Longest a test waits for one API answer. */
const API_TIMEOUT_MS = 50_000;
/**
 * A stop's bounds, all inside the 60 s hook timeout so that a slow stop prints what it waits for
 * instead of failing as a silent hook timeout: a note at SLOW_STOP_MS (what Kiln printed, the
 * process's state), SIGKILL at KILL_AFTER_MS (Kiln's own deadline, KILN_STOP_TIMEOUT_MS, is 30 s),
 * then at most GONE_WAIT_MS for the process to be gone.
 */
const SLOW_STOP_MS = Number(process.env.KILN_TEST_SLOW_STOP_MS ?? 10_000);
const KILL_AFTER_MS = 35_000;
const GONE_WAIT_MS = 10_000;

/** The kernel's view of a process (state, what it waits in), or "" once it is gone. */
function processState(pid: number | undefined): string {
  if (!pid) return "";
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
    if (state === "Z" || state === "X") return "";
    // Threads counted by state and the kernel function they wait in (a D state names the I/O).
    const counts = new Map<string, number>();
    for (const t of readdirSync(`/proc/${pid}/task`)) {
      try {
        const ts = readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8");
        const key = `${ts.slice(ts.lastIndexOf(")") + 2).split(" ")[0]}:${readFileSync(`/proc/${pid}/task/${t}/wchan`, "utf8") || "-"}`;
        counts.set(key, (counts.get(key) ?? 0) + 1);
      } catch {}
    }
    return `state ${state}; threads ${[...counts].map(([k, n]) => `${n}x ${k}`).join(", ")}`;
  } catch {
    return "";
  }
}

/** SIGTERM, then SIGKILL if it outlasts KILL_AFTER_MS; resolves with the exit code (null if killed). */
export function stopProcess(proc: ChildProcess, stderr: () => string): Promise<number | null> {
  return new Promise((ok) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return ok(proc.exitCode);
    const t0 = Date.now();
    const secs = () => ((Date.now() - t0) / 1000).toFixed(1);
    const timers: ReturnType<typeof setTimeout>[] = [];
    let poll: ReturnType<typeof setInterval> | undefined;
    let done = false;
    const finish = (code: number | null) => {
      if (done) return;
      done = true;
      for (const t of timers) clearTimeout(t);
      clearInterval(poll);
      // A slow stop is worth a line in the output even when it ends well (what CI runs show).
      if (Date.now() - t0 > SLOW_STOP_MS) console.error(`kiln took ${secs()} s to stop (exit ${code})`);
      ok(code);
    };
    proc.once("exit", (code) => finish(code));
    timers.push(
      setTimeout(() => console.error(`kiln (pid ${proc.pid}) still stopping after ${secs()} s: ${processState(proc.pid)}\n${stderr().slice(-3000)}`), SLOW_STOP_MS),
      setTimeout(() => {
        console.error(`kiln did not exit ${secs()} s after SIGTERM (${processState(proc.pid)}); killed\n${stderr().slice(-3000)}`);
        proc.kill("SIGKILL");
        // Gone is gone: do not rely on the exit event alone.
        poll = setInterval(() => {
          if (!processState(proc.pid)) finish(null);
        }, 200);
        timers.push(
          setTimeout(() => {
            console.error(`kiln (pid ${proc.pid}) still there ${secs()} s after SIGKILL: ${processState(proc.pid)}`);
            finish(null);
          }, GONE_WAIT_MS),
        );
      }, KILL_AFTER_MS),
    );
    proc.kill("SIGTERM");
  });
}

const running = new Set<TestKiln>();
process.on("exit", () => {
  for (const k of running) k.proc.kill("SIGKILL");
});

/**
 * The test data dirs of this file's Kilns. Tests remove what they start, but one that fails or times
 * out (or restarts a Kiln on its dir and keeps it to the end) leaves its Kiln and dir behind: when the
 * file ends, a Kiln still running is killed and every dir goes. Registered when a test file first
 * imports this module, the hook runs after the file's own (vitest runs afterAll hooks as a stack).
 */
const madeDirs = new Set<string>();
afterAll(() => {
  for (const k of running) k.proc.kill("SIGKILL");
  for (const d of madeDirs) removeDir(d);
  madeDirs.clear();
});

export { removeDir } from "./dirs";

/** Creates a project with the platform token and returns it. */
export async function createProject(k: TestKiln, name = `p-${randomBytes(4).toString("hex")}`, token?: string) {
  const r = await k.api("POST", "/projects", { body: { name }, token });
  if (r.status !== 201) throw new Error(`create project: ${r.status} ${r.text}\n${k.stderr}`);
  return r.body as { id: string; name: string; status: string };
}

export async function createToken(k: TestKiln, projectId: string, body: Record<string, unknown> = {}) {
  const r = await k.api("POST", `/projects/${projectId}/access-tokens`, {
    body: { name: `t-${randomBytes(4).toString("hex")}`, scope: "full", ...body },
  });
  if (r.status !== 201) throw new Error(`create token: ${r.status} ${r.text}\n${k.stderr}`);
  return r.body as { id: string; token: string; name: string; scope: string };
}

/**
 * For a test that counts in windows of Kiln's clock (hourly rate limits, daily usage): when the
 * current window of `periodSeconds` has less than `marginSeconds` left, moves the clock (Kiln started
 * with --controllable-clock) just past its end, so the test's requests all fall in one window. The
 * clock runs with the wall clock, and CI runs cross hours and midnights.
 */
export async function clearOfWindowEnd(k: TestKiln, periodSeconds: number, marginSeconds = 300) {
  const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now) / 1000;
  const left = periodSeconds - (now % periodSeconds);
  if (left >= marginSeconds) return;
  const r = await k.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: Math.ceil(left) + 1 } });
  if (r.status !== 200) throw new Error(`clock advance: ${r.status} ${r.text}`);
}

/** Polls until the predicate holds (async work such as deletion and propagation). */
export async function eventually<T>(fn: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  let v = await fn();
  while (!ok(v)) {
    if (Date.now() > end) throw new Error(`condition not met in ${timeoutMs} ms; last value: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
    v = await fn();
  }
  return v;
}

/**
 * One Kiln for the enclosing describe block (or file): started before its tests, stopped and removed
 * after. The returned object forwards to the running instance.
 */
export function useKiln(opts: KilnOptions = {}): TestKiln {
  let inst: TestKiln | undefined;
  beforeAll(async () => {
    inst = await startKiln(opts);
  });
  afterAll(async () => {
    if (!inst) return;
    // Kiln exits 1 when its stop outlasts KILN_STOP_TIMEOUT_MS: say what it waited for.
    if ((await inst.stop()) !== 0) console.error(`kiln did not stop cleanly:\n${inst.stderr.slice(-2000)}`);
    removeDir(inst.dataDir);
  });
  return new Proxy({} as TestKiln, {
    get(_, prop) {
      if (!inst) throw new Error("Kiln is not started yet: use it inside a test or hook");
      const v = (inst as any)[prop];
      return typeof v === "function" ? v.bind(inst) : v;
    },
  });
}

/** A Kiln for a single test: started, handed to `fn`, and stopped and removed whatever happens. */
export async function withKiln<T>(opts: KilnOptions, fn: (k: TestKiln) => Promise<T>): Promise<T> {
  const k = await startKiln(opts);
  try {
    return await fn(k);
  } finally {
    await k.stop();
    removeDir(k.dataDir);
  }
}

/**
 * Runs the `kiln` CLI against a test server, with its own config folder (so `kiln login` in one test
 * file never touches another's). `passToken` adds `--url` and `--token` to every call.
 */
export function useCli(k: TestKiln, o: { passToken?: boolean } = {}) {
  const configDir = mkdtempSync(join(tmpdir(), "kiln-cli-"));
  afterAll(() => removeDir(configDir));
  const run = (...args: string[]) => {
    const r = spawnSync(TEST_BINARY ?? BUN, [...(TEST_BINARY ? [] : [KILN]), ...(o.passToken ? ["--url", k.url, "--token", k.token] : []), ...args], {
      cwd: ROOT,
      encoding: "utf8",
      env: { ...process.env, KILN_CONFIG_DIR: configDir, KILN_URL: k.url, KILN_TOKEN: undefined, KILN_SERVICE_KEY: undefined } as NodeJS.ProcessEnv,
    });
    return { code: r.status, out: r.stdout, err: r.stderr };
  };
  const json = (...args: string[]) => {
    const r = run("--json", ...args);
    if (r.code !== 0) throw new Error(`kiln ${args.join(" ")} exited ${r.code}: ${r.err}`);
    return JSON.parse(r.out);
  };
  return { run, json, configDir };
}
