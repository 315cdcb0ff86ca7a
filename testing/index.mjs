// kiln/testing: one Kiln per test file, put back to a known state between tests (docs/testing.md).
// Plain JavaScript with no dependencies, so that it loads the same in Node (node:test, jest), Bun
// (bun test) and vitest; it starts `kiln start` as a child process and speaks its HTTP API.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const UNITS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** `1500`, `"90s"`, `"15m"`, `"1h30m"`, `"1d"`: milliseconds. */
export function durationMs(v) {
  if (typeof v === "number" && Number.isFinite(v) && v >= 0) return v;
  const s = String(v).trim();
  const parts = [...s.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d|w)/g)];
  if (!parts.length || parts.map((p) => p[0]).join("") !== s) throw new Error(`'${v}' is not a duration (a number of ms, or e.g. 90s, 15m, 1h30m, 1d)`);
  return parts.reduce((sum, p) => sum + Number(p[1]) * UNITS[p[2]], 0);
}

/**
 * Starts a Kiln on free ports with its state in a temporary folder, the state right after start (or
 * the seed) kept for reset(). Options: `clock: "controllable"` (advance()), `seed` (a kiln.seed.yaml
 * path), `args` (more `kiln start` flags), `env`, `startTimeoutMs`.
 */
export async function startKiln(options = {}) {
  const token = `pk-${randomBytes(20).toString("hex")}`;
  const args = ["start", "--ephemeral", "--port", "0", "--pg-port", "0", "--smtp-port", "0", "--json", "--resettable"];
  if (options.clock === "controllable") args.push("--controllable-clock");
  if (options.seed) args.push("--seed", resolve(options.seed));
  args.push(...(options.args ?? []));
  // Under Bun, Kiln's TypeScript entry runs directly; under Node, the bin starts Kiln's own Bun.
  const entry = process.versions.bun ? join(ROOT, "cmd/kiln.ts") : join(ROOT, "cmd/kiln.mjs");
  // A test file's Kiln lives seconds: JavaScriptCore's optimizing tier at raised thresholds costs less
  // CPU than it saves there (cmd/jsc-options.json; the caller's own BUN_JSC_* settings win).
  const jsc = JSON.parse(readFileSync(join(ROOT, "cmd/jsc-options.json"), "utf8"));
  const env = { ...jsc, ...process.env, KILN_LOG: process.env.KILN_LOG ?? "quiet", ...options.env, KILN_PLATFORM_TOKEN: token };
  const child = spawn(process.execPath, [entry, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((r) => child.once("exit", (code, signal) => r(code ?? signal)));
  const url = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`Kiln did not start in ${options.startTimeoutMs ?? 60_000} ms\n${stderr}`)), options.startTimeoutMs ?? 60_000);
    child.stdout.on("data", (d) => {
      stdout += d;
      const m = /\{"listening":"([^"]+)"\}/.exec(stdout);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      fail(new Error(`Kiln exited (${code}) before it listened\n${stderr}`));
    });
  });

  async function api(method, path, body) {
    const res = await fetch(url + path, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    const parsed = text ? JSON.parse(text) : undefined;
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${parsed?.error ?? text}`);
    return parsed;
  }
  /** A project by id or by exact name. */
  async function projectId(project) {
    for (let page = 1; ; page++) {
      const r = await api("GET", `/projects?page=${page}&limit=100`);
      const hit = r.data.find((p) => p.id === project || p.name === project);
      if (hit) return hit.id;
      if (!r.has_more) throw new Error(`no project '${project}'`);
    }
  }
  // Keys made by this helper, per project; a reset or restore may remove them, so they are made again then.
  let keys = new Map();
  const forget = (r) => ((keys = new Map()), r);

  return {
    url,
    platformToken: token,
    pid: child.pid,
    async serviceKey(project) {
      const id = await projectId(project);
      if (!keys.has(id)) keys.set(id, (await api("POST", `/projects/${id}/service-keys`, { name: `kiln-testing-${randomBytes(3).toString("hex")}` })).key);
      return keys.get(id);
    },
    async anonKey(project) {
      const r = await api("GET", `/projects/${await projectId(project)}/anon-keys`);
      if (!r.data.length) throw new Error(`project '${project}' has no anon key`);
      return r.data[0].key;
    },
    async connectionString(project, db) {
      return (await api("GET", `/projects/${await projectId(project)}/databases/${encodeURIComponent(db)}`)).connection_string;
    },
    /** Puts everything back to the seed, or to the state right after start. */
    reset: async () => forget(await api("POST", "/_kiln/reset")),
    /** Moves the controllable clock forward: ms, or "90s", "15m", "1d"; timers due on the way fire first. */
    advance: async (by) => {
      const ms = durationMs(by);
      // 0 reads the clock (the route moves it by a positive amount only).
      return ms === 0 ? api("GET", "/_kiln/clock") : api("POST", "/_kiln/clock/advance", { seconds: ms / 1000 });
    },
    snapshot: async (name) => api("POST", "/_kiln/snapshots", { name }),
    restore: async (name) => forget(await api("POST", `/_kiln/snapshots/${encodeURIComponent(name)}/restore`)),
    /** Stops Kiln and removes its state. */
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}
