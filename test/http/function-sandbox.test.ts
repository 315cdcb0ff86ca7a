// How function code is isolated on machines as users have them: with bubblewrap, without it (the
// util-linux namespace sandbox), with no working sandbox at all (503s naming the fix), and with the
// explicit opt-in to run unsandboxed. Host tools are hidden per test by starting Kiln in a private
// mount namespace with /dev/null bound over them, which needs root (as CI runs).
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { deploy, localServer, npmTarball, settled, tgz, processesTagged } from "../support/functions";
import { BUN, createProject, FUNCTION_RUNTIME, KILN, removeDir, ROOT, startKiln, type TestKiln } from "../support/kiln";

const isRoot = process.getuid?.() === 0;
const run = isRoot && process.platform === "linux" && FUNCTION_RUNTIME === "process";

/** Starts Kiln (or any command) with these host tools replaced by /dev/null. */
const hiding = (...tools: string[]) => [
  "unshare",
  "--mount",
  "--propagation",
  "private",
  "--",
  "/bin/sh",
  "-c",
  `${tools.map((t) => `mount --bind /dev/null ${t}`).join(" && ")} && exec "$@"`,
  "hide",
];
const NO_BWRAP = hiding("/usr/bin/bwrap");
const NO_SANDBOX = hiding("/usr/bin/bwrap", "/usr/bin/unshare");

// What a hostile function tries: Kiln's data dir and its process's environment, its HTTP port,
// root's files, and who it is.
const PROBE = {
  "index.js": `const fs = require("node:fs"), net = require("node:net");
const attempt = (f) => { try { return { ok: String(f()).slice(0, 200) }; } catch (e) { return { err: e.code ?? e.message }; } };
exports.handler = async (e) => ({
  dataDir: attempt(() => fs.readdirSync(e.dataDir).join(",")),
  environ: attempt(() => fs.readFileSync("/proc/" + e.kilnPid + "/environ", "utf8")),
  shadow: attempt(() => fs.readFileSync("/etc/shadow", "utf8")),
  uid: process.getuid(),
  hostUid: Number(attempt(() => fs.readFileSync("/proc/self/uid_map", "utf8")).ok?.trim().split(/\\s+/)[1] ?? process.getuid()),
  env: Object.keys(process.env).sort(),
  kilnPort: await new Promise((resolve) => {
    const s = net.connect(e.port, "127.0.0.1");
    s.setTimeout(2000, () => { s.destroy(); resolve("timeout"); });
    s.on("connect", () => { s.destroy(); resolve("connected"); });
    s.on("error", (err) => resolve(err.code));
  }),
});`,
};

async function serviceKey(k: TestKiln, projectId: string) {
  return (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "backend" } })).body.key as string;
}

function probeEvent(k: TestKiln) {
  return { dataDir: k.dataDir, kilnPid: k.proc.pid, port: Number(new URL(k.url).port) };
}

function doctor(wrap: string[], env: Record<string, string> = {}) {
  const r = spawnSync(wrap[0]!, [...wrap.slice(1), BUN, KILN, "doctor"], { cwd: ROOT, encoding: "utf8", env: { ...process.env, ...env } });
  return { code: r.status, out: r.stdout + r.stderr };
}

/**
 * The hostile probe of issue 24 on a running Kiln: background processes outliving their invocation
 * (busy loops at 100% CPU past the 200, outside the time limit and CPU budget, filling the warm
 * worker's process limit), and a sandbox that let code make user namespaces.
 */
