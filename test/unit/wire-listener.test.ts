import { spawn } from "node:child_process";
import { connect, type Socket } from "node:net";
import type { PGlite } from "@electric-sql/pglite";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startWireListener, type WireClient, type WireListener, type WireRouter } from "../../server/backends/databases/wire/listener";
import { PgliteSessionMux } from "../../server/backends/databases/wire/pglite-mux";
import { MessageBuilder, readInt32 } from "../../server/backends/databases/wire/protocol";
import { InProcessSession } from "../../server/backends/databases/pglite-thread";
import { runOverProtocol } from "../../server/backends/databases/protocol-query";
import { freshPglite } from "../support/pglite";

// A real PGlite behind a real listener, spoken to by the `postgres` client and by psql.

const USER = "service_client_abc";
const ANON = "anon_client_abc"; // same database; its init drops to role r1 and sets a JWT claim
const PASSWORD = "s3cret-Pa55word";
const HOST = "127.0.0.1";

let db: PGlite;
let mux: PgliteSessionMux;
let listener: WireListener;
const opened: WireClient[] = [];
const listenerErrors: unknown[] = [];
const clients: postgres.Sql[] = [];

const router: WireRouter = {
  async credentials(user, database) {
    if (database !== "mydb") return null;
    if (user === USER) return { target: "mydb/service", password: PASSWORD };
    if (user === ANON) return { target: "mydb/anon", password: PASSWORD };
    return null;
  },
  async open(target, client, control) {
    opened.push(client);
    const init = target === "mydb/anon" ? ["SET ROLE r1", "select set_config('request.jwt.claim.sub', 'user-1', false)"] : [];
    return mux.open(init, client, control);
  },
};

const url = (user = USER, password = PASSWORD, database = "mydb") =>
  `postgres://${user}:${encodeURIComponent(password)}@${HOST}:${listener.port}/${database}`;

function client(opts: postgres.Options<{}> = {}, user = USER, password = PASSWORD, database = "mydb"): postgres.Sql {
  const sql = postgres(url(user, password, database), { max: 1, onnotice: () => {}, ...opts });
  clients.push(sql);
  return sql;
}

function psql(args: string[], opts: { user?: string; password?: string; input?: string; env?: Record<string, string> } = {}) {
  const argv = ["-h", HOST, "-p", String(listener.port), "-U", opts.user ?? USER, "-d", "mydb", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", ...args];
  const env = { ...process.env, PGPASSWORD: opts.password ?? PASSWORD, PGCONNECT_TIMEOUT: "10", ...opts.env };
  return new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    const p = spawn("/usr/bin/psql", argv, { env });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    p.on("close", (code) => resolve({ code: code ?? -1, stdout, stderr }));
    p.stdin.end(opts.input ?? "");
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A promise plus whether it has settled yet. */
function watch<T>(p: Promise<T>): { promise: Promise<T>; settled: () => boolean } {
  let done = false;
  const promise = p.finally(() => (done = true));
  promise.catch(() => {});
  return { promise, settled: () => done };
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(10);
  }
}

beforeAll(async () => {
  db = await freshPglite();
  await db.exec(`
    create role r1;
    create schema elsewhere;
    create table elsewhere.marker (x text); insert into elsewhere.marker values ('elsewhere');
    create table public.marker (x text); insert into public.marker values ('public');
    grant usage on schema elsewhere to r1;
    grant select on all tables in schema public, elsewhere to r1;
  `);
  mux = new PgliteSessionMux(new InProcessSession(db));
  listener = await startWireListener({ host: HOST, port: 0, router, onError: (e) => listenerErrors.push(e) });
}, 60_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.end({ timeout: 1 }).catch(() => {})));
  await listener?.close();
  await mux?.closeAll("test over");
  await db?.close();
});

