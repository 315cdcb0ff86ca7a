// CREATE DATABASE and DROP DATABASE over the wire (issue 26): a managed database of the same project,
// reached with the same credentials (only the database name changes), as Prisma's `migrate dev`
// shadow database and per-worker test set-ups expect. Both engines: embedded (PGlite has no template1)
// and postgres (the tenant role has no CREATEDB: the statement is answered by Kiln's proxy).
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import pg from "pg";
import { describe, expect, test } from "vitest";
import { activeDatabase } from "../support/databases";
import { createProject, useKiln } from "../support/kiln";

// DROP DATABASE waits for the database's other sessions as PostgreSQL does (5 s); shorter here.
const k = useKiln({ env: { KILN_DROP_DATABASE_WAIT_MS: "300" } });
const PG15 = "/usr/lib/postgresql/15/bin";

function urlFor(url: string, database: string, app?: string): string {
  const u = new URL(url);
  u.pathname = `/${encodeURIComponent(database)}`;
  if (app) u.searchParams.set("application_name", app);
  return u.toString();
}

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 30_000 });
  c.on("error", () => {}); // a session ended by DROP DATABASE ... WITH (FORCE): the test looks at its queries
  await c.connect();
  return c;
}

/** The error (code, message) a statement gets, or null if it succeeds. */
async function failure(c: pg.Client, sql: string): Promise<{ code: string; message: string; detail?: string } | null> {
  try {
    await c.query(sql);
    return null;
  } catch (e) {
    const err = e as { code: string; message: string; detail?: string };
    return { code: err.code, message: err.message, detail: err.detail };
  }
}

const names = async (projectId: string, token?: string) =>
  ((await k.api("GET", `/projects/${projectId}/databases`, { token })).body.data as { database_name: string; status: string }[]).map((d) => `${d.database_name}:${d.status}`);

