import { COMPILED } from "../server/embedded/embedded";
import { lookup } from "node:dns";
import { chmodSync, existsSync, lstatSync, mkdirSync, realpathSync, rmSync } from "node:fs";
import { connect, createServer, isIP, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import { dirname, join } from "node:path";
import type { Mount } from "./mounts";

/**
 * The only way out of the build sandbox: an HTTP forward proxy on a unix socket that is bind-mounted
 * into the sandbox (which has its own network namespace, only a private loopback inside). Inside,
 * bootstraps/build-egress-forwarder.mjs turns a loopback port into connections to this socket and
 * points the installer's proxy environment at it.
 *
 * It serves CONNECT host:port (https) and absolute-URI requests (http). Every target name is resolved
 * here (all addresses) and refused with a 403 when any address is local: loopback, unspecified,
 * private, link-local, CGNAT, multicast, reserved, the IPv4-mapped/embedded forms of those, or one
 * of this host's own interface addresses. The connection then goes to the exact address that was
 * checked, never a second resolution (DNS rebinding). `allowHosts` (host or host:port, exact) skip
 * the check: a local registry mirror configured on purpose.
 */

export interface BuildEgressOptions {
  /** Created (0755) if missing; the socket is `<socketDir>/egress.sock`, mode 0666. Keep the path short (unix sockets: 107 bytes). */
  socketDir: string;
  /** Exact `host` or `host:port` (IPv6 as `[::1]:8080` or `::1`) let through even when local. */
  allowHosts?: string[];
  /** `http://[user:pass@]host:port` (Kiln's HTTPS_PROXY/HTTP_PROXY): targets are reached through it. */
  upstreamProxy?: string | null;
  /** Kiln's NO_PROXY: targets it names are reached directly, not through `upstreamProxy`. */
  noProxy?: string | null;
  log?: (m: string) => void;
  /** Concurrent client connections; beyond it a 503. Default 128. */
  maxConnections?: number;
  /** A tunnel or request with no traffic either way for this long is closed. Default 120 s. */
  idleTimeoutMs?: number;
  /** Name resolution plus connecting to the target. Default 15 s. */
  connectTimeoutMs?: number;
}

export interface BuildEgress {
  socketPath: string;
  close(): Promise<void>;
}

const MAX_HEAD = 32 * 1024;
const HEAD_TIMEOUT_MS = 30_000;

export async function startBuildEgress(opts: BuildEgressOptions): Promise<BuildEgress> {
  const log = opts.log ?? (() => {});
  const maxConnections = opts.maxConnections ?? 128;
  const idleTimeoutMs = opts.idleTimeoutMs ?? 120_000;
  const connectTimeoutMs = opts.connectTimeoutMs ?? 15_000;
  const allow = parseAllowHosts(opts.allowHosts ?? []);
  const upstream = opts.upstreamProxy ? parseUpstream(opts.upstreamProxy) : null;
  const noProxy = parseNoProxy(opts.noProxy ?? "");

  mkdirSync(opts.socketDir, { recursive: true, mode: 0o755 });
  // Never a folder someone else made (a shared /tmp): they could swap the socket.
  const st = lstatSync(opts.socketDir);
  if (!st.isDirectory() || (process.getuid && st.uid !== process.getuid())) throw new Error(`build egress: ${opts.socketDir} is not a folder of this user`);
  chmodSync(opts.socketDir, 0o755);
  const socketPath = join(opts.socketDir, "egress.sock");
  rmSync(socketPath, { force: true });

  const open = new Set<Socket>();
  let clients = 0;
  const track = (s: Socket) => {
    open.add(s);
    s.on("close", () => open.delete(s));
  };
  // Half-open allowed: a client that shuts its side after the request still gets the answer.
  const server = createServer({ allowHalfOpen: true }, (client) => {
    track(client);
    client.on("error", () => {});
    clients++;
    client.on("close", () => clients--);
    if (clients > maxConnections) {
      log(`build egress: more than ${maxConnections} connections, refusing one`);
      endWith(client, response(503, "Service Unavailable", "too many connections through the build egress proxy"));
      return;
    }
    readHead(client)
      .then((h) => h && handle(client, h))
      .catch((e) => {
        log(`build egress: ${(e as Error).message}`);
        client.destroy();
      });
  });

  async function handle(client: Socket, h: Head): Promise<void> {
    let host: string;
    let port: number;
    let absolute: URL | null = null;
    if (h.method === "CONNECT") {
      const a = parseAuthority(h.target, 443);
      if (!a) return void endWith(client, response(400, "Bad Request", `not host:port: ${printable(h.target)}`));
      ({ host, port } = a);
    } else {
      try {
        absolute = new URL(h.target);
      } catch {
        return void endWith(client, response(400, "Bad Request", "this is a forward proxy: use an absolute http:// URL or CONNECT"));
      }
      if (absolute.protocol !== "http:") return void endWith(client, response(400, "Bad Request", `only http:// URLs (CONNECT for ${printable(absolute.protocol)})`));
      host = unbracket(absolute.hostname);
      port = absolute.port ? Number(absolute.port) : 80;
    }
    const what = `${h.method} ${printable(absolute ? `http://${absolute.host}` : h.target)}`;
    const viaUpstream = upstream && !matchesNoProxy(noProxy, host, port) ? upstream : null;

    // Resolve, check every address, then connect to one of exactly those (no second lookup).
    let addresses: string[] | null;
    try {
      addresses = await withTimeout(resolveAll(host), connectTimeoutMs, "timed out");
    } catch (e) {
      if (!viaUpstream) {
        log(`build egress: ${what}: cannot resolve ${host}: ${(e as Error).message}`);
        return void endWith(client, response(502, "Bad Gateway", `cannot resolve ${printable(host)}`));
      }
      addresses = null; // the upstream proxy may know names this host does not
    }
    if (addresses && !isAllowed(allow, host, port)) {
      const interfaces = localInterfaceAddresses();
      for (const a of addresses) {
        const why = localReason(a, interfaces);
        if (!why) continue;
        const reason = `${printable(host)}${normalizeHost(host) === normalizeHost(a) ? " is" : ` resolves to ${a},`} ${why}; builds may only reach public addresses`;
        log(`build egress: refused ${what}: ${reason}`);
        return void endWith(client, response(403, "Forbidden", `Kiln build sandbox: ${reason}`));
      }
    }

    let target: Socket;
    try {
      // Through the upstream proxy the name goes on (its allow lists are by name); it was checked above when resolvable.
      target = viaUpstream ? await dial([viaUpstream.host], viaUpstream.port, connectTimeoutMs) : await dial(addresses!, port, connectTimeoutMs);
    } catch (e) {
      log(`build egress: ${what}: ${(e as Error).message}`);
      return void endWith(client, response(502, "Bad Gateway", `cannot connect to ${printable(host)}:${port}`));
    }
    track(target);
    if (client.destroyed) return void target.destroy();
    guard(client, target, idleTimeoutMs);
    const authority = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;

    if (h.method === "CONNECT") {
      let early: Buffer | null = null;
      if (viaUpstream) {
        target.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${viaUpstream.auth}\r\n`);
        const answer = await readHead(target, true).catch(() => null);
        if (!answer || !/^2\d\d$/.test(answer.status)) {
          const status = answer ? `${answer.status} ${answer.reason}` : "no answer";
          log(`build egress: ${what}: the upstream proxy answered ${status}`);
          target.destroy();
          return void endWith(client, response(502, "Bad Gateway", `the upstream proxy refused ${printable(authority)}: ${printable(status)}`));
        }
        early = answer.rest;
      }
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (early?.length) client.write(early);
      if (h.rest.length) target.write(h.rest);
      client.pipe(target);
      target.pipe(client);
      client.resume();
      target.resume();
      return;
    }

    // Plain http: one request per client connection. The head is rewritten (origin form, hop-by-hop
    // headers dropped, Connection: close); the body and the response stream through.
    const u = absolute!;
    const lines = [`${h.method} ${viaUpstream ? u.href : `${u.pathname}${u.search}`} ${h.version}`];
    if (!h.headers.some(([n]) => n.toLowerCase() === "host")) lines.push(`Host: ${u.host}`);
    for (const [name, value] of h.headers) if (!HOP_BY_HOP.has(name.toLowerCase())) lines.push(`${name}: ${value}`);
    if (viaUpstream?.auth) lines.push(viaUpstream.auth.trimEnd());
    lines.push("Connection: close");
    target.write(`${lines.join("\r\n")}\r\n\r\n`);
    if (h.rest.length) target.write(h.rest);
    client.pipe(target);
    client.resume();
    // The response head is rewritten too (Connection: close), so the client never reuses this connection.
    const answer = await readHead(target, true);
    const out = [`${answer!.version} ${answer!.status} ${answer!.reason}`];
    for (const [name, value] of answer!.headers) if (!HOP_BY_HOP.has(name.toLowerCase())) out.push(`${name}: ${value}`);
    out.push("Connection: close");
    client.write(`${out.join("\r\n")}\r\n\r\n`);
    if (answer!.rest.length) client.write(answer!.rest);
    target.pipe(client);
    target.resume();
  }

  /** Connects to the first of `addresses` that answers (IPv4 first: IPv6 is often unrouted). */
  function dial(addresses: string[], port: number, timeoutMs: number): Promise<Socket> {
    const ordered = [...addresses.filter((a) => isIP(a) !== 6), ...addresses.filter((a) => isIP(a) === 6)];
    const attempt = (a: string) =>
      new Promise<Socket>((resolve, reject) => {
        const s = connect({ host: a, port, allowHalfOpen: true });
        const t = setTimeout(() => {
          s.destroy();
          reject(new Error(`connecting to ${a}:${port} timed out`));
        }, timeoutMs);
        s.once("connect", () => {
          clearTimeout(t);
          s.removeAllListeners("error");
          s.on("error", () => {});
          resolve(s);
        });
        s.once("error", (e) => {
          clearTimeout(t);
          s.destroy();
          reject(new Error(`connecting to ${a}:${port}: ${e.message}`));
        });
      });
    return ordered.reduce<Promise<Socket>>((prev, a) => prev.catch(() => attempt(a)), Promise.reject(new Error("no address")));
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(socketPath, () => {
      server.off("error", reject);
      resolve();
    });
  });
  chmodSync(socketPath, 0o666);

  return {
    socketPath,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => {
          rmSync(socketPath, { force: true });
          resolve();
        });
      }),
  };
}

/** Where the wiring puts things inside the build sandbox. */
export const EGRESS_IN_SANDBOX = { dir: "/run/kiln-egress", socket: "/run/kiln-egress/egress.sock", bun: "/opt/kiln/bun", forwarder: "/var/runtime/build-egress-forwarder.mjs" };

/** Kiln's own Bun binary (the forwarder's runtime inside the sandbox; pip and bundler builds have no node). */
export function hostBunPath(): string {
  if (process.versions.bun) return realpathSync(process.execPath);
  const local = join(import.meta.dirname, "..", "node_modules", ".bin", "bun"); // Kiln's code run by node (vitest)
  if (existsSync(local)) return realpathSync(local);
  throw new Error("build egress: no Bun binary for the forwarder");
}

/**
 * What a build launch needs for the egress, for any sandbox: two read-only mounts (Kiln's Bun and
 * the socket's folder; the sandbox has its own network namespace) and the prefix in front of the
 * installer's argv. The forwarder itself is in bootstraps/, which the sandbox shows at /var/runtime.
 */
export function egressWiring(socketPath: string, bunPath = hostBunPath()): { mounts: Mount[]; argvPrefix: string[] } {
  return {
    mounts: [
      { kind: "bind", src: bunPath, dest: EGRESS_IN_SANDBOX.bun },
      { kind: "bind", src: realpathSync(dirname(socketPath)), dest: EGRESS_IN_SANDBOX.dir },
    ],
    // Kiln's binary is Bun only when told (BUN_BE_BUN); otherwise it would run its own CLI.
    argvPrefix: [...(COMPILED ? ["/usr/bin/env", "BUN_BE_BUN=1"] : []), EGRESS_IN_SANDBOX.bun, EGRESS_IN_SANDBOX.forwarder, EGRESS_IN_SANDBOX.socket, "--"],
  };
}

/** Registry hosts the operator configured in Kiln's environment (npm_config_registry, PIP_INDEX_URL, …): candidates for allowHosts. */
export function registryHostsFromEnv(env: Record<string, string | undefined> = process.env): string[] {
  const out = new Set<string>();
  for (const [k, v] of Object.entries(env)) {
    if (!v || !/^(npm_config_registry|NPM_CONFIG_REGISTRY|PIP_INDEX_URL|PIP_EXTRA_INDEX_URL|BUNDLE_MIRROR__.*)$/.test(k)) continue;
    for (const word of v.split(/\s+/)) {
      try {
        const u = new URL(word);
        if (u.protocol === "http:" || u.protocol === "https:") out.add(`${u.hostname}:${u.port || (u.protocol === "https:" ? 443 : 80)}`);
      } catch {
        // not a URL
      }
    }
  }
  return [...out];
}

// ---------------------------------------------------------------------------------------------
// HTTP heads

interface Head {
  method: string;
  target: string;
  version: string;
  /** Only for a response head (readHead(_, true)). */
  status: string;
  reason: string;
  headers: [string, string][];
  /** Bytes read past the head. */
  rest: Buffer;
}

const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade"]);

/**
 * Reads one HTTP head (at most MAX_HEAD bytes, within HEAD_TIMEOUT_MS), leaving the socket paused.
 * On a malformed request head the client gets a 400 and null comes back.
 */
function readHead(s: Socket, isResponse = false): Promise<Head | null> {
  return new Promise((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    const done = () => {
      clearTimeout(timer);
      s.off("data", onData);
      s.off("end", onEnd);
      s.off("error", onEnd);
      s.pause();
    };
    const fail = (status: number, text: string, body: string) => {
      done();
      if (isResponse) return reject(new Error(body));
      endWith(s, response(status, text, body));
      resolve(null);
    };
    const timer = setTimeout(() => fail(408, "Request Timeout", "no request head in time"), HEAD_TIMEOUT_MS);
    const onEnd = () => {
      done();
      if (isResponse) reject(new Error("closed before a response head"));
      else {
        s.destroy();
        resolve(null);
      }
    };
    const onData = (chunk: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      const end = buf.indexOf("\r\n\r\n");
      if (end < 0) {
        if (buf.length > MAX_HEAD) fail(431, "Request Header Fields Too Large", "request head too large");
        return;
      }
      if (end > MAX_HEAD) return fail(431, "Request Header Fields Too Large", "request head too large");
      done();
      const [first, ...rest] = buf.subarray(0, end).toString("latin1").split("\r\n");
      const parts = first!.split(" ");
      const headers: [string, string][] = [];
      for (const line of rest) {
        const i = line.indexOf(":");
        if (i <= 0 || /^[ \t]/.test(line)) return fail(400, "Bad Request", "malformed header line");
        headers.push([line.slice(0, i).trim(), line.slice(i + 1).trim()]);
      }
      const head: Head = isResponse
        ? { method: "", target: "", version: parts[0] ?? "", status: parts[1] ?? "", reason: parts.slice(2).join(" "), headers, rest: buf.subarray(end + 4) }
        : { method: parts[0] ?? "", target: parts[1] ?? "", version: parts[2] ?? "", status: "", reason: "", headers, rest: buf.subarray(end + 4) };
      if (!isResponse && (parts.length !== 3 || !/^HTTP\/1\.[01]$/.test(head.version) || !/^[A-Z]+$/.test(head.method)))
        return fail(400, "Bad Request", "malformed request line");
      resolve(head);
    };
    s.on("data", onData);
    s.on("end", onEnd);
    s.on("error", onEnd);
    s.resume();
  });
}

/** Answers and closes; with half-open sockets the peer's side is cut after a grace period too. */
function endWith(s: Socket, text: string): void {
  s.end(text);
  setTimeout(() => s.destroy(), 5000).unref();
}

function response(status: number, text: string, body: string): string {
  const b = `${body}\n`;
  // The reason phrase carries the reason too: npm and pip print it ("403 Forbidden (…)") where they drop the body.
  const phrase = status === 403 ? `${text} (${body.replace(/[^\x20-\x7e]/g, "?")})` : text;
  return `HTTP/1.1 ${status} ${phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(b)}\r\nConnection: close\r\n\r\n${b}`;
}

/** Closes both sockets when either ends, fails or sees no traffic for `idleMs` (pipes carry the data). */
function guard(client: Socket, target: Socket, idleMs: number): void {
  const close = () => {
    client.destroy();
    target.destroy();
  };
  for (const s of [client, target]) {
    s.setTimeout(idleMs, close);
    s.on("error", close);
    s.on("close", close);
  }
}

// ---------------------------------------------------------------------------------------------
// names and addresses

function parseAuthority(s: string, defaultPort: number): { host: string; port: number } | null {
  const m = /^(?:\[([0-9a-fA-F:.%]+)\]|([^\s:/[\]@]+))(?::(\d{1,5}))?$/.exec(s);
  if (!m) return null;
  const port = m[3] ? Number(m[3]) : defaultPort;
  // defaultPort 0: "any port" for NO_PROXY and allowHosts entries without one (they used to match nothing).
  if ((m[3] || defaultPort) && (port < 1 || port > 65535)) return null;
  return { host: (m[1] ?? m[2]!).toLowerCase(), port };
}

function unbracket(h: string): string {
  return h.startsWith("[") && h.endsWith("]") ? h.slice(1, -1) : h.toLowerCase();
}

function normalizeHost(h: string): string {
  h = unbracket(h.toLowerCase()).replace(/\.$/, "");
  return isIP(h) === 6 ? canonicalV6(h) ?? h : h;
}

interface AllowEntry {
  host: string;
  port: number | null;
}

function parseAllowHosts(list: string[]): AllowEntry[] {
  const out: AllowEntry[] = [];
  for (const raw of list) {
    const s = raw.trim();
    if (!s) continue;
    if (isIP(s) === 6) out.push({ host: normalizeHost(s), port: null });
    else {
      const a = parseAuthority(s, 0);
      if (!a) throw new Error(`build egress: allowHosts entry is not host or host:port: ${s}`);
      out.push({ host: normalizeHost(a.host), port: a.port || null });
    }
  }
  return out;
}

function isAllowed(allow: AllowEntry[], host: string, port: number): boolean {
  const h = normalizeHost(host);
  return allow.some((a) => a.host === h && (a.port === null || a.port === port));
}

function parseUpstream(s: string): { host: string; port: number; auth: string } {
  let u: URL;
  try {
    u = new URL(s.includes("://") ? s : `http://${s}`);
  } catch {
    throw new Error(`build egress: upstream proxy is not a URL: ${s}`);
  }
  if (u.protocol !== "http:") throw new Error(`build egress: only http:// upstream proxies are supported, not ${u.protocol}`);
  const auth = u.username ? `Proxy-Authorization: Basic ${Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString("base64")}\r\n` : "";
  return { host: unbracket(u.hostname), port: u.port ? Number(u.port) : 80, auth };
}

function parseNoProxy(s: string): string[] {
  return s
    .split(/[,\s]+/)
    .map((x) => x.trim().toLowerCase())
    .filter(Boolean);
}

function matchesNoProxy(list: string[], host: string, port: number): boolean {
  const h = normalizeHost(host);
  return list.some((e) => {
    if (e === "*") return true;
    const a = parseAuthority(e.replace(/^\*?\./, ""), 0);
    if (!a) return false;
    if (a.port && a.port !== port) return false;
    const d = normalizeHost(a.host);
    return h === d || (!isIP(h) && h.endsWith(`.${d}`));
  });
}

function resolveAll(host: string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    lookup(host, { all: true }, (err, addresses) => {
      if (err) return reject(err);
      const list = (addresses as { address: string }[]).map((a) => a.address);
      if (list.length === 0) reject(new Error("no addresses"));
      else resolve(list);
    });
  });
}

function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(message)), ms);
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

