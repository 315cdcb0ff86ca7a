// A tenant's connection string reaches its own database and nothing else (issue 24). On the production
// engine every managed database has a login role of its own: whatever a client runs, in either access
// mode and after RESET ROLE, it is that role, never Kiln's and never a superuser, so the server's
// programs, files, configuration, roles and other databases stay out of reach. On the embedded engine
// each database is a PGlite instance of its own: the service role is that instance's superuser, and
// what it can do stays inside the instance (WebAssembly: no processes, no host files).
import { randomBytes } from "node:crypto";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { tenantRoleName } from "../../server/backends/databases/tenant-roles";
import { makeSecretKey, parseKey } from "../../server/secrets/secret-key";
import { connect, withApp } from "../support/database-clients";
import { activeDatabase, backup } from "../support/databases";
import { startPgServer, type PgServer } from "../support/postgres-server";
import { createProject, eventually, freshDatabase, startKiln, STORE, TEST_SECRET_KEY, useKiln, type TestKiln } from "../support/kiln";

type Err = { code?: string; message: string };

/** The error a statement raises, or null when it ran. */
async function attempt(c: postgres.Sql, sql: string): Promise<Err | null> {
  try {
    await c.unsafe(sql);
    return null;
  } catch (err) {
    const e = err as { code?: string; message: string };
    return { code: e.code, message: e.message };
  }
}

/** A project with an active database, an end user, and a session in each access mode (one connection each). */
async function tenant(k: TestKiln, name = "app") {
  const project = await createProject(k);
  const db = await activeDatabase(k, project.id, name);
  const anon = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key as string;
  const signup = await k.api("POST", "/auth/signup", { token: anon, body: { email: `u-${randomBytes(4).toString("hex")}@example.com`, password: "long enough" } });
  if (signup.status !== 201 && signup.status !== 200) throw new Error(`signup: ${signup.status} ${signup.text}`);
  const userId = signup.body.user.id as string;
  return {
    project,
    db,
    userId,
    sessions: {
      service_full_access: () => connect(db.connection_string),
      service_user_access: () => connect(withApp(db.connection_string, `service_user_access:${userId}`)),
    },
  };
}

/** The server-side name of a Kiln database (production engine). */
const serverDb = (id: string) => `kiln_${id}`;

/** What a tenant's role could have been given by mistake: each must be refused (42501). */
function refusedStatements(kilnRole: string): string[] {
  return [
    `set role ${kilnRole}`,
    `set session authorization ${kilnRole}`,
    `copy (select 1) to program 'id > /tmp/kiln-tenant-escape'`,
    `copy loot from program 'id'`,
    `select pg_read_file('/etc/passwd')`,
    `select pg_ls_dir('/')`,
    `select lo_import('/etc/passwd')`,
    `alter system set work_mem = '1MB'`,
    `create role evil_${randomBytes(3).toString("hex")} superuser`,
    `create role plain_${randomBytes(3).toString("hex")}`,
    `grant pg_execute_server_program to current_user`,
    `grant pg_read_server_files to current_user`,
    `create extension dblink`,
    `create extension postgres_fdw`,
    `create tablespace escape location '/tmp'`,
    `alter role current_user superuser`,
    // (CREATE DATABASE is answered by Kiln itself, as a managed database of the project: see
    // database-create-over-wire.test.ts; the role's own lack of CREATEDB is checked below.)
  ];
}