describe("authentication", () => {
  test("offers SCRAM-SHA-256 (and nothing else) after refusing TLS", async () => {
    const socket = connect(listener.port, HOST);
    const got = collect(socket);
    await new Promise((r) => socket.once("connect", r));
    socket.write(new MessageBuilder().int32(80877103).build(null)); // SSLRequest
    await until(() => got.bytes().length >= 1);
    expect(String.fromCharCode(got.bytes()[0]!)).toBe("N");
    socket.write(
      new MessageBuilder().int32(196608).cstring("user").cstring(USER).cstring("database").cstring("mydb").byte(0).build(null),
    );
    await until(() => got.bytes().length >= 1 + 9);
    const auth = got.bytes().subarray(1);
    expect(String.fromCharCode(auth[0]!)).toBe("R");
    expect(readInt32(auth, 5)).toBe(10); // AuthenticationSASL
    expect(Buffer.from(auth.subarray(9, 1 + readInt32(auth, 1))).toString()).toBe("SCRAM-SHA-256\0\0");
    socket.destroy();
  });

  test("wrong password, unknown role and unknown database all fail as 28P01", async () => {
    const attempts = [
      { user: USER, password: "wrong", database: "mydb" },
      { user: "nobody", password: PASSWORD, database: "mydb" },
      { user: USER, password: PASSWORD, database: "otherdb" },
    ];
    for (const a of attempts) {
      const sql = client({}, a.user, a.password, a.database);
      await expect(sql`select 1`).rejects.toMatchObject({
        code: "28P01",
        message: `password authentication failed for user "${a.user}"`,
      });
    }
    const bad = await psql(["-c", "select 1"], { password: "wrong" });
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain(`password authentication failed for user "${USER}"`);
  });

  test("the right password works for the postgres client (which checks the server's SCRAM signature) and psql", async () => {
    const sql = client();
    expect(await sql`select current_user as u, current_database() as d`).toEqual([{ u: "postgres", d: "postgres" }]);
    const ok = await psql(["-c", "select 'psql ok'"]);
    expect(ok).toMatchObject({ code: 0, stdout: "psql ok\n" });
    const last = opened.at(-1)!;
    expect(last).toMatchObject({ user: USER, database: "mydb", applicationName: "psql", remoteAddress: HOST });
  });
});

describe("misbehaving connections", () => {
  /** Sends `bytes`, optionally half-closes, and resolves with all the server sent once it closes. */
  function exchange(bytes: Uint8Array, halfClose = false): Promise<Buffer> {
    return new Promise((resolve) => {
      const socket = connect(listener.port, HOST, () => {
        socket.write(bytes);
        if (halfClose) socket.end();
      });
      const got = collect(socket);
      socket.on("error", () => {});
      socket.on("close", () => resolve(Buffer.from(got.bytes())));
    });
  }
  const startup = (length: number) => {
    const m = new MessageBuilder().int32(196608).cstring("user").cstring(USER).byte(0).build(null);
    m.set([length >>> 24, (length >>> 16) & 255, (length >>> 8) & 255, length & 255]);
    return m;
  };

  test("garbage, an oversized startup packet, a cancel request and a half-closed handshake are turned away", async () => {
    const http = (await exchange(Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))).toString();
    expect(http).toContain("08P01");
    expect(http).toContain("invalid message length");
    expect((await exchange(startup(1_000_000))).toString()).toContain("invalid message length 1000000");
    const v4 = new MessageBuilder().int32(4 << 16).cstring("user").cstring(USER).byte(0).build(null);
    expect((await exchange(v4)).toString()).toContain("unsupported frontend protocol 4.0");
    expect((await exchange(new MessageBuilder().int32(80877102).int32(1).int32(2).build(null))).length).toBe(0);
    const halfClosed = await exchange(startup(new MessageBuilder().int32(196608).cstring("user").cstring(USER).byte(0).build(null).length), true);
    expect(halfClosed[0]).toBe("R".charCodeAt(0)); // it got as far as the SASL offer, then the client left
    expect(await client()`select 'still serving' as s`).toEqual([{ s: "still serving" }]);
    expect(listenerErrors).toEqual([]);
  });
});

