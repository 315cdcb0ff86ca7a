// The `kiln` CLI as people and scripts use it, against a real server.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, delimiter, join } from "node:path";
import type { Command } from "commander";
import { describe, expect, test } from "vitest";
import { buildProgram } from "../../cmd/program";
import JSC_OPTIONS from "../../cmd/jsc-options.json";
import { KILN_VERSION } from "../../server/version";
import { BUN, KILN, ROOT, STORE, eventually, secret, useCli, useKiln, withKiln } from "../support/kiln";

// One Kiln for the file's clients (each describe block had its own: four starts more). Each block's
// calls go through a CLI config folder of its own, and each test works in projects of its own. The
// grammar tests try every command with a wrong token: far more than the per-address limit of them.
const k = useKiln({ env: { KILN_AUTH_FAILURE_LIMIT: "100000" } });

describe("kiln CLI", () => {
  const { run: kiln, json, configDir } = useCli(k);

  test("login saves the token; later commands use it", () => {
    const bad = kiln("login", "--token", "pk-wrongwrongwrongwrongwrong");
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/^kiln: 401 invalid token\nhint: the credential read from --token was refused by http:\/\/127\.0\.0\.1:\d+; run `kiln login --token pk-\.\.\. --url /);
    const r = kiln("login", "--token", k.token);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toContain("Logged in");
    expect(json("projects", "list").total).toBeGreaterThanOrEqual(0);
  });

  test("projects create/get/update/list/delete, as tables and as JSON", () => {
    kiln("login", "--token", k.token);
    const p = json("projects", "create", "cli-project");
    expect(p).toMatchObject({ name: "cli-project", status: "active" });
    const table = kiln("projects", "list");
    expect(table.out).toMatch(/^ID\s+NAME\s+STATUS/);
    expect(table.out).toContain("cli-project");
    expect(json("projects", "get", p.id).cloud_application_name).toBeDefined();
    expect(json("projects", "update", p.id, "--name", "renamed").name).toBe("renamed");
    expect(json("projects", "list", "--search", "renam").data.map((x: any) => x.id)).toContain(p.id);
    expect(json("projects", "delete", p.id).status).toBe("deleting");
  });

  test("tokens, keys and vars", () => {
    kiln("login", "--token", k.token);
    const p = json("projects", "create", "cli-creds");
    const t = json("tokens", "create", "--project", p.id, "--name", "ci", "--scope", "read_only");
    expect(t.token).toMatch(/^pt-/);
    expect(json("tokens", "list", "--project", p.id).data.map((x: any) => x.name)).toEqual(["ci"]);
    expect(json("tokens", "get", t.id, "--project", p.id).scope).toBe("read_only");
    expect(json("tokens", "usage", "--project", p.id, "--days", "2").days).toBe(2);
    expect(kiln("tokens", "usage", t.id, "--project", p.id).out).toContain("TOTAL");
    expect(kiln("tokens", "revoke", t.id, "--project", p.id).code).toBe(0);
    expect(json("tokens", "get", t.id, "--project", p.id).status).toBe("revoked");

    const sk = json("keys", "service", "create", "worker", "--project", p.id, "--permissions", "locks.manage");
    expect(sk).toMatchObject({ name: "worker", permissions: ["locks.manage"] });
    expect(json("keys", "service", "update", sk.id, "--project", p.id, "--permissions", "full").permissions).toBeNull();
    expect(json("keys", "service", "list", "--project", p.id).data).toHaveLength(1);
    expect(kiln("keys", "service", "delete", sk.id, "--project", p.id).code).toBe(0);
    expect(json("keys", "anon", "list", "--project", p.id).data[0].name).toBe("default");
    const ak = json("keys", "anon", "create", "web", "--project", p.id, "--permissions", "functions.invoke");
    expect(ak.key).toMatch(/^ak-/);
    expect(kiln("keys", "anon", "delete", ak.id, "--project", p.id).code).toBe(0);

    expect(json("vars", "set", "API_URL", "one", "--project", p.id).value).toBe("one");
    expect(json("vars", "set", "API_URL", "two", "--project", p.id).value).toBe("two");
    expect(kiln("vars", "get", "API_URL", "--project", p.id).out.trim()).toBe("two");
    expect(kiln("vars", "list", "--project", p.id).out).toContain("API_URL");
    expect(kiln("vars", "unset", "API_URL", "--project", p.id).code).toBe(0);
    expect(kiln("vars", "get", "API_URL", "--project", p.id).err.trim()).toBe("kiln: 404 variable not found");
  });

  test("errors are one line with the HTTP status; missing flags are named", () => {
    kiln("login", "--token", k.token);
    const r = kiln("projects", "get", "does-not-exist");
    expect(r.code).toBe(1);
    expect(r.err.trim()).toBe("kiln: 404 project not found");
    const v = kiln("tokens", "create", "--name", "x");
    expect(v.code).not.toBe(0);
    expect(v.err).toContain("--project");
    const bad = kiln("keys", "service", "create", "x", "--project", "nope", "--permissions", "db.drop");
    expect(bad.err.trim()).toMatch(/^kiln: (400|404) /);
  });

  test("the CLI sends its version: a server that requires a newer CLI answers 426", async () => {
    await withKiln({ args: ["--min-cli-version", "99.0.0"] }, async (strict) => {
      const r = spawnSync(BUN, [KILN, "projects", "list", "--url", strict.url, "--token", strict.token], {
        cwd: ROOT,
        env: { ...process.env, KILN_CONFIG_DIR: configDir },
        encoding: "utf8",
      });
      expect(r.status).toBe(1);
      expect(r.stderr.trim()).toMatch(/^kiln: 426 .*99\.0\.0/);
    });
  });
});

describe("kiln CLI: end users, auth settings, mail", () => {
  const { run: kiln, json } = useCli(k, { passToken: true });

  test("users create/list/delete", () => {
    const p = json("projects", "create", "cli-users");
    const u = json("users", "create", "ada@example.com", "--project", p.id, "--password", "long enough");
    expect(u).toMatchObject({ email: "ada@example.com", email_confirmed: true });
    expect(kiln("users", "list", "--project", p.id).out).toContain("ada@example.com");
    expect(json("users", "list", "--project", p.id, "--search", "ADA").total).toBe(1);
    expect(kiln("users", "create", "ada@example.com", "--project", p.id).err.trim()).toMatch(/^kiln: 409 /);
    expect(kiln("users", "delete", u.id, "--project", p.id).code).toBe(0);
    expect(json("users", "list", "--project", p.id).total).toBe(0);
  });

  test("auth config get/set", () => {
    const p = json("projects", "create", "cli-auth");
    const set = json(
      "auth", "config", "set", "--project", p.id,
      "--redirect-urls", "http://localhost:3000/cb,https://app.example.com/cb",
      "--require-email-confirmation", "true",
      "--access-token-ttl", "900",
      "--rate-limit", "signup=5", "forgot-password=2",
    );
    expect(set).toMatchObject({
      allowed_redirect_urls: ["http://localhost:3000/cb", "https://app.example.com/cb"],
      require_email_confirmation: true,
      access_token_ttl_seconds: 900,
      rate_limits: { signup: 5, forgot_password: 2, signin: 300 },
    });
    expect(json("auth", "config", "get", "--project", p.id).access_token_ttl_seconds).toBe(900);
    const bad = kiln("auth", "config", "set", "--project", p.id, "--redirect-urls", "javascript:alert(1)");
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/^kiln: 400 .*allowed_redirect_urls/);
  });

  test("mail lists the latest caught messages with their links", async () => {
    const p = json("projects", "create", "cli-mail");
    json("users", "create", "grace@example.com", "--project", p.id, "--password", "long enough");
    const anon = json("keys", "anon", "list", "--project", p.id).data[0].key;
    await k.api("POST", "/auth/forgot-password", { token: anon, body: { email: "grace@example.com" } });
    await eventually(async () => kiln("mail", "--to", "grace@example.com").out, (out) => out.includes("Reset your password"));
    const out = kiln("mail", "--to", "grace@example.com").out;
    expect(out).toMatch(/to grace@example\.com\s+Reset your password/);
    expect(out).toMatch(/http:\/\/127\.0\.0\.1:\d+\/auth\/reset-password\?token=/);
  });
});

describe("kiln CLI: databases", () => {
  const { run: kiln, json } = useCli(k, { passToken: true });

  test("db create --wait, list, get, query, psql, reset-password, delete", () => {
    const p = json("projects", "create", "cli-db");
    const d = json("db", "create", "Shop", "--project", p.id, "--wait");
    expect(d).toMatchObject({ database_name: "shop", status: "active", connection_string: expect.stringMatching(/^postgres:\/\//) });
    expect(kiln("db", "list", "--project", p.id).out).toMatch(/shop\s+active/);
    const psql = kiln("db", "psql", "shop", "--project", p.id, "--", "-X", "-A", "-t", "-c", "create table items (id serial primary key, name text, qty int); insert into items (name, qty) values ('a', 1), ('b', 5); select count(*) from items");
    expect(psql.code, psql.err).toBe(0);
    expect(psql.out.trim().split("\n").pop()).toBe("2");
    // The banner says how many statements run at once (stderr, so scripts reading psql's output are unaffected).
    expect(psql.err).toMatch(STORE === "embedded" ? /embedded engine \(PGlite, PostgreSQL 18\): one statement at a time per database.*--postgres-url/ : /runs on PostgreSQL 15 \(--postgres-url\).*statements run concurrently/);
    const sk = json("keys", "service", "create", "cli", "--project", p.id).key;
    const noKey = kiln("db", "query", "shop", "select", "--table", "items");
    expect(noKey.code).toBe(1);
    expect(noKey.err).toMatch(/--key/);
    const q = json("db", "query", "shop", "select", "--key", sk, "--table", "items", "--filter", "qty=gte:2", "--select", "name,qty");
    expect(q).toEqual({ data: [{ name: "b", qty: 5 }], count: 1 });
    const ins = json("db", "query", "shop", "insert", "--key", sk, "--table", "items", "--values", '{"name":"c","qty":9}');
    expect(ins.count).toBe(1);
    expect(kiln("db", "query", "shop", "select", "--key", sk, "--table", "items", "--order", "qty:desc", "--limit", "1").out).toMatch(/c\s+9/);
    const reset = json("db", "reset-password", "shop", "--project", p.id);
    expect(reset.role_name).toBe(`service_client_${d.id}`);
    expect(json("db", "get", "shop", "--project", p.id).connection_string).toBe(reset.connection_string);
    expect(kiln("db", "delete", "shop", "--project", p.id).code).toBe(0);
    expect(kiln("db", "get", "shop", "--project", p.id).err.trim()).toBe("kiln: 404 database not found");
  });
});

describe("kiln CLI: functions", () => {
  const { run: kiln, json } = useCli(k, { passToken: true });

  test("deploy a folder --wait, list, get, invoke, deployments, delete; doctor", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-cli-fn-"));
    try {
      writeFileSync(join(dir, "index.js"), "exports.handler = async (e) => ({ got: e })");
      mkdirSync(join(dir, "node_modules", "junk"), { recursive: true });
      writeFileSync(join(dir, "node_modules", "junk", "index.js"), "x");
      const p = json("projects", "create", "cli-fn");
      const fn = json("functions", "deploy", dir, "--project", p.id, "--name", "echo", "--runtime", "nodejs22.x", "--wait");
      expect(fn).toMatchObject({ name: "echo", status: "active" });
      expect(kiln("functions", "list", "--project", p.id).out).toMatch(/echo\s+active/);
      expect(json("functions", "get", "echo", "--project", p.id).id).toBe(fn.id);
      const sk = json("keys", "service", "create", "cli", "--project", p.id).key;
      const out = kiln("functions", "invoke", "echo", "--key", sk, "--data", '{"a":1}');
      expect(out.code, out.err).toBe(0);
      expect(JSON.parse(out.out)).toEqual({ got: { a: 1 } });
      expect(json("functions", "deployments", "echo", "--project", p.id).data[0].status).toBe("succeeded");
      const bad = kiln("functions", "deploy", dir, "--project", p.id, "--name", "Bad_Name", "--runtime", "nodejs22.x");
      expect(bad.err.trim()).toMatch(/^kiln: 400 .*'name'/);
      expect(kiln("functions", "delete", "echo", "--project", p.id).code).toBe(0);
      expect(kiln("doctor").out).toMatch(/nodejs22\.x/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// The `kiln` bin as `npx kiln` runs it in a project that depends on Kiln: plain Node, from a folder
// outside Kiln's, with no `bun` on PATH (the shim finds the Bun of Kiln's own dependencies).
describe("the kiln bin (cmd/kiln.mjs)", () => {
  /** A real Node: under `bunx --bun` the first `node` on PATH is Bun itself. */
  function realNode(): string {
    for (const dir of (process.env.PATH ?? "").split(delimiter)) {
      try {
        const real = realpathSync(join(dir, "node"));
        if (!/^bunx?(\.exe)?$/.test(basename(real))) return real;
      } catch {}
    }
    throw new Error("no Node on PATH: the kiln bin needs Node (apt-get install nodejs)");
  }

  test.skipIf(STORE !== "embedded")("runs from any folder without bun on PATH: version, commands and exit codes, signals", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bin-"));
    try {
      mkdirSync(join(dir, "bin"));
      symlinkSync(realNode(), join(dir, "bin", "node"));
      const path = [join(dir, "bin"), "/usr/local/bin", "/usr/bin", "/bin"].filter((d) => !existsSync(join(d, "bun"))).join(delimiter);
      const env = { ...process.env, PATH: path, KILN_LOG: "quiet", KILN_TOKEN: undefined, KILN_URL: undefined, KILN_CONFIG_DIR: join(dir, "config") };
      const shim = join(ROOT, "cmd/kiln.mjs");
      const kiln = (...args: string[]) => spawnSync("node", [shim, ...args], { cwd: dir, env, encoding: "utf8" });
      expect(spawnSync("sh", ["-c", "command -v bun"], { env }).status).not.toBe(0);

      const version = kiln("--version");
      expect(version.status, version.stderr).toBe(0);
      expect(version.stdout.trim()).toBe(KILN_VERSION);

      // A long-running command: stdout comes through, and a signal to the shim reaches Kiln. Bun gets the
      // user's environment as it is: the user's JSC options where they set them, and not the test
      // fixture's raised thresholds (cmd/jsc-options.json: a `kiln start` here is a long-lived server).
      const token = secret("pk");
      const [kept, overridden] = Object.keys(JSC_OPTIONS);
      const serverEnv: Record<string, string | undefined> = { ...env, KILN_PLATFORM_TOKEN: token, [overridden!]: "777" };
      delete serverEnv[kept!];
      const server = spawn("node", [shim, "start", "--ephemeral", "--port", "0", "--pg-port", "0"], { cwd: dir, env: serverEnv, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      server.stderr.on("data", (d) => (err += d));
      const exited = new Promise<{ code: number | null; signal: string | null }>((ok) => server.once("exit", (code, signal) => ok({ code, signal })));
      const url = await new Promise<string>((ok, fail) => {
        server.stdout.on("data", (d) => {
          out += d;
          const m = /Kiln listening on (http:\/\/\S+)/.exec(out);
          if (m) ok(m[1]!);
        });
        void exited.then((e) => fail(new Error(`kiln exited (${JSON.stringify(e)}) before listening\n${out}\n${err}`)));
      });
      // Kiln hides its /proc entries from its own uid (hideOwnProcEntries); root (the CI runner) still reads them.
      if (process.getuid?.() === 0) {
        const bunPid = Number(readFileSync(`/proc/${server.pid}/task/${server.pid}/children`, "utf8").trim().split(/\s+/)[0]);
        const environ = new Set(readFileSync(`/proc/${bunPid}/environ`, "utf8").split("\0"));
        expect([...environ].filter((e) => e.startsWith(`${kept}=`))).toEqual([]);
        expect(environ).toContain(`${overridden}=777`);
      }
      const list = kiln("--url", url, "--token", token, "--json", "projects", "list");
      expect(list.status, list.stderr).toBe(0);
      expect(JSON.parse(list.stdout)).toMatchObject({ total: 0 });
      const denied = kiln("--url", url, "--token", "pk-wrongwrongwrongwrongwrong", "projects", "list");
      expect(denied.status).toBe(1);
      expect(denied.stderr).toMatch(/^kiln: 401 invalid token\nhint: the credential read from --token was refused/);
      server.kill("SIGINT"); // not a terminal: the shim relays it, Kiln stops cleanly and exits 0
      expect(await exited).toEqual({ code: 0, signal: null });
      await expect(fetch(`${url}/healthz`)).rejects.toThrow();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Issue 25, "one CLI grammar": the same flags for the same things in every command (--project or
// KILN_PROJECT or `kiln use`, --key for application keys, --json everywhere, errors included), units in
// human output, and errors that say what to do next. The command tree is walked, so a command added
// later is covered without touching this file.
describe("kiln CLI: one grammar", () => {
  const { json } = useCli(k, { passToken: true });
  const WRONG = "pk-wrongwrongwrongwrongwrong";

  /** Every runnable command of the program (those with an action), as its words: ["db", "branch", "create"]. */
  function commands(): { path: string[]; cmd: Command }[] {
    const out: { path: string[]; cmd: Command }[] = [];
    const walk = (c: Command, path: string[]) => {
      for (const sub of c.commands) {
        if (sub.name() === "help") continue;
        const p = [...path, sub.name()];
        if ((sub as unknown as { _actionHandler: unknown })._actionHandler) out.push({ path: p, cmd: sub });
        walk(sub, p);
      }
    };
    walk(buildProgram(), []);
    return out;
  }
  /** The words of a call: the command, a placeholder for each required argument and option. */
  const callOf = ({ path, cmd }: { path: string[]; cmd: Command }) => [
    ...path,
    ...cmd.registeredArguments.filter((a) => a.required).map(() => "x"),
    ...cmd.options.filter((o) => o.mandatory).flatMap((o) => [o.long!, "x"]),
  ];
  const hasOption = (cmd: Command, long: string) => cmd.options.some((o) => o.long === long);

  /** The CLI in a folder of our choosing, with only the environment given (no KILN_* from outside). */
  function cli(args: string[], o: { env?: Record<string, string>; cwd?: string; configDir?: string } = {}) {
    const env: Record<string, string | undefined> = { ...process.env, KILN_URL: k.url, KILN_CONFIG_DIR: o.configDir ?? mkdtempSync(join(tmpdir(), "kiln-cfg-")), ...o.env };
    for (const v of ["KILN_TOKEN", "KILN_PROJECT", "KILN_SERVICE_KEY", "KILN_DATA_DIR", "COLUMNS"]) if (!o.env?.[v]) delete env[v];
    return new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
      const p = spawn(BUN, [KILN, ...args], { cwd: o.cwd ?? ROOT, env: env as NodeJS.ProcessEnv, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      p.stdout.on("data", (d) => (out += d));
      p.stderr.on("data", (d) => (err += d));
      p.once("exit", (code) => resolve({ code, out, err }));
    });
  }
  /** Runs calls a few at a time (each is a process). */
  async function all<T, R>(items: T[], fn: (t: T) => Promise<R>, width = 4): Promise<R[]> {
    const results: R[] = new Array(items.length);
    let next = 0;
    await Promise.all(Array.from({ length: width }, async () => {
      while (next < items.length) {
        const i = next++;
        results[i] = await fn(items[i]!);
      }
    }));
    return results;
  }
  /** stderr as the one JSON error line --json promises. */
  const jsonError = (err: string) => {
    const lines = err.trim().split("\n");
    expect(lines, err).toHaveLength(1);
    const e = JSON.parse(lines[0]!);
    expect(typeof e.error, err).toBe("string");
    return e as { error: string; status?: number; hint?: string };
  };

  // Calls that fail other than by the wrong token: commands that never reach a server, and `use`
  // (which alone only reads the current project).
  const LOCAL_FAILURES: Record<string, string[]> = {
    use: ["use", "no-such-project"],
    // The mail catcher of an embedded Kiln is open to anyone: only an unreachable server fails it.
    mail: ["mail", "--url", "http://127.0.0.1:9"],
    start: ["start", "--port", "notaport"],
    "emulators mail": ["emulators", "mail", "--port", "99999"],
    "emulators oauth": ["emulators", "oauth", "--port", "99999"],
    doctor: ["doctor", "--docker-host", "unix:///nonexistent/kiln-test.sock"],
    "functions base-image": ["functions", "base-image", "--no-such-option"],
    "internal prepare-template": ["internal", "prepare-template", "--no-such-option"],
    // The runtime cache is this machine's: an unknown name fails install; list and prune (which would
    // change the cache) only on a bad option.
    "runtimes install": ["runtimes", "install", "no-such-runtime"],
    "runtimes list": ["runtimes", "list", "--no-such-option"],
    "runtimes prune": ["runtimes", "prune", "--no-such-option"],
  };

  test("every command accepts --json, and a failing call prints {\"error\"} as JSON on stderr with a non-zero exit", { timeout: 240_000 }, async () => {
    const list = commands();
    expect(list.length).toBeGreaterThan(80);
    for (const name of Object.keys(LOCAL_FAILURES)) expect(list.map((c) => c.path.join(" "))).toContain(name);
    const results = await all(list, async (c) => {
      const args = LOCAL_FAILURES[c.path.join(" ")] ?? callOf(c);
      return { name: c.path.join(" "), args, r: await cli(["--token", WRONG, "--json", ...args], { env: { KILN_PROJECT: "p-none" } }) };
    });
    for (const { name, args, r } of results) {
      expect(r.code, `kiln ${args.join(" ")}: ${r.out}${r.err}`).not.toBe(0);
      const e = jsonError(r.err);
      expect(e.error, name).not.toMatch(/^kiln:/);
      // No human text on stdout (doctor prints its report as JSON even when it fails).
      if (r.out.trim()) expect(() => JSON.parse(r.out), `${name} stdout: ${r.out}`).not.toThrow();
      // KILN_PROJECT stood for --project: no project-scoped command asked for one.
      expect(r.err, name).not.toMatch(/missing --project|required option '--project/);
    }
    // A group without a subcommand, and --json placed before the command: the same shape.
    const group = await cli(["--json", "db"]);
    expect(group.code).not.toBe(0);
    expect(jsonError(group.err).error).toMatch(/subcommand/);
    // The server's 401 for the wrong token, with its status and a hint.
    const denied = jsonError((await cli(["--json", "--token", WRONG, "projects", "list"])).err);
    expect(denied).toMatchObject({ error: "401 invalid token", status: 401, hint: expect.stringContaining("kiln login") });
  });

  test("every project-scoped command takes the project from --project, KILN_PROJECT or `kiln use`", { timeout: 240_000 }, async () => {
    const p = json("projects", "create", "grammar-project");
    const scoped = commands().filter((c) => hasOption(c.cmd, "--project"));
    expect(scoped.length).toBeGreaterThan(50);
    // Without any: the error names all three ways (commands where the project only narrows are exempt).
    const OPTIONAL = new Set(["deployments", "storage policies create", "storage policies list", "storage policies delete"]);
    const configDir = mkdtempSync(join(tmpdir(), "kiln-cfg-"));
    const missing = await all(scoped.filter((c) => !OPTIONAL.has(c.path.join(" "))), async (c) => ({ c, r: await cli(["--json", "--token", WRONG, ...callOf(c)], { configDir }) }));
    for (const { c, r } of missing) {
      if (r.code === 0 || !/missing --project/.test(r.err)) {
        // Some fail on their own input first (a missing local folder): with a project they must get further.
        expect(r.code, c.path.join(" ")).not.toBe(0);
        continue;
      }
      expect(jsonError(r.err).hint).toMatch(/--project <id>, set KILN_PROJECT, or run `kiln use <project>`/);
    }
    expect(missing.filter(({ r }) => /missing --project/.test(r.err)).length).toBeGreaterThan(45);

    // The project `kiln use` remembers: the call gets past the project (to the server's 401 for the wrong token).
    const used = await cli(["--token", k.token, "use", "grammar-project"], { configDir });
    expect(used.code, used.err).toBe(0);
    expect(used.out).toContain(p.id);
    // (KILN_PROJECT for every command: the first test.)
    const runs = await all(scoped, async (c) => ({ c, r: await cli(["--json", "--token", WRONG, ...callOf(c)], { configDir }) }));
    for (const { c, r } of runs) expect(r.err, `kiln ${callOf(c).join(" ")}`).not.toMatch(/missing --project|required option '--project/);

    // And for real: `kiln use` by name, then commands without --project; --project still wins; --clear.
    const other = json("projects", "create", "grammar-other");
    const env = { KILN_TOKEN: k.token };
    expect((await cli(["vars", "set", "WHERE", "remembered"], { env, configDir })).code).toBe(0);
    expect((await cli(["vars", "set", "WHERE", "flag", "--project", other.id], { env, configDir })).code).toBe(0);
    expect((await cli(["vars", "get", "WHERE"], { env, configDir })).out.trim()).toBe("remembered");
    expect((await cli(["vars", "get", "WHERE"], { env: { ...env, KILN_PROJECT: other.id }, configDir })).out.trim()).toBe("flag");
    expect(JSON.parse((await cli(["--json", "use"], { env, configDir })).out)).toMatchObject({ id: p.id, name: "grammar-project", from: expect.stringMatching(/^kiln use/) });
    expect(JSON.parse((await cli(["--json", "use"], { env: { ...env, KILN_PROJECT: other.id }, configDir })).out)).toMatchObject({ id: other.id, from: "KILN_PROJECT" });
    // The remembered project belongs to its server: another address does not use it.
    const elsewhere = await cli(["vars", "get", "WHERE", "--url", "http://127.0.0.1:9"], { env, configDir });
    expect(elsewhere.err).toMatch(/^kiln: missing --project <id>\nhint: the project remembered by `kiln use` \(grammar-project\) is for http:\/\/127\.0\.0\.1:\d+, not http:\/\/127\.0\.0\.1:9/);
    expect((await cli(["use", "--clear"], { env, configDir })).code).toBe(0);
    expect((await cli(["vars", "get", "WHERE"], { env, configDir })).err).toMatch(/missing --project/);
    const unknown = await cli(["use", "no-such-project"], { env, configDir });
    expect(unknown.err).toMatch(/^kiln: no project 'no-such-project' on http/);
  });

  test("--key for application keys everywhere (--service-key still works, hidden); storage cp: missing local file, --upsert hint; units; empty states; tables fit", { timeout: 120_000 }, async () => {
    // Which commands take an application key: all by --key, none shows --service-key.
    const keyed = commands().filter((c) => hasOption(c.cmd, "--key")).map((c) => c.path.join(" "));
    expect(keyed).toEqual(expect.arrayContaining(["functions invoke", "db query", "storage cp", "storage ls", "storage rm", "storage mv", "storage policies list", "locks acquire", "locks get"]));
    for (const c of commands()) expect(c.cmd.helpInformation(), c.path.join(" ")).not.toContain("--service-key");

    const p = json("projects", "create", "grammar-keys");
    const sk = json("keys", "service", "create", "cli", "--project", p.id).key;
    const env = { KILN_TOKEN: k.token, KILN_PROJECT: p.id };
    expect((await cli(["storage", "buckets", "create", "pics", "--file-size-limit", "1GiB"], { env })).code).toBe(0);
    const buckets = await cli(["storage", "buckets", "list"], { env });
    expect(buckets.out).toMatch(/^NAME\s+ID\s+FILE_SIZE_LIMIT/);
    expect(buckets.out).toMatch(/pics\s+\S+\s+1\.0 GiB/);

    const dir = mkdtempSync(join(tmpdir(), "kiln-grammar-"));
    try {
      writeFileSync(join(dir, "two.bin"), Buffer.alloc(2048, 1));
      const empty = await cli(["storage", "ls", "pics", "--key", sk], { env });
      expect(empty.code, empty.err).toBe(0);
      expect(empty.out.trim()).toBe("(no objects)");
      const up = await cli(["storage", "cp", "two.bin", "pics/a/two.bin", "--key", sk], { env, cwd: dir });
      expect(up.code, up.err).toBe(0);
      expect(up.out).toMatch(/^Uploaded two\.bin -> pics\/a\/two\.bin: 2\.0 KiB in (\d+ ms|[\d.]+ s) \(/);
      expect((await cli(["storage", "ls", "pics", "--key", sk], { env })).out).toMatch(/a\/two\.bin\s+2\.0 KiB\s+/);
      // The old flag still works.
      expect((await cli(["--json", "storage", "ls", "pics", "--service-key", sk], { env })).out).toContain("a/two.bin");

      // The object exists: the hint is the CLI's flag, not the HTTP header.
      const again = await cli(["storage", "cp", "two.bin", "pics/a/two.bin", "--key", sk], { env, cwd: dir });
      expect(again.code).toBe(1);
      expect(again.err).toBe("kiln: 409 object 'a/two.bin' already exists\nhint: pass --upsert to replace it\n");
      expect(jsonError((await cli(["--json", "storage", "cp", "two.bin", "pics/a/two.bin", "--key", sk], { env, cwd: dir })).err)).toEqual({ error: "409 object 'a/two.bin' already exists", status: 409, hint: "pass --upsert to replace it" });
      expect((await cli(["storage", "cp", "two.bin", "pics/a/two.bin", "--key", sk, "--upsert"], { env, cwd: dir })).code).toBe(0);

      // A local file that is not there: said so, before any request (no key needed to find out).
      const missing = await cli(["storage", "cp", "./missing.png", "pics/x.png"], { env, cwd: dir });
      expect(missing.code).toBe(1);
      expect(missing.err).toMatch(/^kiln: no such local file \.\/missing\.png\nhint: check the path/);
      expect((await cli(["storage", "cp", "missing.png", "pics/x.png", "--key", sk], { env, cwd: dir })).err).toMatch(/^kiln: no such local file missing\.png\n/);
      // <bucket>/<path> that is neither: the 404, and the hint that no local file has that name either.
      const neither = await cli(["storage", "cp", "nodir/missing.png", "pics/x.png", "--key", sk], { env, cwd: dir });
      expect(neither.err).toMatch(/^kiln: 404 bucket not found\nhint: downloading nodir\/missing\.png found nothing there, and there is no local file nodir\/missing\.png to upload either/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }

    // Locks and the query API take --key; without one the error names the flag.
    const lock = await cli(["--json", "locks", "acquire", "job", "--ttl", "30", "--key", sk], { env });
    expect(lock.code, lock.err).toBe(0);
    expect(JSON.parse(lock.out).key).toBe("job");
    const noKey = jsonError((await cli(["--json", "locks", "get", "job"], { env })).err);
    expect(noKey.error).toBe("a lock needs --key <key>");
    expect(noKey.hint).toMatch(/--key.*KILN_SERVICE_KEY/);
    const badKey = jsonError((await cli(["--json", "locks", "get", "job", "--key", "sk-nothingnothingnothing"], { env })).err);
    expect(badKey).toMatchObject({ status: 401, hint: expect.stringMatching(/application key from --key was refused/) });

    // Empty states read the same everywhere; tables fit the width asked for.
    expect((await cli(["vars", "list"], { env })).out.trim()).toBe("(no variables)");
    expect((await cli(["tokens", "list"], { env })).out.trim()).toBe("(no access tokens)");
    expect((await cli(["logs"], { env })).out.trim()).toBe("(no log lines)");
    for (let i = 0; i < 3; i++) json("projects", "create", `a-project-with-a-rather-long-name-number-${i}-${"x".repeat(40)}`);
    const narrow = await cli(["projects", "list"], { env: { ...env, COLUMNS: "70" } });
    expect(narrow.code, narrow.err).toBe(0);
    for (const line of narrow.out.trimEnd().split("\n")) expect(line.length, line).toBeLessThanOrEqual(70);
    expect(narrow.out).toContain("…");
    const wide = await cli(["projects", "list"], { env });
    expect(wide.out).toContain(`${"x".repeat(40)}`);
  });

  test("a 401 says to run kiln login and which credentials it read", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-nocreds-"));
    try {
      // Nothing anywhere: every place looked at is named.
      const configDir = join(dir, "config");
      const none = await cli(["projects", "list"], { cwd: dir, configDir });
      expect(none.code).toBe(1);
      const [first, hint] = none.err.trim().split("\n");
      expect(first).toBe("kiln: 401 authentication required");
      expect(hint).toContain(`no credential found (looked at --token, KILN_TOKEN, ${join(configDir, "config.json")}, ${join(realpathSync(dir), ".kiln/credentials.json")})`);
      expect(hint).toContain(`run \`kiln login --token pk-... --url ${k.url}\``);
      // A saved login whose token is refused: that file is named.
      mkdirSync(configDir, { recursive: true });
      writeFileSync(join(configDir, "config.json"), JSON.stringify({ url: k.url, token: WRONG }));
      const saved = await cli(["--json", "projects", "list"], { cwd: dir, configDir });
      expect(jsonError(saved.err)).toEqual({ error: "401 invalid token", status: 401, hint: `the credential read from ${join(configDir, "config.json")} was refused by ${k.url}; run \`kiln login --token pk-... --url ${k.url}\` to save a working one` });
      // Still the way out: login, then the same command works.
      expect((await cli(["login", "--token", k.token], { cwd: dir, configDir })).code).toBe(0);
      expect((await cli(["projects", "list"], { cwd: dir, configDir })).code).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
