// Dumps of a database with a pg_dump of the version it runs (GET .../dump, kiln db dump) and loads
// with the user's own tools (kiln db restore: psql or pg_restore 15), and pg_version telling what
// runs. Both engines: embedded (PGlite, PostgreSQL 18, pg_dump 18 in WebAssembly) and postgres (the
// PostgreSQL 15 server of the test run, its pg_dump).
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { activeDatabase, dbPath } from "../support/databases";
import { createProject, createToken, eventually, removeDir, STORE, useCli, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln();
const cli = useCli(k, { passToken: true });
const PG15 = "/usr/lib/postgresql/15/bin";
const dir = mkdtempSync(join(tmpdir(), "kiln-dumps-"));
afterAll(() => removeDir(dir));

/** A database with what a dump must carry: rows (text with a tab, a quote, non-ASCII, NULL), a sequence, a function, a view, an index, RLS and its policy, a grant. */
async function filledDatabase(kiln: TestKiln = k) {
  const project = await createProject(kiln);
  const db = await activeDatabase(kiln, project.id);
  const c = connect(db.connection_string);
  await c.unsafe(`
    create table items (id bigint generated always as identity primary key, name text not null, qty int default 1, note text);
    create index items_name on items (name);
    insert into items (name, qty, note) values ('plain', 1, null), (E'tab\\there', 2, 'it''s'), ('Grüße ☃', 3, 'x');
    insert into items (name, qty) select 'bulk ' || g, g from generate_series(1, 500) g;
    create function double_qty(x int) returns int language sql immutable as 'select x * 2';
    create view big_items as select id, name, double_qty(qty) as doubled from items where qty > 250;
    alter table items enable row level security;
    create policy readable on items for select to authenticated using (qty > 0);
    grant select on items to authenticated;
  `);
  await c.end({ timeout: 1 });
  return { project, db };
}

/** What a round trip must keep: rows, columns, the function's result, the view's rows, the index and policy. */
async function contents(url: string) {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 30 });
  try {
    return {
      rows: (await c`select id::int, name, qty, note from items order by id`).map((r) => ({ ...r })),
      columns: (await c`select column_name, data_type, column_default, is_identity from information_schema.columns where table_name = 'items' order by ordinal_position`).map((r) => ({ ...r })),
      fn: (await c`select double_qty(21) as v`)[0]!.v,
      view: (await c`select count(*)::int as n, sum(doubled)::int as s from big_items`)[0],
      indexes: (await c`select indexname from pg_indexes where tablename = 'items' order by 1`).map((r) => r.indexname),
      policies: (await c`select policyname, cmd from pg_policies where tablename = 'items'`).map((r) => ({ ...r })),
      rls: (await c`select relrowsecurity from pg_class where relname = 'items'`)[0]!.relrowsecurity,
      // The identity sequence's position (compared apart: see sameContents).
      sequence: Number((await c.unsafe(`select last_value from ${(await c`select pg_get_serial_sequence('items', 'id') as s`)[0]!.s}`))[0]!.last_value),
    };
  } finally {
    await c.end({ timeout: 1 });
  }
}

/**
 * The copy holds what the original held. Its identity sequence goes on from where the original's
 * did, or (embedded: the dump is of a snapshot, which PostgreSQL opens as after a crash) up to 32
 * further on, PostgreSQL's logged-ahead sequence values: never a value the original handed out.
 */
async function sameContents(copyUrl: string, before: Awaited<ReturnType<typeof contents>>) {
  const after = await contents(copyUrl);
  expect({ ...after, sequence: 0 }).toEqual({ ...before, sequence: 0 });
  expect(after.sequence).toBeGreaterThanOrEqual(before.sequence);
  expect(after.sequence).toBeLessThanOrEqual(before.sequence + (STORE === "embedded" ? 32 : 0));
}

async function download(projectId: string, format?: string, token?: string) {
  const res = await fetch(`${k.url}${dbPath(projectId)}/dump${format ? `?format=${format}` : ""}`, { headers: { Authorization: `Bearer ${token ?? k.token}` } });
  const bytes = new Uint8Array(await res.arrayBuffer());
  return { res, bytes };
}

