import type { PGlite } from "@electric-sql/pglite";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import type { WireBackend } from "../../server/backends/databases/wire/listener";
import { callsSessionSetConfig, PgliteSessionMux, startupSettings } from "../../server/backends/databases/wire/pglite-mux";
import { eachMessage, errorFields, MessageBuilder } from "../../server/backends/databases/wire/protocol";
import { dataRowValues } from "../support/wire";
import { InProcessSession } from "../../server/backends/databases/pglite-thread";
import { listenOps } from "../../server/backends/databases/wire/listen-statements";
import { runOverProtocol } from "../../server/backends/databases/protocol-query";
import { freshPglite } from "../support/pglite";

// The session mux spoken to in raw protocol messages, the way a driver would, without a socket.

let db: PGlite;
let mux: PgliteSessionMux;

const m = () => new MessageBuilder();
const parse = (name: string, sql: string) => m().cstring(name).cstring(sql).int16(0).build(0x50);
const bind = (portal: string, statement: string, params: string[] = []) => {
  const b = m().cstring(portal).cstring(statement).int16(0).int16(params.length);
  for (const p of params) b.int32(Buffer.byteLength(p)).bytes(Buffer.from(p));
  return b.int16(0).build(0x42);
};
const describeStatement = (name: string) => m().byte(0x53).cstring(name).build(0x44);
const execute = (portal = "") => m().cstring(portal).int32(0).build(0x45);
const closeStatement = (name: string) => m().byte(0x53).cstring(name).build(0x43);
const sync = () => m().build(0x53);
const flush = () => m().build(0x48);
const query = (sql: string) => m().cstring(sql).build(0x51);
const copyData = (text: string) => m().bytes(Buffer.from(text)).build(0x64);
const copyDone = () => m().build(0x63);

interface Reply {
  type: string;
  payload: Uint8Array;
}

/** One client of the mux: sends frontend messages, keeps what comes back. */
class RawClient {
  readonly backend: WireBackend;
  terminated: string | null = null;
  private replies: Reply[] = [];

  constructor(name: string, init: string[] = []) {
    const params = { user: name, database: "mydb", application_name: name };
    this.backend = mux.open(init, { user: name, database: "mydb", applicationName: name, params, remoteAddress: "" }, { terminate: (msg) => (this.terminated = msg) });
  }

  async send(...messages: Uint8Array[]): Promise<void> {
    for (const message of messages)
      await this.backend.handle(message, (data) =>
        eachMessage(data, (type, start, end) => this.replies.push({ type: String.fromCharCode(type), payload: data.slice(start, end) })),
      );
  }

  /** Replies since the last take. */
  take(): Reply[] {
    const r = this.replies;
    this.replies = [];
    return r;
  }

  async run(sql: string): Promise<{ rows: string[][]; error?: string; code?: string; status: string }> {
    await this.send(query(sql));
    return summarize(this.take());
  }
}

function summarize(replies: Reply[]): { rows: string[][]; error?: string; code?: string; status: string; types: string } {
  const rows: string[][] = [];
  let error: Record<string, string> | undefined;
  let status = "";
  for (const r of replies) {
    if (r.type === "D") rows.push(dataRowValues(r.payload));
    if (r.type === "E") error ??= errorFields(r.payload);
    if (r.type === "Z") status = String.fromCharCode(r.payload[0]!);
  }
  return { rows, error: error?.M, code: error?.C, status, types: replies.map((r) => r.type).join("") };
}