describe.skipIf(STORE !== "postgres")("production engine: a tenant's sessions run as its own role", () => {
  const k = useKiln();
  let a: Awaited<ReturnType<typeof tenant>>;
  let b: Awaited<ReturnType<typeof tenant>>;
  const kilnRole = () => new URL(inject("pgUrl")).username;

  beforeAll(async () => {
    [a, b] = [await tenant(k), await tenant(k, "other")];
    const owner = a.sessions.service_full_access();
    await owner.unsafe(`create table loot (x text)`);
    await owner.unsafe(`grant all on loot to authenticated`);
    await b.sessions.service_full_access().unsafe(`create table secrets (x text); insert into secrets values ('b only')`);
  });

  for (const mode of ["service_full_access", "service_user_access"] as const) {
    test(`${mode}: RESET ROLE gives back the tenant's role, no superuser; every escape is refused, before and after it`, async () => {
      const c = a.sessions[mode]();
      const [before] = await c.unsafe(`select current_user::text as cu, session_user::text as su`);
      expect(before!.su).toBe(tenantRoleName(a.db.id));
      expect(before!.cu).toBe(mode === "service_user_access" ? "authenticated" : tenantRoleName(a.db.id));
      for (const phase of ["as connected", "after reset role"]) {
        if (phase === "after reset role") await c.unsafe(`reset role`);
        const [who] = await c.unsafe(
          `select current_user::text as cu, session_user::text as su, (select rolsuper from pg_roles where rolname = current_user) as sup,
                  (select rolcreatedb from pg_roles where rolname = session_user) as createdb,
                  array(select rolname::text from pg_roles where pg_has_role(session_user, oid, 'MEMBER') order by 1) as member_of`,
        );
        expect(who!.sup, phase).toBe(false);
        expect(who!.createdb, phase).toBe(false);
        expect(who!.su, phase).toBe(tenantRoleName(a.db.id));
        // Its own role, the two end-user roles, and (as its database's owner) pg_database_owner: nothing of Kiln's, no other pg_* role.
        expect(who!.member_of, phase).toEqual(["anonymous", "authenticated", tenantRoleName(a.db.id), "pg_database_owner"].sort());
        for (const sql of refusedStatements(kilnRole())) {
          const err = await attempt(c, sql);
          expect(err, `${mode} ${phase}: ${sql}`).not.toBeNull();
          expect(err!.code, `${mode} ${phase}: ${sql}: ${err!.message}`).toBe("42501");
        }
        const [priv] = await c.unsafe(
          `select has_database_privilege(current_user, $1, 'CONNECT') as other, has_database_privilege(current_user, $2, 'CONNECT') as control`,
          [serverDb(b.db.id), decodeURIComponent(new URL(k.databaseUrl!).pathname.slice(1))],
        );
        expect(priv, phase).toEqual({ other: false, control: false });
      }
      // Nothing ran on the host.
      const [ran] = await connect(inject("pgUrl")).unsafe(`select count(*)::int as n from pg_ls_dir('/tmp') f where f = 'kiln-tenant-escape'`);
      expect(ran!.n).toBe(0);
    });
  }

  test("another tenant's database and the control database refuse the tenant role even with its password; Kiln's listener refuses A's credentials for B", async () => {
    // The role's password never leaves Kiln; the test derives it from the test key as Kiln does.
    const key = makeSecretKey(parseKey(TEST_SECRET_KEY, "test key"));
    const role = tenantRoleName(a.db.id);
    const server = new URL(inject("pgUrl"));
    const as = (database: string) => {
      const u = new URL(server.toString());
      u.username = role;
      u.password = encodeURIComponent(key.derive(`postgres tenant role ${role}`));
      u.pathname = `/${database}`;
      return postgres(u.toString(), { max: 1, onnotice: () => {}, connect_timeout: 10 });
    };
    const own = as(serverDb(a.db.id));
    expect((await own`select current_user::text as u`)[0]!.u).toBe(role);
    await own.end();
    for (const database of [serverDb(b.db.id), decodeURIComponent(new URL(k.databaseUrl!).pathname.slice(1))]) {
      const c = as(database);
      const err = await attempt(c, "select 1");
      await c.end({ timeout: 1 }).catch(() => {});
      expect(err?.code, `${database}: ${err?.message}`).toBe("42501");
      expect(err!.message).toMatch(/permission denied for database/);
    }
    // Through Kiln's listener: A's user and password, B's database name.
    const u = new URL(a.db.connection_string);
    u.pathname = `/${b.db.database_name}`;
    const cross = postgres(u.toString(), { max: 1, onnotice: () => {}, connect_timeout: 10 });
    const err = await attempt(cross, "select x from secrets");
    await cross.end({ timeout: 1 }).catch(() => {});
    expect(err?.code).toMatch(/^28/);
  });

  test("the query API's anon and end-user modes work, and a branch copies the data as the branch's own role", async () => {
    const owner = a.sessions.service_full_access();
    await owner.unsafe(`create table notes (id int primary key, body text)`);
    await owner.unsafe(`insert into notes values (1, 'hello')`);
    await owner.unsafe(`grant select on notes to anonymous`);
    // Default privileges are the owner's: the branch's role must get them as its own.
    await owner.unsafe(`alter default privileges in schema public grant select on tables to anonymous`);
    const anon = (await k.api("GET", `/projects/${a.project.id}/anon-keys`)).body.data[0].key as string;
    const r = await k.api("POST", `/databases/${a.db.database_name}/query/select`, { token: anon, body: { table: "notes" } });
    expect(r.status, r.text).toBe(200);
    expect(r.body.data).toEqual([{ id: 1, body: "hello" }]);
    const br = await k.api("POST", `/projects/${a.project.id}/databases/${a.db.database_name}/branches`, { body: { name: "copy" } });
    expect([201, 202], br.text).toContain(br.status);
    const branch = await eventually(
      () => k.api("GET", `/projects/${a.project.id}/databases/${a.db.database_name}/branches/copy`),
      (x) => x.body.status !== "provisioning",
      60_000,
    );
    expect(branch.body.status, branch.text).toBe("active");
    const c = connect(branch.body.connection_string);
    const [row] = await c.unsafe(`select body, pg_get_userbyid((select relowner from pg_class where relname = 'notes')) as owner, session_user::text as su from notes`);
    expect(row!.body).toBe("hello");
    expect(row!.owner).toBe(row!.su);
    expect(row!.su).not.toBe(tenantRoleName(a.db.id));
    expect(row!.su).toMatch(/^kiln_/);
    // The parent's default privileges hold in the branch, as its own role's: a new table is readable by anonymous.
    await c.unsafe(`create table later (x int)`);
    expect(await c.unsafe(`select has_table_privilege('anonymous', 'later', 'SELECT') as s`)).toEqual([{ s: true }]);
  });
});