async function serverMajor(url: string): Promise<number> {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 30 });
  try {
    return Math.floor(Number((await c`show server_version_num`)[0]!.server_version_num) / 10000);
  } finally {
    await c.end({ timeout: 1 });
  }
}

/** A new active database in a project of its own (HOBBY: one database a project). */
async function emptyDatabase(name = "copy") {
  const p = await createProject(k);
  return { project: p, db: await activeDatabase(k, p.id, name) };
}

/**
 * One filled database for the route and round-trip tests, made once, with what it held then, and its
 * first plain and custom dumps, taken once: a database and a dump cost seconds each on the embedded
 * engine (a snapshot opened on a thread of its own and pg_dump in WebAssembly), and these tests only
 * read them. Tests that write to it do so after the dumps are taken (sharedDump first), so a round
 * trip compares its copy with `before`, what that dump holds. The CLI test has a database of its own.
 */
let shared: Promise<{ project: { id: string }; db: { id: string; connection_string: string }; before: Awaited<ReturnType<typeof contents>> }> | undefined;
const sharedFilled = () =>
  (shared ??= (async () => {
    const { project, db } = await filledDatabase();
    return { project, db, before: await contents(db.connection_string) };
  })());
const sharedDumps = new Map<string, Promise<Awaited<ReturnType<typeof download>>>>();
async function sharedDump(format: "plain" | "custom") {
  const { project } = await sharedFilled();
  if (!sharedDumps.has(format)) sharedDumps.set(format, download(project.id, format === "custom" ? undefined : format));
  return sharedDumps.get(format)!;
}