function watch<T>(p: Promise<T>): { promise: Promise<T>; settled: () => boolean } {
  let done = false;
  const promise = p.finally(() => (done = true));
  return { promise, settled: () => done };
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const preparedNames = () =>
  mux.exclusive(async (pg) => (await runOverProtocol(pg, [], "select name from pg_prepared_statements order by name", [])).rows.map((r) => r.name as string));

beforeAll(async () => {
  db = await freshPglite();
  await db.exec("create role r1; create table t (id int primary key, v text); insert into t values (1, 'one')");
  mux = new PgliteSessionMux(new InProcessSession(db));
}, 60_000);

afterAll(async () => {
  if (!db.closed) await db.close();
});

describe("prepared statements", () => {
  test("two clients use the same statement name for different SQL", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.send(parse("s1", "select 'from a'"), sync());
    await b.send(parse("s1", "select 'from b'"), sync());
    expect(summarize(a.take()).types).toBe("1Z");
    expect(summarize(b.take()).types).toBe("1Z");
    for (let i = 0; i < 2; i++) {
      await b.send(bind("", "s1"), execute(), sync());
      await a.send(bind("", "s1"), execute(), sync());
      expect(summarize(a.take()).rows).toEqual([["from a"]]);
      expect(summarize(b.take()).rows).toEqual([["from b"]]);
    }
    // Within one client, names behave as on a real server.
    await a.send(parse("s1", "select 2"), sync());
    expect(summarize(a.take()).code).toBe("42P05");
    await b.send(parse("only-b", "select 'b only'"), sync());
    await a.send(bind("", "only-b"), execute(), sync());
    expect(summarize(a.take()).code).toBe("26000");
    await a.send(closeStatement("s1"), sync());
    await a.send(bind("", "s1"), execute(), sync());
    expect(summarize(a.take())).toMatchObject({ code: "26000", types: "3ZEZ" });

    await b.backend.close();
    await a.backend.close();
    expect(await preparedNames()).toEqual([]);
  });

  test("names too long to prefix still stay apart", async () => {
    const long = "x".repeat(62);
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.send(parse(long, "select 'a long'"), sync());
    await b.send(parse(long, "select 'b long'"), sync());
    await a.send(bind("", long), execute(), sync());
    await b.send(bind("", long), execute(), sync());
    expect(summarize(a.take()).rows).toEqual([["a long"]]);
    expect(summarize(b.take()).rows).toEqual([["b long"]]);
    await a.backend.close();
    await b.backend.close();
    expect(await preparedNames()).toEqual([]);
  });

  test("an unnamed statement parsed in one batch and bound in the next survives another client's query", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.send(parse("", "select 'still mine'"), describeStatement(""), sync());
    expect(summarize(a.take()).types).toBe("1tTZ");
    expect((await b.run("select 'b was here'")).rows).toEqual([["b was here"]]);
    await a.send(bind("", ""), execute(), sync());
    // No stray ParseComplete from the re-parse: exactly what a real server would answer.
    expect(summarize(a.take())).toMatchObject({ types: "2DCZ", rows: [["still mine"]] });
    await a.backend.close();
    await b.backend.close();
  });
});

describe("ownership of the session", () => {
  test("Flush without Sync answers at once and keeps the session until Sync", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.send(parse("", "select $1::int + 1"), describeStatement(""), flush());
    expect(summarize(a.take()).types).toBe("1tT");
    const other = watch(b.run("select 'b'"));
    await sleep(50);
    expect(other.settled()).toBe(false);
    await a.send(bind("", "", ["41"]), execute(), sync());
    expect(summarize(a.take())).toMatchObject({ types: "2DCZ", rows: [["42"]], status: "I" });
    expect((await other.promise).rows).toEqual([["b"]]);
    await a.backend.close();
    await b.backend.close();
  });

  test("an error inside a transaction keeps the session until the client rolls back", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.run("begin");
    expect(await a.run("select 1/0")).toMatchObject({ code: "22012", status: "E" });
    const other = watch(b.run("select count(*) from t"));
    await sleep(50);
    expect(other.settled()).toBe(false);
    expect(mux.stats()).toMatchObject({ clients: 2, inTransaction: true });
    expect(await a.run("select 1")).toMatchObject({ code: "25P02", status: "E" });
    expect(await a.run("rollback")).toMatchObject({ status: "I" });
    expect((await other.promise).rows).toEqual([["1"]]);
    expect(mux.stats().inTransaction).toBe(false);
    await a.backend.close();
    await b.backend.close();
  });

  test("a client closed while waiting for the session leaves the queue", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    const c = new RawClient("c");
    await a.run("begin");
    await a.run("update t set v = 'a' where id = 1");
    const bWaits = watch(b.run("update t set v = 'b' where id = 1"));
    const cWaits = watch(c.run("select v from t where id = 1"));
    await sleep(20);
    await b.backend.close(); // gone before it got the session: its update never runs
    expect(await bWaits.promise).toMatchObject({ rows: [], status: "" });
    await a.run("commit");
    expect((await cWaits.promise).rows).toEqual([["a"]]);
    await a.backend.close();
    await c.backend.close();
  });

  test("a client that fails its init is terminated and never runs with another client's state", async () => {
    const a = new RawClient("a", ["SET ROLE r1"]);
    const broken = new RawClient("broken", ["SET ROLE no_such_role"]);
    const c = new RawClient("c");
    expect((await a.run("select current_user")).rows).toEqual([["r1"]]);
    await broken.send(query("select current_user"));
    expect(broken.take()).toEqual([]);
    expect(broken.terminated).toContain('role "no_such_role" does not exist');
    await broken.backend.close();
    expect((await c.run("select current_user")).rows).toEqual([["postgres"]]);
    expect((await a.run("select current_user")).rows).toEqual([["r1"]]);
    await a.backend.close();
    await c.backend.close();
  });
});

