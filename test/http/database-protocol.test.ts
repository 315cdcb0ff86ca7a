// PostgreSQL as its clients know it, on both engines (the same file runs in the `embedded` and the
// `postgres` vitest projects): LISTEN/NOTIFY between connections (node-postgres, postgres.js's
// sql.listen, psycopg 3), COPY messages, Flush and Sync outside the state that expects them, startup
// parameters as PostgreSQL reads them, and the drivers users bring (asyncpg, postgres.js COPY in and
// out, node-postgres with pg-copy-streams, psycopg 3, SQLAlchemy). Every test asserts the data.
import { newDatabase } from "../support/databases";
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import pg from "pg";
import { from as copyFrom, to as copyTo } from "pg-copy-streams";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createProject, eventually, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln();
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of closers.reverse()) await c().catch(() => {});
});

/** Debian's Python, where python3-psycopg, python3-asyncpg and python3-sqlalchemy install (test/support/system-deps.sh). */
const PYTHON = "/usr/bin/python3";

/** A new active database in a project of its own; its connection string. */
const database = newDatabase;

const cs = { notify: "", copy: "", drivers: "" };
beforeAll(async () => {
  for (const name of Object.keys(cs) as (keyof typeof cs)[]) cs[name] = await database(k, name);
}, 120_000);

type Note = { channel: string; payload: string; processId: number };

async function pgClient(url: string) {
  const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 });
  const notes: Note[] = [];
  c.on("notification", (n) => notes.push({ channel: n.channel, payload: n.payload ?? "", processId: n.processId }));
  c.on("error", () => {});
  await c.connect();
  closers.push(() => c.end());
  return Object.assign(c, { notes, pid: (c as unknown as { processID: number }).processID });
}

function sqlClient(url: string, opts: postgres.Options<{}> = {}) {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10, ...opts });
  closers.push(() => c.end({ timeout: 1 }));
  return c;
}

/** Resolves with `p`, or rejects after `ms`: a client held up behind another fails the test instead of hanging it. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, fail) => (timer = setTimeout(() => fail(new Error(`${what}: no answer within ${ms} ms`)), ms))),
  ]);
}

/** Waits until `c` has `n` notifications (they arrive asynchronously). */
const received = (c: { notes: Note[] }, n: number) => eventually(async () => c.notes.length, (len) => len >= n, 10_000);

function python(script: string, url: string, timeoutMs = 60_000): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(PYTHON, ["-c", script], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, DATABASE_URL: url } });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (err += d));
    const timer = setTimeout(() => {
      err += `\n[killed after ${timeoutMs} ms]`;
      p.kill("SIGKILL");
    }, timeoutMs);
    p.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out, err });
    });
  });
}

