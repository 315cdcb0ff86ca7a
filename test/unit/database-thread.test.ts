import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { DATABASE_TEMPLATE } from "../../server/backends/databases/embedded";
import { PgliteThread } from "../../server/backends/databases/pglite-thread";
import type { WireBackend } from "../../server/backends/databases/wire/listener";
import { PgliteSessionMux } from "../../server/backends/databases/wire/pglite-mux";
import { eachMessage, errorFields, MessageBuilder } from "../../server/backends/databases/wire/protocol";
import { createFromTemplate } from "../../server/store/template";
import { dataRowValues } from "../support/wire";

// The session mux on real database threads, spoken to in raw protocol messages as drivers do:
// statement-only batches beside a holder's transaction, cancel and statement_timeout (which restart
// the thread), idle-in-transaction timeouts, COPY FREEZE, and databases that do not block each other.

const dirs: string[] = [];
const threads: PgliteThread[] = [];
afterAll(async () => {
  for (const t of threads) await t.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function database(idleInTransactionTimeoutMs = 60_000): Promise<PgliteSessionMux> {
  const dir = mkdtempSync(join(tmpdir(), "kiln-thread-test-"));
  dirs.push(dir);
  await createFromTemplate(DATABASE_TEMPLATE, join(dir, "db"));
  const thread = await PgliteThread.open(join(dir, "db"), ["shared_buffers=8MB"]);
  threads.push(thread);
  return new PgliteSessionMux(thread, { idleInTransactionTimeoutMs });
}

const m = () => new MessageBuilder();
const parse = (name: string, sql: string) => m().cstring(name).cstring(sql).int16(0).build(0x50);
const bind = (statement: string, params: string[] = []) => {
  const b = m().cstring("").cstring(statement).int16(0).int16(params.length);
  for (const p of params) b.int32(Buffer.byteLength(p)).bytes(Buffer.from(p));
  return b.int16(0).build(0x42);
};
const execute = () => m().cstring("").int32(0).build(0x45);
const sync = () => m().build(0x53);
const query = (sql: string) => m().cstring(sql).build(0x51);
const copyData = (text: string) => m().bytes(Buffer.from(text)).build(0x64);
const copyDone = () => m().build(0x63);

interface Summary {
  rows: string[][];
  code?: string;
  message?: string;
  status: string;
  types: string;
}

class Client {
  readonly backend: WireBackend & { cancel(): void };
  terminated: { message: string; code?: string } | null = null;
  private replies: { type: string; payload: Uint8Array }[] = [];

  constructor(mux: PgliteSessionMux, name: string) {
    const params = { user: name, database: "db", application_name: name };
    this.backend = mux.open([], { user: name, database: "db", applicationName: name, params, remoteAddress: "" }, {
      // As the wire listener: a FATAL closes the connection, and closing rolls back and releases.
      terminate: (message, code) => {
        this.terminated ??= { message, code }; // the first FATAL is the one a client sees
        void this.backend.close();
      },
    }) as WireBackend & { cancel(): void };
  }

  async send(...messages: Uint8Array[]): Promise<Summary> {
    for (const message of messages)
      await this.backend.handle(message, (data) =>
        eachMessage(data, (type, start, end) => this.replies.push({ type: String.fromCharCode(type), payload: data.slice(start, end) })),
      );
    return this.take();
  }

  run(sql: string): Promise<Summary> {
    return this.send(query(sql));
  }

  take(): Summary {
    const out: Summary = { rows: [], status: "", types: "" };
    for (const r of this.replies) {
      out.types += r.type;
      if (r.type === "D") out.rows.push(dataRowValues(r.payload));
      else if (r.type === "E" && !out.code) {
        const f = errorFields(r.payload);
        out.code = f.C;
        out.message = f.M;
      } else if (r.type === "Z") out.status = String.fromCharCode(r.payload[0]!);
    }
    this.replies = [];
    return out;
  }
}

function watch<T>(p: Promise<T>): { promise: Promise<T>; settled: () => boolean } {
  let done = false;
  const promise = p.finally(() => (done = true));
  return { promise, settled: () => done };
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const LONG = "select count(*) from generate_series(1, 2000000000)";

let mux: PgliteSessionMux;
beforeAll(async () => {
  mux = await database();
  const setup = new Client(mux, "setup");
  expect((await setup.run("create table accounts (id int primary key, balance int); insert into accounts select g, 100 from generate_series(1, 10) g")).code).toBeUndefined();
  await setup.backend.close();
}, 60_000);

describe("statement-only batches beside a holder's transaction", () => {
  test("a Parse+Sync is answered while another client holds a transaction; its execution waits for the commit", async () => {
    const a = new Client(mux, "a");
    const b = new Client(mux, "b");
    await a.run("begin");
    expect((await a.run("update accounts set balance = balance + 1 where id = 1")).status).toBe("T");
    // libpq's PQprepare is synchronous: a single-threaded client (pgbench -c 2) blocks here.
    const prepared = await b.send(parse("get", "select balance from accounts where id = $1"), sync());
    expect(prepared).toMatchObject({ types: "1Z", status: "I" });
    expect(prepared.code).toBeUndefined();
    const read = watch(b.send(bind("get", ["1"]), execute(), sync()));
    await sleep(50);
    expect(read.settled()).toBe(false);
    expect((await a.run("commit")).status).toBe("I");
    expect(await read.promise).toMatchObject({ rows: [["101"]], status: "I" });
    // The holder's session state was untouched by the side work.
    expect((await a.run("select balance from accounts where id = 1")).rows).toEqual([["101"]]);
    await a.backend.close();
    await b.backend.close();
  });

  test("a Parse error beside a transaction reaches its client and leaves the holder's transaction healthy", async () => {
    const a = new Client(mux, "a");
    const b = new Client(mux, "b");
    await a.run("begin; update accounts set balance = balance - 1 where id = 2");
    const bad = await b.send(parse("bad", "select nope from accounts"), sync());
    expect(bad).toMatchObject({ code: "42703", status: "I" });
    expect(await a.run("select balance from accounts where id = 2")).toMatchObject({ rows: [["99"]], status: "T" });
    expect((await a.run("rollback")).status).toBe("I");
    expect((await a.run("select balance from accounts where id = 2")).rows).toEqual([["100"]]);
    await a.backend.close();
    await b.backend.close();
  });
});

describe("cancel and statement_timeout", () => {
  test("a cancel ends a running statement with 57014; every client keeps its prepared statements", async () => {
    const a = new Client(mux, "a");
    const b = new Client(mux, "b");
    await a.send(parse("one", "select balance from accounts where id = $1"), sync());
    await b.send(parse("one", "select id from accounts where id = $1"), sync());
    const running = a.run(LONG);
    await sleep(300);
    a.backend.cancel();
    expect(await running).toMatchObject({ code: "57014", message: "canceling statement due to user request", status: "I" });
    expect((await a.send(bind("one", ["3"]), execute(), sync())).rows).toEqual([["100"]]);
    expect((await b.send(bind("one", ["3"]), execute(), sync())).rows).toEqual([["3"]]);
    await a.backend.close();
    await b.backend.close();
  });

  test("a cancel of one client of a group: it gets 57014, the others of that hand-over are ended (57P01: whether theirs committed is unknown); the session serves on", async () => {
    // The same startup parameters: the same session state, so their batches may share one call.
    const [h, a, b] = [new Client(mux, "g"), new Client(mux, "g"), new Client(mux, "g")];
    await a.send(parse("long", LONG), sync());
    await b.send(parse("quick", "select id from accounts where id = $1"), sync());
    await h.run("begin"); // h holds the session: a's and b's batches queue behind it
    const aRuns = a.send(bind("long"), execute(), sync());
    const bRuns = b.send(bind("quick", ["4"]), execute(), sync());
    await sleep(50);
    await h.run("commit"); // a and b now run in one hand-over, a's statement first
    await sleep(300);
    a.backend.cancel();
    expect(await aRuns).toMatchObject({ code: "57014", message: "canceling statement due to user request", status: "I" });
    expect(await bRuns).toMatchObject({ rows: [], status: "" });
    expect(b.terminated?.code).toBe("57P01");
    expect((await a.run("select 2")).rows).toEqual([["2"]]);
    expect((await h.run("select balance from accounts where id = 4")).rows).toEqual([["100"]]);
    await a.backend.close();
    await h.backend.close();
  });

  test("cancelled inside a transaction block: the transaction is aborted and its writes are gone after ROLLBACK", async () => {
    const a = new Client(mux, "a");
    await a.run("begin; update accounts set balance = 0 where id = 4");
    const running = a.run(LONG);
    await sleep(300);
    a.backend.cancel();
    expect(await running).toMatchObject({ code: "57014", status: "E" });
    expect(await a.run("select 1")).toMatchObject({ code: "25P02", status: "E" });
    expect((await a.run("rollback")).status).toBe("I");
    expect((await a.run("select balance from accounts where id = 4")).rows).toEqual([["100"]]);
    await a.backend.close();
  });

  test("a client waiting for the session can be cancelled without touching the holder", async () => {
    const a = new Client(mux, "a");
    const b = new Client(mux, "b");
    await a.run("begin");
    const waiting = b.run("select 1");
    await sleep(50);
    b.backend.cancel();
    expect(await waiting).toMatchObject({ code: "57014", status: "I", rows: [] });
    expect((await a.run("select 2")).rows).toEqual([["2"]]);
    expect((await a.run("commit")).status).toBe("I");
    await a.backend.close();
    await b.backend.close();
  });

  test("a cancelled client keeps the settings it had set, with nobody else running in between", async () => {
    const a = new Client(mux, "a");
    await a.run("set search_path = pg_catalog, public; set my.flavour = 'lemon'");
    const running = a.run(LONG);
    await sleep(300);
    a.backend.cancel();
    expect((await running).code).toBe("57014");
    expect((await a.run("select current_setting('search_path'), current_setting('my.flavour', true)")).rows).toEqual([["pg_catalog, public", "lemon"]]);
    await a.backend.close();
  });

  test("statement_timeout set by the client cancels a long statement", async () => {
    const a = new Client(mux, "a");
    await a.run("set statement_timeout = '300ms'");
    expect(await a.run(LONG)).toMatchObject({ code: "57014", message: "canceling statement due to statement timeout" });
    expect((await a.run("select 'alive'")).rows).toEqual([["alive"]]);
    await a.backend.close();
  });
});

describe("idle in transaction", () => {
  test("a holder idle past the timeout is terminated (25P03) and rolled back; the others go on", async () => {
    const db = await database(400);
    const setup = new Client(db, "setup");
    await setup.run("create table t (v int); insert into t values (1)");
    const a = new Client(db, "a");
    const b = new Client(db, "b");
    await a.run("begin; update t set v = 2");
    const other = await b.run("select v from t"); // waits for a, which never commits
    expect(other.rows).toEqual([["1"]]);
    expect(a.terminated).toMatchObject({ code: "25P03", message: expect.stringContaining("idle-in-transaction") });
    await a.backend.close();
    await b.backend.close();
    await setup.backend.close();
  }, 30_000);
});

describe("client encoding", () => {
  test("UTF8 only: another encoding is refused at connect (22023), and a client that switches is ended before PGlite cuts an answer short", async () => {
    const params = { user: "l", database: "db", client_encoding: "LATIN1" };
    expect(() => mux.open([], { user: "l", database: "db", applicationName: "", params, remoteAddress: "" }, { terminate: () => {} })).toThrow(
      expect.objectContaining({ code: "22023", message: expect.stringContaining("only UTF8") }),
    );
    const a = new Client(mux, "a");
    await a.run("set client_encoding = 'LATIN1'");
    expect(a.terminated).toMatchObject({ code: "22023" });
    const b = new Client(mux, "b");
    expect((await b.run("select 'é' as e, current_setting('client_encoding')")).rows).toEqual([["é", "UTF8"]]);
    await b.backend.close();
  });
});

describe("COPY", () => {
  test("COPY FREEZE after TRUNCATE in the same transaction works (pgbench -i)", async () => {
    const a = new Client(mux, "a");
    await a.run("create table frozen (id int, name text)");
    await a.run("begin; truncate frozen");
    const started = await a.run("copy frozen from stdin with (freeze on)");
    expect(started.types).toBe("G");
    expect(await a.send(copyData("1\tone\n2\ttwo\n"), copyDone())).toMatchObject({ types: "CZ", status: "T" });
    expect((await a.run("commit")).status).toBe("I");
    expect((await a.run("select name from frozen order by id")).rows).toEqual([["one"], ["two"]]);
    await a.backend.close();
  });
});

describe("database threads", () => {
  test("answers smaller than, just around and larger than the shared channel come back whole and in order", async () => {
    // The thread writes PGlite's answer straight into the channel while it fits and sends the whole
    // answer as a message once it does not (chunks written before the overflow included).
    const c = new Client(mux, "big");
    for (const rows of [1, 200, 2_000, 20_000]) {
      const r = await c.run(`select g, repeat('x', 100) || g from generate_series(1, ${rows}) g`);
      expect(r.code).toBeUndefined();
      expect(r.rows.length).toBe(rows);
      expect(r.rows[rows - 1]).toEqual([String(rows), "x".repeat(100) + rows]);
      expect(r.rows.every((row, i) => row[0] === String(i + 1))).toBe(true);
    }
    expect((await c.run("select 'after'")).rows).toEqual([["after"]]);
    await c.backend.close();
  }, 30_000);

  test("closing a database does not wait for a statement that is still running", async () => {
    const db = await database();
    const busy = new Client(db, "busy");
    const long = watch(busy.run(LONG));
    await sleep(200);
    await db.closeAll("the database was deleted");
    await long.promise;
    expect(busy.terminated).toMatchObject({ message: "the database was deleted" });
  }, 30_000);

  test("a long statement in one database does not hold up another", async () => {
    const other = await database();
    const busy = new Client(mux, "busy");
    const quick = new Client(other, "quick");
    const long = watch(busy.run(LONG));
    await sleep(200);
    expect((await quick.run("select 'answered'")).rows).toEqual([["answered"]]);
    expect(long.settled()).toBe(false);
    busy.backend.cancel();
    expect((await long.promise).code).toBe("57014");
    await busy.backend.close();
    await quick.backend.close();
  }, 30_000);
});
