// The `kiln` CLI as people and scripts use it, against a real server.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, delimiter, join } from "node:path";
import { describe, expect, test } from "vitest";
import JSC_OPTIONS from "../../cmd/jsc-options.json";
import { KILN_VERSION } from "../../server/version";
import { BUN, KILN, ROOT, STORE, eventually, secret, useCli, useKiln, withKiln } from "../support/kiln";

describe("kiln CLI", () => {
  const k = useKiln();
  const { run: kiln, json, configDir } = useCli(k);

  test("login saves the token; later commands use it", () => {
    const bad = kiln("login", "--token", "pk-wrongwrongwrongwrongwrong");
    expect(bad.code).toBe(1);
    expect(bad.err.trim()).toBe("kiln: 401 invalid token");
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
  const k = useKiln();
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
  const k = useKiln();
  const { run: kiln, json } = useCli(k, { passToken: true });

  test("db create --wait, list, get, query, psql, reset-password, delete", () => {
    const p = json("projects", "create", "cli-db");
    const d = json("db", "create", "Shop", "--project", p.id, "--wait");
    expect(d).toMatchObject({ database_name: "shop", status: "active", connection_string: expect.stringMatching(/^postgres:\/\//) });
    expect(kiln("db", "list", "--project", p.id).out).toMatch(/shop\s+active/);
    const psql = kiln("db", "psql", "shop", "--project", p.id, "--", "-X", "-A", "-t", "-c", "create table items (id serial primary key, name text, qty int); insert into items (name, qty) values ('a', 1), ('b', 5); select count(*) from items");
    expect(psql.code, psql.err).toBe(0);
    expect(psql.out.trim().split("\n").pop()).toBe("2");
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
  const k = useKiln();
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

      // A long-running command: stdout comes through, and a signal to the shim reaches Kiln. Bun gets
      // Kiln's JSC options (cmd/jsc-options.json) where the user set none, and the user's where they did.
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
        expect(environ).toContain(`${kept}=${(JSC_OPTIONS as Record<string, string>)[kept!]}`);
        expect(environ).toContain(`${overridden}=777`);
      }
      const list = kiln("--url", url, "--token", token, "--json", "projects", "list");
      expect(list.status, list.stderr).toBe(0);
      expect(JSON.parse(list.stdout)).toMatchObject({ total: 0 });
      const denied = kiln("--url", url, "--token", "pk-wrongwrongwrongwrongwrong", "projects", "list");
      expect(denied.status).toBe(1);
      expect(denied.stderr.trim()).toBe("kiln: 401 invalid token");
      server.kill("SIGINT"); // not a terminal: the shim relays it, Kiln stops cleanly and exits 0
      expect(await exited).toEqual({ code: 0, signal: null });
      await expect(fetch(`${url}/healthz`)).rejects.toThrow();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
