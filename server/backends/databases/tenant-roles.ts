import { createHash, createHmac, pbkdf2Sync, randomBytes } from "node:crypto";
import type postgres from "postgres";

/**
 * Tenant roles on the production engine (issue 24): every managed database has a login role of its
 * own that owns the database and everything in it, and nothing else. Clients (the wire proxy, the
 * query API's pool, pg_dump/pg_restore of branches and backups) run as that role, never as Kiln's.
 * The end-user modes are the shared NOLOGIN roles `anonymous` and `authenticated`, granted to each
 * tenant role and entered with SET ROLE from the tenant's own session: RESET ROLE gives back the
 * tenant role, which is what the connection string's holder has anyway.
 *
 * The role has no SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS, no membership in Kiln's
 * role or in the pg_* roles that reach the server's files and programs, and CONNECT on its own
 * database only (PUBLIC's CONNECT is revoked). Its password is derived from Kiln's secret key, so
 * every instance sharing the store agrees on it and it is never stored; Kiln sets it again at the
 * first use of a database in each process, so a rotated key needs nothing else.
 */
export function tenantRoleName(id: string): string {
  return `kiln_${id}`;
}

export function ident(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

export function literal(v: string): string {
  return `'${v.replace(/'/g, "''")}'`;
}

/**
 * A SCRAM-SHA-256 verifier for `password` (what PostgreSQL stores): ALTER ROLE gets the verifier, so
 * the password itself never appears in a statement the server might log.
 */
export function scramVerifier(password: string, iterations = 4096): string {
  const salt = randomBytes(16);
  const salted = pbkdf2Sync(password, salt, iterations, 32, "sha256");
  const clientKey = createHmac("sha256", salted).update("Client Key").digest();
  const storedKey = createHash("sha256").update(clientKey).digest();
  const serverKey = createHmac("sha256", salted).update("Server Key").digest();
  return `SCRAM-SHA-256$${iterations}:${salt.toString("base64")}$${storedKey.toString("base64")}:${serverKey.toString("base64")}`;
}

/** Predefined roles that reach the server's files, programs or every table: never a tenant's. */
export const DANGEROUS_ROLES = ["pg_execute_server_program", "pg_read_server_files", "pg_write_server_files", "pg_read_all_data", "pg_write_all_data"];

export interface KilnRoleCheck {
  role: string;
  superuser: boolean;
  /** What is missing for the production engine to work at all: Kiln refuses to start. */
  missing: string[];
  /** What the role has beyond what it needs: Kiln starts and warns. */
  excess: string[];
}

/**
 * What Kiln's own role (the `--postgres-url` user) may do. It needs LOGIN, CREATEDB and CREATEROLE
 * (a database and a login role per managed database), REPLICATION only for point-in-time restore
 * (without it that feature answers 503 saying so; Kiln still starts).
 * Superuser works but is more than it needs; so are BYPASSRLS and the file/program roles.
 */
export async function checkKilnRole(admin: postgres.Sql, opts: { replication: boolean }): Promise<KilnRoleCheck> {
  const [r] = await admin.unsafe(
    `select current_user::text as role, rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls,
            array(select b.rolname::text from pg_roles b where b.rolname = any($1::text[]) and pg_has_role(current_user, b.oid, 'USAGE')) as dangerous
       from pg_roles where rolname = current_user`,
    [DANGEROUS_ROLES],
  );
  const row = r as unknown as { role: string; rolsuper: boolean; rolcreatedb: boolean; rolcreaterole: boolean; rolreplication: boolean; rolbypassrls: boolean; dangerous: string[] };
  const missing: string[] = [];
  const excess: string[] = [];
  if (row.rolsuper) excess.push("SUPERUSER");
  else {
    if (!row.rolcreatedb) missing.push("CREATEDB");
    if (!row.rolcreaterole) missing.push("CREATEROLE");
    if (!opts.replication && row.rolreplication) excess.push("REPLICATION");
    if (row.rolbypassrls) excess.push("BYPASSRLS");
    for (const d of row.dangerous) excess.push(`membership in ${d}`);
  }
  return { role: row.role, superuser: row.rolsuper, missing, excess };
}

export function roleCheckMessages(c: KilnRoleCheck): { refuse: string | null; warn: string | null } {
  const refuse = c.missing.length
    ? `Kiln's PostgreSQL role "${c.role}" (the --postgres-url user) lacks ${c.missing.join(", ")}: the production engine makes a database and a login role for each managed database. As a superuser run: ALTER ROLE ${ident(c.role)} ${c.missing.map((m) => m.split(" ")[0]).join(" ")}; (docs/production.md, "Roles and privileges")`
    : null;
  const warn = c.excess.length
    ? `Kiln's PostgreSQL role "${c.role}" has more than it needs (${c.excess.join(", ")}); tenants never run as it, but a role with LOGIN, CREATEDB and CREATEROLE is enough (docs/production.md, "Roles and privileges")`
    : null;
  return { refuse, warn };
}

/**
 * Makes the tenant role of a database exist with exactly its privileges and the given password, as
 * Kiln's role (idempotent; serialized per role across instances by an advisory lock on the admin
 * connection's database). Kiln's role becomes a member of it (CREATE DATABASE ... OWNER, dropping
 * and renaming its database need that), never the other way round.
 */
export async function ensureTenantRole(admin: postgres.Sql, role: string, password: string, superuser: boolean): Promise<void> {
  await ensureSharedRoles(admin);
  await admin.begin(async (tx) => {
    await tx.unsafe(`select pg_advisory_xact_lock(74320003, hashtext($1))`, [role]);
    const exists = await tx.unsafe(`select 1 from pg_roles where rolname = $1`, [role]);
    const attrs = `login nosuperuser nocreatedb nocreaterole noreplication nobypassrls inherit password ${literal(scramVerifier(password))}`;
    await tx.unsafe(exists.length ? `alter role ${ident(role)} with ${attrs}` : `create role ${ident(role)} with ${attrs}`);
    // SET ROLE anonymous/authenticated from the tenant's own session: the end-user access modes.
    await tx.unsafe(`grant anonymous, authenticated to ${ident(role)}`);
    if (!superuser) await tx.unsafe(`grant ${ident(role)} to current_user`);
  });
}

/**
 * The end-user roles every database shares (cluster-wide names, so policies say `to anonymous`): made
 * once, under one advisory lock, since instances creating databases at once would race to make them.
 */
async function ensureSharedRoles(admin: postgres.Sql): Promise<void> {
  const have = await admin.unsafe(`select count(*)::int as n from pg_roles where rolname in ('anonymous', 'authenticated')`);
  if (have[0]!.n === 2) return;
  await admin.begin(async (tx) => {
    await tx.unsafe(`select pg_advisory_xact_lock(74320003, 0)`);
    for (const shared of ["anonymous", "authenticated"]) {
      const has = await tx.unsafe(`select 1 from pg_roles where rolname = $1`, [shared]);
      if (!has.length) await tx.unsafe(`create role ${shared} nologin`);
    }
  });
}

/** PUBLIC loses CONNECT (and TEMP) on a tenant database: only its own role (its owner) connects. */
export function lockDatabaseSql(database: string): string {
  return `revoke all on database ${ident(database)} from public`;
}

/**
 * Hands a database an older Kiln made (owned by Kiln's role, objects created as Kiln's role) to its
 * tenant role: run by Kiln's role connected to that database. Every schema, relation, routine and
 * type Kiln's role owns there changes owner (REASSIGN OWNED would also take Kiln's other databases).
 * Sequences owned by a column follow their table.
 */
export function adoptObjectsSql(role: string): string {
  return `do $kiln$
declare r record; me oid := (select oid from pg_roles where rolname = current_user); t text := ${literal(role)};
begin
  for r in select nspname from pg_namespace where nspowner = me and nspname not like 'pg\\_%' and nspname <> 'information_schema' loop
    execute format('alter schema %I owner to %I', r.nspname, t);
  end loop;
  for r in select c.oid::regclass as rel, c.relkind from pg_class c join pg_namespace n on n.oid = c.relnamespace
            where c.relowner = me and c.relkind in ('r', 'p', 'v', 'm', 'f', 'S') and n.nspname not like 'pg\\_%' and n.nspname <> 'information_schema'
              and not (c.relkind = 'S' and exists (select from pg_depend d where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.deptype in ('a', 'i'))) loop
    execute format('alter %s %s owner to %I', case r.relkind when 'v' then 'view' when 'm' then 'materialized view' when 'f' then 'foreign table' when 'S' then 'sequence' else 'table' end, r.rel, t);
  end loop;
  for r in select p.oid::regprocedure as fn, p.prokind from pg_proc p join pg_namespace n on n.oid = p.pronamespace
            where p.proowner = me and n.nspname not like 'pg\\_%' and n.nspname <> 'information_schema' loop
    execute format('alter %s %s owner to %I', case r.prokind when 'p' then 'procedure' when 'a' then 'aggregate' else 'function' end, r.fn, t);
  end loop;
  for r in select ty.oid::regtype as typ from pg_type ty join pg_namespace n on n.oid = ty.typnamespace
            where ty.typowner = me and ty.typtype in ('e', 'd', 'r', 'c') and (ty.typtype <> 'c' or (select relkind from pg_class where oid = ty.typrelid) = 'c')
              and n.nspname not like 'pg\\_%' and n.nspname <> 'information_schema' loop
    execute format('alter type %s owner to %I', r.typ, t);
  end loop;
end
$kiln$`;
}

/** The current role's default privileges in the current database, one row per granted privilege. */
export const DEFAULT_PRIVILEGES_SQL = `select n.nspname::text as schema, d.defaclobjtype::text as kind,
       case when a.grantee = 0 then null else pg_get_userbyid(a.grantee)::text end as grantee,
       a.privilege_type::text as privilege, a.is_grantable as grantable
  from pg_default_acl d left join pg_namespace n on n.oid = d.defaclnamespace, aclexplode(d.defaclacl) a
 where d.defaclrole = (select oid from pg_roles where rolname = current_user)`;

export interface DefaultPrivilege {
  schema: string | null;
  /** r tables, S sequences, f functions, T types, n schemas. */
  kind: string;
  /** null: PUBLIC. */
  grantee: string | null;
  privilege: string;
  grantable: boolean;
}

const KINDS: Record<string, string> = { r: "tables", S: "sequences", f: "functions", T: "types", n: "schemas" };

/**
 * ALTER DEFAULT PRIVILEGES statements that give `to` (a branch's role) the default privileges `from`
 * (its parent's) held: grants to other roles and PUBLIC as they were, the owner's own as `to`'s. A
 * global entry for functions or types without PUBLIC's EXECUTE/USAGE is a revoke of what PostgreSQL
 * would otherwise give PUBLIC, and is repeated as one.
 */
export function defaultPrivilegeStatements(rows: DefaultPrivilege[], from: string, to: string): string[] {
  const out: string[] = [];
  const scope = (schema: string | null) => (schema ? ` in schema ${ident(schema)}` : "");
  for (const r of rows) {
    const objects = KINDS[r.kind];
    if (!objects) continue;
    const grantee = r.grantee === null ? "public" : ident(r.grantee === from ? to : r.grantee);
    out.push(`alter default privileges for role ${ident(to)}${scope(r.schema)} grant ${r.privilege} on ${objects} to ${grantee}${r.grantable ? " with grant option" : ""}`);
  }
  for (const [kind, privilege] of [["f", "execute"], ["T", "usage"]] as const) {
    const global = rows.filter((r) => r.kind === kind && r.schema === null);
    if (global.length && !global.some((r) => r.grantee === null)) out.push(`alter default privileges for role ${ident(to)} revoke ${privilege} on ${KINDS[kind]} from public`);
  }
  return out;
}
