// Real PostgreSQL clients against a Kiln database, on both engines: pgbench (default initialisation,
// TPC-B in every protocol mode and 1-16 clients, select-only), psql (\copy in text, CSV and binary),
// CancelRequest and statement_timeout, idle in transaction, a pg.Pool running named prepared
// statements in concurrent transactions, postgres.js pipelining and drizzle-orm. Each asserts the
// data that results, not only that nothing failed.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { drizzle } from "drizzle-orm/node-postgres";
import { integer, pgTable, serial, text, timestamp } from "drizzle-orm/pg-core";
import pg from "pg";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createProject, eventually, useKiln } from "../support/kiln";

const k = useKiln();
const closers: (() => Promise<unknown>)[] = [];
const tmp = mkdtempSync(join(tmpdir(), "kiln-clients-"));
afterAll(async () => {
  for (const c of closers) await c().catch(() => {});
  rmSync(tmp, { recursive: true, force: true });
});

/** A new active database; its connection string. */
async function database(name: string): Promise<string> {
  const p = await createProject(k);
  const r = await k.api("POST", `/projects/${p.id}/databases`, { body: { name } });
  expect(r.status, r.text).toBe(201);
  const d = await eventually(() => k.api("GET", `/projects/${p.id}/databases/${r.body.name}`), (x) => x.body.status !== "provisioning");
  expect(d.body.status).toBe("active");
  return d.body.connection_string as string;
}

function sqlClient(url: string, opts: postgres.Options<{}> = {}) {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10, ...opts });
  closers.push(() => c.end({ timeout: 1 }));
  return c;
}

/** Runs a client program; a hang fails the test (killed after `timeoutMs`) instead of stalling the suite. */
function run(cmd: string, args: string[], timeoutMs = 60_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (out += d));
    const timer = setTimeout(() => {
      out += `\n[killed after ${timeoutMs} ms]`;
      p.kill("SIGKILL");
    }, timeoutMs);
    p.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out: out.trim() });
    });
  });
}

const psql = (url: string, ...args: string[]) => run("psql", [url, "-X", "-v", "ON_ERROR_STOP=1", "-A", "-t", ...args], 30_000);

describe("pgbench", () => {
  let cs: string;
  beforeAll(async () => {
    cs = await database("bench");
  });

  test("default initialisation (client-side COPY with FREEZE), TPC-B in every mode with 1-16 clients, balances consistent", async () => {
    const init = await run("pgbench", ["-i", "-s", "1", cs]);
    expect(init.code, init.out).toBe(0);
    expect(init.out).toContain("client-side generate");
    const db = sqlClient(cs);
    expect((await db`select count(*)::int as n from pgbench_accounts`)[0]!.n).toBe(100_000);

    let processed = 0;
    for (const mode of ["simple", "extended", "prepared"]) {
      for (const clients of [1, 2, 8, 16]) {
        const r = await run("pgbench", ["-n", "-M", mode, "-c", String(clients), "-j", clients > 1 ? "2" : "1", "-t", "15", cs]);
        expect(r.code, `pgbench -M ${mode} -c ${clients}: ${r.out}`).toBe(0);
        const m = /number of transactions actually processed: (\d+)\/(\d+)/.exec(r.out);
        expect(m, r.out).not.toBeNull();
        expect(m![1]).toBe(m![2]);
        processed += Number(m![1]);
      }
    }
    expect(processed).toBe(15 * (1 + 2 + 8 + 16) * 3);
    const [sums] = await db`select (select sum(abalance) from pgbench_accounts)::int as a, (select sum(tbalance) from pgbench_tellers)::int as t,
      (select sum(bbalance) from pgbench_branches)::int as b, (select count(*) from pgbench_history)::int as h`;
    expect(sums!.a).toBe(sums!.t);
    expect(sums!.t).toBe(sums!.b);
    expect(sums!.h).toBe(processed);

    const select = await run("pgbench", ["-n", "-S", "-M", "prepared", "-c", "8", "-j", "2", "-t", "200", cs]);
    expect(select.code, select.out).toBe(0);
    expect(select.out).toContain("number of transactions actually processed: 1600/1600");
  }, 240_000);

  test("a single-threaded client with two connections and prepared statements (pgbench -c 2 -j 1) finishes; psql answers meanwhile", async () => {
    const bench = run("pgbench", ["-n", "-M", "prepared", "-c", "2", "-j", "1", "-t", "300", cs]);
    const during = await psql(cs, "-c", "select 'still answering'");
    expect(during).toMatchObject({ code: 0, out: "still answering" });
    const r = await bench;
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain("number of transactions actually processed: 600/600");
  }, 120_000);
});

