// `kiln start` as the contract describes it: flags, the listening line, /healthz, graceful stop,
// restart on the same data dir, the generated platform token.
import { spawn } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { createProject, createToken, removeDir, secret, startKiln, STORE, withKiln } from "../support/kiln";

// The data dir's mode and lock and the flags' checks are the same whichever control store Kiln uses:
// those tests run on the embedded project only (each costs Kiln starts; suite time).
const DATA_DIR_ONLY = STORE === "postgres";

describe("kiln start", () => {
  const dirs: string[] = [];
  afterAll(() => dirs.forEach(removeDir));

  // One start serves both: the listening line and a clean stop, then a restart on its data dir.
  test("prints the listening line, answers /healthz without a credential, stops cleanly with exit 0; a restart on the same data dir finds projects and tokens as they were", async () => {
    const k = await startKiln();
    dirs.push(k.dataDir);
    expect(k.stdout).toMatch(/^Kiln listening on http:\/\/127\.0\.0\.1:\d+$/m);
    const r = await k.api("GET", "/healthz", { token: null });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ status: "ok" });
    expect(r.headers.get("x-service-version")).toBe(`local-${JSON.parse(readFileSync("package.json", "utf8")).version}`);
    expect(r.headers.get("x-service-region")).toBe("local");
    const p = await createProject(k, "survivor");
    const t = await createToken(k, p.id, { name: "ci" });
    expect(await k.stop()).toBe(0);
    // The data dir lock is released at a clean stop.
    expect(existsSync(join(k.dataDir, "kiln.pid"))).toBe(false);
    const k2 = await startKiln({ dataDir: k.dataDir, databaseUrl: k.databaseUrl, env: { KILN_PLATFORM_TOKEN: k.token } });
    const got = await k2.api("GET", `/projects/${p.id}`);
    expect(got.status).toBe(200);
    expect(got.body.name).toBe("survivor");
    const viaToken = await k2.api("GET", `/projects/${p.id}`, { token: t.token });
    expect(viaToken.status).toBe(200);
    const tokens = await k2.api("GET", `/projects/${p.id}/access-tokens`);
    expect(tokens.body.data.map((x: any) => x.name)).toEqual(["ci"]);
    await k2.stop();
  });

  // The restart after the forced exit is also the start whose areas' resume is held (KILN_FAULTS
  // start-hold, until the test removes the file): one start fewer than a test for each.
  test("a stop that takes longer than KILN_STOP_TIMEOUT_MS says what it waits for and exits 1; a restart finds the data; /healthz answers while the areas still resume after listening; every other request waits for them and then answers", async () => {
    const k = await startKiln({ env: { KILN_STOP_TIMEOUT_MS: "1500", KILN_FAULTS: "stop-hang" } });
    dirs.push(k.dataDir);
    const project = await createProject(k, "kept");
    expect(await k.stop()).toBe(1);
    expect(k.stderr).toMatch(/kiln: stopping took longer than 1500 ms, still waiting for: an injected fault \(stop-hang\); exiting/);
    const again = await startKiln({ dataDir: k.dataDir, databaseUrl: k.databaseUrl, env: { KILN_PLATFORM_TOKEN: k.token, KILN_FAULTS: "start-hold" } });
    try {
      const hold = join(k.dataDir, "start-hold");
      expect(existsSync(hold)).toBe(true);
      expect((await again.api("GET", "/healthz", { token: null })).status).toBe(200);
      let settled = false;
      const held = again.api("GET", `/projects/${project.id}`).finally(() => (settled = true));
      // A later /healthz answers while the request sent before it is still held.
      expect((await again.api("GET", "/healthz", { token: null })).status).toBe(200);
      expect(settled).toBe(false);
      rmSync(hold);
      const r = await held;
      expect(r.status).toBe(200);
      expect(r.body.name).toBe("kept");
      expect(await again.stop()).toBe(0);
    } finally {
      await again.stop();
    }
  });

  test("without KILN_PLATFORM_TOKEN a token is generated, printed once and saved with mode 0600", async () => {
    const k = await startKiln({ generatedToken: true });
    dirs.push(k.dataDir);
    expect(k.token).toMatch(/^pk-[A-Za-z0-9]{40}$/);
    const file = join(k.dataDir, "credentials.json");
    expect(JSON.parse(readFileSync(file, "utf8"))).toEqual({ platform_token: k.token });
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect((await k.api("GET", "/projects")).status).toBe(200);
    await k.stop();
    const k2 = await startKiln({ dataDir: k.dataDir, databaseUrl: k.databaseUrl, generatedToken: true });
    expect(k2.stdout).not.toContain("pk-"); // printed once only
    expect((await k2.api("GET", "/projects", { token: k.token })).status).toBe(200);
    await k2.stop();
  });

  // Three rules of the data dir and its lock, on the starts of one test (each was a test with its own).
  test.skipIf(DATA_DIR_ONLY)("the data dir is closed to other users (and to function code run without a sandbox) whatever its mode was; a second Kiln on a data dir in use is refused; a stale kiln.pid whose pid now belongs to another process does not block the start (old and new lock formats)", async () => {
    // The lock is read before anything else in the data dir: a dir holding only the stale lock is
    // a crashed Kiln's as far as the lock goes (no first start to make one).
    const dir = mkdtempSync(join(tmpdir(), "kiln-test-"));
    chmodSync(dir, 0o755);
    dirs.push(dir);
    const token = secret("pk");
    // A live process that is not Kiln holds the recorded pid, as after a crash and pid reuse.
    const squatter = spawn("sleep", ["30"], { stdio: "ignore" });
    try {
      for (const [i, lock] of [`${squatter.pid}\n`, `${squatter.pid}\nstart=1 boot=00000000-0000-0000-0000-000000000000\n`].entries()) {
        writeFileSync(join(dir, "kiln.pid"), lock);
        const k2 = await startKiln({ dataDir: dir, env: { KILN_PLATFORM_TOKEN: token } });
        // The new lock records this Kiln's pid and start time.
        expect(readFileSync(join(dir, "kiln.pid"), "utf8")).toMatch(new RegExp(`^${k2.proc.pid}\nstart=\\d+ boot=[\\w-]+\n$`));
        if (i === 0) {
          expect(statSync(dir).mode & 0o777).toBe(0o700);
          await expect(startKiln({ dataDir: dir })).rejects.toThrow(/in use by another Kiln/);
        }
        expect(await k2.stop()).toBe(0);
      }
    } finally {
      squatter.kill();
    }
  });

  test("--ephemeral keeps state in a temporary folder removed at exit", async () => {
    const k = await startKiln({ args: ["--ephemeral"] });
    dirs.push(k.dataDir);
    await createProject(k);
    expect(await k.stop()).toBe(0);
    // The folder given by --data-dir was never used; the temporary one is gone.
    if (STORE === "embedded") expect(existsSync(join(k.dataDir, "control"))).toBe(false);
  });

  test.skipIf(DATA_DIR_ONLY)("bad flags fail fast with a clear message", async () => {
    await expect(startKiln({ args: ["--plan", "gold"] })).rejects.toThrow(/--plan must be hobby or superagent/);
    await expect(startKiln({ args: ["--regions", "Bad Region"] })).rejects.toThrow(/--regions/);
    // The environment is read when a flag is absent (the flags have no defaults of their own that would win).
    await expect(startKiln({ env: { KILN_PLAN: "gold" } })).rejects.toThrow(/--plan must be hobby or superagent, got "gold"/);
    await expect(startKiln({ env: { KILN_REGIONS: "Bad Region" } })).rejects.toThrow(/--regions/);
  });
});

describe("ports in use", () => {
  // A port is taken whatever holds it: a plain listener stands for another program (or another Kiln).
  test("a taken HTTP or wire port fails the start with a message naming the flag, and leaves nothing behind", async () => {
    const holder = createServer();
    await new Promise<void>((r) => holder.listen(0, "127.0.0.1", r));
    const dir = mkdtempSync(join(tmpdir(), "kiln-test-"));
    try {
      const taken = String((holder.address() as AddressInfo).port);
      await expect(startKiln({ dataDir: dir, args: ["--port", taken] })).rejects.toThrow(/port \d+ is in use .*--port/);
      // The PostgreSQL wire port taken, the HTTP port free: the message names --pg-port.
      await expect(startKiln({ dataDir: dir, args: ["--pg-port", taken] })).rejects.toThrow(new RegExp(`PostgreSQL wire port ${taken} is in use .*--pg-port`));
      // The data dir lock was released both times: the same dir starts fine on free ports.
      await withKiln({ dataDir: dir }, async (k) => expect((await k.api("GET", "/healthz", { token: null })).status).toBe(200));
    } finally {
      holder.close();
      removeDir(dir);
    }
  });
});
