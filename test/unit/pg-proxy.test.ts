import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { AccessMode } from "../../server/backends/databases/engine";
import { openProxy, startupParams, type ProxyTarget } from "../../server/backends/databases/pg-proxy";
import { PostgresEngine, serverDatabaseName } from "../../server/backends/databases/production";
import { tenantRoleName } from "../../server/backends/databases/tenant-roles";
import { startWireListener, type WireBackend, type WireClient, type WireListener } from "../../server/backends/databases/wire/listener";
import { B, errorFields, firstResult, readInt32, simpleQuery } from "../../server/backends/databases/wire/protocol";
import { startPgServer, type PgServer } from "../support/postgres-server";

// The production engine's proxy against a throwaway PostgreSQL on loopback: the client's startup
// parameters reach the server (or the server's refusal reaches the client), and a CancelRequest
// cancels what the session runs.

const DB = "proxy_t1";
const PASSWORD = "s3cret-Pa55word";
const HOST = "127.0.0.1";

let server: PgServer;
let engine: PostgresEngine;
let admin: postgres.Sql;
let listener: WireListener;
const listenerErrors: unknown[] = [];
const backends: WireBackend[] = [];

beforeAll(async () => {
  server = await startPgServer();
  engine = new PostgresEngine(server.url, { tenantPassword: (role) => `test-password-${role}` });
  await engine.init();
  await engine.create(DB);
  admin = postgres(server.url, { max: 1, onnotice: () => {} });
  const db = postgres(server.url.replace(/\/postgres$/, `/${serverDatabaseName(DB)}`), { max: 1, onnotice: () => {} });
  await db.unsafe(`create schema myschema`);
  await db.end();
  listener = await startWireListener({
    host: HOST,
    port: 0,
    onError: (e) => listenerErrors.push(e),
    router: {
      async credentials(user, database) {
        return user === "service_client" && database === "mydb" ? { target: DB, password: PASSWORD } : null;
      },
      open: (target, client, control) => engine.openWire(target, { kind: "admin" }, client, control),
    },
  });
}, 90_000);

afterAll(async () => {
  await Promise.all(backends.map((b) => b.close().catch(() => {})));
  await listener?.close();
  await admin?.end({ timeout: 1 });
  await engine?.close();
  await server?.stop();
});

function wireClient(params: Record<string, string>): WireClient {
  const all: Record<string, string> = { user: "service_client", database: "mydb", ...params };
  return { user: all.user, database: all.database, applicationName: all.application_name ?? "", params: all, remoteAddress: HOST };
}

async function open(params: Record<string, string>, mode: AccessMode = { kind: "admin" }) {
  const terminated: string[] = [];
  const backend = await engine.openWire(DB, mode, wireClient(params), { terminate: (m) => terminated.push(m) });
  backends.push(backend);
  return { backend, terminated };
}

/** Sends one simple Query and resolves with every byte the server answered up to ReadyForQuery. */
function query(backend: WireBackend, sql: string, timeoutMs = 5_000): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    let out = Buffer.alloc(0);
    const timer = setTimeout(() => reject(new Error(`no ReadyForQuery within ${timeoutMs} ms for: ${sql}`)), timeoutMs);
    void backend.handle(simpleQuery(sql), (d) => {
      out = Buffer.concat([out, d]);
      // Walk whole messages; done once the last one is a ReadyForQuery.
      for (let at = 0; at + 5 <= out.length; ) {
        const end = at + 1 + readInt32(out, at + 1);
        if (end > out.length) break;
        if (out[at] === B.readyForQuery && end === out.length) {
          clearTimeout(timer);
          return resolve(new Uint8Array(out));
        }
        at = end;
      }
    });
  });
}

/** Fields of every ErrorResponse in a response. */
function errors(out: Uint8Array): Record<string, string>[] {
  const found: Record<string, string>[] = [];
  for (let at = 0; at + 5 <= out.length; ) {
    const end = at + 1 + readInt32(out, at + 1);
    if (out[at] === B.error) found.push(errorFields(out.subarray(at + 5, end)));
    at = end;
  }
  return found;
}