describe("psql", () => {
  test("\\copy round trips text, CSV with a header and binary; COPY FROM STDIN inside a transaction", async () => {
    const cs = await database("copies");
    const db = sqlClient(cs);
    await db`create table t (id int primary key, body text, amount numeric)`;
    const rows = [
      { id: 1, body: "tab\there, quote ' and \" double", amount: "1.50" },
      { id: 2, body: null, amount: null },
      { id: 3, body: "unicode ✓ 日本 — and a backslash \\ and\nnewline", amount: "-7" },
      { id: 4, body: "", amount: "0" },
    ];
    for (const r of rows) await db`insert into t values (${r.id}, ${r.body}, ${r.amount})`;
    const all = () => db`select id, body, amount::text from t order by id`;
    const expected = await all();
    for (const [format, options] of [
      ["text", ""],
      ["csv", " (format csv, header)"],
      ["binary", " (format binary)"],
    ] as const) {
      const file = join(tmp, `t.${format}`);
      const out = await psql(cs, "-c", `\\copy t to '${file}'${options}`);
      expect(out, format).toMatchObject({ code: 0, out: "COPY 4" });
      await db`truncate t`;
      const back = await psql(cs, "-c", `\\copy t from '${file}'${options}`);
      expect(back, format).toMatchObject({ code: 0, out: "COPY 4" });
      expect(await all(), format).toEqual(expected);
    }
    // In a transaction, after a TRUNCATE (COPY FREEZE needs exactly that).
    const script = join(tmp, "tx.sql");
    writeFileSync(script, `begin;\ntruncate t;\n\\copy t from '${join(tmp, "t.csv")}' (format csv, header, freeze)\ncommit;\n`);
    expect((await psql(cs, "-f", script)).code).toBe(0);
    expect(await all()).toEqual(expected);
    // A failing COPY in a transaction aborts it, and nothing of it stays.
    writeFileSync(join(tmp, "bad.csv"), "id,body,amount\n9,x,1\nnot-a-number,y,2\n");
    writeFileSync(script, `begin;\ndelete from t;\n\\copy t from '${join(tmp, "bad.csv")}' (format csv, header)\ncommit;\n`);
    const failed = await psql(cs, "-f", script);
    expect(failed.code).not.toBe(0);
    expect(failed.out).toContain("invalid input syntax for type integer");
    expect(await all()).toEqual(expected);
  }, 60_000);
});

describe("cancel and timeouts", () => {
  test("a CancelRequest cancels a running statement (57014); the connection and its prepared statements go on", async () => {
    const cs = await database("cancels");
    const db = sqlClient(cs);
    await db`create table t (id int primary key, v text)`;
    await db`insert into t values (1, 'one')`;
    const prepared = () => db`select v from t where id = ${1}`; // postgres.js prepares it (named statement)
    expect(await prepared()).toEqual([{ v: "one" }]);
    const q = db`select pg_sleep(30)`;
    setTimeout(() => q.cancel(), 300);
    const started = Date.now();
    await expect(q).rejects.toMatchObject({ code: "57014" });
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(await prepared()).toEqual([{ v: "one" }]);
    expect(await db`select count(*)::int as n from t`).toEqual([{ n: 1 }]);

    // Inside a transaction: the transaction is aborted (25P02 until ROLLBACK) and its writes are gone.
    const tx = await db.reserve();
    await tx`begin`;
    await tx`insert into t values (2, 'uncommitted')`;
    const long = tx`select pg_sleep(30)`;
    setTimeout(() => long.cancel(), 300);
    await expect(long).rejects.toMatchObject({ code: "57014" });
    await expect(tx`select 1`).rejects.toMatchObject({ code: "25P02" });
    await tx`rollback`;
    tx.release();
    expect(await db`select id, v from t order by id`).toEqual([{ id: 1, v: "one" }]);
  }, 60_000);

  test("statement_timeout set by the client ends a long statement with 57014", async () => {
    const cs = await database("timeouts");
    const db = sqlClient(cs);
    await db`set statement_timeout = '500ms'`;
    await expect(db`select pg_sleep(30)`).rejects.toMatchObject({ code: "57014", message: expect.stringContaining("statement timeout") });
    expect(await db`select 'alive' as s`).toEqual([{ s: "alive" }]);
  }, 60_000);

  test("a client idle in a transaction past its idle_in_transaction_session_timeout is ended (25P03); others go on", async () => {
    const cs = await database("idle");
    const admin = sqlClient(cs);
    await admin`create table t (v int)`;
    await admin`insert into t values (1)`;
    const a = new pg.Client({ connectionString: cs });
    const errors: (Error & { code?: string })[] = [];
    a.on("error", (e) => errors.push(e));
    await a.connect();
    closers.push(() => a.end());
    await a.query("set idle_in_transaction_session_timeout = '1500ms'");
    await a.query("begin");
    await a.query("update t set v = 2");
    // The embedded engine makes this wait for a's transaction; PostgreSQL answers from its snapshot.
    expect(await admin`select v from t`).toEqual([{ v: 1 }]);
    // The server's FATAL first, then the closed connection.
    await eventually(async () => errors.length, (n) => n > 0, 15_000);
    expect(errors[0]).toMatchObject({ code: "25P03", message: expect.stringContaining("idle-in-transaction") });
    await expect(a.query("select 1")).rejects.toThrow();
    expect(await admin`select v from t`).toEqual([{ v: 1 }]);
  }, 60_000);
});