function printable(s: string): string {
  return s.replace(/[^\x21-\x7e]/g, "?").slice(0, 200);
}

/** This host's own addresses, canonical (IPv4 dotted, IPv6 fully expanded). */
function localInterfaceAddresses(): Set<string> {
  const out = new Set<string>();
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) {
      const c = isIP(a.address) === 6 ? canonicalV6(a.address) : a.address;
      if (c) out.add(c);
    }
  }
  return out;
}

const V4_LOCAL: [string, number, string][] = [
  ["0.0.0.0", 8, "an unspecified address"],
  ["10.0.0.0", 8, "a private address"],
  ["100.64.0.0", 10, "a shared (CGNAT) address"],
  ["127.0.0.0", 8, "a loopback address"],
  ["169.254.0.0", 16, "a link-local address"],
  ["172.16.0.0", 12, "a private address"],
  ["192.0.0.0", 24, "a special-purpose address"],
  ["192.168.0.0", 16, "a private address"],
  ["198.18.0.0", 15, "a benchmarking address"],
  ["224.0.0.0", 4, "a multicast address"],
  ["240.0.0.0", 4, "a reserved address"],
];

function v4ToInt(a: string): number {
  const p = a.split(".").map(Number);
  return ((p[0]! << 24) | (p[1]! << 16) | (p[2]! << 8) | p[3]!) >>> 0;
}