describe("queries", () => {
  test("DDL and DML round trip with the postgres client and psql -c", async () => {
    const sql = client();
    await sql`create table items (id serial primary key, name text not null, n int)`;
    const [a] = await sql`insert into items (name, n) values (${"alpha"}, ${1}) returning id`;
    await sql`update items set n = n + 41 where id = ${a!.id}`;
    const viaPsql = await psql(["-c", "insert into items (name, n) values ('from psql', 7) returning name"]);
    expect(viaPsql).toMatchObject({ code: 0, stdout: "from psql\n" });
    expect(await sql`select name, n from items order by id`).toEqual([
      { name: "alpha", n: 42 },
      { name: "from psql", n: 7 },
    ]);
    await sql`delete from items where name = ${"alpha"}`;
    expect((await psql(["-c", "select count(*) from items"])).stdout).toBe("1\n");
  });

  test("a multi-statement psql session with a transaction", async () => {
    const r = await psql([], {
      input: `
        create table notes (id int primary key, body text);
        begin;
        insert into notes values (1, 'one'), (2, 'two');
        update notes set body = 'uno' where id = 1;
        commit;
        begin;
        insert into notes values (3, 'three');
        rollback;
        select id || ':' || body from notes order by id;
        show application_name;
      `,
    });
    expect(r).toMatchObject({ code: 0, stdout: "1:uno\n2:two\npsql\n" });
  });

  test("COPY FROM STDIN (psql \\copy), also inside a transaction, and COPY TO STDOUT", async () => {
    await client()`create table copied (a int, b text)`;
    const plain = await psql(["-c", "\\copy copied from stdin", "-c", "select count(*) from copied"], { input: "1\tone\n2\ttwo\n" });
    expect(plain).toMatchObject({ code: 0, stdout: "2\n" });
    const inTx = await psql([], {
      input: "begin;\nselect 'in tx';\ncopy copied from stdin;\n3\tthree\n\\.\nselect count(*) from copied;\ncommit;\ncopy (select a, b from copied order by a) to stdout;\n",
    });
    expect(inTx).toMatchObject({ code: 0, stdout: "in tx\n3\n1\tone\n2\ttwo\n3\tthree\n" });
    const bad = await psql(["-c", "\\copy copied from stdin"], { input: "not-a-number\tx\n" });
    expect(bad.stderr).toContain("invalid input syntax for type integer");
    expect((await psql(["-c", "select count(*) from copied"])).stdout).toBe("3\n");
  });

  test("a pool of 10 runs 200 concurrent queries correctly", async () => {
    const sql = client({ max: 10 });
    await sql`create table hits (n int)`;
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        i % 2 ? sql`select ${i}::int * 2 as v, pg_sleep(0)` : sql`insert into hits values (${i}) returning n as v`,
      ),
    );
    results.forEach((rows, i) => expect(rows[0]!.v).toBe(i % 2 ? i * 2 : i));
    expect(await sql`select count(*)::int as c, sum(n)::int as s from hits`).toEqual([{ c: 100, s: 9900 }]);
    expect(mux.stats().clients).toBeGreaterThanOrEqual(10);
  });
});

