// TLS on Kiln's PostgreSQL wire listener, seen from real clients on both engines: psql (libpq 15) with
// sslmode=require, verify-full against Kiln's local CA (<data-dir>/tls/ca.pem) by IP and by name, a
// wrong CA refused, sslmode=disable still served; postgres.js and node-postgres with ssl {ca} and
// rejectUnauthorized; a CancelRequest ending a statement of a TLS session (postgres.js sends it over
// TLS; a plaintext one as libpq 15 sends it); --pg-require-ssl refusing plaintext with PostgreSQL's words.
import { cancelRequest } from "../support/database-clients";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { connect as tcpConnect } from "node:net";
import { join } from "node:path";
import pg from "pg";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { newDatabase } from "../support/databases";
import { eventually, STORE, useKiln, withKiln, type TestKiln } from "../support/kiln";

const k = useKiln();
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of closers.reverse()) await c().catch(() => {});
});

let url = "";
let caPath = "";
beforeAll(async () => {
  url = await newDatabase(k, "tls");
  // Nothing is made until a client asks for TLS (a start pays neither the keys nor node-forge's loading).
  if (existsSync(join(k.dataDir, "tls", "ca.pem"))) throw new Error("TLS material was made before any client asked for it");
  caPath = await caOf(k);
}, 120_000);

/** Kiln's CA certificate: made at the first SSLRequest or CA download (this one asks for it). */
async function caOf(kiln: TestKiln): Promise<string> {
  const path = join(kiln.dataDir, "tls", "ca.pem");
  const r = await fetch(`${kiln.url}/_kiln/ca.pem`);
  if (r.status !== 200) throw new Error(`GET /_kiln/ca.pem: ${r.status} ${await r.text()}`);
  await eventually(
    async () => {
      try {
        return readFileSync(path, "utf8");
      } catch {
        return "";
      }
    },
    (pem) => pem.includes("BEGIN CERTIFICATE"),
    30_000,
  );
  return path;
}

/** The connection string with libpq parameters added (and the host swapped, if given). */
function withParams(cs: string, params: Record<string, string>, host?: string): string {
  const u = new URL(cs);
  if (host) u.hostname = host;
  for (const [name, value] of Object.entries(params)) u.searchParams.set(name, value);
  return u.toString();
}

interface Ran {
  code: number | null;
  out: string;
  err: string;
}

function psql(cs: string, commands: string[]): Promise<Ran> {
  const args = [cs, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", ...commands.flatMap((c) => ["-c", c])];
  return new Promise((resolve) => {
    const p = spawn("psql", args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PGCONNECT_TIMEOUT: "20", PGSSLCERT: "/nonexistent", PGSSLKEY: "/nonexistent" } });
    let out = "";
    let err = "";
    p.stdout!.on("data", (d) => (out += d));
    p.stderr!.on("data", (d) => (err += d));
    const timer = setTimeout(() => p.kill("SIGKILL"), 30_000);
    p.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out, err });
    });
  });
}

function jsClient(cs: string, ssl: postgres.Options<{}>["ssl"]) {
  const c = postgres(cs, { max: 1, onnotice: () => {}, connect_timeout: 20, ssl });
  closers.push(() => c.end({ timeout: 1 }));
  return c;
}

async function pgClient(cs: string, ssl: pg.ClientConfig["ssl"]): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: cs, ssl });
  c.on("error", () => {});
  await c.connect();
  closers.push(() => c.end());
  return c;
}


/** Cancels `query` once `text` runs (production: seen active in pg_stat_activity; embedded: a short pause); what it ended with. */
async function cancelOnceRunning(cs: string, text: string, query: PromiseLike<unknown>, cancel: () => unknown) {
  const settled = Promise.resolve(query).then(
    () => null,
    (e: Error & { code?: string }) => e,
  );
  if (STORE === "postgres") {
    const probe = postgres(cs, { max: 1, onnotice: () => {}, connect_timeout: 20, ssl: "prefer" });
    try {
      await eventually(
        () => probe`select count(*)::int as n from pg_stat_activity where state = 'active' and query = ${text} and wait_event is distinct from 'ClientRead' and clock_timestamp() - query_start > interval '1 second'`,
        (r) => r[0]!.n > 0,
        20_000,
      );
    } finally {
      await probe.end({ timeout: 1 });
    }
  } else await new Promise((r) => setTimeout(r, 300));
  await cancel();
  return settled;
}