function v4Reason(a: string, interfaces: Set<string>): string | null {
  const n = v4ToInt(a);
  for (const [base, bits, why] of V4_LOCAL) {
    const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
    if ((n & mask) >>> 0 === (v4ToInt(base) & mask) >>> 0) return why;
  }
  return interfaces.has(a) ? "an address of this host" : null;
}

/** Eight 16-bit groups, or null. */
function parseV6(s: string): number[] | null {
  s = s.split("%")[0]!;
  // A trailing dotted IPv4 part (::ffff:127.0.0.1) becomes two groups.
  const m = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (m) {
    if (isIP(m[2]!) !== 4) return null;
    const n = v4ToInt(m[2]!);
    s = `${m[1]}${(n >>> 16).toString(16)}:${(n & 0xffff).toString(16)}`;
  }
  const halves = s.split("::");
  if (halves.length > 2) return null;
  const part = (x: string) => (x === "" ? [] : x.split(":").map((g) => (/^[0-9a-f]{1,4}$/i.test(g) ? parseInt(g, 16) : NaN)));
  const head = part(halves[0]!);
  const back = halves.length === 2 ? part(halves[1]!) : [];
  const fill = halves.length === 2 ? 8 - head.length - back.length : 0;
  if (fill < 0 || (halves.length === 2 && fill < 1)) return null;
  const groups = [...head, ...Array<number>(fill).fill(0), ...back];
  return groups.length === 8 && groups.every((g) => Number.isInteger(g)) ? groups : null;
}