describe.skipIf(STORE !== "postgres")("production engine: Kiln's own role", () => {
  const admin = () => postgres(inject("pgUrl"), { max: 1, onnotice: () => {} });
  const roles: string[] = [];
  const kilns: TestKiln[] = [];
  afterAll(async () => {
    for (const kiln of kilns) await kiln.stop().catch(() => {});
  });

  /** A login role with the given attributes owning a fresh control database; its URLs. */
  async function role(attrs: string) {
    const name = `kiln_op_${randomBytes(4).toString("hex")}`;
    const password = randomBytes(12).toString("hex");
    const sql = admin();
    await sql.unsafe(`create role ${name} login password '${password}' ${attrs}`);
    const control = new URL(await freshDatabase());
    await sql.unsafe(`alter database ${control.pathname.slice(1)} owner to ${name}`);
    await sql.end();
    roles.push(name);
    const at = (u: URL) => {
      const x = new URL(u.toString());
      x.username = name;
      x.password = password;
      return x.toString();
    };
    return { name, postgresUrl: at(new URL(inject("pgUrl"))), databaseUrl: at(control) };
  }

  test("a least-privilege role (LOGIN CREATEDB CREATEROLE) runs everything without a warning; the control database is closed to PUBLIC", async () => {
    const r = await role("createdb createrole");
    const kiln = await startKiln({ databaseUrl: r.databaseUrl, postgresUrl: r.postgresUrl });
    kilns.push(kiln);
    expect(kiln.stderr).not.toMatch(/more than it needs|PUBLIC has CONNECT/);
    const t = await tenant(kiln);
    const owner = t.sessions.service_full_access();
    await owner.unsafe(`create table items (id int primary key, owner uuid default auth.uid(), name text)`);
    await owner.unsafe(`alter table items enable row level security`);
    await owner.unsafe(`create policy mine on items to authenticated using (owner = auth.uid()) with check (owner = auth.uid())`);
    await owner.unsafe(`grant select, insert on items to authenticated`);
    await owner.unsafe(`grant select on items to anonymous`);
    // The end-user mode over the wire and the query API as anon: SET ROLE from the tenant's session.
    const user = t.sessions.service_user_access();
    await user.unsafe(`insert into items (id, name) values (1, 'mine')`);
    expect(await user.unsafe(`select name from items`)).toEqual([{ name: "mine" }]);
    const anon = (await kiln.api("GET", `/projects/${t.project.id}/anon-keys`)).body.data[0].key as string;
    const q = await kiln.api("POST", `/databases/${t.db.database_name}/query/select`, { token: anon, body: { table: "items" } });
    expect(q.status, q.text).toBe(200);
    expect(q.body.data).toEqual([]); // RLS: no policy for anonymous
    // Still no way out after RESET ROLE.
    await user.unsafe(`reset role`);
    expect((await attempt(user, `copy (select 1) to program 'id'`))?.code).toBe("42501");
    const [pub] = await connect(inject("pgUrl")).unsafe(`select has_database_privilege('public', $1, 'CONNECT') as c`, [decodeURIComponent(new URL(r.databaseUrl).pathname.slice(1))]);
    expect(pub!.c).toBe(false);
  });

  test("a role without CREATEROLE: Kiln refuses to start and says what to grant", async () => {
    const r = await role("createdb");
    const err = await startKiln({ databaseUrl: r.databaseUrl, postgresUrl: r.postgresUrl }).then(
      (kiln) => (kilns.push(kiln), null),
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/exited with 1 before listening/);
    expect(err!.message).toContain(`Kiln's PostgreSQL role "${r.name}" (the --postgres-url user) lacks CREATEROLE`);
    expect(err!.message).toContain(`ALTER ROLE "${r.name}" CREATEROLE`);
  });

  test("a superuser works and Kiln warns that it is more than it needs", async () => {
    const kiln = await startKiln();
    kilns.push(kiln);
    expect(kiln.stderr).toContain(`has more than it needs (SUPERUSER)`);
  });
});