async function straysAndSyscalls(k: TestKiln, kind: string) {
  const tag = `kiln-stray-http-${process.pid}-${kind}`;
  const running = () => processesTagged(tag);
  try {
    const p = await createProject(k);
    const sk = await serviceKey(k, p.id);
    const strays = await deploy(
      k,
      p.id,
      { name: "strays", runtime: "nodejs22.x" },
      tgz({
        "index.js": `const cp = require("node:child_process"), fs = require("node:fs");
const tagged = (tag) => fs.readdirSync("/proc").filter((p) => { try { return fs.readFileSync("/proc/" + p + "/cmdline", "utf8").includes(tag); } catch { return false; } });
exports.handler = async (e) => {
  cp.spawn("setsid", ["sh", "-c", "while :; do :; done", e.tag], { detached: true, stdio: "ignore" }).unref();
  cp.spawn("sh", ["-c", "(sh -c 'while :; do :; done' " + e.tag + " &) &"], { stdio: "ignore" }).unref();
  cp.spawn("sh", ["-c", "sleep 1000; :", e.tag], { stdio: "ignore" }).unref();
  while (tagged(e.tag).length < 3) await new Promise((r) => setTimeout(r, 10));
  return { pid: process.pid };
};`,
      }),
    );
    expect((await settled(k, p.id, strays.body.id)).status).toBe("active");
    // 45 calls leave 135 processes behind if nothing clears them: over the default limit of 128.
    let runtimePid: number | undefined;
    for (let i = 0; i < 45; i++) {
      const r = await k.api("POST", `/functions/${strays.body.id}/invoke`, { token: sk, body: { payload: { tag } } });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      runtimePid ??= r.body.pid;
      expect(r.body.pid).toBe(runtimePid); // the same warm worker every time
      await expect.poll(running, { timeout: 5000, interval: 20 }).toEqual([]);
    }

    const probe = await deploy(
      k,
      p.id,
      { name: "syscalls", runtime: "python3.11" },
      tgz({
        "main.py": [
          "import ctypes, errno, platform, subprocess",
          "libc = ctypes.CDLL(None, use_errno=True)",
          "NR = {'x86_64': dict(ptrace=101, keyctl=250, bpf=321, mount=165, unshare=272),",
          "      'aarch64': dict(ptrace=117, keyctl=219, bpf=280, mount=40, unshare=97)}[platform.machine()]",
          "def call(name, *args):",
          "    return 'ok' if libc.syscall(NR[name], *args) >= 0 else errno.errorcode[ctypes.get_errno()]",
          "def handler(event, context):",
          "    u = subprocess.run(['unshare', '-U', 'true'], capture_output=True, text=True)",
          "    return {'unshareCommand': u.stderr.strip(), 'unshare': call('unshare', 0x10000000), 'ptrace': call('ptrace', 0, 0, 0, 0),",
          "            'keyctl': call('keyctl', 0, ctypes.c_long(-3), 0), 'bpf': call('bpf', 0, ctypes.create_string_buffer(128), 128),",
          "            'mount': call('mount', b'none', b'/tmp', b'tmpfs', 0, None)}",
        ].join("\n"),
      }),
    );
    expect((await settled(k, p.id, probe.body.id)).status).toBe("active");
    const r = await k.api("POST", `/functions/${probe.body.id}/invoke`, { token: sk, body: { payload: {} } });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ unshareCommand: "unshare: unshare failed: Operation not permitted", unshare: "EPERM", ptrace: "EPERM", keyctl: "EPERM", bpf: "EPERM", mount: "EPERM" });
    expect(k.stderr).toMatch(/functions are sandboxed: .*seccomp filter/);
  } finally {
    for (const pid of running()) process.kill(Number(pid), "SIGKILL");
  }
}

