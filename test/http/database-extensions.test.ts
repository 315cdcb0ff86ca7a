// PostgreSQL extensions through a real client: each one users reach for first is created and one of its
// functions called; pg_available_extensions lists only what can be created; they survive a restart of
// Kiln and go into branches; the query API reads and writes their types. Embedded: PGlite's bundles,
// mounted into each database (extensions.ts). Production: the server's own (the test server is Debian's
// postgresql-15, whose contrib is there but not pgvector).
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { connect } from "../support/database-clients";
import { createProject, eventually, removeDir, startKiln, STORE, type TestKiln } from "../support/kiln";

const EMBEDDED = STORE === "embedded";
/** pgvector is not in the production test server (Debian's postgresql-15 packages it separately). */
const HAS_VECTOR = EMBEDDED;

let k: TestKiln;
beforeAll(async () => {
  k = await startKiln();
}, 60_000);
afterAll(async () => {
  if (!k) return;
  await k.stop();
  removeDir(k.dataDir);
});

async function activeDatabase(projectId: string, name: string) {
  const r = await k.api("POST", `/projects/${projectId}/databases`, { body: { name } });
  if (r.status !== 201) throw new Error(`create database: ${r.status} ${r.text}`);
  const d = await eventually(() => k.api("GET", `/projects/${projectId}/databases/${name}`), (x) => x.body.status !== "provisioning");
  if (d.body.status !== "active") throw new Error(`database ${d.body.status}`);
  return d.body as { id: string; connection_string: string };
}

const EXTENSIONS = ["pgcrypto", "uuid-ossp", "pg_trgm", "citext", "hstore", "ltree", "fuzzystrmatch", "btree_gin", "btree_gist", "tablefunc", ...(HAS_VECTOR ? ["vector"] : [])];

/** One statement per extension that fails unless it is installed and its module loads; each answers `ok`. */
const USES: Record<string, string> = {
  pgcrypto: `select crypt('secret', h) = h and length(digest('x', 'sha256')) = 32 as ok from (select crypt('secret', gen_salt('bf', 4)) as h) s`,
  "uuid-ossp": `select uuid_generate_v4()::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-4' and uuid_generate_v5(uuid_ns_url(), 'x')::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-5' as ok`,
  pg_trgm: `select similarity('kiln', 'kilns') > 0.5 and show_trgm('ab') = '{"  a"," ab","ab "}' as ok`,
  citext: `select 'Hello'::citext = 'hELLO'::citext as ok`,
  hstore: `select ('a=>1, b=>2'::hstore -> 'b') = '2' as ok`,
  ltree: `select 'top.science'::ltree @> 'top.science.astronomy'::ltree and nlevel('a.b.c') = 3 as ok`,
  fuzzystrmatch: `select levenshtein('kitten', 'sitting') = 3 and soundex('Robert') = 'R163' as ok`,
  btree_gin: `select count(*) = 1 as ok from pg_indexes where indexname = 'ext_gin_idx'`,
  btree_gist: `select count(*) = 1 as ok from pg_constraint where conname = 'ext_no_overlap'`,
  tablefunc: `select a = 10 and b = 20 as ok from crosstab('select 1, ''a'', 10 union all select 1, ''b'', 20 order by 1, 2') as ct(r int, a int, b int)`,
  vector: `select ('[1,2,3]'::vector <-> '[1,2,5]'::vector) = 2 and vector_dims('[1,2,3]'::vector) = 3 as ok`,
};

/** Objects whose creation needs the extension (a gin index on an integer, a gist exclusion on integers). */
const SETUP: Record<string, string[]> = {
  btree_gin: [`create table ext_gin (n int)`, `create index ext_gin_idx on ext_gin using gin (n)`],
  btree_gist: [`create table ext_rooms (room int, during tsrange, constraint ext_no_overlap exclude using gist (room with =, during with &&))`],
};

async function usesAll(url: string): Promise<Record<string, boolean>> {
  const c = connect(url);
  const out: Record<string, boolean> = {};
  for (const e of EXTENSIONS) out[e] = ((await c.unsafe(USES[e]!)) as unknown as { ok: boolean }[])[0]!.ok;
  await c.end();
  return out;
}

const allTrue = Object.fromEntries(EXTENSIONS.map((e) => [e, true]));