describe("transactions", () => {
  test("a client's transaction blocks another client until it commits", async () => {
    const a = client();
    const b = client();
    await a`create table acct (id int primary key, v int)`;
    await a`insert into acct values (1, 1)`;
    let open!: () => void;
    let finish!: () => void;
    const inTx = new Promise<void>((r) => (open = r));
    const gate = new Promise<void>((r) => (finish = r));
    const aDone = a.begin(async (tx) => {
      await tx`update acct set v = v * 10 where id = 1`;
      open();
      await gate;
    });
    await inTx;
    const bUpdate = watch(b`update acct set v = v + 1 where id = 1 returning v`);
    await sleep(200);
    expect(bUpdate.settled()).toBe(false);
    expect(mux.stats().inTransaction).toBe(true);
    finish();
    await aDone;
    // A's *10 came first, then B's +1; the other order would give 20.
    expect((await bUpdate.promise)[0]!.v).toBe(11);
  });

  test("a client whose socket is destroyed mid-transaction is rolled back; the waiting client proceeds", async () => {
    const b = client();
    await b`create table victims (id int primary key, note text)`;
    await b`insert into victims values (0, 'start')`;
    let socket!: Socket;
    // `socket` (a custom, already connected socket) is in postgres' README but not in its types.
    const dying = client({
      socket: () =>
        new Promise<Socket>((resolve) => {
          const s = connect(listener.port, HOST, () => resolve(s));
          socket = s;
        }),
    } as postgres.Options<{}>);
    let open!: () => void;
    const inTx = new Promise<void>((r) => (open = r));
    const died = dying
      .begin(async (tx) => {
        await tx`insert into victims values (1, 'never committed')`;
        await tx`update victims set note = 'dying' where id = 0`;
        open();
        await new Promise(() => {}); // never commits
      })
      .catch((e) => e);
    await inTx;
    const waiting = watch(b`update victims set note = note || '+b' where id = 0 returning note`);
    await sleep(100);
    expect(waiting.settled()).toBe(false);
    socket.destroy();
    expect((await waiting.promise)[0]!.note).toBe("start+b");
    expect(await b`select id from victims order by id`).toEqual([{ id: 0 }]);
    expect(await died).toBeInstanceOf(Error);
  });

  test("a psql killed mid-transaction is rolled back", async () => {
    const b = client();
    await b`create table killed (id int)`;
    const p = spawn("/usr/bin/psql", ["-h", HOST, "-p", String(listener.port), "-U", USER, "-d", "mydb", "-X", "-A", "-t"], {
      env: { ...process.env, PGPASSWORD: PASSWORD },
    });
    let out = "";
    p.stdout.on("data", (d) => (out += d));
    p.stdin.write("begin;\ninsert into killed values (1);\nselect 'ready';\n");
    await until(() => out.includes("ready"));
    const waiting = watch(b`insert into killed values (2) returning id`);
    await sleep(100);
    expect(waiting.settled()).toBe(false);
    p.kill("SIGKILL");
    await waiting.promise;
    expect(await b`select id from killed`).toEqual([{ id: 2 }]);
  });

  test("exclusive() waits for a client's transaction and gets a reset session", async () => {
    const anon = client({}, ANON);
    await anon`set search_path = elsewhere, public`;
    let open!: () => void;
    let finish!: () => void;
    const inTx = new Promise<void>((r) => (open = r));
    const gate = new Promise<void>((r) => (finish = r));
    const held = anon.begin(async (tx) => {
      await tx`select set_config('app.flag', 'in-tx', false)`;
      open();
      await gate;
    });
    await inTx;
    const ex = watch(
      mux.exclusive(async (pg) => {
        const r = await runOverProtocol(
          pg,
          [],
          "select current_user as u, current_setting('search_path') as sp, nullif(current_setting('request.jwt.claim.sub', true), '') as sub, nullif(current_setting('app.flag', true), '') as flag",
          [],
        );
        return r.rows[0];
      }),
    );
    await sleep(150);
    expect(ex.settled()).toBe(false);
    finish();
    await held;
    expect(await ex.promise).toEqual({ u: "postgres", sp: "public", sub: null, flag: null });
    // And the client gets its own session back afterwards.
    expect(await anon`select current_user as u, current_setting('search_path') as sp, current_setting('app.flag') as flag, x from marker`).toEqual([
      { u: "r1", sp: "elsewhere, public", flag: "in-tx", x: "elsewhere" },
    ]);
  });
});