describe.skipIf(STORE !== "postgres")("production engine: a database an older Kiln made", () => {
  test("is handed to its own role at first use: owner of the database and its tables, data intact", async () => {
    const databaseUrl = await freshDatabase();
    let kiln = await startKiln({ databaseUrl });
    const project = await createProject(kiln);
    const db = await activeDatabase(kiln, project.id);
    await connect(db.connection_string).unsafe(`create table items (id int primary key, name text); insert into items values (1, 'kept')`);
    await kiln.stop();
    // As an older Kiln left it: everything owned by Kiln's role, no tenant role.
    const superUrl = new URL(inject("pgUrl"));
    const kilnRole = superUrl.username;
    const inDb = new URL(superUrl.toString());
    inDb.pathname = `/${serverDb(db.id)}`;
    const old = postgres(inDb.toString(), { max: 1, onnotice: () => {} });
    await old.unsafe(`reassign owned by ${tenantRoleName(db.id)} to ${kilnRole}`);
    await old.unsafe(`drop owned by ${tenantRoleName(db.id)}`);
    await old.unsafe(`grant connect on database ${serverDb(db.id)} to public`);
    await old.end();
    const sql = postgres(superUrl.toString(), { max: 1, onnotice: () => {} });
    await sql.unsafe(`drop role ${tenantRoleName(db.id)}`);
    await sql.end();

    kiln = await startKiln({ databaseUrl, dataDir: kiln.dataDir });
    try {
      const c = connect((await kiln.api("GET", `/projects/${project.id}/databases/${db.database_name}`)).body.connection_string);
      const [r] = await c.unsafe(`select name, session_user::text as su, pg_get_userbyid((select relowner from pg_class where relname = 'items')) as owner,
                                         pg_get_userbyid((select datdba from pg_database where datname = current_database())) as dba,
                                         has_database_privilege('public', current_database(), 'CONNECT') as public_connect from items`);
      expect(r).toEqual({ name: "kept", su: tenantRoleName(db.id), owner: tenantRoleName(db.id), dba: tenantRoleName(db.id), public_connect: false });
      await c.unsafe(`insert into items values (2, 'new')`);
    } finally {
      await kiln.stop();
    }
  });
});

