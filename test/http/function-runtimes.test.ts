// Every runtime name on a machine as a new user has it (issue 30): no bubblewrap (the util-linux
// namespaces sandbox), no pyenv/rbenv, no host Python or Ruby of those versions on PATH. The
// Python and Ruby names Debian ships run on the root filesystems Kiln provisions (prepared by npm
// test's pretest, `bun runtime-sandbox/runtimes.ts prepare`; this Kiln may not install anything:
// KILN_RUNTIME_INSTALL=off); the names no reachable source ships are refused at build with how to
// provide the interpreter. Then pip inside a root from a local simple index, the isolation probes
// per language on the roots, and a runtime whose root cannot be provisioned.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { ROOT_RECIPES } from "../../runtime-sandbox/runtime-roots";
import { cacheDir, RUNTIME_NAMES } from "../../runtime-sandbox/runtimes";
import { removeDir } from "../support/dirs";
import { deploy, settled, tgz } from "../support/functions";
import { BUN, createProject, eventually, FUNCTION_RUNTIME, startKiln, type TestKiln } from "../support/kiln";
import { buildKilnpkgWheel } from "../support/python-wheel";

const run = process.getuid?.() === 0 && process.platform === "linux" && FUNCTION_RUNTIME === "process";
const work = mkdtempSync(join(tmpdir(), "kiln-runtimes-test-"));
afterAll(() => removeDir(work));

// Kiln in a private mount namespace with bubblewrap replaced by /dev/null (needs root, as CI runs).
const NO_BWRAP = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", 'mount --bind /dev/null /usr/bin/bwrap && exec "$@"', "hide"];

// A PyPI-style simple index with one pure-Python wheel, built here.
const wheel = buildKilnpkgWheel(work, "from the local index");
// A local gem source: a one-file gem built and indexed here by the host's RubyGems (`gem build`,
// `gem generate_index`: the static full index Bundler falls back to without a compact index).
const gems = join(work, "gems");
mkdirSync(join(work, "gemsrc/lib"), { recursive: true });
mkdirSync(join(gems, "gems"), { recursive: true });
writeFileSync(join(work, "gemsrc/lib/kilngem.rb"), 'module Kilngem\n  VALUE = "from the local gem source"\nend\n');
writeFileSync(join(work, "gemsrc/kilngem.gemspec"), 'Gem::Specification.new do |s|\n  s.name = "kilngem"; s.version = "1.0.0"; s.summary = "t"; s.authors = ["kiln"]; s.files = ["lib/kilngem.rb"]; s.license = "MIT"\nend\n');
execFileSync("gem", ["build", "kilngem.gemspec", "-o", join(gems, "gems/kilngem-1.0.0.gem")], { cwd: join(work, "gemsrc"), stdio: "ignore" });
execFileSync("gem", ["generate_index", "-d", gems], { stdio: "ignore" });

// The index's pages are text/html (pip refuses a simple page of another type); anything else is a
// file of the gem source.
const indexFiles = new Map<string, { type: string; body: Buffer }>();
const indexRequests: string[] = [];
const indexServer = createServer((req, res) => {
  const url = (req.url ?? "").split("?")[0]!;
  indexRequests.push(url);
  let f = indexFiles.get(url);
  if (!f && !url.includes("..")) {
    try {
      f = { type: "application/octet-stream", body: readFileSync(join(gems, url)) };
    } catch {
      // not there: 404
    }
  }
  res.writeHead(f ? 200 : 404, { "content-type": f?.type ?? "text/plain" }).end(f?.body ?? "not found");
});
await new Promise<void>((r) => indexServer.listen(0, "127.0.0.1", r));
const index = { port: (indexServer.address() as AddressInfo).port, url: `http://127.0.0.1:${(indexServer.address() as AddressInfo).port}` };
afterAll(() => indexServer.close());
indexFiles.set("/files/kilnpkg-1.0-py3-none-any.whl", { type: "application/octet-stream", body: readFileSync(wheel) });
indexFiles.set("/simple/kilnpkg/", { type: "text/html", body: Buffer.from(`<!DOCTYPE html><html><body><a href="${index.url}/files/kilnpkg-1.0-py3-none-any.whl">kilnpkg-1.0-py3-none-any.whl</a></body></html>`) });