const SETTINGS_SQL = `select current_setting('search_path'), current_setting('statement_timeout'), current_setting('DateStyle'),
  current_setting('TimeZone'), current_setting('application_name'), session_user::text, current_user::text, now()::date::text`;

describe("startup parameters", () => {
  test("every client parameter but user, database, replication and _pq_.* is passed on; the target's user and database win", () => {
    const t: ProxyTarget = {
      host: HOST,
      port: 1,
      user: "internal",
      password: "x",
      database: "kiln_db",
      applicationName: "client-app",
      params: {
        user: "service_client",
        database: "mydb",
        replication: "database",
        "_pq_.something": "on",
        application_name: "ignored-here",
        options: "-c search_path=a",
        DateStyle: "ISO, DMY",
        client_encoding: "LATIN1",
        extra_float_digits: "3",
      },
    };
    expect(startupParams(t)).toEqual({
      user: "internal",
      database: "kiln_db",
      application_name: "client-app",
      options: "-c search_path=a",
      DateStyle: "ISO, DMY",
      client_encoding: "LATIN1",
      extra_float_digits: "3",
    });
    // Without a client encoding the proxy still asks for UTF8, as before.
    expect(startupParams({ ...t, params: {} }).client_encoding).toBe("UTF8");
  });

  test("options (-c), DateStyle and TimeZone shape the server session and the reported parameters", async () => {
    const { backend } = await open({
      application_name: "my-app",
      options: "-c search_path=myschema,public -c statement_timeout=1234",
      DateStyle: "SQL, DMY",
      TimeZone: "Asia/Tokyo",
    });
    const out = await query(backend, SETTINGS_SQL);
    const r = firstResult(out);
    expect(r.error).toBeNull();
    const [searchPath, statementTimeout, dateStyle, timeZone, appName, sessionUser, currentUser, today] = r.rows[0]!;
    expect(searchPath!.replace(/\s/g, "")).toBe("myschema,public");
    expect(statementTimeout).toBe("1234ms");
    expect(dateStyle).toBe("SQL, DMY");
    expect(timeZone).toBe("Asia/Tokyo");
    expect(appName).toBe("my-app");
    // The server's user is the database's own tenant role (never Kiln's); the client's `user` was not passed on.
    expect(sessionUser).toBe(tenantRoleName(DB));
    expect(currentUser).toBe(sessionUser);
    expect(today).toMatch(/^\d\d\/\d\d\/\d{4}$/); // DateStyle SQL, DMY: dd/mm/yyyy

    const reported = await backend.parameters();
    expect(reported).toMatchObject({ DateStyle: "SQL, DMY", TimeZone: "Asia/Tokyo", application_name: "my-app" });
    expect(reported.server_version).toMatch(/^\d+/);
  });

  test("forwarded parameters and the access mode's init both hold in a restricted session", async () => {
    const { backend } = await open(
      { options: "-c search_path=myschema,public", TimeZone: "UTC", DateStyle: "ISO, YMD" },
      { kind: "user", userId: "00000000-0000-0000-0000-000000000001", email: "u@example.com" },
    );
    const r = firstResult(await query(backend, `select current_user::text, current_setting('search_path'), auth.uid()::text, current_setting('TimeZone')`));
    expect(r.error).toBeNull();
    expect(r.rows[0]![0]).toBe("authenticated");
    expect(r.rows[0]![1]!.replace(/\s/g, "")).toBe("myschema,public");
    expect(r.rows[0]![2]).toBe("00000000-0000-0000-0000-000000000001");
    expect(r.rows[0]![3]).toBe("UTC");
    expect(await backend.parameters()).toMatchObject({ TimeZone: "UTC", DateStyle: "ISO, YMD" });
  });

  test("a parameter the server does not know fails the open with the server's error and SQLSTATE", async () => {
    const err = await engine.openWire(DB, { kind: "admin" }, wireClient({ no_such_setting: "1" }), { terminate: () => {} }).then(
      () => null,
      (e: unknown) => e as Error & { code?: string },
    );
    expect(err).toBeInstanceOf(Error);
    expect(err!.message).toBe('unrecognized configuration parameter "no_such_setting"');
    expect(err!.code).toBe("42704");

    // A bad value inside `options` too.
    const t: ProxyTarget = {
      host: HOST,
      port: server.port,
      user: new URL(server.url).username,
      password: decodeURIComponent(new URL(server.url).password),
      database: serverDatabaseName(DB),
      applicationName: "",
      params: { options: "-c statement_timeout=soon" },
    };
    await expect(openProxy(t, [])).rejects.toMatchObject({ code: "22023", message: expect.stringContaining("statement_timeout") });
  });

  test("through the wire listener: a client sees the server's refusal as its FATAL error; good parameters apply", async () => {
    const url = `postgres://service_client:${PASSWORD}@${HOST}:${listener.port}/mydb`;
    const bad = postgres(url, { max: 1, onnotice: () => {}, connection: { no_such_setting: "1" } as Record<string, string> });
    try {
      await expect(bad`select 1`).rejects.toMatchObject({
        severity: "FATAL",
        code: "42704",
        message: 'unrecognized configuration parameter "no_such_setting"',
      });
    } finally {
      await bad.end({ timeout: 1 });
    }

    const good = postgres(url, {
      max: 1,
      onnotice: () => {},
      connection: { options: "-c search_path=myschema,public", TimeZone: "Asia/Tokyo" } as Record<string, string>,
    });
    try {
      const [row] = await good`select current_setting('search_path') as sp, current_setting('TimeZone') as tz`;
      expect(row!.sp.replace(/\s/g, "")).toBe("myschema,public");
      expect(row!.tz).toBe("Asia/Tokyo");
      expect(good.parameters.TimeZone).toBe("Asia/Tokyo");
    } finally {
      await good.end({ timeout: 1 });
    }
    expect(listenerErrors).toEqual([]);
  });
});