describe("groups: batches of idle clients in one hand-over", () => {
  test("batches waiting together run in one call; names stay apart and an error in one touches no other", async () => {
    // The same startup parameters (application_name too): the same session state, so they may share a call.
    const [h, a, b, c] = ["g", "g", "g", "g"].map((n) => new RawClient(n));
    await h!.run("create table g1 (id int primary key, who text)");
    // Every client names its statement "ins", each with other SQL; b's fails when it runs.
    await a!.send(parse("ins", "insert into g1 values ($1, 'a') returning who"), sync());
    await b!.send(parse("ins", "select 1 / (id - id) from t where id = $1"), sync());
    await c!.send(parse("ins", "insert into g1 values ($1, 'c') returning who"), sync());
    for (const x of [a, b, c]) expect(summarize(x!.take()).types).toBe("1Z");
    await h!.run("begin"); // h holds the session: the others' batches queue behind it
    const calls = vi.spyOn(db, "execProtocolRawStream");
    const sent = [a!.send(bind("", "ins", ["1"]), execute(), sync()), b!.send(bind("", "ins", ["1"]), execute(), sync()), c!.send(bind("", "ins", ["2"]), execute(), sync())];
    await sleep(20);
    calls.mockClear();
    await h!.run("commit");
    await Promise.all(sent);
    expect(calls.mock.calls.length).toBe(2); // h's COMMIT, then a, b and c together
    calls.mockRestore();
    expect(summarize(a!.take())).toMatchObject({ types: "2DCZ", rows: [["a"]], status: "I" });
    expect(summarize(b!.take())).toMatchObject({ types: "2EZ", code: "22012", status: "I" });
    expect(summarize(c!.take())).toMatchObject({ types: "2DCZ", rows: [["c"]], status: "I" });
    // a's and c's implicit transactions committed; b's error rolled back only its own.
    expect((await h!.run("select id, who from g1 order by id")).rows).toEqual([["1", "a"], ["2", "c"]]);
    for (const x of [h, a, b, c]) await x!.backend.close();
  });

  test("a batch that opens a transaction block is never grouped, and the batches behind it wait for its end", async () => {
    const [h, a, b] = ["g", "g", "g"].map((n) => new RawClient(n));
    await h!.run("create table g2 (id int primary key, who text)");
    await a!.send(parse("begin", "begin"), parse("ins", "insert into g2 values ($1, 'a')"), sync());
    await b!.send(parse("ins", "insert into g2 values ($1, 'b') returning who"), sync());
    a!.take();
    b!.take();
    await h!.run("begin");
    const calls = vi.spyOn(db, "execProtocolRawStream");
    const aBegins = a!.send(bind("", "begin"), execute(), sync());
    const bWaits = watch(b!.send(bind("", "ins", ["2"]), execute(), sync()));
    await sleep(20);
    calls.mockClear();
    await h!.run("commit");
    await aBegins;
    expect(summarize(a!.take()).status).toBe("T");
    expect(calls.mock.calls.length).toBe(2); // h's COMMIT, a's BEGIN alone
    calls.mockRestore();
    await a!.send(bind("", "ins", ["1"]), execute(), sync());
    expect(summarize(a!.take()).status).toBe("T");
    await sleep(20);
    expect(bWaits.settled()).toBe(false); // b is not run inside a's transaction
    expect(await a!.run("rollback")).toMatchObject({ status: "I" });
    await bWaits.promise;
    expect(summarize(b!.take())).toMatchObject({ rows: [["b"]], status: "I" });
    expect((await h!.run("select id, who from g2 order by id")).rows).toEqual([["2", "b"]]);
    for (const x of [h, a, b]) await x!.backend.close();
  });

  test("clients in different session states, or running utility statements, are not grouped", async () => {
    const [h, a, b] = [new RawClient("g"), new RawClient("g"), new RawClient("other")];
    await a!.send(parse("q", "select current_setting('application_name')"), sync());
    await b!.send(parse("q", "select current_setting('application_name')"), sync());
    await h!.send(parse("show", "show application_name"), sync());
    a!.take();
    b!.take();
    h!.take();
    await h!.run("begin");
    const calls = vi.spyOn(db, "execProtocolRawStream");
    const sent = [a!.send(bind("", "q"), execute(), sync()), b!.send(bind("", "q"), execute(), sync())];
    await sleep(20);
    calls.mockClear();
    await h!.run("commit");
    await Promise.all(sent);
    // COMMIT, a, then switching to b's state and b: one call each (the switch is one more)
    expect(calls.mock.calls.length).toBe(4);
    calls.mockRestore();
    expect(summarize(a!.take()).rows).toEqual([["g"]]);
    expect(summarize(b!.take()).rows).toEqual([["other"]]);
    for (const x of [h, a, b]) await x!.backend.close();
  });
});

