// Builds that talk and fail early (issue 25): the code is loaded at deploy (a syntax error or a
// missing handler fails the deployment with the language's own error), a failed install names its
// cause, the host's package-manager configuration (.npmrc, pip.conf, proxy settings) reaches the
// build, and `kiln functions deploy --wait` prints the build log as it is written.
//
// Hermetic: the registries are this file's own servers on 127.0.0.1; Kiln's proxy setting is a port
// nothing listens on, so anything that is not one of them fails at once instead of going out.
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { isMissing, resolveRuntime } from "../../runtime-sandbox/runtimes";
import { removeDir } from "../support/dirs";
import { deploy, npmTarball, settled, tgz } from "../support/functions";
import { BUN, createProject, FUNCTION_RUNTIME, KILN, ROOT, useKiln } from "../support/kiln";
import { buildKilnpkgWheel } from "../support/python-wheel";

const work = mkdtempSync(join(tmpdir(), "kiln-builds-test-"));
afterAll(() => removeDir(work));

/** A package server: npm packuments and tarballs, a PyPI "simple" index and its wheels; requests counted by path. */
async function packageServer() {
  const files = new Map<string, { type: string; body: Buffer }>();
  const requests: string[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    requests.push(req.url ?? "");
    const f = files.get(req.url ?? "");
    res.writeHead(f ? 200 : 404, { "content-type": f?.type ?? "text/plain" }).end(f?.body ?? "not found");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { server, url, files, requests };
}

/** A port nothing listens on (bound, then closed). */
async function deadPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const registry = await packageServer();
afterAll(() => registry.server.close());
// npm: a package `present` (1.0.0); `absent` is not there (404).
registry.files.set("/present/-/present-1.0.0.tgz", { type: "application/octet-stream", body: npmTarball("present", "module.exports = 'from the .npmrc registry';") });
registry.files.set("/present", {
  type: "application/json",
  body: Buffer.from(JSON.stringify({ name: "present", "dist-tags": { latest: "1.0.0" }, versions: { "1.0.0": { name: "present", version: "1.0.0", main: "index.js", dist: { tarball: `${registry.url}/present/-/present-1.0.0.tgz` } } } })),
});
// PyPI: a wheel `kilnpkg` 1.0 behind a simple index.
const wheel = buildKilnpkgWheel(work, "from the pip.conf index");
registry.files.set("/files/kilnpkg-1.0-py3-none-any.whl", { type: "application/octet-stream", body: readFileSync(wheel) });
registry.files.set("/simple/kilnpkg/", { type: "text/html", body: Buffer.from(`<!DOCTYPE html><html><body><a href="${registry.url}/files/kilnpkg-1.0-py3-none-any.whl">kilnpkg-1.0-py3-none-any.whl</a></body></html>`) });

// The host's configuration, only through its files: npm's user config and pip's config file.
const npmrc = join(work, "npmrc");
writeFileSync(npmrc, `registry=${registry.url}/\nfetch-retries=0\n`);
const pipConf = join(work, "pip.conf");
writeFileSync(pipConf, `[global]\nindex-url = ${registry.url}/simple/\nretries = 0\ntimeout = 5\n`);
const dead = await deadPort();
const k = useKiln({
  env: {
    NPM_CONFIG_USERCONFIG: npmrc,
    PIP_CONFIG_FILE: pipConf,
    // No registry from the environment: the files alone say where to go.
    npm_config_registry: undefined,
    NPM_CONFIG_REGISTRY: undefined,
    npm_config_userconfig: undefined,
    PIP_INDEX_URL: undefined,
    PIP_EXTRA_INDEX_URL: undefined,
    PIP_FIND_LINKS: undefined,
    // Anything not on this machine would go through a proxy that is not there: nothing leaves.
    HTTPS_PROXY: `http://127.0.0.1:${dead}`,
    HTTP_PROXY: `http://127.0.0.1:${dead}`,
    https_proxy: undefined,
    http_proxy: undefined,
    NO_PROXY: "127.0.0.1",
    no_proxy: undefined,
    // The unreachable registry of one test: a local address the egress would refuse otherwise.
    KILN_BUILD_ALLOW_HOSTS: `127.0.0.1:${dead}`,
  },
});

const BEFORE_THE_WORKER = FUNCTION_RUNTIME !== "process";
const python = await (async () => {
  for (const v of ["python3.12", "python3.11", "python3.13", "python3.10", "python3.14"]) if (!isMissing(await resolveRuntime(v))) return v;
  return null;
})();

/** Invokes with a service key of the function's project (platform tokens may not invoke). */
async function invoke(projectId: string, fnId: string) {
  const key = (await k.api("POST", `/projects/${projectId}/service-keys`, { body: { name: "backend" } })).body.key as string;
  return k.api("POST", `/functions/${fnId}/invoke`, { token: key, body: { payload: {} } });
}

async function deployed(projectId: string, fields: Record<string, string>, files: Record<string, string>) {
  const d = await deploy(k, projectId, fields, tgz(files));
  expect([200, 201], JSON.stringify(d.body)).toContain(d.status);
  const fn = await settled(k, projectId, d.body.id);
  const deps = (await k.api("GET", `/projects/${projectId}/functions/${fn.id}/deployments`)).body.data;
  return { fn, deployment: deps[0] as { status: string; error: string | null } };
}

describe.skipIf(BEFORE_THE_WORKER)("the code is loaded at deploy", () => {
  test("node: a syntax error fails the deployment with Node's SyntaxError; the function is not active", async () => {
    const p = await createProject(k);
    const { fn, deployment } = await deployed(p.id, { name: "broken", runtime: "nodejs22.x" }, { "index.js": "exports.handler = async (event) => {\n  return { ok: true ;\n};\n" });
    expect(fn.status).toBe("failed");
    expect(deployment.status).toBe("failed");
    expect(deployment.error).toMatch(/^the code does not load: SyntaxError: /);
    expect(deployment.error).toMatch(/index\.js:2/);
    const invoked = await invoke(p.id, fn.id);
    expect(invoked.status).toBe(409);
  });

  test("node: a handler that does not exist fails the deployment naming it", async () => {
    const p = await createProject(k);
    const { fn, deployment } = await deployed(p.id, { name: "nohandler", runtime: "nodejs22.x", handler: "main" }, { "index.js": "exports.handler = async () => 1;" });
    expect(fn.status).toBe("failed");
    expect(deployment.error).toMatch(/does not export a function named "main" \(it exports: handler\)/);
  });

  test("node: a good deploy still goes active, and a redeploy with a syntax error keeps the old code serving", async () => {
    const p = await createProject(k);
    const good = await deployed(p.id, { name: "keeps", runtime: "nodejs22.x" }, { "index.js": "exports.handler = async () => 'v1';" });
    expect(good.fn.status).toBe("active");
    const bad = await deployed(p.id, { name: "keeps", runtime: "nodejs22.x" }, { "index.js": "exports.handler = async () => 'v2'" + ")" });
    expect(bad.deployment.error).toMatch(/SyntaxError/);
    const r = await invoke(p.id, good.fn.id);
    expect(r.body).toBe("v1");
  });

  test.skipIf(!python)("python: a SyntaxError and a missing def fail the deployment with Python's words", async () => {
    const p = await createProject(k);
    const syntax = await deployed(p.id, { name: "pysyntax", runtime: python! }, { "main.py": "def handler(event, context)\n    return 1\n" });
    expect(syntax.fn.status).toBe("failed");
    expect(syntax.deployment.error).toMatch(/^the code does not load: SyntaxError: .*main\.py, line 1/);
    const missing = await deployed(p.id, { name: "pymissing", runtime: python!, handler: "main" }, { "main.py": "def handler(event, context):\n    return 1\n" });
    expect(missing.fn.status).toBe("failed");
    expect(missing.deployment.error).toMatch(/main\.py defines no function named "main"/);
  });
});

describe.skipIf(BEFORE_THE_WORKER)("dependency installs: the host's configuration, and failures that name their cause", () => {
  test("an .npmrc alone (NPM_CONFIG_USERCONFIG) points the build at a local registry, which it installs from", async () => {
    const p = await createProject(k);
    const before = registry.requests.length;
    const { fn, deployment } = await deployed(p.id, { name: "npmrc", runtime: "nodejs22.x" }, {
      "index.js": "const present = require('present'); exports.handler = async () => present;",
      "package.json": JSON.stringify({ dependencies: { present: "^1.0.0" } }),
    });
    expect(deployment.error).toBeNull();
    expect(fn.status).toBe("active");
    expect(registry.requests.slice(before)).toEqual(expect.arrayContaining(["/present", "/present/-/present-1.0.0.tgz"]));
    const r = await invoke(p.id, fn.id);
    expect(r.body).toBe("from the .npmrc registry");
  });

  test("a dependency the registry does not have: the error names resolution", async () => {
    const p = await createProject(k);
    const { fn, deployment } = await deployed(p.id, { name: "absent", runtime: "nodejs22.x" }, {
      "index.js": "exports.handler = async () => 1;",
      "package.json": JSON.stringify({ dependencies: { absent: "^1.0.0" } }),
    });
    expect(fn.status).toBe("failed");
    expect(deployment.error).toMatch(/^dependency installation failed: resolution: /);
    expect(deployment.error).toMatch(/404/);
  });

  test("a registry that cannot be reached: the error names the network", async () => {
    const p = await createProject(k);
    const { fn, deployment } = await deployed(p.id, { name: "unreachable", runtime: "nodejs22.x" }, {
      "index.js": "exports.handler = async () => 1;",
      // The function's own .npmrc wins over the host's: a registry on a port nothing listens on.
      ".npmrc": `registry=http://127.0.0.1:${dead}/\nfetch-retries=0\n`,
      "package.json": JSON.stringify({ dependencies: { present: "^1.0.0" } }),
    });
    expect(fn.status).toBe("failed");
    expect(deployment.error).toMatch(/^dependency installation failed: network: /);
    expect(deployment.error).toContain(`127.0.0.1:${dead}`);
  });

  test.skipIf(!python)("a pip.conf alone (PIP_CONFIG_FILE) points pip at a local simple index", async () => {
    const p = await createProject(k);
    const before = registry.requests.length;
    const { fn, deployment } = await deployed(p.id, { name: "pipconf", runtime: python! }, {
      "main.py": "import kilnpkg\n\ndef handler(event, context):\n    return kilnpkg.VALUE\n",
      "requirements.txt": "kilnpkg==1.0\n",
    });
    expect(deployment.error).toBeNull();
    expect(fn.status).toBe("active");
    expect(registry.requests.slice(before)).toContain("/simple/kilnpkg/");
    const r = await invoke(p.id, fn.id);
    expect(r.body).toBe("from the pip.conf index");
  });

  test.skipIf(!python)("pip: a distribution the index does not have names resolution", async () => {
    const p = await createProject(k);
    const { deployment } = await deployed(p.id, { name: "pipabsent", runtime: python! }, { "main.py": "def handler(event, context):\n    return 1\n", "requirements.txt": "notthere==1.0\n" });
    expect(deployment.error).toMatch(/^dependency installation failed: resolution: /);
  });
});

describe.skipIf(BEFORE_THE_WORKER)("kiln functions deploy --wait", () => {
  /** The CLI, run without blocking this process (it serves the registry the build installs from). */
  function cli(args: string[]) {
    const configDir = mkdtempSync(join(work, "cli-"));
    const env: Record<string, string | undefined> = { ...process.env, KILN_CONFIG_DIR: configDir, KILN_URL: k.url, KILN_TOKEN: k.token, KILN_PROJECT: undefined };
    for (const v of Object.keys(env)) if (env[v] === undefined) delete env[v];
    return new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
      const p = spawn(BUN, [KILN, ...args], { cwd: ROOT, env: env as NodeJS.ProcessEnv, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      p.stdout.on("data", (d) => (out += d));
      p.stderr.on("data", (d) => (err += d));
      p.once("exit", (code) => resolve({ code, out, err }));
    });
  }

  test("prints the build's log lines (the install, the code check) before it ends; a failed build's too", async () => {
    const p = await createProject(k);
    const dir = join(work, "cli-fn");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "index.js"), "const present = require('present'); exports.handler = async () => present;");
    writeFileSync(join(dir, "package.json"), JSON.stringify({ dependencies: { present: "^1.0.0" } }));
    const ok = await cli(["functions", "deploy", dir, "--project", p.id, "--name", "waited", "--runtime", "nodejs22.x", "--wait"]);
    expect(ok.code, ok.err).toBe(0);
    expect(ok.out).toMatch(/status\s+active/);
    expect(ok.err).toMatch(/^build {2}installing Node dependencies/m);
    expect(ok.err).toMatch(/^build {2}code check: index\.js loads and exports handler$/m);
    expect(ok.err).toMatch(/^build {2}build succeeded$/m);

    writeFileSync(join(dir, "index.js"), "exports.handler = async () => {");
    const bad = await cli(["functions", "deploy", dir, "--project", p.id, "--name", "waited", "--runtime", "nodejs22.x", "--wait"]);
    expect(bad.code).not.toBe(0);
    expect(bad.err).toMatch(/^build {2}.*SyntaxError/m);
    expect(bad.err).toMatch(/deployment failed: the code does not load: SyntaxError/);
  });
});
