// Least privilege in managed databases: `anonymous` (the anon key) and `authenticated` (end users) get
// nothing on user tables until the owner grants it; row-level security then decides the rows. The lint
// route and `kiln db lint` list what RLS does not guard; databases made with the old default grants are
// upgraded when Kiln opens them.
import { randomBytes } from "node:crypto";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import { connect, withApp } from "../support/database-clients";
import { createProject, createToken, eventually, removeDir, startKiln, useCli, useKiln, type TestKiln } from "../support/kiln";


async function activeDatabase(kiln: TestKiln, projectId: string, name: string) {
  const r = await kiln.api("POST", `/projects/${projectId}/databases`, { body: { name } });
  if (r.status !== 201) throw new Error(`create database: ${r.status} ${r.text}`);
  const d = await eventually(() => kiln.api("GET", `/projects/${projectId}/databases/${r.body.name}`), (x) => x.body.status !== "provisioning");
  if (d.body.status !== "active") throw new Error(`database ${d.body.status}`);
  return d.body as { id: string; database_name: string; connection_string: string };
}

/** A project with an active database, a full service key, the anon key and a signed-up end user. */
async function setup(kiln: TestKiln, name = "app") {
  const project = await createProject(kiln);
  const db = await activeDatabase(kiln, project.id, name);
  const sk = (await kiln.api("POST", `/projects/${project.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
  const anon = (await kiln.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key as string;
  const signup = await kiln.api("POST", "/auth/signup", { token: anon, body: { email: `u-${randomBytes(4).toString("hex")}@example.com`, password: "long enough" } });
  if (signup.status !== 201 && signup.status !== 200) throw new Error(`signup: ${signup.status} ${signup.text}`);
  const user = { token: signup.body.access_token as string, id: signup.body.user.id as string };
  const admin = connect(db.connection_string);
  const q = (op: string, body: unknown, token: string) => kiln.api("POST", `/databases/${db.database_name}/query/${op}`, { token, body });
  return { project, db, sk, anon, user, admin, q };
}

const eq = (column: string, value: unknown) => [{ column, operator: "eq", value }];

// One Kiln for the route and CLI tests (the upgrade test below restarts Kilns of its own).
const k = useKiln();

describe("privileges of the anon key and end users", () => {

  test("a table without grants: the anon key and end users are refused (403, naming the role and the grant) for every operation; the service key is not", async () => {
    const { q, sk, anon, user, admin } = await setup(k);
    await admin.unsafe(`create table items (id int primary key, name text); insert into items values (1, 'a'), (2, 'b')`);
    const ops = [
      ["select", { table: "items" }, "select"],
      ["insert", { table: "items", values: { id: 3, name: "c" } }, "select, insert"],
      ["update", { table: "items", values: { name: "x" }, filters: eq("id", 1) }, "select, update"],
      ["delete", { table: "items", filters: eq("id", 1) }, "select, delete"],
    ] as const;
    for (const [role, token] of [["anonymous", anon], ["authenticated", user.token]] as const) {
      for (const [op, body, grant] of ops) {
        const r = await q(op, body, token);
        expect(r.status, `${role} ${op}: ${r.text}`).toBe(403);
        expect(Object.keys(r.body)).toEqual(["error"]);
        expect(r.body.error).toMatch(/^permission denied for table items: role /);
        expect(r.body.error).toContain(`grant ${grant} on items to ${role}`);
        for (const h of ["x-service-proxy-ms", "x-service-compute-ms"]) expect(r.headers.get(h)).toMatch(/^\d+$/);
      }
    }
    expect((await admin`select count(*)::int as n from items`)[0]!.n).toBe(2); // nothing changed
    // The service key bypasses: it owns the tables.
    expect((await q("select", { table: "items" }, sk)).body.count).toBe(2);
    expect((await q("insert", { table: "items", values: { id: 3, name: "c" } }, sk)).status).toBe(200);
    expect((await q("delete", { table: "items", filters: eq("id", 3) }, sk)).body.count).toBe(1);
    // Tables, views and sequences made later get nothing either (no default privileges).
    const acl = await admin`select count(*)::int as n from pg_default_acl`;
    expect(acl[0]!.n).toBe(0);
  });

  test("anon key: a grant without RLS opens the rows; RLS with no policy hides them; a policy shows its rows", async () => {
    const { q, anon, sk, admin } = await setup(k);
    await admin.unsafe(`create table posts (id int primary key, title text, published boolean not null default false);
      insert into posts values (1, 'draft', false), (2, 'hello', true), (3, 'world', true)`);
    await admin`grant select on posts to anonymous`;
    const open = await q("select", { table: "posts", order: [{ column: "id", ascending: true }] }, anon);
    expect(open.status, open.text).toBe(200);
    expect(open.body.count).toBe(3);
    // SELECT alone: writing is still refused.
    const ins = await q("insert", { table: "posts", values: { id: 4, title: "spam" } }, anon);
    expect(ins.status).toBe(403);
    expect(ins.body.error).toContain("grant select, insert on posts to anonymous");
    await admin`alter table posts enable row level security`;
    expect((await q("select", { table: "posts" }, anon)).body).toEqual({ data: [], count: 0 });
    await admin.unsafe(`create policy published on posts for select to anonymous using (published)`);
    const seen = await q("select", { table: "posts", select: ["id"], order: [{ column: "id", ascending: true }] }, anon);
    expect(seen.body).toEqual({ data: [{ id: 2 }, { id: 3 }], count: 2 });
    // With INSERT granted, RLS still refuses a row no policy admits: 403 with PostgreSQL's message.
    await admin`grant insert on posts to anonymous`;
    const refused = await q("insert", { table: "posts", values: { id: 5, title: "x", published: true } }, anon);
    expect(refused.status).toBe(403);
    expect(refused.body.error).toMatch(/row-level security/);
    expect((await q("select", { table: "posts" }, sk)).body.count).toBe(3);
  });

  test("end users: nothing by default; grants plus RLS give each user their own rows; a serial needs its sequence granted, an identity column does not", async () => {
    const { q, user, admin, sk, anon, db } = await setup(k);
    const other = crypto.randomUUID();
    await admin.unsafe(`
      create table notes (id serial primary key, user_id uuid not null default auth.uid(), body text);
      create table todos (id bigint generated by default as identity primary key, user_id uuid not null default auth.uid(), body text);
      alter table notes enable row level security;
      alter table todos enable row level security;
      create policy own on notes to authenticated using (user_id = auth.uid()) with check (user_id = auth.uid());
      create policy own on todos to authenticated using (user_id = auth.uid()) with check (user_id = auth.uid());
    `);
    await admin`insert into notes (user_id, body) values (${user.id}, 'mine'), (${other}, 'theirs')`;
    expect((await q("select", { table: "notes" }, user.token)).status).toBe(403);
    await admin.unsafe(`grant select, insert, update, delete on notes, todos to authenticated`);
    expect((await q("select", { table: "notes", select: ["body"] }, user.token)).body).toEqual({ data: [{ body: "mine" }], count: 1 });
    // serial: nextval needs USAGE on the sequence.
    const noSeq = await q("insert", { table: "notes", values: { body: "new" } }, user.token);
    expect(noSeq.status).toBe(403);
    expect(noSeq.body.error).toMatch(/^permission denied for sequence notes_id_seq: role authenticated .*grant usage on sequence notes_id_seq to authenticated/);
    await admin`grant usage on sequence notes_id_seq to authenticated`;
    const made = await q("insert", { table: "notes", values: { body: "new" } }, user.token);
    expect(made.status, made.text).toBe(200);
    expect(made.body.data[0].user_id).toBe(user.id);
    // identity: no sequence grant needed.
    const todo = await q("insert", { table: "todos", values: { body: "t" } }, user.token);
    expect(todo.status, todo.text).toBe(200);
    expect((await q("update", { table: "notes", values: { body: "edited" }, filters: [{ column: "id", operator: "gte", value: 0 }] }, user.token)).body.count).toBe(2);
    expect((await q("delete", { table: "notes", filters: eq("body", "theirs") }, user.token)).body.count).toBe(0);
    expect((await q("select", { table: "notes" }, sk)).body.count).toBe(3);
    // The grants were to authenticated: the anon key still has nothing.
    expect((await q("select", { table: "notes" }, anon)).status).toBe(403);
    // The wire path as an end user (service_user_access) follows the same grants.
    const asUser = connect(withApp(db.connection_string, `service_user_access:${user.id}`));
    expect(await asUser`select body from notes order by id`).toEqual([{ body: "edited" }, { body: "edited" }]);
    await admin`revoke all on notes from authenticated`;
    await expect(asUser`select body from notes`).rejects.toMatchObject({ code: "42501" });
  });

  test("lint: tables without RLS, exposed when anonymous or authenticated can use them; security_invoker views are left out", async () => {
    const { project, admin } = await setup(k);
    await admin.unsafe(`
      create table private_t (id int);
      create table public_read (id int);
      create table guarded (id int);
      create table colgrant (id int, secret text);
      alter table guarded enable row level security;
      grant select on public_read to anonymous;
      grant select, insert on guarded to anonymous, authenticated;
      grant update (id) on colgrant to authenticated;
      create view v_definer as select * from private_t;
      grant select on v_definer to authenticated;
      create view v_invoker with (security_invoker) as select * from guarded;
      grant select on v_invoker to anonymous;
      create schema extra;
      create table extra.hidden (id int);
      grant select on extra.hidden to anonymous;
    `);
    const r = await k.api("GET", `/projects/${project.id}/databases/app/lint`);
    expect(r.status, r.text).toBe(200);
    const byName = Object.fromEntries(r.body.tables_without_rls.map((t: any) => [`${t.schema}.${t.name}`, t]));
    expect(Object.keys(byName).sort()).toEqual(["extra.hidden", "public.colgrant", "public.private_t", "public.public_read", "public.v_definer"]);
    expect(byName["public.private_t"]).toEqual({ schema: "public", name: "private_t", kind: "table", anonymous: [], authenticated: [], exposed: false });
    expect(byName["public.public_read"]).toMatchObject({ anonymous: ["SELECT"], authenticated: [], exposed: true });
    expect(byName["public.colgrant"]).toMatchObject({ anonymous: [], authenticated: ["UPDATE"], exposed: true });
    expect(byName["public.v_definer"]).toMatchObject({ kind: "view", authenticated: ["SELECT"], exposed: true });
    // No USAGE on schema extra: the grant on its table reaches nobody.
    expect(byName["extra.hidden"]).toMatchObject({ anonymous: [], exposed: false });
    expect(r.body.exposed_tables).toEqual(["public.colgrant", "public.public_read", "public.v_definer"]);
    // An ordinary read: read-only tokens may lint; unknown database 404.
    const ro = await createToken(k, project.id, { scope: "read_only" });
    expect((await k.api("GET", `/projects/${project.id}/databases/app/lint`, { token: ro.token })).status).toBe(200);
    expect((await k.api("GET", `/projects/${project.id}/databases/nope/lint`)).status).toBe(404);
    expect((await k.api("GET", `/projects/${project.id}/databases/app/lint`, { token: null })).status).toBe(401);
  });
});

describe("kiln db lint", () => {
  const { run: kiln, json } = useCli(k, { passToken: true });

  test("prints the tables without RLS and warns about exposed ones; --json gives the route's answer", async () => {
    const { project, admin } = await setup(k, "shop");
    expect(kiln("db", "lint", "shop", "--project", project.id).out).toMatch(/Every table has row-level security enabled/);
    await admin.unsafe(`create table catalog (id int); create table drafts (id int); grant select on catalog to anonymous;
      create table orders (id int); alter table orders enable row level security; grant select on orders to authenticated`);
    const r = kiln("db", "lint", "shop", "--project", project.id);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toMatch(/^TABLE\s+KIND\s+ANONYMOUS\s+AUTHENTICATED\s+EXPOSED/m);
    expect(r.out).toMatch(/public\.catalog\s+table\s+SELECT\s+-\s+EXPOSED/);
    expect(r.out).toMatch(/public\.drafts\s+table\s+-\s+-\s+no/);
    expect(r.out).not.toContain("orders");
    expect(r.out).toMatch(/warning: public\.catalog has no row-level security/);
    expect(r.out).not.toMatch(/warning: public\.drafts/);
    const j = json("db", "lint", "shop", "--project", project.id);
    expect(j.exposed_tables).toEqual(["public.catalog"]);
    expect(j.tables_without_rls.map((t: any) => t.name)).toEqual(["catalog", "drafts"]);
    expect(kiln("db", "lint", "nope", "--project", project.id).err.trim()).toBe("kiln: 404 database not found");
  });
});

// Last in the file: it stops the file's Kiln and restarts Kilns of its own on its data (as a user's
// upgrade of Kiln would), which the file's hooks then no longer reach; this test stops and removes them.
describe("databases made with the old default grants", () => {
  test("are upgraded when Kiln opens them: tables without RLS lose the old grants, RLS tables keep theirs, default privileges go; once only", { timeout: 150_000 }, async () => {
    let kiln: TestKiln = k;
    const { dataDir, databaseUrl, token } = kiln;
    try {
      const { project, db, anon, user, q, admin } = await setup(kiln);
      // The state a database made by the previous Kiln is in: no marker, default grants to both roles.
      await admin.unsafe(`
        comment on schema auth is null;
        alter default privileges in schema public grant all on tables to authenticated, anonymous;
        alter default privileges in schema public grant all on sequences to authenticated, anonymous;
        alter default privileges in schema public grant execute on functions to authenticated, anonymous;
        create table open_t (id serial primary key, v text);
        insert into open_t (v) values ('a'), ('b');
        create view open_v as select * from open_t;
        create table guarded (id serial primary key, user_id uuid not null default auth.uid(), v text);
        alter table guarded enable row level security;
        create policy own on guarded to authenticated using (user_id = auth.uid()) with check (user_id = auth.uid());
      `);
      // The old grants really are there: the anon key reads a table without RLS.
      expect((await q("select", { table: "open_t" }, anon)).body.count).toBe(2);
      expect((await q("select", { table: "open_v" }, anon)).body.count).toBe(2);
      await admin.end();

      await kiln.stop();
      kiln = await startKiln({ dataDir, databaseUrl, env: { KILN_PLATFORM_TOKEN: token } });
      const conn = (await kiln.api("GET", `/projects/${project.id}/databases/${db.database_name}`)).body.connection_string as string;
      const q2 = (op: string, body: unknown, t: string) => kiln.api("POST", `/databases/${db.database_name}/query/${op}`, { token: t, body });
      for (const table of ["open_t", "open_v"]) {
        const r = await q2("select", { table }, anon);
        expect(r.status, `${table}: ${r.text}`).toBe(403);
        expect((await q2("select", { table }, user.token)).status).toBe(403);
      }
      // The RLS table keeps its grants (its policy decides), sequence included: the app still works.
      const ins = await q2("insert", { table: "guarded", values: { v: "mine" } }, user.token);
      expect(ins.status, ins.text).toBe(200);
      expect((await q2("select", { table: "guarded", select: ["v"] }, user.token)).body).toEqual({ data: [{ v: "mine" }], count: 1 });
      expect((await q2("select", { table: "guarded" }, anon)).body.count).toBe(0);
      const admin2 = connect(conn);
      expect((await admin2`select count(*)::int as n from pg_default_acl where defaclnamespace = 'public'::regnamespace`)[0]!.n).toBe(0);
      expect((await admin2`select obj_description('auth'::regnamespace, 'pg_namespace') as c`)[0]!.c).toMatch(/^kiln: privileges model 2/);
      await admin2`create table later (id int)`;
      expect((await q2("select", { table: "later" }, anon)).status).toBe(403);
      const lint = await kiln.api("GET", `/projects/${project.id}/databases/${db.database_name}/lint`);
      expect(lint.body.exposed_tables).toEqual([]);
      expect(lint.body.tables_without_rls.map((t: any) => t.name)).toEqual(["later", "open_t", "open_v"]);
      // The owner's grants after the upgrade are theirs: another start leaves them alone.
      await admin2`grant select on open_t to anonymous`;
      await admin2.end();
      await kiln.stop();
      kiln = await startKiln({ dataDir, databaseUrl, env: { KILN_PLATFORM_TOKEN: token } });
      const again = await kiln.api("POST", `/databases/${db.database_name}/query/select`, { token: anon, body: { table: "open_t" } });
      expect(again.status, again.text).toBe(200);
      expect(again.body.count).toBe(2);
    } finally {
      await kiln.stop();
      removeDir(dataDir);
    }
  });
});
