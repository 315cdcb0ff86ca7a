// Helpers of the managed-database suites (backups, restores, branches): the controllable clock, a
// database made active, a table `items` to check what a restore or a fork kept, and a manual backup.
import postgres from "postgres";
import { connect } from "./database-clients";
import { createProject, eventually, type TestKiln } from "./kiln";

/** Moves Kiln's controllable clock; returns its new time (epoch ms). */
export async function advance(kiln: TestKiln, seconds: number): Promise<number> {
  const r = await kiln.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds } });
  if (r.status !== 200) throw new Error(`advance: ${r.status} ${r.text}`);
  return new Date(r.body.now).getTime();
}

export const clockNow = async (kiln: TestKiln) => new Date((await kiln.api("GET", "/_kiln/clock", { token: null })).body.now).getTime();

export const dbPath = (projectId: string, db = "app") => `/projects/${projectId}/databases/${db}`;

export async function activeDatabase(kiln: TestKiln, projectId: string, name = "app", token?: string) {
  const r = await kiln.api("POST", `/projects/${projectId}/databases`, { body: { name }, token });
  if (r.status !== 201) throw new Error(`create database: ${r.status} ${r.text}`);
  const d = await eventually(() => kiln.api("GET", `/projects/${projectId}/databases/${r.body.name}`, { token }), (x) => x.body.status !== "provisioning", 30_000);
  if (d.body.status !== "active") throw new Error(`database ${d.body.status}`);
  return d.body as { id: string; database_name: string; connection_string: string; created_at: string };
}

/** A new active database in a project of its own (a HOBBY project has one database); its connection string. */
export async function newDatabase(kiln: TestKiln, name: string): Promise<string> {
  const p = await createProject(kiln);
  return (await activeDatabase(kiln, p.id, name)).connection_string;
}

/** A project with an active database `app` holding `items` = [(1, 'before')]. */
export async function itemsDatabase(kiln: TestKiln) {
  const project = await createProject(kiln);
  const db = await activeDatabase(kiln, project.id);
  const c = connect(db.connection_string);
  await c`create table items (id int primary key, name text not null)`;
  await c`insert into items values (1, 'before')`;
  return { project, db, c };
}

/** The names in `items`, in id order, over a connection of its own (closed after). */
export async function itemNames(url: string): Promise<string[]> {
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 30 });
  try {
    return (await c`select name from items order by id`).map((r) => r.name as string);
  } finally {
    await c.end({ timeout: 1 });
  }
}

/** Takes a manual backup (moving the clock a minute on first, past the spacing rule). */
export async function backup(kiln: TestKiln, projectId: string, name: string) {
  await advance(kiln, 61);
  const r = await kiln.api("POST", `${dbPath(projectId)}/backups`, { body: { name } });
  if (r.status !== 201) throw new Error(`backup: ${r.status} ${r.text}`);
  return r.body as { name: string; size_bytes: number; created_at: string };
}