// ---------------------------------------------------------------------------------------------------
describe("LISTEN/NOTIFY between connections", () => {
  test("node-postgres: a listener gets NOTIFY and pg_notify of another connection, after commit, in commit order, with the sender's process id; the sender (not listening) gets nothing", async () => {
    const a = await pgClient(cs.notify);
    const b = await pgClient(cs.notify);
    const c = await pgClient(cs.notify);
    await a.query("LISTEN chan1");
    await b.query("NOTIFY chan1, 'one'");
    await b.query("SELECT pg_notify('chan1', 'two')");
    await received(a, 2);
    // A rolled back transaction sends nothing; a committed one sends at commit, in order.
    await b.query("BEGIN");
    await b.query("NOTIFY chan1, 'rolled back'");
    await b.query("ROLLBACK");
    await b.query("BEGIN");
    await b.query("NOTIFY chan1, 'three'");
    await b.query("NOTIFY chan1, 'four'");
    await b.query("COMMIT");
    await c.query("NOTIFY chan1, 'five'");
    await b.query("NOTIFY chan1, 'six'");
    await received(a, 6);
    expect(a.notes.map((n) => n.payload)).toEqual(["one", "two", "three", "four", "five", "six"]);
    expect(a.notes.every((n) => n.channel === "chan1")).toBe(true);
    // The sender's process id, as its BackendKeyData announced it (the production proxy rewrites the server's).
    const pids = a.notes.map((n) => n.processId);
    expect(pids).toEqual([b.pid, b.pid, b.pid, b.pid, c.pid, b.pid]);
    await a.query("SELECT 1");
    await b.query("SELECT 1");
    await c.query("SELECT 1");
    expect(b.notes).toEqual([]);
    expect(c.notes).toEqual([]);
    expect(a.notes).toHaveLength(6);
  });

  test("node-postgres: a sender that listens gets its own; LISTEN in a transaction counts from its commit, a rolled back one never; multi-statement LISTEN; quoted channel names", async () => {
    const a = await pgClient(cs.notify);
    const b = await pgClient(cs.notify);
    await a.query('LISTEN self; LISTEN "Mixed Case"');
    await a.query("NOTIFY self, 'mine'");
    await b.query(`NOTIFY "Mixed Case", 'quoted'`);
    await received(a, 2);
    expect(a.notes.map((n) => [n.channel, n.payload])).toEqual([
      ["self", "mine"],
      ["Mixed Case", "quoted"],
    ]);
    // b: LISTEN rolled back, LISTEN committed (in a transaction with a NOTIFY of its own: delivered at that commit).
    await b.query("BEGIN");
    await b.query("LISTEN never");
    await b.query("ROLLBACK");
    await b.query("BEGIN");
    await b.query("LISTEN later");
    await b.query("NOTIFY later, 'same transaction'");
    await b.query("COMMIT");
    await a.query("NOTIFY never, 'x'; NOTIFY later, 'from a'");
    await received(b, 2);
    expect(b.notes.map((n) => [n.channel, n.payload])).toEqual([
      ["later", "same transaction"],
      ["later", "from a"],
    ]);
    // A simple query whose statement fails after LISTEN: the whole implicit transaction rolls back.
    await expect(b.query("LISTEN failed; SELECT 1/0")).rejects.toThrow(/division by zero/);
    await a.query("NOTIFY failed, 'x'; NOTIFY later, 'sentinel'");
    await received(b, 3);
    expect(b.notes.map((n) => n.payload)).toEqual(["same transaction", "from a", "sentinel"]);
  });

  test("UNLISTEN, UNLISTEN * and disconnect stop delivery to that client only; the others listening on the channel still get it", async () => {
    const a = await pgClient(cs.notify);
    const d = await pgClient(cs.notify);
    const e = await pgClient(cs.notify);
    const sender = await pgClient(cs.notify);
    await a.query("LISTEN shared; LISTEN sentinel");
    await d.query("LISTEN shared");
    await e.query("LISTEN shared");
    await sender.query("NOTIFY shared, '1'");
    await Promise.all([received(a, 1), received(d, 1), received(e, 1)]);
    await a.query("UNLISTEN shared");
    await sender.query("NOTIFY shared, '2'; NOTIFY sentinel, 's2'");
    await Promise.all([received(a, 2), received(d, 2), received(e, 2)]);
    expect(a.notes.map((n) => n.payload)).toEqual(["1", "s2"]);
    await d.query("UNLISTEN *");
    await d.query("LISTEN sentinel");
    await e.end();
    await sender.query("NOTIFY shared, '3'; NOTIFY sentinel, 's3'");
    await Promise.all([received(a, 3), received(d, 3)]);
    expect(a.notes.map((n) => n.payload)).toEqual(["1", "s2", "s3"]);
    expect(d.notes.map((n) => n.payload)).toEqual(["1", "2", "s3"]);
    expect(e.notes.map((n) => n.payload)).toEqual(["1", "2"]);
    // A new listener after all that gets the channel again.
    const f = await pgClient(cs.notify);
    await f.query("LISTEN shared");
    await sender.query("NOTIFY shared, '4'");
    await received(f, 1);
    expect(f.notes.map((n) => n.payload)).toEqual(["4"]);
  });

  test("payloads up to the server's limit (7999 bytes) arrive whole; 8000 bytes is refused (22023)", async () => {
    const a = await pgClient(cs.notify);
    const b = await pgClient(cs.notify);
    await a.query("LISTEN big");
    const payload = Array.from({ length: 7999 }, (_, i) => String.fromCharCode(97 + (i % 26))).join("");
    await b.query("SELECT pg_notify('big', $1)", [payload]);
    await received(a, 1);
    expect(a.notes[0]!.payload).toBe(payload);
    await expect(b.query("SELECT pg_notify('big', $1)", ["x".repeat(8000)])).rejects.toMatchObject({ code: "22023" });
  });

  test("a listener in a transaction gets the notifications once its transaction ends, not before", async () => {
    const a = await pgClient(cs.notify);
    const b = await pgClient(cs.notify);
    await a.query("LISTEN held");
    await a.query("BEGIN");
    await a.query("SELECT 1");
    // On the embedded engine b's NOTIFY waits for a's transaction; on PostgreSQL it commits now.
    const sent = b.query("NOTIFY held, 'h'");
    await a.query("SELECT 2");
    expect(a.notes).toEqual([]);
    await a.query("COMMIT");
    await sent;
    await received(a, 1);
    expect(a.notes.map((n) => n.payload)).toEqual(["h"]);
  });

  test("postgres.js sql.listen: gets notifications from sql.notify and another client; unlisten stops them", async () => {
    const sql = sqlClient(cs.notify);
    const other = sqlClient(cs.notify);
    const got: string[] = [];
    const l = await sql.listen("pjs", (x) => got.push(x));
    await other.notify("pjs", "first");
    await sql.notify("pjs", "second");
    await other`select pg_notify('pjs', 'third')`;
    await eventually(async () => got.length, (n) => n >= 3, 10_000);
    expect(got).toEqual(["first", "second", "third"]);
    const got2: string[] = [];
    await sql.listen("pjs-sentinel", (x) => got2.push(x));
    await l.unlisten();
    await other.notify("pjs", "after unlisten");
    await other.notify("pjs-sentinel", "s");
    await eventually(async () => got2.length, (n) => n >= 1, 10_000);
    expect(got).toEqual(["first", "second", "third"]);
  });

  test("psycopg 3: LISTEN on one connection, NOTIFY (autocommit and in a committed or rolled back transaction) on another", async () => {
    const r = await python(
      String.raw`
import json, os, psycopg
url = os.environ["DATABASE_URL"]
listener = psycopg.connect(url, autocommit=True)
sender = psycopg.connect(url, autocommit=True)
own = []
sender.add_notify_handler(lambda n: own.append(n.payload))
listener.execute("LISTEN psy")
sender.execute("NOTIFY psy, 'a'")
with sender.transaction():
    sender.execute("SELECT pg_notify('psy', 'rolled back')")
    raise psycopg.Rollback()
with sender.transaction():
    sender.execute("SELECT pg_notify('psy', %s)", ["b"])
sender.execute("NOTIFY psy, 'c'")
got = []
for n in listener.notifies():
    got.append([n.channel, n.payload, n.pid])
    if len(got) == 3:
        break
sender.execute("SELECT 1")
print(json.dumps({"got": got, "own": own, "sender": sender.info.backend_pid}))
`,
      cs.notify,
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    const out = JSON.parse(r.out) as { got: [string, string, number][]; own: string[]; sender: number };
    expect(out.got.map(([c, p]) => [c, p])).toEqual([
      ["psy", "a"],
      ["psy", "b"],
      ["psy", "c"],
    ]);
    expect(new Set(out.got.map(([, , pid]) => pid)).size).toBe(1);
    expect(out.got[0]![2]).toBe(out.sender);
    expect(out.own).toEqual([]);
  });
});

// ---------------------------------------------------------------------------------------------------
describe("protocol messages outside the state that expects them", () => {
  /** Writes raw frontend messages on a connected pg client's socket. */
  function raw(c: pg.Client, ...messages: Buffer[]): void {
    (c as unknown as { connection: { stream: { write(b: Buffer): void } } }).connection.stream.write(Buffer.concat(messages));
  }
  const message = (type: string, body = Buffer.alloc(0)) => {
    const head = Buffer.alloc(5);
    head.write(type, 0, "latin1");
    head.writeInt32BE(4 + body.length, 1);
    return Buffer.concat([head, body]);
  };

  test("CopyFail, CopyDone, CopyData and Flush from an idle client are ignored (no held session: another client runs at once); a lone Sync is answered ReadyForQuery", async () => {
    const x = await pgClient(cs.copy);
    const y = await pgClient(cs.copy);
    const answers: Buffer[] = [];
    (x as unknown as { connection: { stream: NodeJS.EventEmitter } }).connection.stream.on("data", (d: Buffer) => answers.push(d));
    raw(x, message("f", Buffer.from("stray copy fail\0")));
    expect((await within(y.query("SELECT 1 AS n"), 10_000, "a query after another client's stray CopyFail")).rows).toEqual([{ n: 1 }]);
    raw(x, message("c"), message("d", Buffer.from("1\n")));
    expect((await within(y.query("SELECT 2 AS n"), 10_000, "a query after stray CopyDone/CopyData")).rows).toEqual([{ n: 2 }]);
    raw(x, message("H"));
    expect((await within(y.query("SELECT 3 AS n"), 10_000, "a query after a lone Flush")).rows).toEqual([{ n: 3 }]);
    expect(Buffer.concat(answers).length).toBe(0);
    raw(x, message("S"));
    await eventually(async () => Buffer.concat(answers), (b) => b.length >= 6, 10_000);
    expect([...Buffer.concat(answers)]).toEqual([0x5a, 0, 0, 0, 5, 0x49]); // ReadyForQuery 'I', nothing else
    expect((await x.query("SELECT 4 AS n")).rows).toEqual([{ n: 4 }]);
  });

  test("postgres.js COPY FROM STDIN (writable) and COPY TO STDOUT (readable): the rows arrive, and another client is not held up after it", async () => {
    const sql = sqlClient(cs.copy);
    const other = sqlClient(cs.copy);
    await sql`drop table if exists pjs_copy`;
    await sql`create table pjs_copy (id int primary key, name text)`;
    const w = await sql`copy pjs_copy (id, name) from stdin`.writable();
    await pipeline(Readable.from(Array.from({ length: 500 }, (_, i) => `${i}\tname ${i}\n`)), w);
    // postgres.js sends a CopyFail after the copy ended: the session must not stay with it.
    const [{ n }] = await within(other`select count(*)::int as n from pjs_copy`, 10_000, "another client's query after a postgres.js COPY");
    expect(n).toBe(500);
    const chunks: Buffer[] = [];
    const r = await sql`copy (select id, name from pjs_copy where id < 3 order by id) to stdout`.readable();
    await pipeline(r, new Writable({ write: (c, _e, cb) => (chunks.push(c), cb()) }));
    expect(Buffer.concat(chunks).toString()).toBe("0\tname 0\n1\tname 1\n2\tname 2\n");
    const [{ m }] = await within(other`select count(*)::int as m from pjs_copy where name like 'name %'`, 10_000, "a query after COPY TO");
    expect(m).toBe(500);
  });

  test("node-postgres with pg-copy-streams: COPY FROM STDIN in CSV and COPY TO STDOUT", async () => {
    const c = await pgClient(cs.copy);
    const other = await pgClient(cs.copy);
    await c.query("DROP TABLE IF EXISTS pcs; CREATE TABLE pcs (id int, note text)");
    const stream = c.query(copyFrom("COPY pcs FROM STDIN (FORMAT csv)"));
    await pipeline(Readable.from(Array.from({ length: 300 }, (_, i) => `${i},"note, ${i}"\n`)), stream);
    expect((await within(other.query("SELECT count(*)::int AS n, sum(id)::int AS s FROM pcs"), 10_000, "a query after pg-copy-streams")).rows).toEqual([
      { n: 300, s: (299 * 300) / 2 },
    ]);
    const out: Buffer[] = [];
    await pipeline(
      c.query(copyTo("COPY (SELECT * FROM pcs WHERE id IN (0, 299) ORDER BY id) TO STDOUT (FORMAT csv)")),
      new Writable({ write: (chunk, _e, cb) => (out.push(chunk), cb()) }),
    );
    expect(Buffer.concat(out).toString()).toBe('0,"note, 0"\n299,"note, 299"\n');
  });
});

// ---------------------------------------------------------------------------------------------------
describe("drivers and startup parameters", () => {
  test("asyncpg (client_encoding='utf-8' with the quotes, server_settings): connects, writes and reads rows, prepared statements, a transaction, copy_records_to_table", async () => {
    const r = await python(
      String.raw`
import asyncio, json, os, asyncpg
async def main():
    url = os.environ["DATABASE_URL"]
    c = await asyncpg.connect(url, server_settings={"application_name": "apg", "search_path": "apg_schema, public", "DateStyle": "ISO, DMY"})
    await c.execute("CREATE SCHEMA IF NOT EXISTS apg_schema; DROP TABLE IF EXISTS apg_schema.t; CREATE TABLE apg_schema.t (id int primary key, name text, at date)")
    stmt = await c.prepare("INSERT INTO t (id, name, at) VALUES ($1, $2, $3)")
    import datetime
    for i in range(5):
        await stmt.fetch(i, f"n{i} é", datetime.date(2024, 1, i + 1))
    async with c.transaction():
        await c.execute("INSERT INTO t VALUES (100, 'in tx', '2024-02-01')")
    try:
        async with c.transaction():
            await c.execute("INSERT INTO t VALUES (200, 'rolled back', '2024-02-01')")
            raise RuntimeError("undo")
    except RuntimeError:
        pass
    await c.copy_records_to_table("t", records=[(300 + i, f"copied {i}", datetime.date(2024, 3, 1)) for i in range(50)], columns=["id", "name", "at"])
    rows = await c.fetch("SELECT id, name, at::text AS at FROM t WHERE id < 3 OR id IN (100, 200, 349) ORDER BY id")
    settings = await c.fetchrow("SELECT current_setting('application_name') a, current_setting('search_path') s, current_setting('DateStyle') d, current_setting('client_encoding') e, to_char('2024-01-02'::date, 'DD/MM') x")
    n = await c.fetchval("SELECT count(*) FROM t")
    await c.close()
    print(json.dumps({"rows": [dict(r) for r in rows], "settings": dict(settings), "n": n}))
asyncio.run(main())
`,
      cs.drivers,
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({
      rows: [
        { id: 0, name: "n0 é", at: "2024-01-01" },
        { id: 1, name: "n1 é", at: "2024-01-02" },
        { id: 2, name: "n2 é", at: "2024-01-03" },
        { id: 100, name: "in tx", at: "2024-02-01" },
        { id: 349, name: "copied 49", at: "2024-03-01" },
      ],
      settings: { a: "apg", s: "apg_schema, public", d: "ISO, DMY", e: "UTF8", x: "02/01" },
      n: 56,
    });
  });

  test("psycopg 3: options=-c settings, parameters, executemany, a rolled back transaction, COPY in and out, server-side cursor", async () => {
    const r = await python(
      String.raw`
import json, os, psycopg
url = os.environ["DATABASE_URL"]
with psycopg.connect(url, options="-c search_path=psy_schema,public -c statement_timeout=5min", application_name="psy") as c:
    c.execute("CREATE SCHEMA IF NOT EXISTS psy_schema")
    c.execute("DROP TABLE IF EXISTS t")
    c.execute("CREATE TABLE t (id int primary key, v text)")
    c.commit()
    with c.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, f"v{i}") for i in range(20)])
    c.commit()
    c.execute("INSERT INTO t VALUES (1000, 'rolled back')")
    c.rollback()
    with c.cursor().copy("COPY t (id, v) FROM STDIN") as cp:
        for i in range(100, 130):
            cp.write_row((i, f"copy {i}"))
    c.commit()
    out = bytearray()
    with c.cursor().copy("COPY (SELECT id, v FROM t WHERE id IN (0, 129) ORDER BY id) TO STDOUT") as cp:
        for chunk in cp:
            out += chunk
    with c.cursor(name="named") as cur:
        cur.execute("SELECT id FROM t ORDER BY id")
        first = [r[0] for r in cur.fetchmany(3)]
    s = c.execute("SELECT current_setting('search_path'), current_setting('statement_timeout'), current_setting('application_name'), count(*) FROM t").fetchone()
    print(json.dumps({"copied": out.decode(), "first": first, "settings": list(s)}))
`,
      cs.drivers,
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({ copied: "0\tv0\n129\tcopy 129\n", first: [0, 1, 2], settings: ["psy_schema,public", "5min", "psy", 50] });
  });

  test("SQLAlchemy (asyncpg dialect): ORM models, a session's commit and rollback, a query with a join", async () => {
    const url = new URL(cs.drivers);
    url.protocol = "postgresql+asyncpg:";
    url.search = ""; // asyncpg takes no sslmode from SQLAlchemy's URL
    const r = await python(
      String.raw`
import asyncio, json, os
from sqlalchemy import Column, ForeignKey, Integer, String, select, func
from sqlalchemy.ext.asyncio import create_async_engine, AsyncSession
from sqlalchemy.orm import declarative_base, relationship
Base = declarative_base()
class Author(Base):
    __tablename__ = "sa_author"
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False)
class Book(Base):
    __tablename__ = "sa_book"
    id = Column(Integer, primary_key=True)
    title = Column(String, nullable=False)
    author_id = Column(Integer, ForeignKey("sa_author.id"), nullable=False)
async def main():
    engine = create_async_engine(os.environ["DATABASE_URL"])
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.drop_all)
        await conn.run_sync(Base.metadata.create_all)
    async with AsyncSession(engine) as s:
        s.add_all([Author(id=1, name="Ann"), Author(id=2, name="Bo")])
        await s.flush()
        s.add_all([Book(title="A1", author_id=1), Book(title="A2", author_id=1), Book(title="B1", author_id=2)])
        await s.commit()
        s.add(Book(title="never", author_id=2))
        await s.flush()
        await s.rollback()
        rows = (await s.execute(select(Author.name, func.count(Book.id)).join(Book, Book.author_id == Author.id).group_by(Author.name).order_by(Author.name))).all()
    await engine.dispose()
    print(json.dumps([list(r) for r in rows]))
asyncio.run(main())
`,
      url.toString(),
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual([
      ["Ann", 2],
      ["Bo", 1],
    ]);
  });
});