const SSL_LINE = /SSL connection \(protocol: TLSv1\.[23]/;

describe("TLS on the wire listener", () => {
  test("psql with sslmode=require connects over TLS (\\conninfo) and queries; sslmode=disable still connects, without TLS", async () => {
    const tls = await psql(withParams(url, { sslmode: "require" }), ["\\conninfo", "select 'over tls'"]);
    expect(tls.err).toBe("");
    expect(tls.code).toBe(0);
    expect(tls.out).toMatch(SSL_LINE);
    expect(tls.out).toContain("over tls");

    const plain = await psql(withParams(url, { sslmode: "disable" }), ["\\conninfo", "select 'in plaintext'"]);
    expect(plain.code).toBe(0);
    expect(plain.out).not.toContain("SSL connection");
    expect(plain.out).toContain("in plaintext");
  });

  test("psql with sslmode=verify-full and sslrootcert=<data-dir>/tls/ca.pem verifies the certificate for 127.0.0.1 and localhost; a wrong CA is refused", async () => {
    for (const host of ["127.0.0.1", "localhost"]) {
      const r = await psql(withParams(url, { sslmode: "verify-full", sslrootcert: caPath }, host), ["\\conninfo", "select 42"]);
      expect(r.err).toBe("");
      expect(r.out).toMatch(SSL_LINE);
      expect(r.out).toContain("42");
    }
    // The system's public CAs did not sign Kiln's certificate.
    const wrong = await psql(withParams(url, { sslmode: "verify-full", sslrootcert: "/etc/ssl/certs/ca-certificates.crt" }), ["select 1"]);
    expect(wrong.code).not.toBe(0);
    expect(wrong.err).toMatch(/certificate verify failed/);
  });

  test("GET /_kiln/ca.pem serves the CA certificate (no key) that <data-dir>/tls/ca.pem holds", async () => {
    const r = await fetch(`${k.url}/_kiln/ca.pem`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toBe("application/x-pem-file");
    const pem = await r.text();
    expect(pem).toBe(readFileSync(caPath, "utf8"));
    expect(pem).not.toContain("PRIVATE KEY");
    expect(r.headers.get("x-kiln-ca-path")).toBe(caPath);
  });

  test("postgres.js and node-postgres with ssl {ca (from GET /_kiln/ca.pem), rejectUnauthorized: true} work; with another CA they fail", async () => {
    const ca = await (await fetch(`${k.url}/_kiln/ca.pem`)).text();
    const js = jsClient(url, { ca, rejectUnauthorized: true });
    expect((await js`select 'js over tls' as v`)[0]!.v).toBe("js over tls");

    const c = await pgClient(url, { ca, rejectUnauthorized: true });
    expect((await c.query("select 'pg over tls' as v")).rows[0].v).toBe("pg over tls");
    // node-postgres reads and writes through a TLS socket once the server said 'S'.
    expect((c as unknown as { connection: { stream: { encrypted?: boolean; getProtocol?: () => string } } }).connection.stream.getProtocol?.()).toMatch(/^TLSv1\.[23]$/);

    const other = readFileSync("/etc/ssl/certs/ca-certificates.crt", "utf8");
    const bad = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 20, ssl: { ca: other, rejectUnauthorized: true } });
    await expect(bad`select 1`).rejects.toThrow(/certificate/i);
    await bad.end({ timeout: 1 });
    const badPg = new pg.Client({ connectionString: url, ssl: { ca: other, rejectUnauthorized: true } });
    badPg.on("error", () => {});
    await expect(badPg.connect()).rejects.toThrow(/certificate/i);
  });

  test("a CancelRequest ends pg_sleep(30) of a TLS session with 57014: postgres.js's (over TLS) and a plaintext one; the sessions go on", async () => {
    const ca = readFileSync(caPath, "utf8");
    const js = jsClient(url, { ca, rejectUnauthorized: true });
    // Connected (and the database open) first: the embedded path cancels 300 ms after sending.
    await js`select 1`;
    const q = js`select pg_sleep(30)`;
    const e1 = await cancelOnceRunning(url, "select pg_sleep(30)", q.execute(), () => q.cancel());
    expect(e1).toMatchObject({ code: "57014" });
    expect((await js`select 'after cancel' as v`)[0]!.v).toBe("after cancel");

    const c = await pgClient(url, { ca, rejectUnauthorized: true });
    const e2 = await cancelOnceRunning(url, "select pg_sleep(30)", c.query("select pg_sleep(30)"), () => cancelRequest(url, c));
    expect(e2).toMatchObject({ code: "57014" });
    expect((await c.query("select 'still here' as v")).rows[0].v).toBe("still here");
  });
});

describe("--pg-require-ssl", () => {
  test("a plaintext startup is refused (FATAL 28000, PostgreSQL's words and a hint); TLS sessions and plaintext CancelRequests are served", async () => {
    await withKiln({ args: ["--pg-require-ssl"] }, async (strict) => {
      const cs = await newDatabase(strict, "strict");
      const ca = await caOf(strict);

      const plain = await psql(withParams(cs, { sslmode: "disable" }), ["select 1"]);
      expect(plain.code).not.toBe(0);
      expect(plain.err).toMatch(/FATAL: {2}no pg_hba\.conf entry for host "127\.0\.0\.1", user "[^"]+", database "[^"]+", no encryption/);
      expect(plain.err).toContain("HINT:  SSL required");

      const pgPlain = new pg.Client({ connectionString: cs, ssl: false });
      pgPlain.on("error", () => {});
      await expect(pgPlain.connect()).rejects.toMatchObject({ code: "28000" });

      // libpq's default (prefer) tries TLS first and gets it.
      const preferred = await psql(cs, ["\\conninfo", "select 'prefer'"]);
      expect(preferred.out).toMatch(SSL_LINE);
      const full = await psql(withParams(cs, { sslmode: "verify-full", sslrootcert: ca }), ["select 'verified'"]);
      expect(full.out).toContain("verified");

      const c = await pgClient(cs, { ca: readFileSync(ca, "utf8"), rejectUnauthorized: true });
      const e = await cancelOnceRunning(cs, "select pg_sleep(30)", c.query("select pg_sleep(30)"), () => cancelRequest(cs, c));
      expect(e).toMatchObject({ code: "57014" });
      await c.end();
    });
  }, 120_000);
});