describe("drivers", () => {
  test("pg.Pool of 10: 200 concurrent transactions of named prepared statements; money is conserved", async () => {
    const cs = await database("pool");
    const pool = new pg.Pool({ connectionString: cs, max: 10 });
    closers.push(() => pool.end());
    await pool.query("create table accounts (id int primary key, balance int not null)");
    await pool.query("insert into accounts select g, 1000 from generate_series(1, 20) g");
    const expected = new Map<number, number>(Array.from({ length: 20 }, (_, i) => [i + 1, 1000]));
    await Promise.all(
      Array.from({ length: 200 }, async (_, i) => {
        const from = (i % 20) + 1;
        const to = ((i * 7) % 20) + 1;
        const amount = (i % 13) + 1;
        const c = await pool.connect();
        try {
          await c.query("begin");
          // Rows locked in id order, as an application does to avoid deadlocks on PostgreSQL (40P01).
          const debit = { name: "debit", text: "update accounts set balance = balance - $1 where id = $2", values: [amount, from] };
          const credit = { name: "credit", text: "update accounts set balance = balance + $1 where id = $2", values: [amount, to] };
          for (const q of from <= to ? [debit, credit] : [credit, debit]) await c.query(q);
          const { rows } = await c.query({ name: "read", text: "select balance from accounts where id = $1", values: [from] });
          expect(typeof rows[0].balance).toBe("number");
          if (i % 10 === 0) {
            await c.query("rollback");
            return;
          }
          await c.query("commit");
          expected.set(from, expected.get(from)! - amount);
          expected.set(to, expected.get(to)! + amount);
        } finally {
          c.release();
        }
      }),
    );
    const { rows } = await pool.query("select id, balance from accounts order by id");
    expect(rows.reduce((n, r) => n + r.balance, 0)).toBe(20_000);
    expect(rows.map((r) => [r.id, r.balance])).toEqual([...expected.entries()].sort((a, b) => a[0] - b[0]));
  }, 60_000);

  test("postgres.js pipelines queries over a pool of 4 and inside a transaction", async () => {
    const cs = await database("pipeline");
    const db = sqlClient(cs, { max: 4 });
    const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => db`select ${i}::int as i, ${`v${i}`}::text as v`));
    expect(answers.map((r) => r[0])).toEqual(Array.from({ length: 200 }, (_, i) => ({ i, v: `v${i}` })));
    await db`create table items (id serial primary key, name text not null)`;
    const [first, second, count] = await db.begin((tx) => [
      tx`insert into items (name) values ('a') returning id`,
      tx`insert into items (name) values ('b') returning id`,
      tx`select count(*)::int as n from items`,
    ]);
    expect([first![0]!.id, second![0]!.id, count![0]!.n]).toEqual([1, 2, 2]);
    await expect(
      db.begin((tx) => [tx`insert into items (name) values ('c')`, tx`insert into items (name) values (null)`]),
    ).rejects.toMatchObject({ code: "23502" });
    expect(await db`select name from items order by id`).toEqual([{ name: "a" }, { name: "b" }]);
  }, 60_000);

  test("drizzle-orm on pg: inserts, selects, updates, deletes, and a transaction that rolls back", async () => {
    const cs = await database("orm");
    const pool = new pg.Pool({ connectionString: cs, max: 4 });
    closers.push(() => pool.end());
    await pool.query("create table notes (id serial primary key, title text not null, stars integer not null default 0, created_at timestamp not null default now())");
    const notes = pgTable("notes", {
      id: serial("id").primaryKey(),
      title: text("title").notNull(),
      stars: integer("stars").notNull().default(0),
      createdAt: timestamp("created_at").notNull().defaultNow(),
    });
    const db = drizzle(pool);
    const inserted = await db.insert(notes).values([{ title: "a", stars: 1 }, { title: "b", stars: 2 }]).returning({ id: notes.id });
    expect(inserted).toEqual([{ id: 1 }, { id: 2 }]);
    await db.update(notes).set({ stars: 5 }).where(eq(notes.title, "a"));
    await expect(
      db.transaction(async (tx) => {
        await tx.insert(notes).values({ title: "never" });
        await tx.delete(notes).where(eq(notes.title, "a"));
        throw new Error("changed my mind");
      }),
    ).rejects.toThrow("changed my mind");
    await db.delete(notes).where(eq(notes.title, "b"));
    const left = await db.select().from(notes);
    expect(left).toHaveLength(1);
    expect(left[0]).toMatchObject({ id: 1, title: "a", stars: 5 });
    expect(left[0]!.createdAt).toBeInstanceOf(Date);
  }, 60_000);
});