describe.skipIf(!run)("function sandbox", () => {
  test("without bubblewrap, functions are isolated with util-linux namespaces: no data dir, no Kiln environment, no host network, never root; builds reach only allowed registries; what a function leaves running is killed when it answers, and namespaces, ptrace, keys, bpf and mount are refused", async () => {
    const registry = await localServer({ "/greeting.tgz": npmTarball("greeting", "module.exports = 'hello from a local registry';") });
    const service = await localServer({});
    // A temp folder of its own: the sandboxes' mount point Kiln makes there is gone once it exits.
    const tmp = mkdtempSync(join(tmpdir(), "kiln-sandbox-tmp-"));
    const mountPoints = () => readdirSync(tmp).filter((f) => f.startsWith("kiln-sandbox-root-"));
    const k = await startKiln({ wrap: NO_BWRAP, env: { KILN_LOG: "", KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${registry.port}`, TMPDIR: tmp } });
    try {
      const p = await createProject(k);
      const sk = await serviceKey(k, p.id);
      const d = await deploy(k, p.id, { name: "probe", runtime: "nodejs22.x" }, tgz(PROBE));
      expect(d.status).toBe(201);
      expect((await settled(k, p.id, d.body.id)).status).toBe("active");
      const r = await k.api("POST", `/functions/${d.body.id}/invoke`, { token: sk, body: { payload: probeEvent(k) } });
      expect(r.status).toBe(200);
      expect(r.body.dataDir).toEqual({ err: "ENOENT" });
      expect(r.body.environ.err).toMatch(/ENOENT|EACCES/);
      expect(r.body.shadow).toEqual({ err: "ENOENT" });
      expect(r.body.kilnPort).not.toBe("connected");
      expect(r.body.uid).toBe(1000);
      expect(r.body.hostUid).toBe(64000); // a root Kiln drops user code to the sandbox uid
      expect(r.body.env).not.toContain("KILN_PLATFORM_TOKEN");
      expect(r.body.env).not.toContain("KILN_ADMIN_TOKEN");
      // (Said a second after the start: a deploy and an invocation can be quicker than that.)
      await expect.poll(() => k.stderr).toMatch(/functions are sandboxed: Linux namespaces through util-linux/);

      // A build in the namespace sandbox installs from a registry allowed by name, through the build
      // proxy, and cannot reach any other local service.
      const withDep = tgz({ "index.js": "exports.handler = async () => require('greeting');", "package.json": `{"dependencies":{"greeting":"http://127.0.0.1:${registry.port}/greeting.tgz"}}` });
      const good = await deploy(k, p.id, { name: "dep", runtime: "nodejs22.x" }, withDep);
      expect((await settled(k, p.id, good.body.id)).status).toBe("active");
      expect((await k.api("POST", `/functions/${good.body.id}/invoke`, { token: sk, body: {} })).body).toBe("hello from a local registry");
      const evil = tgz({ "index.js": "exports.handler = async () => 1", "package.json": `{"dependencies":{"evil":"http://127.0.0.1:${service.port}/evil.tgz"}}` });
      const bad = await deploy(k, p.id, { name: "evil", runtime: "nodejs22.x" }, evil);
      expect((await settled(k, p.id, bad.body.id)).status).toBe("failed");
      const deps = (await k.api("GET", `/projects/${p.id}/functions/${bad.body.id}/deployments`)).body.data;
      expect(deps[0].error).toMatch(/403|loopback/);
      expect(service.connections()).toBe(0);
      // What a function leaves running is killed when it answers; namespaces, ptrace, keys, bpf and mount are refused.
      await straysAndSyscalls(k, "namespaces");
      const doc = doctor(NO_BWRAP);
      expect(doc.out).toMatch(/isolation: Linux namespaces/);
      expect(doc.out).toMatch(/not used: bubblewrap/);
      expect(doc.code).toBe(0);
      expect(mountPoints()).toHaveLength(1);
      expect(await k.stop()).toBe(0);
      expect(mountPoints()).toEqual([]);
    } finally {
      await k.stop();
      removeDir(k.dataDir);
      removeDir(tmp);
      registry.close();
      service.close();
    }
  }, 120_000);

  // (The namespace sandbox's run of the same probe: in the first test, on its Kiln.)
  test("bubblewrap: what a function leaves running is killed when it answers, and namespaces, ptrace, keys, bpf and mount are refused", async () => {
    const k = await startKiln({ env: { KILN_LOG: "" } });
    try {
      await straysAndSyscalls(k, "bubblewrap");
    } finally {
      await k.stop();
      removeDir(k.dataDir);
    }
  }, 120_000);

  test("with no working sandbox, start warns, deploys and invocations answer 503 naming the fix, and doctor fails", async () => {
    // A function deployed while a sandbox worked, then the same data dir on a host with none.
    const first = await startKiln();
    const p = await createProject(first);
    const sk = await serviceKey(first, p.id);
    const d = await deploy(first, p.id, { name: "hello", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 'hi';" }));
    expect((await settled(first, p.id, d.body.id)).status).toBe("active");
    await first.stop();
    const k = await startKiln({ wrap: NO_SANDBOX, dataDir: first.dataDir, databaseUrl: first.databaseUrl, env: { KILN_PLATFORM_TOKEN: first.token, KILN_LOG: "" } });
    try {
      const r = await k.api("POST", `/functions/${d.body.id}/invoke`, { token: sk, body: { payload: {} } });
      expect(r.status).toBe(503);
      expect(r.body.error).toMatch(/no sandbox is available/);
      expect(r.body.error).toMatch(/Install bubblewrap/);
      expect(r.body.error).toMatch(/--function-runtime docker/);
      expect(r.body.error).toMatch(/--allow-unsandboxed-functions/);
      const again = await deploy(k, p.id, { name: "other", runtime: "nodejs22.x" }, tgz({ "index.js": "exports.handler = async () => 1;" }));
      expect(again.status).toBe(503);
      expect(again.body.error).toMatch(/Install bubblewrap/);
      await expect.poll(() => k.stderr).toMatch(/functions and builds will be refused \(503\)/);
      const doc = doctor(NO_SANDBOX);
      expect(doc.out).toMatch(/no sandbox is available/);
      expect(doc.code).toBe(1);
    } finally {
      await k.stop();
      removeDir(k.dataDir);
    }
  });

  test("--allow-unsandboxed-functions runs code as a plain process, but as the sandbox uid: not root, no Kiln environment, no data dir", async () => {
    const k = await startKiln({ wrap: NO_SANDBOX, args: ["--allow-unsandboxed-functions"], env: { KILN_LOG: "" } });
    try {
      const p = await createProject(k);
      const sk = await serviceKey(k, p.id);
      // Python from /usr: Kiln's Node install lives in root's home, which the sandbox uid cannot enter.
      const code = tgz({
        "main.py": `import os, json
def attempt(f):
    try:
        return {"ok": str(f())[:200]}
    except OSError as e:
        return {"err": type(e).__name__}
def handler(event, context):
    return {
        "uid": os.getuid(),
        "env": sorted(os.environ),
        "blobs": attempt(lambda: os.listdir(os.path.join(event["dataDir"], "blobs"))),
        "lock": attempt(lambda: open(os.path.join(event["dataDir"], "kiln.pid")).read()),
        "environ": attempt(lambda: open("/proc/%d/environ" % event["kilnPid"]).read()),
    }
`,
      });
      const d = await deploy(k, p.id, { name: "plain", runtime: "python3.11" }, code);
      expect(d.status).toBe(201);
      expect((await settled(k, p.id, d.body.id)).status).toBe("active");
      const r = await k.api("POST", `/functions/${d.body.id}/invoke`, { token: sk, body: { payload: probeEvent(k) } });
      expect(r.status).toBe(200);
      expect(r.body.uid).toBe(64000);
      expect(r.body.env.filter((e: string) => e.startsWith("KILN_"))).toEqual([]);
      expect(r.body.blobs).toEqual({ err: "PermissionError" });
      expect(r.body.lock).toEqual({ err: "PermissionError" });
      expect(r.body.environ).toEqual({ err: "PermissionError" });
      expect(k.stderr).toMatch(/functions are NOT sandboxed/);
    } finally {
      await k.stop();
      removeDir(k.dataDir);
    }
  });
});