// --runtime-path, black-box: python3.10 pointed at a wrapper of the host's python3 (another minor
// version: refused, naming the path and the version it found); python3.12 at a wrapper of a host
// Python 3.12 when this machine has one (pyenv): served by it.
// The system's python3 (an absolute path: the test's own PATH may lead to a pyenv shim).
const SYSTEM_PYTHON = "/usr/bin/python3";
const hostPython = (() => {
  try {
    const v = execFileSync(SYSTEM_PYTHON, ["-c", "import platform; print(platform.python_version())"], { encoding: "utf8" }).trim();
    return v.startsWith("3.10.") ? null : v;
  } catch {
    return null;
  }
})();
const host312 = [join(process.env.HOME ?? "/root", ".pyenv/versions")]
  .flatMap((d) => {
    try {
      return readdirSync(d).filter((v) => v.startsWith("3.12.")).map((v) => join(d, v, "bin/python3.12"));
    } catch {
      return [];
    }
  })
  .find((p) => existsSync(p));
const wrapper = (name: string, target: string) => {
  const f = join(work, `${name}-wrapper`);
  writeFileSync(f, `#!/bin/sh\nexec ${target} "$@"\n`, { mode: 0o755 });
  return f;
};
const wrong310 = wrapper("python3.10", SYSTEM_PYTHON);
const wrap312 = host312 ? wrapper("python3.12", host312) : null;
const RUNTIME_PATHS = [...(hostPython ? [`python3.10=${wrong310}`] : []), ...(wrap312 ? [`python3.12=${wrap312}`] : [])].join(",");

const ECHO: Record<"node" | "python" | "ruby", Record<string, string>> = {
  node: { "index.js": "exports.handler = async (event, context) => ({ echo: event, version: process.versions.node, fn: context.functionName });" },
  python: { "main.py": "import platform\n\ndef handler(event, context):\n    return {'echo': event, 'version': platform.python_version(), 'fn': context.function_name}\n" },
  ruby: { "main.rb": "def handler(event:, context:)\n  { 'echo' => event, 'version' => RUBY_VERSION, 'fn' => context.function_name }\nend\n" },
};
const family = (name: string) => (name.startsWith("nodejs") ? "node" : name.startsWith("python") ? "python" : "ruby");
const wantVersion = (name: string) => (name.startsWith("nodejs") ? `${name.slice(6, 8)}.` : `${name.replace(/^\D+/, "")}.`);

// What a hostile function tries, per language: Kiln's environment (/proc of Kiln's pid, and its own),
// a write outside /tmp (the code folder, /usr, /etc), and Kiln's HTTP port on loopback.
const PROBES: Record<"python" | "ruby", Record<string, string>> = {
  python: {
    "main.py": `import os, socket
def attempt(f):
    try:
        return {"ok": str(f())[:100]}
    except Exception as e:
        return {"err": type(e).__name__}
def write(p):
    with open(p, "w") as f:
        f.write("x")
    return "written"
def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.close()
    return "connected"
def handler(event, context):
    return {"environ": attempt(lambda: open("/proc/%d/environ" % event["kilnPid"]).read()),
            "env": sorted(os.environ.keys()),
            "task": attempt(lambda: write("/var/task/x")), "usr": attempt(lambda: write("/usr/x")), "etc": attempt(lambda: write("/etc/x")),
            "tmp": attempt(lambda: write("/tmp/x")), "dataDir": attempt(lambda: os.listdir(event["dataDir"])),
            "kilnPort": attempt(lambda: connect(event["port"])), "uid": os.getuid()}
`,
  },
  ruby: {
    "main.rb": `require "socket"
def attempt
  { "ok" => yield.to_s[0, 100] }
rescue Exception => e
  { "err" => e.class.name }
end
def handler(event:, context:)
  { "environ" => attempt { File.read("/proc/#{event["kilnPid"]}/environ") },
    "env" => ENV.keys.sort,
    "task" => attempt { File.write("/var/task/x", "x"); "written" }, "usr" => attempt { File.write("/usr/x", "x"); "written" },
    "etc" => attempt { File.write("/etc/x", "x"); "written" }, "tmp" => attempt { File.write("/tmp/x", "x"); "written" },
    "dataDir" => attempt { Dir.children(event["dataDir"]) },
    "kilnPort" => attempt { Socket.tcp("127.0.0.1", event["port"], connect_timeout: 2).close; "connected" }, "uid" => Process.uid }
end
`,
  },
};