describe.skipIf(STORE !== "postgres")("production engine: TLS to the server (sslmode and sslrootcert in --postgres-url)", () => {
  // A server of its own that refuses every TCP connection without TLS.
  let pg: PgServer;
  let k: TestKiln;
  const tlsUrl = (mode: string, rootCert?: string) => `${pg.url}?sslmode=${mode}${rootCert ? `&sslrootcert=${encodeURIComponent(rootCert)}` : ""}`;
  beforeAll(async () => {
    pg = await startPgServer({ tls: true });
    k = await startKiln({ postgresUrl: tlsUrl("verify-full", pg.certFile), args: ["--controllable-clock"] });
  }, 120_000);
  afterAll(async () => {
    await k?.stop();
    await pg?.stop();
  });

  test("verify-full: wire sessions, the query API and a backup (pg_dump) reach the server over TLS", async () => {
    const t = await tenant(k);
    const c = t.sessions.service_full_access();
    expect(await c.unsafe(`select ssl from pg_stat_ssl where pid = pg_backend_pid()`)).toEqual([{ ssl: true }]);
    await c.unsafe(`create table items (id int primary key, name text); insert into items values (1, 'over tls')`);
    const sk = (await k.api("POST", `/projects/${t.project.id}/service-keys`, { body: { name: "backend" } })).body.key as string;
    const q = await k.api("POST", `/databases/${t.db.database_name}/query/select`, { token: sk, body: { table: "items" } });
    expect(q.status, q.text).toBe(200);
    expect(q.body.data).toEqual([{ id: 1, name: "over tls" }]);
    const b = await backup(k, t.project.id, "tls");
    expect(b.size_bytes).toBeGreaterThan(0);
  });

  test("verify-full without the server's CA: Kiln refuses to start with the TLS error", async () => {
    const err = await startKiln({ postgresUrl: tlsUrl("verify-full") }).then(
      async (kiln) => (await kiln.stop(), null),
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/exited with 1 before listening/);
    expect(err!.message).toMatch(/self[- ]signed certificate/i);
  });
});

describe.skipIf(STORE !== "embedded")("embedded engine: the service role is its own PGlite's superuser, and nothing leaves the instance", () => {
  const k = useKiln();

  test("no host files, no programs, no dblink; roles and settings it makes stay in its instance; another tenant's database refuses its credentials", async () => {
    const [a, b] = [await tenant(k), await tenant(k, "other")];
    const c = a.sessions.service_full_access();
    const [who] = await c.unsafe(`select current_user::text as cu, (select rolsuper from pg_roles where rolname = current_user) as sup`);
    expect(who).toEqual({ cu: "postgres", sup: true });
    // The instance sees a WebAssembly file system: its own data folder and PGlite's files, not the host's.
    const root = (await c.unsafe(`select pg_ls_dir('/') as f`)).map((r) => r.f as string);
    for (const hostDir of ["etc", "usr", "root", "var"]) expect(root).not.toContain(hostDir);
    for (const path of ["/etc/passwd", "/proc/self/environ", `${k.dataDir}/secret.key`, `${k.dataDir}/credentials.json`]) {
      expect((await attempt(c, `select pg_read_file('${path}')`))?.message, path).toMatch(/could not open file|No such file/);
      expect((await attempt(c, `select lo_import('${path}')`))?.message, path).toMatch(/could not open server file|No such file/);
    }
    // No processes in WebAssembly: the statement fails and the database keeps serving.
    expect(await attempt(c, `copy (select 1) to program 'id'`)).not.toBeNull();
    const again = connect(a.db.connection_string);
    expect((await again`select 1 as one`)[0]!.one).toBe(1);
    expect((await attempt(again, `create extension dblink`))?.message).toMatch(/not available/);
    // What it may do as superuser of its instance is its own instance's business.
    const evil = `evil_${randomBytes(3).toString("hex")}`;
    expect(await attempt(again, `create role ${evil} superuser`)).toBeNull();
    expect(await attempt(again, `alter system set work_mem = '7MB'`)).toBeNull();
    const other = b.sessions.service_full_access();
    expect(await other.unsafe(`select count(*)::int as n from pg_roles where rolname = $1`, [evil])).toEqual([{ n: 0 }]);
    // Kiln's listener: A's credentials, B's database.
    const u = new URL(a.db.connection_string);
    u.pathname = `/${b.db.database_name}`;
    const cross = postgres(u.toString(), { max: 1, onnotice: () => {}, connect_timeout: 10 });
    const err = await attempt(cross, "select 1");
    await cross.end({ timeout: 1 }).catch(() => {});
    expect(err?.code).toMatch(/^28/);
  });
});