describe("CREATE DATABASE / DROP DATABASE over the wire", () => {
  test("Prisma migrate dev's shadow database: its exact sequence with node-postgres", async () => {
    const project = await createProject(k);
    const db = await activeDatabase(k, project.id);
    const main = await client(db.connection_string);
    // What the schema engine (postgres flavour) sends, in order.
    const probe = `SELECT EXISTS(SELECT 1 FROM pg_namespace WHERE nspname = $1), version(), current_setting('server_version_num')::integer as numeric_version;`;
    expect((await main.query(probe, ["public"])).rows[0].exists).toBe(true);
    const shadow = `prisma_migrate_shadow_db_${randomUUID()}`;
    await main.query(`CREATE DATABASE "${shadow}"`);
    // Listed by the API (the name as the API normalizes it: '-' becomes '_'), active.
    const apiName = shadow.replace(/-/g, "_");
    expect(await names(project.id)).toContain(`${apiName}:active`);

    // The same URL with only the path changed: same user, same password.
    const s = await client(urlFor(db.connection_string, shadow));
    expect((await s.query(probe, ["public"])).rows[0].exists).toBe(true);
    await s.query(`-- CreateTable
CREATE TABLE "User" ("id" SERIAL NOT NULL, "email" TEXT NOT NULL, "name" TEXT, CONSTRAINT "User_pkey" PRIMARY KEY ("id"));
-- CreateIndex
CREATE UNIQUE INDEX "User_email_key" ON "User"("email");
INSERT INTO "User" ("email", "name") VALUES ('a@example.com', 'A'), ('b@example.com', 'B');`);
    const tables = await s.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1`);
    expect(tables.rows.map((r) => r.table_name)).toEqual(["User"]);
    expect((await s.query(`select current_database() as d`)).rows[0].d).toBeTruthy();
    // A second client of the shadow database sees the rows; the main database does not have the table.
    const s2 = await client(urlFor(db.connection_string, apiName));
    expect((await s2.query(`select email from "User" order by id`)).rows.map((r) => r.email)).toEqual(["a@example.com", "b@example.com"]);
    await s2.end();
    expect((await failure(main, `select 1 from "User"`))?.code).toBe("42P01");
    await s.end();

    await main.query(`DROP DATABASE IF EXISTS "${shadow}" WITH (FORCE)`);
    expect((await names(project.id)).some((n) => n.startsWith(apiName))).toBe(false);
    await expect(client(urlFor(db.connection_string, shadow))).rejects.toMatchObject({ code: "28P01" });
    // The main database is untouched and still serves.
    expect((await main.query(`select 1 as one`)).rows[0].one).toBe(1);
    await main.end();
  });

  test("createdb and dropdb (psql 15's tools), a copy with TEMPLATE, and data that stays per database", async () => {
    const project = await createProject(k);
    const db = await activeDatabase(k, project.id);
    const u = new URL(db.connection_string);
    const env = { ...process.env, PGPASSWORD: decodeURIComponent(u.password), PGAPPNAME: "service_full_access" };
    const common = ["-h", u.hostname, "-p", u.port, "-U", u.username, "--maintenance-db", "app"];
    const run = (tool: string, args: string[]) => spawnSync(`${PG15}/${tool}`, [...common, ...args], { env, encoding: "utf8", timeout: 60_000 });

    const made = run("createdb", ["worker_1"]);
    expect(made.stderr).toBe("");
    expect(made.status).toBe(0);
    const w1 = await client(urlFor(db.connection_string, "worker_1"));
    await w1.query(`create table t (v int); insert into t values (1), (2)`);
    // The same name again: PostgreSQL's duplicate_database.
    const again = run("createdb", ["worker_1"]);
    expect(again.status).not.toBe(0);
    expect(again.stderr).toMatch(/database "worker_1" already exists/);

    // A copy of a database these credentials reach (TEMPLATE): its rows come along.
    const main = await client(db.connection_string);
    await main.query(`create table items (id int primary key, name text); insert into items values (1, 'from app')`);
    await main.query(`CREATE DATABASE app_copy TEMPLATE app`);
    const copy = await client(urlFor(db.connection_string, "app_copy"));
    expect((await copy.query(`select name from items`)).rows).toEqual([{ name: "from app" }]);
    await copy.query(`insert into items values (2, 'copy only')`);
    expect((await main.query(`select count(*)::int as n from items`)).rows[0].n).toBe(1);
    await copy.end();
    expect((await failure(main, `CREATE DATABASE nope TEMPLATE missing_db`))?.code).toBe("3D000");

    // The data is the database's own: worker_1 holds its rows, listed by the API.
    expect((await w1.query(`select sum(v)::int as s from t`)).rows[0].s).toBe(3);
    expect(await names(project.id)).toEqual(expect.arrayContaining(["app:active", "worker_1:active", "app_copy:active"]));

    // dropdb while worker_1 has a session: 55006 (after PostgreSQL's wait); --force ends it.
    const busy = run("dropdb", ["worker_1"]);
    expect(busy.status).not.toBe(0);
    expect(busy.stderr).toMatch(/database "worker_1" is being accessed by other users/);
    expect(busy.stderr).toMatch(/There is 1 other session using the database/);
    const forced = run("dropdb", ["--force", "worker_1"]);
    expect(forced.stderr).toBe("");
    expect(forced.status).toBe(0);
    await expect(w1.query(`select 1`)).rejects.toThrow();
    const gone = run("dropdb", ["--if-exists", "worker_1"]);
    expect(gone.status).toBe(0);
    expect(gone.stderr).toMatch(/database "worker_1" does not exist, skipping/);
    expect((await main.query(`DROP DATABASE app_copy`)).command).toBe("DROP");
    expect(await names(project.id)).toEqual(["app:active"]);
    await main.end();
  });

  test("refusals: what PostgreSQL answers, with its SQLSTATE", async () => {
    const project = await createProject(k);
    const db = await activeDatabase(k, project.id);
    const main = await client(db.connection_string);
    expect((await failure(main, `CREATE DATABASE app`))?.code).toBe("42P04");
    expect(await failure(main, `DROP DATABASE nothing_here`)).toMatchObject({ code: "3D000", message: 'database "nothing_here" does not exist' });
    // Not made over the wire: not the wire's to drop (PostgreSQL checks ownership first, too).
    expect(await failure(main, `DROP DATABASE app`)).toMatchObject({ code: "42501", message: "must be owner of database app" });
    // A database the API made is not the wire's to drop.
    const other = await k.api("POST", `/projects/${project.id}/databases`, { body: { name: "by_api" } });
    expect(other.status).toBe(201);
    expect((await failure(main, `DROP DATABASE by_api`))?.code).toBe("42501");
    expect((await failure(main, `CREATE DATABASE x1 ENCODING 'LATIN1'`))?.code).toBe("0A000");
    await main.query(`CREATE DATABASE x2 WITH ENCODING = 'UTF8' OWNER = whoever CONNECTION LIMIT = -1`);
    const onX2 = await client(urlFor(db.connection_string, "x2"));
    expect(await failure(onX2, `DROP DATABASE x2`)).toMatchObject({ code: "55006", message: "cannot drop the currently open database" });
    await onX2.end();
    // Inside a transaction block: the engine's own 25001, and the transaction is aborted.
    await main.query("begin");
    expect((await failure(main, `CREATE DATABASE x3`))?.code).toBe("25001");
    expect((await failure(main, `select 1`))?.code).toBe("25P02");
    await main.query("rollback");
    expect(await names(project.id)).not.toContain("x3:active");
    // An end user's session (RLS) may not create or drop databases.
    const user = (await k.api("POST", `/projects/${project.id}/users`, { body: { email: `u-${randomUUID()}@example.com`, password: "long enough" } })).body;
    const asUser = await client(urlFor(db.connection_string, "app", `service_user_access:${user.id}`));
    expect((await failure(asUser, `CREATE DATABASE x4`))?.code).toBe("42501");
    expect((await failure(asUser, `DROP DATABASE x2`))?.code).toBe("42501");
    await asUser.end();
    expect((await main.query(`DROP DATABASE x2`)).command).toBe("DROP");
    await main.end();
  });

  test("HOBBY's one database per project: 53400 configuration_limit_exceeded", async () => {
    const hobby = (await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } })).body.platform_token as string;
    const project = await createProject(k, undefined, hobby);
    const db = await activeDatabase(k, project.id, "app", hobby);
    const main = await client(db.connection_string);
    const refused = await failure(main, `CREATE DATABASE second`);
    expect(refused?.code).toBe("53400");
    expect(refused?.message).toMatch(/HOBBY plan allows 1 database/);
    await main.end();
  });
});