describe.skipIf(!run)("runtimes on a machine with no bubblewrap and no host interpreters of those versions", () => {
  let k: TestKiln;
  let sk: string;
  let projectId: string;
  const home = join(work, "home");

  test("Kiln starts with the namespaces sandbox and the provisioned roots", async () => {
    const pipConf = join(work, "pip.conf");
    writeFileSync(pipConf, `[global]\nindex-url = ${index.url}/simple/\nretries = 0\ntimeout = 5\n`);
    k = await startKiln({
      wrap: NO_BWRAP,
      env: {
        KILN_LOG: "",
        KILN_RUNTIME_INSTALL: "off",
        KILN_CACHE_DIR: cacheDir(),
        // No pyenv/rbenv (a fresh HOME), only the system's folders on PATH: Debian's /usr/bin has
        // python3.11 and Ruby 3.1 at most, neither of which may serve another name.
        HOME: home,
        PYENV_ROOT: join(home, "no-pyenv"),
        RBENV_ROOT: join(home, "no-rbenv"),
        PATH: [dirname(BUN), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].join(":"),
        PIP_CONFIG_FILE: pipConf,
        KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${index.port}`,
        KILN_RUNTIME_PATHS: RUNTIME_PATHS,
      },
    });
    const p = await createProject(k);
    projectId = p.id;
    sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
  });
  afterAll(async () => {
    if (k) {
      await k.stop();
      removeDir(k.dataDir);
    }
  });

  test.each(RUNTIME_NAMES)("%s: an echo function, on the exact version, or refused with how to provide it", async (name) => {
    const d = await deploy(k, projectId, { name: `echo-${name.replace(/\W/g, "-")}`, runtime: name }, tgz(ECHO[family(name)]));
    expect(d.status).toBe(201);
    const fn = await settled(k, projectId, d.body.id);
    const deps = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data;
    if (name === "python3.10" && hostPython) {
      // --runtime-path names an interpreter of another version: refused, never run in its place.
      expect(fn.status).toBe("failed");
      expect(deps[0].error).toBe(`runtime python3.10 is not available on this machine: Python 3.10 (--runtime-path ${wrong310} is ${hostPython}, another version)`);
    } else if (name.startsWith("nodejs") || ROOT_RECIPES[name] || (name === "python3.12" && wrap312)) {
      expect(deps[0].error).toBeNull();
      expect(fn.status).toBe("active");
      const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { n: 1, s: "é" } } });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.body.echo).toEqual({ n: 1, s: "é" });
      expect(r.body.fn).toBe(fn.name);
      expect(r.body.version.startsWith(wantVersion(name)), r.body.version).toBe(true);
    } else {
      expect(fn.status).toBe("failed");
      expect(deps[0].error).toContain(`runtime ${name} is not available on this machine`);
      expect(deps[0].error).toContain(`--runtime-path ${name}=`);
      expect(deps[0].error).toMatch(/no Debian suite ships/);
    }
  });

  test.skipIf(!wrap312)("--runtime-path python3.12: served by that interpreter (the host's /usr, not a root), and kiln doctor shows the flag's value", async () => {
    const code = tgz({ "main.py": "import os, platform, sys\n\ndef handler(event, context):\n    return [platform.python_version(), sys.executable, os.path.exists('/usr/bin/gem')]\n" });
    const fn = await settled(k, projectId, (await deploy(k, projectId, { name: "pinned312", runtime: "python3.12" }, code)).body.id);
    expect(fn.status).toBe("active");
    const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: {} } });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body[0]).toMatch(/^3\.12\./);
    expect(r.body[1]).toBe(host312);
    // The host's /usr (where this test's `gem` lives), as for any host interpreter.
    expect(r.body[2]).toBe(true);
    const doctor = JSON.parse(execFileSync(BUN, [join(import.meta.dirname, "../../cmd/kiln.ts"), "doctor", "--json", "--runtime-path", `python3.10=${wrong310}`, "--runtime-path", `python3.12=${wrap312}`], { encoding: "utf8", env: { ...process.env, KILN_RUNTIME_PATHS: "" } }));
    const rows = Object.fromEntries(doctor.runtimes.map((x: { runtime: string }) => [x.runtime, x]));
    expect(rows["python3.12"].served_by).toBe(`--runtime-path ${wrap312} (${host312}), ${r.body[0]}`);
    expect(rows["python3.12"].source).toBe("none: host interpreter, --runtime-path or --runtime-image");
    expect(rows["python3.10"].install).toBe(`Python 3.10 (--runtime-path ${wrong310} is ${hostPython}, another version)`);
    expect(rows["python3.13"].source).toBe("Debian trixie (python3.13-minimal)");
  });

  test("pip inside the python3.13 root installs requirements.txt from a local simple index into python_deps", async () => {
    const code = tgz({ "main.py": "import kilnpkg, sys\n\ndef handler(event, context):\n    return [kilnpkg.VALUE, sys.version_info[:2]]\n", "requirements.txt": "kilnpkg==1.0\n" });
    const fn = await settled(k, projectId, (await deploy(k, projectId, { name: "pipdeps", runtime: "python3.13" }, code)).body.id);
    const deps = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data;
    expect(deps[0].error).toBeNull();
    const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: {} } });
    expect(r.body).toEqual(["from the local index", [3, 13]]);
  });

  test.each(["ruby3.3", "ruby3.4"] as const)("%s: Bundler inside the root installs the Gemfile from a local gem source into vendor/bundle", async (name) => {
    const code = tgz({
      "main.rb": 'require "bundler/setup"\nrequire "kilngem"\n\ndef handler(event:, context:)\n  [Kilngem::VALUE, RUBY_VERSION[0, 3], $LOADED_FEATURES.grep(/kilngem/).first]\nend\n',
      Gemfile: `source "${index.url}"\ngem "kilngem"\n`,
    });
    const fn = await settled(k, projectId, (await deploy(k, projectId, { name: `gems-${name.replace(/\W/g, "-")}`, runtime: name }, code)).body.id);
    const deps = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data;
    expect(deps[0].error).toBeNull();
    expect(indexRequests).toContain("/gems/kilngem-1.0.0.gem");
    const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: {} } });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.slice(0, 2)).toEqual(["from the local gem source", name.slice(4)]);
    expect(r.body[2]).toMatch(/^\/var\/task\/vendor\/bundle\/ruby\/[\d.]+\/gems\/kilngem-1\.0\.0\/lib\/kilngem\.rb$/);
  });

  // HTTP mode as each language writes it, and an uncaught error: a 500 {error, type}, with the
  // language's own report in the function's logs (a Python traceback, a Ruby backtrace).
  const WEB: Record<"python" | "ruby", Record<string, string>> = {
    python: {
      "main.py": `import json

def fail(detail):
    raise ValueError(f"no such order: {detail}")

def handler(event, context):
    if event["path"].startswith("/boom"):
        fail(event["query"].get("id"))
    return {"statusCode": 201, "headers": {"Content-Type": "application/json", "X-Lang": "python"},
            "body": json.dumps({"method": event["method"], "path": event["path"], "query": event["query"], "body": event["body"]})}
`,
    },
    ruby: {
      "main.rb": `require "json"

def fail_with(detail)
  raise ArgumentError, "no such order: #{detail}"
end

def handler(event:, context:)
  fail_with(event["query"]["id"]) if event["path"].start_with?("/boom")
  { "statusCode" => 201, "headers" => { "Content-Type" => "application/json", "X-Lang" => "ruby" },
    "body" => JSON.generate({ "method" => event["method"], "path" => event["path"], "query" => event["query"], "body" => event["body"] }) }
end
`,
    },
  };
  test.each(["python3.13", "ruby3.4"] as const)("%s: HTTP mode, and an uncaught error is a 500 with the language's own traceback in the logs", async (name) => {
    const lang = family(name) as "python" | "ruby";
    const d = await deploy(k, projectId, { name: `web-${name.replace(/\W/g, "-")}`, runtime: name, invocation_mode: "http", is_public: "true", http_auth_mode: "none" }, tgz(WEB[lang]));
    const fn = await settled(k, projectId, d.body.id);
    expect(fn.status).toBe("active");
    const ok = await fetch(`${fn.invoke_url}/orders/7?x=1`, { method: "PUT", body: "hi" });
    expect(ok.status).toBe(201);
    expect(ok.headers.get("x-lang")).toBe(lang);
    expect(await ok.json()).toEqual({ method: "PUT", path: "/orders/7", query: { x: "1" }, body: "hi" });
    const boom = await fetch(`${fn.invoke_url}/boom?id=42`);
    expect(boom.status).toBe(500);
    expect(await boom.json()).toEqual({ error: "no such order: 42", type: lang === "python" ? "ValueError" : "ArgumentError" });
    const search = await eventually(
      () => k.api("POST", `/projects/${projectId}/logs/search`, { body: { resource: { type: "function", ids: [fn.id] }, limit: 100 } }),
      (r) => r.status === 200 && r.body.data?.some((e: { body: string }) => String(e.body).includes("no such order: 42")),
      10_000,
    );
    const report = search.body.data.map((e: { body: string }) => String(e.body)).find((b: string) => b.includes("no such order: 42"));
    if (lang === "python") {
      // As python prints an uncaught exception, innermost frame last; the bootstrap's own frames left out.
      expect(report).toMatch(/^Traceback \(most recent call last\):\n  File "\/var\/task\/main\.py", line 8, in handler\n.*\n(.*\n)?  File "\/var\/task\/main\.py", line 4, in fail\n.*\n(.*\n)?ValueError: no such order: 42$/);
    } else {
      // As ruby prints an uncaught exception: `file:line:in 'method': message (Class)`, then the callers.
      expect(report).toMatch(/^\/var\/task\/main\.rb:4:in [`'](Object#)?fail_with': no such order: 42 \(ArgumentError\)\n(\n.*\n.*\n)?\tfrom \/var\/task\/main\.rb:8:in [`'](Object#)?handler'$/);
    }
    expect(report).not.toContain("/var/runtime/");
  });

  test.each(["python3.14", "ruby3.3"] as const)("%s on its root: no Kiln environment, no writes outside /tmp, no loopback", async (name) => {
    const fn = await settled(k, projectId, (await deploy(k, projectId, { name: `probe-${name.replace(/\W/g, "-")}`, runtime: name }, tgz(PROBES[family(name) as "python" | "ruby"]))).body.id);
    expect(fn.status).toBe("active");
    const r = await k.api("POST", `/functions/${fn.id}/invoke`, { token: sk, body: { payload: { kilnPid: k.proc.pid, dataDir: k.dataDir, port: Number(new URL(k.url).port) } } });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.environ.err).toBeTruthy();
    expect(r.body.env.filter((v: string) => v.startsWith("KILN"))).toEqual([]);
    for (const p of ["task", "usr", "etc"]) expect(r.body[p].err, p).toBeTruthy();
    expect(r.body.tmp).toEqual({ ok: "written" });
    expect(r.body.dataDir.err).toBeTruthy();
    expect(r.body.kilnPort.ok).toBeUndefined();
    expect(r.body.uid).toBe(1000);
    expect(k.stderr).toMatch(/functions are sandboxed: Linux namespaces through util-linux/);
  });
});

describe.skipIf(!run)("a runtime whose root cannot be provisioned", () => {
  test("the build fails naming why (no mmdebstrap here), and says how to provide the interpreter", async () => {
    // No runtimes in the cache and mmdebstrap hidden: python3.14 has to be built and cannot be. The
    // rest of the cache (the database template) is the usual one: making it again takes long.
    const cache = mkdtempSync(join(work, "cache-"));
    for (const e of readdirSync(cacheDir())) if (e !== "runtimes") symlinkSync(join(cacheDir(), e), join(cache, e));
    const hide = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", 'mount --bind /dev/null /usr/bin/mmdebstrap && exec "$@"', "hide"];
    const k = await startKiln({ wrap: hide, env: { KILN_LOG: "", KILN_CACHE_DIR: cache, KILN_RUNTIME_INSTALL: "on", KILN_NODE_INSTALL: "on", HOME: join(work, "home2"), PYENV_ROOT: join(work, "none") } });
    try {
      const p = await createProject(k);
      const fn = await settled(k, p.id, (await deploy(k, p.id, { name: "nosource", runtime: "python3.14" }, tgz(ECHO.python))).body.id);
      expect(fn.status).toBe("failed");
      const deps = (await k.api("GET", `/projects/${p.id}/functions/${fn.id}/deployments`)).body.data;
      expect(deps[0].error).toMatch(/^runtime python3\.14 is not available on this machine: Python 3\.14 \(Kiln builds its root from Debian's sid with mmdebstrap, which is not installed: apt-get install mmdebstrap/);
      expect(deps[0].error).toContain("--runtime-path python3.14=");
      const log = await k.api("POST", `/projects/${p.id}/logs/search`, { body: { resource: { type: "function", ids: [fn.id], deployments: { ids: [deps[0].id] } }, limit: 100 } });
      expect(log.body.data.map((l: { body: string }) => l.body).join("\n")).toMatch(/first use on this machine, installing its root filesystem from Debian sid/);
    } finally {
      await k.stop();
      removeDir(k.dataDir);
      removeDir(cache);
    }
  });
});