function run(cmd: string, args: string[]) {
  const r = spawnSync(cmd, args, { encoding: "utf8", timeout: 60_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

describe("pg_version is the version that runs", () => {
  test("GET /databases/versions names it; a database's pg_version is it, what was asked for is requested_pg_version", async () => {
    const p = await createProject(k);
    const r = await k.api("POST", `/projects/${p.id}/databases`, { body: { name: "v", pg_version: 15 } });
    expect(r.status).toBe(201);
    const db = (await eventually(() => k.api("GET", dbPath(p.id, "v")), (x) => x.body.status === "active", 30_000)).body;
    const runs = await serverMajor(db.connection_string);
    expect(runs).toBe(STORE === "embedded" ? 18 : 15);
    const versions = await k.api("GET", "/databases/versions", { token: null });
    expect(versions.status).toBe(200);
    expect(versions.body.runs).toBe(runs);
    expect(versions.body.versions).toEqual([14, 15, 16]);
    expect(versions.body.engine.server_versions).toEqual([runs]);
    expect(versions.body.engine.note).toContain("requested_pg_version");
    expect(versions.body.client_tools).toContain(`pg_restore ${runs} or newer`);
    const got = await k.api("GET", dbPath(p.id, "v"));
    expect(got.body.pg_version).toBe(runs);
    expect(got.body.requested_pg_version).toBe(15);
    const list = await k.api("GET", `/projects/${p.id}/databases`);
    expect(list.body.data[0]).toMatchObject({ pg_version: runs, requested_pg_version: 15 });
  });
});

describe("GET .../databases/{name}/dump", () => {
  test("platform or full-scope token; read-only token, end-user token and anon key 403, no token 401, in the error shape; 404 unknown database; 400 bad format", async () => {
    const { project } = await sharedFilled();
    const ro = await createToken(k, project.id, { scope: "read_only" });
    const full = await createToken(k, project.id, { scope: "full" });
    const denied = await download(project.id, "plain", ro.token);
    expect(denied.res.status).toBe(403);
    expect(JSON.parse(new TextDecoder().decode(denied.bytes))).toEqual({ error: expect.stringMatching(/full-scope/) });
    const ok = await download(project.id, "plain", full.token);
    expect(ok.res.status).toBe(200);
    // An end user of the project (signed in through the anon key) is no management credential.
    const anon = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key as string;
    expect((await k.api("POST", `/projects/${project.id}/users`, { body: { email: "dumper@example.com", password: "long enough" } })).status).toBe(201);
    const signin = await k.api("POST", "/auth/signin", { token: anon, body: { email: "dumper@example.com", password: "long enough" } });
    expect(signin.status).toBe(200);
    // Refused as by every management route (the database's own GET): 403, an end user's token or the anon key.
    for (const token of [signin.body.access_token as string, anon]) {
      const r = await k.api("GET", `${dbPath(project.id)}/dump`, { token });
      expect(r.status).toBe(403);
      expect(r.body).toEqual({ error: expect.any(String) });
      expect(r.body).toEqual((await k.api("GET", dbPath(project.id), { token })).body);
    }
    const none = await k.api("GET", `${dbPath(project.id)}/dump`, { token: null });
    expect(none.status).toBe(401);
    expect(none.body).toEqual({ error: expect.any(String) });
    expect((await k.api("GET", `${dbPath(project.id, "nope")}/dump`)).status).toBe(404);
    const bad = await k.api("GET", `${dbPath(project.id)}/dump?format=tar`);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain("format");
  });

  test("custom (the default) and plain: streamed with their length and type; sizes grow with the data; what the plain one holds", async () => {
    const { project } = await sharedFilled();
    // The default format is custom: asked for without ?format (as sharedDump("custom") does).
    const custom = await sharedDump("custom");
    expect(custom.res.status).toBe(200);
    expect(custom.res.headers.get("content-type")).toBe("application/octet-stream");
    expect(custom.res.headers.get("content-disposition")).toBe('attachment; filename="app.dump"');
    expect(Number(custom.res.headers.get("x-kiln-dump-bytes"))).toBe(custom.bytes.length);
    expect(Buffer.from(custom.bytes.subarray(0, 5)).toString("latin1")).toBe("PGDMP");
    expect(custom.bytes.length).toBeGreaterThan(2_000);
    expect(custom.bytes.length).toBeLessThan(200_000);

    const plain = await sharedDump("plain");
    expect(plain.res.status).toBe(200);
    expect(plain.res.headers.get("content-type")).toBe("application/sql; charset=utf-8");
    expect(Number(plain.res.headers.get("x-kiln-dump-bytes"))).toBe(plain.bytes.length);
    const sql = new TextDecoder().decode(plain.bytes);
    expect(sql).toContain(`-- Dumped from database version ${STORE === "embedded" ? "18" : "15"}.`);
    expect(sql).toContain("CREATE TABLE public.items");
    expect(sql).toContain("CREATE FUNCTION public.double_qty(x integer)");
    expect(sql).toContain("CREATE VIEW public.big_items");
    expect(sql).toContain("CREATE POLICY readable ON public.items");
    expect(sql).toContain("bulk 500");
    // What a PostgreSQL 15 server refuses, owners (restored objects belong to whoever loads them),
    // and Kiln's own schema (every Kiln database has it) are left out.
    expect(sql).not.toContain("transaction_timeout");
    expect(sql).not.toMatch(/OWNER TO/);
    expect(sql).not.toMatch(/CREATE SCHEMA auth|FUNCTION auth\./);
    // More data, a larger dump: the size is the dump's, not a constant.
    const c = connect((await k.api("GET", dbPath(project.id))).body.connection_string);
    await c`insert into items (name, qty) select repeat('y', 200), 1 from generate_series(1, 2000)`;
    await c.end({ timeout: 1 });
    const bigger = await download(project.id, "plain");
    expect(bigger.bytes.length).toBeGreaterThan(plain.bytes.length + 400_000);
  });

  test("the database serves its clients while a dump is taken", async () => {
    await sharedDump("plain");
    await sharedDump("custom"); // taken before this test writes to the database
    const { project, db } = await sharedFilled();
    const c = connect(db.connection_string);
    const dumping = download(project.id, "custom");
    const answered: number[] = [];
    let done = false;
    void dumping.finally(() => (done = true));
    while (!done) {
      const t = performance.now();
      await c`insert into items (name) values ('during')`;
      answered.push(performance.now() - t);
    }
    expect((await dumping).res.status).toBe(200);
    await c.end({ timeout: 1 });
    // A dump that held the database would let one or two through (before it and after it).
    expect(answered.length).toBeGreaterThanOrEqual(5);
  });
});

describe("round trip: dump, then load into a new Kiln database with PostgreSQL 15's tools", () => {
  test("plain: psql 15 loads it; rows, columns, function, view, index, policy and the identity's sequence are the same", async () => {
    const { project, before } = await sharedFilled();
    const { bytes } = await sharedDump("plain");
    const file = join(dir, `plain-${project.id}.sql`);
    writeFileSync(file, bytes);
    const target = await emptyDatabase();
    const r = run(join(PG15, "psql"), ["-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-f", file, target.db.connection_string]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    await sameContents(target.db.connection_string, before);
  });

  test("custom: pg_restore of the dumping server's version restores it", async () => {
    const { project, before } = await sharedFilled();
    const { bytes } = await sharedDump("custom");
    const file = join(dir, `custom-${project.id}.dump`);
    writeFileSync(file, bytes);
    const list = run(join(PG15, "pg_restore"), ["--list", file]);
    if (STORE === "embedded") {
      // pg_dump 18's archive (format 1.16): pg_restore 15 cannot read it, which versions' client_tools says.
      expect(list.code).not.toBe(0);
      expect(list.err).toContain("unsupported version (1.16)");
      return;
    }
    expect(list.code).toBe(0);
    const target = await emptyDatabase();
    const r = run(join(PG15, "pg_restore"), ["--no-owner", "--exit-on-error", "--single-transaction", "--dbname", target.db.connection_string, file]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    await sameContents(target.db.connection_string, before);
  });

  test("CLI: kiln db dump writes the file, kiln db restore loads it with psql or pg_restore", async () => {
    const { project, db } = await filledDatabase();
    const before = await contents(db.connection_string);
    const file = join(dir, `cli-${project.id}.sql`);
    const dumped = cli.json("db", "dump", "app", "--project", project.id, "--format", "plain", "-o", file);
    expect(dumped).toMatchObject({ file, format: "plain", pg_version: STORE === "embedded" ? 18 : 15 });
    expect(dumped.size_bytes).toBe(readFileSync(file).length);
    expect(readFileSync(file, "utf8")).toContain("CREATE TABLE public.items");
    const customFile = join(dir, `cli-${project.id}.dump`);
    const human = cli.run("db", "dump", "app", "--project", project.id, "-o", customFile);
    expect(human.code).toBe(0);
    expect(human.out).toMatch(/Wrote .*cli-.*\.dump \(custom, [\d.]+ KiB/);
    expect(readFileSync(customFile).subarray(0, 5).toString("latin1")).toBe("PGDMP");
    // Errors are the grammar's: an unknown database is a 404 line under --json.
    const missing = cli.run("--json", "db", "dump", "nope", "--project", project.id);
    expect(missing.code).not.toBe(0);
    expect(JSON.parse(missing.err.trim().split("\n").pop()!)).toMatchObject({ status: 404 });

    const target = await emptyDatabase();
    const restored = cli.json("db", "restore", "copy", file, "--project", target.project.id, "--pg-bin", PG15);
    expect(restored).toEqual({ restored: file, database: "copy", format: "plain" });
    await sameContents(target.db.connection_string, before);
    if (STORE === "postgres") {
      const again = await emptyDatabase();
      expect(cli.json("db", "restore", "copy", customFile, "--project", again.project.id, "--pg-bin", PG15)).toMatchObject({ format: "custom" });
      await sameContents(again.db.connection_string, before);
    } else {
      // The embedded engine's custom dump needs pg_restore 18: the CLI says so.
      const again = await emptyDatabase();
      const r = cli.run("db", "restore", "copy", customFile, "--project", again.project.id, "--pg-bin", PG15);
      expect(r.code).not.toBe(0);
      expect(r.err).toContain("needs a pg_restore as new as the pg_dump that made it");
    }
  });
});
