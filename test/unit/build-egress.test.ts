import { spawn, spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdtempSync, readlinkSync, realpathSync, rmSync, statSync } from "node:fs";
import { createServer as createHttpServer, type Server } from "node:http";
import { connect, createServer as createNetServer } from "node:net";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { egressWiring, localReason, registryHostsFromEnv, startBuildEgress, type BuildEgress } from "../../runtime-sandbox/build-egress";

// Real sockets, loopback only: the refused targets are refused before any connection is made.
const repo = join(import.meta.dirname, "..", "..");
const bun = realpathSync(join(repo, "node_modules", ".bin", "bun"));
const forwarder = join(repo, "runtime-sandbox", "bootstraps", "build-egress-forwarder.mjs");
const tmp = mkdtempSync(join(tmpdir(), "kiln-egress-"));

let service: Server; // "a service on the host" that builds must not reach
let servicePort = 0;
let serviceHits = 0;
let registry: Server; // a tiny npm registry on loopback
let registryPort = 0;
let registryHits = 0;
let strict: BuildEgress; // allows nothing local
let allowing: BuildEgress; // allows the host service and the registry, by exact host:port
const logs: string[] = [];

function listen(s: Server, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    s.once("error", reject);
    s.listen(0, host, () => resolve((s.address() as { port: number }).port));
  });
}

beforeAll(async () => {
  service = createHttpServer((req, res) => res.end(`hello from the host: ${req.method} ${req.url}`));
  service.on("connection", () => serviceHits++);
  // Every address of this machine (dual stack when there is IPv6): a proxy that forwarded anything
  // local would be seen here.
  servicePort = await listen(service, "::").catch(() => listen(service, "0.0.0.0"));
  registry = createHttpServer((req, res) => {
    registryHits++;
    if (req.url !== "/kiln-egress-probe") return res.writeHead(404).end("{}");
    const tarball = `http://127.0.0.1:${registryPort}/kiln-egress-probe/-/kiln-egress-probe-1.0.0.tgz`;
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ name: "kiln-egress-probe", "dist-tags": { latest: "1.0.0" }, versions: { "1.0.0": { name: "kiln-egress-probe", version: "1.0.0", dist: { tarball, shasum: "0".repeat(40) } } } }));
  });
  registryPort = await listen(registry, "127.0.0.1");
  strict = await startBuildEgress({ socketDir: join(tmp, "strict"), log: (m) => logs.push(m) });
  allowing = await startBuildEgress({ socketDir: join(tmp, "allowing"), allowHosts: [`127.0.0.1:${servicePort}`, `127.0.0.1:${registryPort}`], log: (m) => logs.push(m) });
});

afterAll(async () => {
  await strict?.close();
  await allowing?.close();
  service?.close();
  registry?.close();
  rmSync(tmp, { recursive: true, force: true });
});

/** Sends raw bytes to the proxy's socket; resolves with everything it answers until it closes. */
function raw(socketPath: string, text: string, timeoutMs = 5000, halfClose = false): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(socketPath);
    let out = "";
    const t = setTimeout(() => {
      s.destroy();
      reject(new Error(`no close in time; got: ${out}`));
    }, timeoutMs);
    s.on("data", (d) => (out += d.toString("latin1")));
    s.on("error", reject);
    s.on("close", () => {
      clearTimeout(t);
      resolve(out);
    });
    s.write(text);
    if (halfClose) s.end();
  });
}

/** CONNECT, then (when the tunnel is up) one HTTP request through it. */
function tunnel(socketPath: string, authority: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(socketPath);
    let out = "";
    let sent = false;
    const t = setTimeout(() => {
      s.destroy();
      reject(new Error(`no close in time; got: ${out}`));
    }, 5000);
    s.on("data", (d) => {
      out += d.toString("latin1");
      if (!sent && out.startsWith("HTTP/1.1 200") && out.includes("\r\n\r\n")) {
        sent = true;
        s.write(`GET /through-tunnel HTTP/1.1\r\nHost: ${authority}\r\nConnection: close\r\n\r\n`);
      }
    });
    s.on("error", reject);
    s.on("close", () => {
      clearTimeout(t);
      resolve(out);
    });
    s.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  });
}

const get = (socketPath: string, url: string) => raw(socketPath, `GET ${url} HTTP/1.1\r\nHost: ${new URL(url).host}\r\nUser-Agent: test\r\n\r\n`);

function ownAddress(): string | null {
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (!a.internal && a.family === "IPv4") return a.address;
  return null;
}