describe("session state", () => {
  test("SET ROLE, custom settings and set_config() follow their client", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.run("set role r1; set app.color = 'blue'; select set_config('app.size', 'large', false)");
    await a.send(parse("tz", "select set_config('TimeZone', $1, false)"), sync());
    await a.send(bind("", "tz", ["Asia/Tokyo"]), execute(), sync());
    a.take();
    const state = "select current_user, current_setting('app.color', true), current_setting('app.size', true), current_setting('TimeZone'), current_setting('application_name')";
    for (let i = 0; i < 2; i++) {
      expect((await b.run(state)).rows).toEqual([["postgres", "", "", "UTC", "b"]]);
      expect((await a.run(state)).rows).toEqual([["r1", "blue", "large", "Asia/Tokyo", "a"]]);
    }
    await a.backend.close();
    await b.backend.close();
  });

  test("a switch costs one extra PGlite call, and none between clients in the same state", async () => {
    const a = new RawClient("same");
    const b = new RawClient("same");
    const c = new RawClient("different");
    const calls = vi.spyOn(db, "execProtocolRawStream");
    const callsFor = async (client: RawClient) => {
      calls.mockClear();
      await client.run("select 1");
      return calls.mock.calls.length;
    };
    await callsFor(a);
    expect(await callsFor(a)).toBe(1);
    expect(await callsFor(b)).toBe(1); // same init and settings: nothing to switch
    expect(await callsFor(c)).toBe(2); // reset + restore, then the query
    expect(await callsFor(c)).toBe(1);
    await c.run("set work_mem = '8MB'");
    expect(await callsFor(a)).toBe(2); // capture c's settings, reset + restore a's: still one call
    expect((await c.run("show work_mem")).rows).toEqual([["8MB"]]);
    calls.mockRestore();
    for (const x of [a, b, c]) await x.backend.close();
  });
});

describe("reading SQL and startup packets", () => {
  test("only set_config() calls that may outlive the transaction count as changing the session", () => {
    expect(callsSessionSetConfig("select set_config('a.b', 'x', true)")).toBe(false);
    expect(callsSessionSetConfig("select set_config('a.b', concat('x', 'y'), TRUE), set_config('role', $1, true)")).toBe(false);
    expect(callsSessionSetConfig("select 1 -- no set_config( here")).toBe(true); // a comment is not parsed: counts as yes
    expect(callsSessionSetConfig("select 1 -- nothing to see")).toBe(false);
    expect(callsSessionSetConfig("select set_config('a.b', 'x', false)")).toBe(true);
    expect(callsSessionSetConfig("select set_config('a.b', $2, $3)")).toBe(true);
    expect(callsSessionSetConfig("select set_config('a.b', 'it''s, true)', false)")).toBe(true);
    expect(callsSessionSetConfig("select set_config('a.b', 'x', true), set_config('c.d', 'y', false)")).toBe(true);
    expect(callsSessionSetConfig("select set_config('a', E'x\\'', true)")).toBe(true);
  });

  test("client_encoding is read as PostgreSQL reads an encoding name: letters and digits only, any case (asyncpg sends 'utf-8' with the quotes)", () => {
    for (const e of ["'utf-8'", "UTF8", "Utf-8", "unicode", '"UTF_8"']) expect(startupSettings({ user: "u", client_encoding: e }).has("client_encoding")).toBe(false);
    expect(startupSettings({ user: "u", Client_Encoding: "LATIN1" }).get("client_encoding")).toBe("LATIN1");
    expect(startupSettings({ user: "u", options: "-c client_encoding='utf-8'" }).has("client_encoding")).toBe(false);
  });

  test("LISTEN, UNLISTEN, UNLISTEN * and DISCARD ALL are read from multi-statement SQL as PostgreSQL reads the channel", () => {
    expect(
      listenOps(`select ';listen no'; LISTEN Chan1 ; /* listen no; */ unlisten "Mixed ""Q""";-- listen no
        UNLISTEN *; do $x$ begin perform 1; end $x$; discard   all; listen ${"a".repeat(70)}; notify chan1`),
    ).toEqual([
      { listen: true, channel: "chan1" },
      { listen: false, channel: 'Mixed "Q"' },
      { listen: false, channel: null },
      { listen: false, channel: null },
      { listen: true, channel: "a".repeat(63) },
    ]);
    expect(listenOps("select E'\\\\'; listen x; select $$;$$; listen y")).toEqual([
      { listen: true, channel: "x" },
      { listen: true, channel: "y" },
    ]);
  });

  test("startup parameters and -c options become the client's settings", () => {
    const settings = startupSettings({
      user: "u",
      database: "d",
      application_name: "app",
      client_encoding: "UTF8",
      DateStyle: "ISO, DMY",
      options: "-c search_path=a,b --statement-timeout=5s -cwork_mem=8MB -c lock_timeout=1s\\ 2",
    });
    expect(Object.fromEntries(settings)).toEqual({
      application_name: "app",
      datestyle: "ISO, DMY",
      search_path: "a,b",
      statement_timeout: "5s",
      work_mem: "8MB",
      lock_timeout: "1s 2",
    });
  });
});

