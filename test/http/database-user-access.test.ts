// `application_name=service_user_access:<user id>` on a database connection runs the session as that
// end user under RLS; the id must name an end user of the database's own project, or the connection
// is refused (FATAL 28000) before any SQL runs. Real clients: postgres.js and psql.
import { spawnSync } from "node:child_process";
import { describe, expect, test } from "vitest";
import { connect, withApp } from "../support/database-clients";
import { createProject, eventually, useKiln, type TestKiln } from "../support/kiln";

const k = useKiln();

async function activeDatabase(kiln: TestKiln, projectId: string, name: string) {
  const r = await kiln.api("POST", `/projects/${projectId}/databases`, { body: { name } });
  if (r.status !== 201) throw new Error(`create database: ${r.status} ${r.text}`);
  const d = await eventually(() => kiln.api("GET", `/projects/${projectId}/databases/${r.body.name}`), (x) => x.body.status !== "provisioning", 30_000);
  if (d.body.status !== "active") throw new Error(`database ${d.body.status}`);
  return d.body as { id: string; connection_string: string };
}

async function endUser(kiln: TestKiln, projectId: string, email: string): Promise<string> {
  const r = await kiln.api("POST", `/projects/${projectId}/users`, { body: { email, password: "long enough" } });
  if (r.status !== 201) throw new Error(`create user: ${r.status} ${r.text}`);
  return r.body.id as string;
}

function psql(url: string, sql: string) {
  const r = spawnSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-X", "-A", "-t", "-c", sql], { encoding: "utf8", timeout: 20_000 });
  return { code: r.status, out: r.stdout.trim(), err: r.stderr.trim() };
}

describe("service_user_access", () => {
  test("an id that is no end user of the database's project (made up, or another project's user) is refused with 28000; the project's own user connects", async () => {
    const p = await createProject(k);
    const db = await activeDatabase(k, p.id, "app");
    const own = await endUser(k, p.id, "own@example.com");
    const other = await createProject(k);
    const foreign = await endUser(k, other.id, "foreign@example.com");
    const madeUp = crypto.randomUUID();

    for (const id of [madeUp, foreign]) {
      const c = connect(withApp(db.connection_string, `service_user_access:${id}`));
      const err = (await c`select auth.uid()`.then(
        () => null,
        (e) => e,
      )) as { code?: string; severity?: string; message?: string } | null;
      expect(err, `service_user_access:${id} was let in`).not.toBeNull();
      expect(err).toMatchObject({ code: "28000", severity: "FATAL" });
      expect(err!.message).toBe(`no end user ${id} in project ${p.id} (application_name service_user_access:<user id>)`);
    }
    const viaPsql = psql(withApp(db.connection_string, `service_user_access:${madeUp}`), "select auth.uid()");
    expect(viaPsql.code).not.toBe(0);
    expect(viaPsql.err).toContain(`no end user ${madeUp} in project ${p.id}`);

    // The project's own end user: a session as that user (auth.uid(), auth.email(), role authenticated).
    const asOwn = connect(withApp(db.connection_string, `service_user_access:${own}`));
    expect(await asOwn`select auth.uid()::text as uid, auth.email() as email, current_user as cu`).toEqual([{ uid: own, email: "own@example.com", cu: "authenticated" }]);
    expect(psql(withApp(db.connection_string, `service_user_access:${own}`), "select auth.uid()").out).toBe(own);

    // Deleting the user closes the door for new connections.
    expect((await k.api("DELETE", `/projects/${p.id}/users/${own}`)).status).toBe(204);
    const after = await connect(withApp(db.connection_string, `service_user_access:${own}`))`select 1`.then(
      () => null,
      (e) => e,
    );
    expect(after).toMatchObject({ code: "28000" });
  });
});