describe("cancel", () => {
  async function running(appName: string): Promise<void> {
    const deadline = Date.now() + 5_000;
    for (;;) {
      const rows = await admin`select 1 from pg_stat_activity where application_name = ${appName} and state = 'active' and query like '%pg_sleep%'`;
      if (rows.length > 0) return;
      if (Date.now() > deadline) throw new Error("the query never started");
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  test("cancel() during pg_sleep: the server answers 57014 at once and the session stays usable", async () => {
    const { backend, terminated } = await open({ application_name: "cancel-me" });
    expect(backend.cancel).toBeTypeOf("function");
    const t0 = Date.now();
    const pending = query(backend, "select pg_sleep(10)", 8_000);
    await running("cancel-me");
    backend.cancel!();
    const out = await pending;
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(errors(out)).toEqual([expect.objectContaining({ S: "ERROR", C: "57014", M: "canceling statement due to user request" })]);

    const after = firstResult(await query(backend, "select 41 + 1"));
    expect(after).toMatchObject({ error: null, rows: [["42"]] });
    expect(terminated).toEqual([]);
  });

  test("cancel() with nothing running, or after the session ended, does nothing and never throws", async () => {
    const { backend } = await open({});
    backend.cancel!();
    await new Promise((r) => setTimeout(r, 100));
    expect(firstResult(await query(backend, "select 1")).rows).toEqual([["1"]]);
    await backend.close();
    expect(() => backend.cancel!()).not.toThrow();
  });

  test("through the wire listener: a client's CancelRequest cancels its query on the server", async () => {
    const sql = postgres(`postgres://service_client:${PASSWORD}@${HOST}:${listener.port}/mydb`, {
      max: 1,
      onnotice: () => {},
      connection: { application_name: "cancel-e2e" },
    });
    try {
      const t0 = Date.now();
      const q = sql`select pg_sleep(10)`.execute();
      await running("cancel-e2e");
      q.cancel();
      await expect(q).rejects.toMatchObject({ code: "57014" });
      expect(Date.now() - t0).toBeLessThan(3_000);
      const [row] = await sql`select 1 as one`;
      expect(row!.one).toBe(1);
    } finally {
      await sql.end({ timeout: 1 });
    }
  });
});