function canonicalV6(s: string): string | null {
  const g = parseV6(s);
  return g ? g.map((x) => x.toString(16)).join(":") : null;
}

const v4Of = (hi: number, lo: number) => `${hi >>> 8}.${hi & 0xff}.${lo >>> 8}.${lo & 0xff}`;

/** Why an address counts as local (never reachable from a build), or null for a public one. */
export function localReason(address: string, interfaces: Set<string> = localInterfaceAddresses()): string | null {
  const family = isIP(address.split("%")[0]!);
  if (family === 4) return v4Reason(address, interfaces);
  const g = parseV6(address);
  if (family !== 6 || !g) return "not an IP address";
  const zeros = (n: number) => g.slice(0, n).every((x) => x === 0);
  if (zeros(8)) return "an unspecified address";
  if (zeros(7) && g[7] === 1) return "a loopback address";
  // IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::a.b.c.d: the IPv4 rules apply.
  if ((zeros(5) && g[5] === 0xffff) || zeros(6) || (g[0] === 0x64 && g[1] === 0xff9b && g.slice(2, 6).every((x) => x === 0))) {
    const why = v4Reason(v4Of(g[6]!, g[7]!), interfaces);
    if (why) return `${why} (IPv4 inside IPv6)`;
  }
  if (g[0] === 0x2002) {
    const why = v4Reason(v4Of(g[1]!, g[2]!), interfaces); // 6to4
    if (why) return `${why} (IPv4 inside 6to4)`;
  }
  if (g[0] === 0x64 && g[1] === 0xff9b && g[2] === 1) return "a local-use NAT64 address";
  if ((g[0]! & 0xfe00) === 0xfc00) return "a private (unique local) address";
  if ((g[0]! & 0xffc0) === 0xfe80) return "a link-local address";
  if ((g[0]! & 0xffc0) === 0xfec0) return "a site-local address";
  if ((g[0]! & 0xff00) === 0xff00) return "a multicast address";
  return interfaces.has(g.map((x) => x.toString(16)).join(":")) ? "an address of this host" : null;
}