describe("session isolation", () => {
  test("SET search_path / statement_timeout / application_name / custom settings stay with their client", async () => {
    const a = client({ connection: { application_name: "worker-a" } });
    const b = client();
    expect(await a`show application_name`).toEqual([{ application_name: "worker-a" }]);
    await a`set search_path = elsewhere, public`;
    await a`set statement_timeout = '5s'`;
    await a`select set_config('app.tenant', 'tenant-a', false)`;
    const settingsOf = (sql: postgres.Sql) =>
      sql`select current_setting('search_path') as sp, current_setting('statement_timeout') as st,
                 current_setting('application_name') as an, nullif(current_setting('app.tenant', true), '') as tenant, x from marker`;
    let expected = { sp: "elsewhere, public", st: "5s", an: "worker-a", tenant: "tenant-a", x: "elsewhere" };
    for (let round = 0; round < 3; round++) {
      expect(await settingsOf(b)).toEqual([{ sp: "public", st: "0", an: "postgres.js", tenant: null, x: "public" }]);
      expect(await settingsOf(a)).toEqual([expected]);
      if (round === 1) {
        await a`set application_name = 'renamed-a'`;
        await a`reset statement_timeout`;
        expected = { ...expected, an: "renamed-a", st: "0" };
      }
    }
    // Transaction-local settings end with the transaction, as they would on a real server.
    await a.begin((tx) => tx`select set_config('app.tenant', 'local', true)`);
    expect((await settingsOf(a))[0]!.tenant).toBe("tenant-a");
    const viaPsql = await psql(["-c", "select current_setting('search_path') || ' ' || current_setting('application_name')"], {
      env: { PGOPTIONS: "-c search_path=elsewhere,public" },
    });
    expect(viaPsql.stdout).toBe("elsewhere,public psql\n");
  });

  test("init statements apply per client, interleaved, also across pools", async () => {
    const anon = client({}, ANON);
    const service = client();
    const who = (sql: postgres.Sql) => sql`select current_user as u, nullif(current_setting('request.jwt.claim.sub', true), '') as sub`;
    for (let i = 0; i < 4; i++) {
      expect(await who(anon)).toEqual([{ u: "r1", sub: "user-1" }]);
      expect(await who(service)).toEqual([{ u: "postgres", sub: null }]);
    }
    const anonPool = client({ max: 3 }, ANON);
    const servicePool = client({ max: 3 });
    const all = await Promise.all(Array.from({ length: 60 }, (_, i) => (i % 2 ? who(anonPool) : who(servicePool)).then((r) => [i, r[0]] as const)));
    for (const [i, row] of all) expect(row).toEqual(i % 2 ? { u: "r1", sub: "user-1" } : { u: "postgres", sub: null });
  });

  test("a client's named prepared statements are its own and are deallocated when it leaves", async () => {
    const names = () => mux.exclusive(async (pg) => (await runOverProtocol(pg, [], "select name from pg_prepared_statements", [])).rows.map((r) => r.name as string));
    const others = new Set(await names());
    const a = client();
    const b = client();
    for (let i = 0; i < 3; i++) {
      expect(await a.unsafe("select $1::int + 1 as v", [i], { prepare: true })).toEqual([{ v: i + 1 }]);
      expect(await b.unsafe("select $1::int + 100 as v", [i], { prepare: true })).toEqual([{ v: i + 100 }]);
    }
    const theirs = (await names()).filter((n) => !others.has(n));
    expect(theirs.length).toBeGreaterThanOrEqual(2);
    expect(new Set(theirs.map((n) => /^c(\d+)_/.exec(n)?.[1])).size).toBe(2); // renamed per client
    const count = mux.stats().clients;
    await a.end();
    await b.end();
    await until(() => mux.stats().clients === count - 2);
    expect((await names()).filter((n) => theirs.includes(n))).toEqual([]);
  });
});

describe("listener lifecycle", () => {
  test("no internal errors were reported along the way", () => {
    expect(listenerErrors).toEqual([]);
  });

  test("close() ends its connections and closes their backends", async () => {
    const other = await startWireListener({ host: HOST, port: 0, router });
    const sql = postgres(`postgres://${USER}:${PASSWORD}@${HOST}:${other.port}/mydb`, { max: 1 });
    await sql`select 1`;
    const count = mux.stats().clients;
    await other.close();
    expect(mux.stats().clients).toBe(count - 1);
    await expect(sql`select 1`).rejects.toThrow();
    await sql.end({ timeout: 1 });
  });
});

function collect(socket: Socket): { bytes: () => Uint8Array } {
  const chunks: Buffer[] = [];
  socket.on("data", (d: Buffer) => chunks.push(d));
  return { bytes: () => Buffer.concat(chunks) };
}