describe("extensions", () => {
  let project: { id: string };
  let db: { id: string; connection_string: string };

  test("each is created through a client's connection and one of its functions works", async () => {
    project = await createProject(k);
    db = await activeDatabase(project.id, "ext");
    const c = connect(db.connection_string);
    const available = (await c.unsafe(`select name from pg_available_extensions`)).map((r) => r.name as string);
    expect(available).toEqual(expect.arrayContaining(EXTENSIONS));
    for (const e of EXTENSIONS) {
      await c.unsafe(`create extension "${e}"`);
      for (const s of SETUP[e] ?? []) await c.unsafe(s);
    }
    const installed = (await c.unsafe(`select extname from pg_extension`)).map((r) => r.extname as string);
    expect(installed).toEqual(expect.arrayContaining(EXTENSIONS));
    await c.end();
    expect(await usesAll(db.connection_string)).toEqual(allTrue);
    // The btree_gist exclusion really works: an overlapping booking of the same room is refused.
    const c2 = connect(db.connection_string);
    await c2.unsafe(`insert into ext_rooms values (1, '[2026-01-01 10:00, 2026-01-01 11:00)')`);
    const err = await c2.unsafe(`insert into ext_rooms values (1, '[2026-01-01 10:30, 2026-01-01 12:00)')`).catch((e) => e);
    expect(err.code).toBe("23P01");
    await c2.end();
  }, 120_000);

  test.skipIf(HAS_VECTOR)("vector is not on this server (Debian's postgresql-15 ships contrib, not pgvector)", async () => {
    const c = connect(db.connection_string);
    const err = await c.unsafe(`create extension vector`).catch((e) => e);
    expect(err.code).toBe("0A000");
    await c.end();
  });

  test.runIf(EMBEDDED)("pg_available_extensions tells the truth: every extension it lists can be created", async () => {
    const scratch = await activeDatabase(project.id, "every_ext");
    const c = connect(scratch.connection_string);
    const listed = (await c.unsafe(`select name from pg_available_extensions order by name`)).map((r) => r.name as string);
    expect(listed.length).toBeGreaterThanOrEqual(35);
    const failed: string[] = [];
    for (const name of listed) await c.unsafe(`create extension if not exists "${name}" cascade`).catch((e) => failed.push(`${name}: ${e.message}`));
    expect(failed).toEqual([]);
    const installed = (await c.unsafe(`select extname from pg_extension order by extname`)).map((r) => r.extname as string);
    expect(installed).toEqual(listed);
    // An extension nobody ships stays "not available".
    expect((await c.unsafe(`create extension postgis`).catch((e) => e)).code).toBe("0A000");
    await c.end();
  }, 180_000);

  test.runIf(EMBEDDED)("the extension files are read-only to a database's superuser", async () => {
    const c = connect(db.connection_string);
    for (const target of ["/kiln/extensions/lib/postgresql/hstore.so", "/kiln/extensions/share/postgresql/extension/evil.control"]) {
      const err = await c.unsafe(`copy (select 'x') to '${target}'`).catch((e) => e);
      expect(err).toBeInstanceOf(Error);
      expect(err.message).toMatch(/permission denied|could not open/i);
    }
    await c.end();
    expect((await usesAll(db.connection_string)).hstore).toBe(true);
  });

  test("the query API reads and writes vector, citext and hstore columns", async () => {
    const c = connect(db.connection_string);
    await c.unsafe(`create table profiles (id bigint generated by default as identity primary key, email citext not null unique, attrs hstore${HAS_VECTOR ? ", embedding vector(3)" : ""})`);
    await c.end();
    const sk = (await k.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const q = (op: string, body: unknown) => k.api("POST", `/databases/ext/query/${op}`, { token: sk, body });
    const ins = await q("insert", { table: "profiles", values: { email: "Alice@Example.com", attrs: 'plan=>pro, seats=>"3"', ...(HAS_VECTOR ? { embedding: [1, 2, 3] } : {}) } });
    expect(ins.status, ins.text).toBe(200);
    const row = { id: expect.anything(), email: "Alice@Example.com", attrs: '"plan"=>"pro", "seats"=>"3"', ...(HAS_VECTOR ? { embedding: "[1,2,3]" } : {}) };
    expect(ins.body).toEqual({ data: [row], count: 1 });
    // citext: the filter matches whatever the case.
    const sel = await q("select", { table: "profiles", filters: [{ column: "email", operator: "eq", value: "ALICE@example.COM" }] });
    expect(sel.status, sel.text).toBe(200);
    expect(sel.body).toEqual({ data: [row], count: 1 });
    const dup = await q("insert", { table: "profiles", values: { email: "alice@EXAMPLE.com" } });
    expect(dup.status).toBe(400);
    expect(dup.body.error).toMatch(/duplicate key/);
    if (HAS_VECTOR) {
      const upd = await q("update", { table: "profiles", values: { embedding: [0.5, -1, 2.25] }, filters: [{ column: "id", operator: "eq", value: 1 }] });
      expect(upd.body.data[0].embedding).toBe("[0.5,-1,2.25]");
      const bad = await q("update", { table: "profiles", values: { embedding: [1, 2] }, filters: [{ column: "id", operator: "eq", value: 1 }] });
      expect(bad.status).toBe(400);
      expect(bad.body.error).toMatch(/expected 3 dimensions/);
    }
  });

  test("a branch of a database that uses them has them too", async () => {
    const r = await k.api("POST", `/projects/${project.id}/databases/ext/branches`, { body: { name: "preview" } });
    expect(r.status, r.text).toBe(202);
    const b = await eventually(() => k.api("GET", `/projects/${project.id}/databases/ext/branches/preview`), (x) => x.body?.status !== "provisioning", 60_000);
    expect(b.body.status).toBe("active");
    expect(await usesAll(b.body.connection_string)).toEqual(allTrue);
    const c = connect(b.body.connection_string);
    expect((await c.unsafe(`select email from profiles where email = 'alice@example.com'`)).map((x) => x.email)).toEqual(["Alice@Example.com"]);
    await c.end();
  }, 90_000);

  test("after a restart of Kiln on the same data, they still work", async () => {
    const { dataDir, databaseUrl, token } = k;
    expect(await k.stop()).toBe(0);
    k = await startKiln({ dataDir, databaseUrl, env: { KILN_PLATFORM_TOKEN: token } });
    const d = await k.api("GET", `/projects/${project.id}/databases/ext`);
    expect(await usesAll(d.body.connection_string)).toEqual(allTrue);
  }, 90_000);
});