describe("COPY", () => {
  test("COPY FROM STDIN works in the simple and the extended protocol", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.send(query("create table c (n int); copy c from stdin"));
    expect(summarize(a.take()).types).toBe("CG");
    const waiting = watch(b.run("select 'b'")); // a holds the session through its COPY
    await a.send(copyData("1\n2\n"), copyData("3\n"), copyDone());
    expect(summarize(a.take()).types).toBe("CZ");
    expect((await waiting.promise).rows).toEqual([["b"]]);
    expect((await a.run("select sum(n) from c")).rows).toEqual([["6"]]);

    // The way drivers pipeline it: the Sync after Execute is swallowed by COPY, so a second one ends it.
    await a.send(parse("", "copy c from stdin"), bind("", ""), execute(), sync());
    expect(summarize(a.take()).types).toBe("12G");
    await a.send(copyData("4\n"), copyDone(), sync());
    expect(summarize(a.take())).toMatchObject({ types: "CZ", status: "I" });
    expect((await a.run("select sum(n) from c")).rows).toEqual([["10"]]);
    await a.backend.close();
    await b.backend.close();
  });

  test("inside a transaction, COPY FROM STDIN that PGlite cannot be given in one piece fails cleanly", async () => {
    const a = new RawClient("a");
    await a.run("begin");
    await a.send(parse("", "copy c from stdin"), bind("", ""), execute(), sync());
    const failed = summarize(a.take());
    expect(failed.types).toBe("12GE");
    expect(failed.error).toContain("must be a simple query of its own");
    await a.send(copyData("5\n"), copyDone(), sync()); // what a driver sends anyway; PostgreSQL ignores it
    expect(summarize(a.take())).toMatchObject({ types: "Z", status: "E" });
    expect(await a.run("rollback")).toMatchObject({ status: "I" });
    // And the session (PGlite) is alive.
    expect((await a.run("select count(*) from c")).rows).toEqual([["4"]]);
    await a.backend.close();
  });
});

describe("closeAll", () => {
  test("terminates every client, rolls back a held transaction, refuses new work", async () => {
    const a = new RawClient("a");
    const b = new RawClient("b");
    await a.run("begin; insert into t values (99, 'uncommitted')");
    const waiting = watch(b.run("select 1"));
    await mux.closeAll("database is being restored");
    expect(a.terminated).toBe("database is being restored");
    expect(b.terminated).toBe("database is being restored");
    await waiting.promise;
    expect(mux.stats()).toMatchObject({ clients: 0, inTransaction: false });
    expect(() => new RawClient("late")).toThrow(/shutting down/);
    await expect(mux.exclusive(async () => 1)).rejects.toThrow(/closed/);
    expect(db.isInTransaction()).toBe(false);
    expect((await db.query("select count(*)::int as n from t where id = 99")).rows).toEqual([{ n: 0 }]);
  });
});