describe("build egress proxy", () => {
  test("local targets are refused with a 403, and nothing reaches the host service", async () => {
    const p = servicePort;
    const own = ownAddress();
    const hosts = [`127.0.0.1:${p}`, `localhost:${p}`, `[::1]:${p}`, `0.0.0.0:${p}`, `[::]:${p}`, `[::ffff:127.0.0.1]:${p}`, `2130706433:${p}`, `169.254.169.254:${p}`, `10.1.2.3:${p}`, ...(own ? [`${own}:${p}`] : [])];
    const before = serviceHits;
    const answers = await Promise.all(
      hosts.flatMap((h) => [
        tunnel(strict.socketPath, h).then((a) => [`CONNECT ${h}`, a] as const),
        get(strict.socketPath, `http://${h}/secret`).then((a) => [`GET ${h}`, a] as const),
        // allowHosts is exact: only 127.0.0.1:<port> is let through, not other names for it.
        ...(h === `127.0.0.1:${p}` ? [] : [tunnel(allowing.socketPath, h).then((a) => [`CONNECT ${h} (allowing)`, a] as const)]),
      ]),
    );
    for (const [what, a] of answers) {
      expect(a.split("\r\n")[0], what).toMatch(/^HTTP\/1\.1 403 Forbidden \(Kiln build sandbox: /);
      expect(a, what).toMatch(/builds may only reach public addresses\n$/);
      expect(a, what).not.toContain("hello from the host");
    }
    expect(serviceHits).toBe(before);
    expect(logs.some((l) => l.includes(`refused CONNECT 169.254.169.254:${p}`) && l.includes("link-local"))).toBe(true);
    expect(answers.find(([w]) => w === `GET localhost:${p}`)![1]).toMatch(/localhost resolves to (127\.0\.0\.1|::1), a loopback address/);
    if (own) expect(answers.find(([w]) => w === `GET ${own}:${p}`)![1]).toContain("an address of this host");
  });

  test("an allowed host is forwarded end to end: CONNECT and plain http", async () => {
    const a = `127.0.0.1:${servicePort}`;
    const before = serviceHits;
    const viaTunnel = await tunnel(allowing.socketPath, a);
    expect(viaTunnel).toMatch(/^HTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.1 200 OK/);
    expect(viaTunnel).toContain("hello from the host: GET /through-tunnel");
    const plain = await get(allowing.socketPath, `http://${a}/plain?x=1`);
    expect(plain).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(plain).toContain("Connection: close");
    expect(plain).toContain("hello from the host: GET /plain?x=1"); // origin form upstream
    const post = await raw(allowing.socketPath, `POST http://${a}/upload HTTP/1.1\r\nHost: ${a}\r\nContent-Length: 5\r\nProxy-Connection: keep-alive\r\n\r\nabcde`);
    expect(post).toContain("hello from the host: POST /upload");
    const halfClosed = await raw(allowing.socketPath, `GET http://${a}/half HTTP/1.1\r\nHost: ${a}\r\n\r\n`, 5000, true);
    expect(halfClosed).toContain("hello from the host: GET /half");
    expect(serviceHits).toBe(before + 4);
  });

  test("through an upstream proxy: names and credentials go on, local targets are still refused", async () => {
    // A stand-in for Kiln's HTTPS_PROXY: records each head; tunnels CONNECT to the host service, answers GETs itself.
    const seen: string[] = [];
    const up = createNetServer((c) => {
      let buf = "";
      const onData = (d: Buffer) => {
        buf += d.toString("latin1");
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        c.off("data", onData);
        const head = buf.slice(0, end);
        seen.push(head);
        if (head.startsWith("CONNECT ")) {
          const t = connect(servicePort, "127.0.0.1", () => {
            c.write("HTTP/1.1 200 OK\r\n\r\n");
            t.write(buf.slice(end + 4));
            c.pipe(t).pipe(c);
          });
        } else {
          const body = `upstream saw: ${head.split("\r\n")[0]}`;
          c.end(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
        }
      };
      c.on("data", onData);
      c.on("error", () => {});
    });
    const upPort = await new Promise<number>((r) => up.listen(0, "127.0.0.1", () => r((up.address() as { port: number }).port)));
    const e = await startBuildEgress({ socketDir: join(tmp, "upstream"), upstreamProxy: `http://kiln:s%40cret@127.0.0.1:${upPort}`, noProxy: "direct.test", allowHosts: [`127.0.0.1:${servicePort}`] });
    try {
      const t = await tunnel(e.socketPath, `127.0.0.1:${servicePort}`);
      expect(t).toContain("hello from the host: GET /through-tunnel");
      expect(seen[0]).toMatch(new RegExp(`^CONNECT 127\\.0\\.0\\.1:${servicePort} HTTP/1\\.1\r\n`));
      expect(seen[0]).toContain(`Proxy-Authorization: Basic ${Buffer.from("kiln:s@cret").toString("base64")}`);
      const g = await get(e.socketPath, `http://127.0.0.1:${servicePort}/p?q=1`);
      expect(g).toContain(`upstream saw: GET http://127.0.0.1:${servicePort}/p?q=1 HTTP/1.1`); // absolute form to a proxy
      const n = seen.length;
      expect((await tunnel(e.socketPath, `localhost:${servicePort}`)).split("\r\n")[0]).toMatch(/^HTTP\/1\.1 403 /);
      expect(seen.length).toBe(n);
    } finally {
      await e.close();
      up.close();
    }
  });

  test("NO_PROXY and allowHosts entries without a port: the target is reached directly, bypassing the upstream proxy", async () => {
    // An upstream proxy nothing listens on: a request sent there fails, one that bypasses it succeeds.
    const gone = createNetServer();
    const deadPort = await new Promise<number>((r) => gone.listen(0, "127.0.0.1", () => r((gone.address() as { port: number }).port)));
    await new Promise<void>((r) => gone.close(() => r()));
    const e = await startBuildEgress({ socketDir: join(tmp, "noproxy"), upstreamProxy: `http://127.0.0.1:${deadPort}`, noProxy: "example.invalid, 127.0.0.1", allowHosts: ["127.0.0.1"] });
    try {
      expect(await get(e.socketPath, `http://127.0.0.1:${servicePort}/direct`)).toContain("hello from the host: GET /direct");
      expect(await tunnel(e.socketPath, `127.0.0.1:${servicePort}`)).toContain("hello from the host: GET /through-tunnel");
    } finally {
      await e.close();
    }
  });

  test("bounded: a connection cap (503 beyond it) and idle tunnels closed", async () => {
    const e = await startBuildEgress({ socketDir: join(tmp, "bounded"), allowHosts: [`127.0.0.1:${servicePort}`], maxConnections: 1, idleTimeoutMs: 300 });
    try {
      const first = connect(e.socketPath);
      let firstAnswer = "";
      first.on("data", (d) => (firstAnswer += d));
      const firstClosed = new Promise<number>((r) => first.on("close", () => r(Date.now())));
      first.write(`CONNECT 127.0.0.1:${servicePort} HTTP/1.1\r\n\r\n`);
      await new Promise((r) => setTimeout(r, 100));
      expect(firstAnswer).toMatch(/^HTTP\/1\.1 200 /);
      expect(await raw(e.socketPath, "GET http://example.com/ HTTP/1.1\r\n\r\n")).toMatch(/^HTTP\/1\.1 503 /);
      const opened = Date.now();
      expect((await firstClosed) - opened).toBeLessThan(2000); // the idle tunnel is closed, not kept
    } finally {
      await e.close();
    }
  });

  test("malformed requests get a 400, not a connection", async () => {
    expect(await raw(strict.socketPath, "GET /relative HTTP/1.1\r\nHost: example.com\r\n\r\n")).toMatch(/^HTTP\/1\.1 400 /);
    expect(await raw(strict.socketPath, "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")).toMatch(/^HTTP\/1\.1 400 /);
    expect(await raw(strict.socketPath, "CONNECT a b c\r\n\r\n")).toMatch(/^HTTP\/1\.1 400 /);
    expect(await raw(strict.socketPath, `CONNECT ${"x".repeat(40_000)}`)).toMatch(/^HTTP\/1\.1 431 /);
  });

  test("address rules", () => {
    const none = new Set<string>();
    for (const pub of ["203.0.113.80", "8.8.8.8", "104.16.0.1", "2606:4700::1111", "2a00:1450:4001:82a::200e", "::ffff:8.8.8.8"]) expect(localReason(pub, none), pub).toBeNull();
    for (const loc of ["127.0.0.1", "127.255.0.9", "0.0.0.0", "10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1", "169.254.169.254", "100.64.0.1", "100.127.255.255", "224.0.0.251", "255.255.255.255", "::", "::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "::127.0.0.1", "64:ff9b::10.0.0.1", "2002:a9fe:a9fe::1", "fc00::1", "fd12:3456::1", "fe80::1%eth0", "ff02::1", "fec0::1"])
      expect(localReason(loc, none), loc).not.toBeNull();
    expect(localReason("172.32.0.1", none)).toBeNull();
    expect(localReason("100.128.0.1", none)).toBeNull();
    expect(localReason("203.0.113.7", new Set(["203.0.113.7"]))).toBe("an address of this host");
    expect(localReason("2001:db8::7", new Set(["2001:db8:0:0:0:0:0:7"]))).toBe("an address of this host");
    expect(registryHostsFromEnv({ npm_config_registry: "http://127.0.0.1:4873/", PIP_INDEX_URL: "https://pypi.internal/simple", PATH: "http://x/" }).sort()).toEqual(["127.0.0.1:4873", "pypi.internal:443"]);
  });

  test("the socket is open to any uid, in a 0755 folder", () => {
    expect(statSync(strict.socketPath).mode & 0o777).toBe(0o666);
    expect(statSync(join(tmp, "strict")).mode & 0o777).toBe(0o755);
  });
});

/** Runs a command to its end; resolves with its exit code and output. */
function run(argv: string[], env: Record<string, string>, timeoutMs = 15_000, onSpawn?: (p: ReturnType<typeof spawn>) => void): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(argv[0]!, argv.slice(1), { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout!.on("data", (d) => (out += d));
    p.stderr!.on("data", (d) => (err += d));
    const t = setTimeout(() => {
      p.kill("SIGKILL");
      reject(new Error(`${argv.join(" ")} did not finish; stdout: ${out} stderr: ${err}`));
    }, timeoutMs);
    p.on("error", reject);
    p.on("close", (code) => {
      clearTimeout(t);
      resolve({ code, out, err });
    });
    onSpawn?.(p);
  });
}

const baseEnv = () => ({ PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: tmp, LANG: "C.UTF-8" });

// An installer stand-in: one plain-http request through $HTTP_PROXY, prints status and body, exits 7.
// Raw bytes rather than node:http, whose absolute request paths differ between Node and Bun; the
// target in $TARGET (Bun's `node` shim under `bunx --bun` drops `node -e` arguments).
const standIn = `
const net = require("node:net");
const proxy = new URL(process.env.HTTP_PROXY);
const target = new URL(process.env.TARGET);
const s = net.connect(Number(proxy.port), proxy.hostname);
let got = "";
s.on("data", (d) => (got += d));
s.on("error", (e) => { console.log("error " + e.message); process.exit(9); });
s.on("close", () => {
  const [head, body] = got.split("\\r\\n\\r\\n");
  console.log(head.split(" ")[1] + " " + body.trim() + " NO_PROXY=[" + process.env.NO_PROXY + "] " + (process.env.HTTPS_PROXY === process.env.HTTP_PROXY));
  process.exit(7);
});
s.write("GET " + target.href + " HTTP/1.1\\r\\nHost: " + target.host + "\\r\\n\\r\\n");`;

describe("forwarder (bootstraps/build-egress-forwarder.mjs)", () => {
  test("the installer reaches an allowed host through the proxy env; its exit code comes back", async () => {
    const TARGET = `http://127.0.0.1:${servicePort}/via-forwarder`;
    const r = await run([bun, forwarder, allowing.socketPath, "--", "node", "-e", standIn], { ...baseEnv(), TARGET, HTTPS_PROXY: "http://elsewhere:1", NO_PROXY: "localhost" });
    expect(r.out).toContain("200 hello from the host: GET /via-forwarder NO_PROXY=[] true");
    expect(r.code).toBe(7);
    const refused = await run([bun, forwarder, strict.socketPath, "--", "node", "-e", standIn], { ...baseEnv(), TARGET });
    expect(refused.out).toContain("403 Kiln build sandbox: 127.0.0.1 is a loopback address");
  });

  test("signals are forwarded; death by signal is 128 + its number", async () => {
    const r = await run([bun, forwarder, strict.socketPath, "--", "node", "-e", "console.log('ready'); setInterval(() => {}, 1000)"], baseEnv(), 10_000, (p) => {
      p.stdout!.on("data", (d) => {
        if (String(d).includes("ready")) p.kill("SIGTERM");
      });
    });
    expect(r.code).toBe(143);
  });

  test("a missing installer is 127", async () => {
    const r = await run([bun, forwarder, strict.socketPath, "--", "kiln-no-such-installer"], baseEnv());
    expect(r.code).toBe(127);
  });

  test("npm honours the proxy env: refused when the registry is local, served when allowed", async () => {
    const view = (sock: string) =>
      run([bun, forwarder, sock, "--", "npm", "view", "kiln-egress-probe", "version", "--registry", `http://127.0.0.1:${registryPort}/`, "--fetch-retries=0", "--prefer-online", "--cache", join(tmp, "npm-cache"), "--userconfig", join(tmp, "npmrc")], {
        ...baseEnv(),
        npm_config_update_notifier: "false",
      }, 30_000);
    const before = registryHits;
    const refused = await view(strict.socketPath);
    expect(refused.code).not.toBe(0);
    expect(refused.err).toMatch(/403.*Kiln build sandbox: 127\.0\.0\.1 is a loopback address/);
    expect(registryHits).toBe(before);
    const served = await view(allowing.socketPath);
    expect(served.err).not.toContain("403");
    expect(served.out.trim()).toBe("1.0.0");
    expect(served.code).toBe(0);
    expect(registryHits).toBeGreaterThan(before);
  }, 40_000);
});

describe("under Bun and bubblewrap", () => {
  test("the proxy runs under Bun (Kiln's runtime) the same way", async () => {
    const dir = join(tmp, "bun-hosted");
    // bun -e: process.argv is [bun, ...args]
    const script = `import { startBuildEgress } from ${JSON.stringify(join(repo, "runtime-sandbox", "build-egress.ts"))};
const e = await startBuildEgress({ socketDir: process.argv[1], allowHosts: [process.argv[2]] });
console.log("ready " + e.socketPath);
process.on("SIGTERM", async () => { await e.close(); process.exit(0); });`;
    const p = spawn(bun, ["-e", script, dir, `127.0.0.1:${servicePort}`], { env: baseEnv(), stdio: ["ignore", "pipe", "inherit"] });
    try {
      const sock = await new Promise<string>((resolve, reject) => {
        p.stdout.on("data", (d) => {
          const m = /ready (\S+)/.exec(String(d));
          if (m) resolve(m[1]!);
        });
        p.on("exit", (c) => reject(new Error(`bun exited ${c}`)));
      });
      expect((await get(sock, `http://localhost:${servicePort}/x`)).split("\r\n")[0]).toMatch(/^HTTP\/1\.1 403 /);
      expect(await get(sock, `http://127.0.0.1:${servicePort}/under-bun`)).toContain("hello from the host: GET /under-bun");
      expect(await tunnel(sock, `127.0.0.1:${servicePort}`)).toContain("hello from the host: GET /through-tunnel");
    } finally {
      p.kill("SIGTERM");
    }
  });

  // The wiring described for planBuild: own network namespace, Kiln's Bun and the socket folder bound in.
  const bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].find((p) => existsSync(p));
  const system: string[] = ["--ro-bind", "/usr", "/usr"];
  for (const p of ["/bin", "/sbin", "/lib", "/lib32", "/lib64"]) {
    try {
      const st = lstatSync(p);
      if (st.isSymbolicLink()) system.push("--symlink", readlinkSync(p), p);
      else if (st.isDirectory()) system.push("--ro-bind", p, p);
    } catch {
      // not on this system
    }
  }
  const bwrapWorks = !!bwrap && spawnSync(bwrap, ["--unshare-all", "--die-with-parent", ...system, "--", "/usr/bin/true"], { stdio: "ignore" }).status === 0;

  test.skipIf(!bwrapWorks)("inside bwrap --unshare-net: no direct way to the host, the proxy is the way out", async () => {
    const inside = `
const net = require("node:net");
const s = net.connect(${servicePort}, "127.0.0.1");
s.on("connect", () => { console.log("DIRECT CONNECTED"); process.exit(1); });
s.on("error", (e) => { console.log("direct: " + e.code); ${standIn} });`;
    const wiring = egressWiring(allowing.socketPath, bun);
    const r = await run(
      [
        bwrap!,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--cap-drop",
        "ALL",
        ...system,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        join(repo, "runtime-sandbox", "bootstraps"),
        "/var/runtime",
        ...wiring.mounts.flatMap((m) => (m.kind === "bind" ? ["--ro-bind", m.src, m.dest] : [])),
        "--",
        ...wiring.argvPrefix,
        "/usr/bin/node",
        "-e",
        inside,
      ],
      { ...baseEnv(), HOME: "/tmp", TARGET: `http://127.0.0.1:${servicePort}/from-sandbox` },
    );
    expect(r.out).toContain("direct: ECONNREFUSED");
    expect(r.out).toContain("200 hello from the host: GET /from-sandbox");
    expect(r.code).toBe(7);
  });
});
