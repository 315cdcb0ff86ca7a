import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import postgres from "postgres";
import {
  DATABASE_SETUP_SQL,
  DatabaseQueryError,
  EngineUnavailable,
  RestoreNotStarted,
  PRIVILEGES_UPGRADE_SQL,
  sessionInitSql,
  transactionInitSql,
  dumpArgs,
  portablePlainDump,
  type AccessMode,
  type DatabaseEngine,
  type DumpFormat,
  type QueryResult,
  type ServerPointInTime,
} from "./engine";
import { ServerPitr } from "./pitr";
import { NotificationPids, openProxy } from "./pg-proxy";
import type { WireBackend, WireClient, WireControl } from "./wire/listener";
import { backgroundPriority } from "./background-priority";
import { libpqTlsEnv, postgresJsSsl, serverTlsOf, type ServerTls } from "./server-tls";
import { adoptObjectsSql, checkKilnRole, DEFAULT_PRIVILEGES_SQL, defaultPrivilegeStatements, type DefaultPrivilege, ensureTenantRole, ident, lockDatabaseSql, roleCheckMessages, tenantRoleName } from "./tenant-roles";

function hours(v: string | undefined, fallback: number): number {
  const n = Number(v);
  return (v && Number.isFinite(n) && n > 0 ? n : fallback) * 3_600_000;
}

/** Server-side name of a Kiln database. */
export function serverDatabaseName(id: string): string {
  return `kiln_${id}`;
}

/** Refused to start: Kiln's role cannot run the production engine (the message says what to grant). */
export class KilnRoleRefused extends Error {}

/**
 * Production engine: every Kiln database is a database on a real PostgreSQL server (`--postgres-url`,
 * a role allowed to create databases and roles). Each database has a login role of its own that owns
 * it (tenant-roles.ts); Kiln's wire listener authenticates clients with their per-database credentials
 * and proxies them as that role, never as Kiln's own. Internal credentials never leave Kiln.
 */
export class PostgresEngine implements DatabaseEngine {
  readonly kind = "postgres" as const;
  private readonly admin: postgres.Sql;
  private readonly pools = new Map<string, postgres.Sql>();
  /** Server process id of each wire session -> the process id Kiln announced to its client (for NotificationResponses). */
  private readonly announcedPids = new Map<number, number>();
  private readonly url: URL;
  private version: number | null = null;

  private pitr: ServerPitr | null = null;
  /** TLS to the server (sslmode/sslrootcert of --postgres-url), for every connection to it. */
  private readonly tls: ServerTls | null;

  /** A postgres.js client of the server (URL without sslmode/sslrootcert), with the engine's TLS settings. */
  private client(url: string, opts: postgres.Options<{}> = {}): postgres.Sql {
    return postgres(url, { onnotice: () => {}, ssl: postgresJsSsl(this.tls), ...opts });
  }

  constructor(
    adminUrl: string,
    private readonly opts: {
      /**
       * Point-in-time restore (`KILN_POSTGRES_PITR=on`): where Kiln keeps the server's WAL archive and
       * base backups. Off (undefined): `restore_to` is refused.
       */
      pitrDir?: string;
      log?: { error: (m: string, e?: unknown) => void; warn?: (m: string) => void };
      /**
       * The password of a tenant role: derived from Kiln's secret key, so every instance sharing the
       * server agrees on it without storing it.
       */
      tenantPassword: (role: string) => string;
    },
  ) {
    const { tls, url } = serverTlsOf(adminUrl);
    this.tls = tls;
    this.url = new URL(url);
    this.admin = this.client(url, { max: 2, idle_timeout: 30 });
  }

  /** Whether Kiln's own role is a superuser (it then needs no membership in tenant roles). */
  private superuser = false;

  async init(): Promise<void> {
    const [r] = await this.admin.unsafe(`select current_setting('server_version_num')::int / 10000 as v`);
    this.version = Number(r!.v);
    const check = await checkKilnRole(this.admin, { replication: !!this.opts.pitrDir });
    const { refuse, warn } = roleCheckMessages(check);
    if (refuse) {
      await this.admin.end({ timeout: 1 }).catch(() => {});
      throw new KilnRoleRefused(refuse);
    }
    if (warn) this.opts.log?.warn?.(warn);
    this.superuser = check.superuser;
    if (this.opts.pitrDir) {
      this.pitr = new ServerPitr({
        url: this.url,
        dir: this.opts.pitrDir,
        serverMajor: this.version,
        admin: this.admin,
        env: () => ({ ...this.adminToolEnv(), PGDATABASE: decodeURIComponent(this.url.pathname.slice(1)) || "postgres" }),
        log: this.opts.log ?? { error: (m, e) => console.error(m, e) },
        baseIntervalMs: hours(process.env.KILN_POSTGRES_PITR_BASE_HOURS, 24),
        retentionMs: hours(process.env.KILN_POSTGRES_PITR_RETENTION_HOURS, 168),
      });
      await this.pitr.start().catch((err) => this.opts.log?.error("point-in-time restore could not start", err));
    }
  }

  /**
   * Point-in-time restore of one database by recovering a throwaway copy of the server (see pitr.ts):
   * `off` unless Kiln was started with KILN_POSTGRES_PITR=on.
   */
  readonly serverPointInTime: ServerPointInTime = {
    status: () =>
      this.pitr?.status() ?? {
        state: "off",
        reason: "point-in-time restore is off on the production engine: it archives the whole server's WAL and takes base backups of the whole server, so it is turned on deliberately (KILN_POSTGRES_PITR=on)",
      },
    range: () => this.pitr?.range() ?? null,
    restoreTo: async (id, atMs, keepAt) => {
      if (!this.pitr) throw new RestoreNotStarted("point-in-time restore is off on this engine");
      await this.pgTools();
      return this.pitr.restoreTo(serverDatabaseName(id), atMs, keepAt, (dump, keep) => this.restore(id, dump, keep));
    },
  };

  serverVersions(): number[] {
    return this.version ? [this.version] : [];
  }

  /** A connection URL of database `id` as its tenant role (the server's host, port and options). */
  private urlFor(id: string): string {
    const u = new URL(this.url.toString());
    const role = tenantRoleName(id);
    u.username = encodeURIComponent(role);
    u.password = encodeURIComponent(this.opts.tenantPassword(role));
    u.pathname = `/${serverDatabaseName(id)}`;
    return u.toString();
  }

  /**
   * The tenant role of `id` exists with its password, and owns the database. A database an older
   * Kiln made (owned by Kiln's role) is handed over first: its privileges brought to the current
   * model while Kiln's role still owns what it made (default privileges of that role included),
   * then the database and everything Kiln's role owns in it change owner.
   */
  private async ensureTenant(id: string): Promise<void> {
    const role = tenantRoleName(id);
    const database = serverDatabaseName(id);
    await ensureTenantRole(this.admin, role, this.opts.tenantPassword(role), this.superuser);
    const [db] = await this.admin.unsafe(`select pg_get_userbyid(datdba) as owner from pg_database where datname = $1`, [database]);
    if (!db || db.owner === role) return;
    const u = new URL(this.url.toString());
    u.pathname = `/${database}`;
    const own = this.client(u.toString(), { max: 1 });
    try {
      await own.unsafe(PRIVILEGES_UPGRADE_SQL);
      await own.unsafe(adoptObjectsSql(role));
    } finally {
      await own.end({ timeout: 2 }).catch(() => {});
    }
    await this.admin.unsafe(`alter database ${ident(database)} owner to ${ident(role)}`);
    await this.admin.unsafe(lockDatabaseSql(database));
  }

  /** Databases checked (and upgraded if an older Kiln made them) against the privileges model in this process. */
  private readonly current = new Map<string, Promise<void>>();

  /**
   * Before the first use in this process, a database is brought to the current privileges model (a
   * no-op check once done). A failure is retried at the next use; until then the database is not used.
   */
  private ensureCurrent(id: string): Promise<void> {
    let p = this.current.get(id);
    if (!p) {
      p = this.ensureTenant(id)
        .then(() => this.pool(id).unsafe(PRIVILEGES_UPGRADE_SQL))
        .then(() => undefined);
      p.catch(() => this.current.delete(id));
      this.current.set(id, p);
    }
    return p;
  }

  private pool(id: string): postgres.Sql {
    let p = this.pools.get(id);
    if (!p) {
      p = this.client(this.urlFor(id), { max: 5, idle_timeout: 30 });
      this.pools.set(id, p);
    }
    return p;
  }

  async create(id: string): Promise<void> {
    const role = tenantRoleName(id);
    await ensureTenantRole(this.admin, role, this.opts.tenantPassword(role), this.superuser);
    const exists = await this.admin.unsafe(`select 1 from pg_database where datname = $1`, [serverDatabaseName(id)]);
    // template0: nothing the operator put in template1 (extensions such as dblink) reaches a tenant.
    if (exists.length === 0) await this.admin.unsafe(`create database ${ident(serverDatabaseName(id))} owner ${ident(role)} template template0`);
    await this.admin.unsafe(lockDatabaseSql(serverDatabaseName(id)));
    this.current.set(id, Promise.resolve());
    // The setup runs as the tenant role: what it makes is the tenant's.
    const db = this.client(this.urlFor(id), { max: 1 });
    try {
      for (const stmt of DATABASE_SETUP_SQL) {
        try {
          await db.unsafe(stmt);
        } catch (err) {
          // Roles are cluster-wide: two databases made at once may race to create them.
          if (!["23505", "42710"].includes((err as { code?: string }).code ?? "")) throw err;
        }
      }
    } finally {
      await db.end();
    }
  }

  async drop(id: string): Promise<void> {
    const p = this.pools.get(id);
    this.pools.delete(id);
    this.current.delete(id);
    await p?.end({ timeout: 1 }).catch(() => {});
    await this.admin.unsafe(`drop database if exists ${ident(serverDatabaseName(id))} with (force)`);
    await this.dropTenantRole(id);
  }

  /** The role goes with its database; a role still owning something elsewhere (never Kiln's doing) stays, logged. */
  private async dropTenantRole(id: string): Promise<void> {
    await this.admin.unsafe(`drop role if exists ${ident(tenantRoleName(id))}`).catch((e) => this.opts.log?.error(`dropping role ${tenantRoleName(id)} failed`, e));
  }

  async run(id: string, mode: AccessMode, text: string, params: unknown[]): Promise<QueryResult> {
    await this.ensureCurrent(id);
    try {
      return (await this.pool(id).begin(async (tx) => {
        for (const s of transactionInitSql(mode)) await tx.unsafe(s);
        const t0 = performance.now();
        const rows = await tx.unsafe(text, params as any[]);
        return { rows: [...rows] as Record<string, unknown>[], computeMs: performance.now() - t0 };
      })) as QueryResult;
    } catch (err) {
      const e = err as { message?: string; code?: string; name?: string };
      if (e?.name === "PostgresError" && typeof e.code === "string") throw new DatabaseQueryError(e.message ?? "query failed", e.code);
      throw err;
    }
  }

  async openWire(id: string, mode: AccessMode, client: WireClient, control: WireControl): Promise<WireBackend> {
    await this.ensureCurrent(id);
    const conn = await openProxy(
      {
        host: this.url.hostname,
        port: Number(this.url.port || 5432),
        user: tenantRoleName(id),
        password: this.opts.tenantPassword(tenantRoleName(id)),
        database: serverDatabaseName(id),
        tls: this.tls,
        applicationName: client.applicationName,
        // The client's DateStyle, TimeZone, options (-c ...) and the like: the session starts as asked,
        // and a parameter the server refuses refuses the connection with the server's own error.
        params: client.params,
      },
      sessionInitSql(mode),
    );
    let send: ((d: Uint8Array) => void) | null = null;
    // Notifications name their sender by the key Kiln announced to it, as the embedded engine does.
    const serverPid = conn.serverPid;
    if (serverPid !== null && client.processId !== undefined) this.announcedPids.set(serverPid, client.processId);
    const notes = new NotificationPids((pid) => this.announcedPids.get(pid));
    conn.onData((d) => {
      const out = notes.pass(d);
      if (out) send?.(out);
    });
    conn.onClose(() => {
      if (serverPid !== null && this.announcedPids.get(serverPid) === client.processId) this.announcedPids.delete(serverPid);
      control.terminate("the database connection was closed");
    });
    return {
      parameters: async () => ({ ...conn.parameters, application_name: client.applicationName }),
      handle: async (msg, s) => {
        send = s;
        conn.write(msg);
      },
      // Bytes through as they came (the session's role and mode were set at its start; nothing the
      // client sends can leave them but RESET ROLE, which gives back the tenant role it holds anyway).
      handleRun: (run, s) => {
        send = s;
        if (!conn.write(run)) return conn.drained();
      },
      close: async () => conn.end(),
      cancel: () => conn.cancel(),
    };
  }

  async sizeBytes(id: string): Promise<number> {
    const [r] = await this.admin.unsafe(`select pg_database_size($1)::float8 as n`, [serverDatabaseName(id)]);
    return Number(r?.n ?? 0);
  }

  // ---- copies: branches, backups, restores ---------------------------------------------------------

  private tools: Promise<{ dump: string; restore: string }> | null = null;

  /**
   * pg_dump and pg_restore of the server's major version or newer: from the folder `KILN_PG_BIN` names
   * (then only there), else Debian's /usr/lib/postgresql/<major>/bin, else PATH.
   */
  private pgTools(): Promise<{ dump: string; restore: string }> {
    this.tools ??= (async () => {
      const major = this.version ?? 0;
      const only = process.env.KILN_PG_BIN;
      if (only) {
        if (existsSync(join(only, "pg_dump")) && existsSync(join(only, "pg_restore"))) return { dump: join(only, "pg_dump"), restore: join(only, "pg_restore") };
        throw new EngineUnavailable(`KILN_PG_BIN (${only}) holds no pg_dump and pg_restore`);
      }
      const dirs: string[] = [];
      const debian = "/usr/lib/postgresql";
      if (existsSync(debian))
        for (const v of readdirSync(debian)
          .filter((v) => /^\d+$/.test(v) && Number(v) >= major)
          .sort((a, b) => Number(a) - Number(b)))
          dirs.push(join(debian, v, "bin"));
      for (const dir of dirs)
        if (existsSync(join(dir, "pg_dump")) && existsSync(join(dir, "pg_restore"))) return { dump: join(dir, "pg_dump"), restore: join(dir, "pg_restore") };
      const dump = Bun.which("pg_dump");
      const restore = Bun.which("pg_restore");
      if (dump && restore) {
        const v = /(\d+)\.\d+/.exec(await new Response(Bun.spawn([dump, "--version"], { stdout: "pipe" }).stdout).text());
        if (v && Number(v[1]) >= major) return { dump, restore };
      }
      throw new EngineUnavailable(`branching and backups need pg_dump and pg_restore ${major} or newer on this machine (apt-get install postgresql-client-${major}, or KILN_PG_BIN=<folder>)`);
    })();
    this.tools.catch(() => (this.tools = null));
    return this.tools;
  }

  /** libpq's environment for a tool run as Kiln's own role (the server-wide work of point-in-time restore). */
  private adminToolEnv(): Record<string, string> {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith("PG")) env[k] = v;
    return {
      ...env,
      PGHOST: this.url.hostname,
      PGPORT: this.url.port || "5432",
      PGUSER: decodeURIComponent(this.url.username),
      PGPASSWORD: decodeURIComponent(this.url.password),
      ...libpqTlsEnv(this.tls),
      PGAPPNAME: "kiln",
      PGCONNECT_TIMEOUT: "10",
    };
  }

  /**
   * Runs a tool against databases of Kiln's as their tenant roles: the roles of `ids` (the first is
   * the default user and database; a command naming several says which with --username). Passwords go through a password file (mode 0600, gone
   * after the run), never argv. Resolves when it exits 0, else throws with its stderr.
   */
  private async runTool(cmd: string[], ids: string[], what = cmd[0]!.split("/").pop()): Promise<void> {
    const dir = mkdtempSync(join(tmpdir(), "kiln-pgpass-"));
    try {
      const esc = (v: string) => v.replace(/\\/g, "\\\\").replace(/:/g, "\\:");
      const passfile = join(dir, "pgpass");
      writeFileSync(
        passfile,
        ids.map((id) => [this.url.hostname, this.url.port || "5432", "*", tenantRoleName(id), this.opts.tenantPassword(tenantRoleName(id))].map(esc).join(":")).join("\n") + "\n",
        { mode: 0o600 },
      );
      const { PGPASSWORD: _, PGUSER: __, ...env } = this.adminToolEnv();
      env.PGPASSFILE = passfile;
      // A single database: the tool connects as its role by default.
      if (ids.length === 1) {
        env.PGUSER = tenantRoleName(ids[0]!);
        env.PGDATABASE = serverDatabaseName(ids[0]!);
      }
      const proc = Bun.spawn(cmd, { env, stdin: "ignore", stdout: "ignore", stderr: "pipe" });
      const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
      if (code !== 0) throw new Error(`${what} failed (${code}): ${err.trim().slice(0, 2000)}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  /**
   * An empty database filled from a pg_dump of `sourceId` streamed into pg_restore. pg_dump reads
   * everything in one repeatable-read snapshot, so the copy is transactionally consistent, and it takes
   * only ACCESS SHARE locks: the source keeps serving reads and writes (DDL on it waits for the dump).
   */
  private async copyInto(sourceId: string, targetId: string): Promise<void> {
    const { dump, restore } = await this.pgTools();
    await this.createEmpty(targetId, tenantRoleName(targetId));
    // The dump goes to a file first (not a pipe): its table of contents is listed to leave out the
    // source role's default privileges (ALTER DEFAULT PRIVILEGES FOR ROLE <source role>, which the
    // target's role may not run), then given again as the target role's below. The tools run at the
    // lowest CPU priority and their bytes never pass through Kiln's event loop (which also carries the
    // parent's wire traffic). Each side as its own tenant role: the copy's objects are the target's (--no-owner).
    const dir = mkdtempSync(join(tmpdir(), "kiln-copy-"));
    try {
      const script = [
        `set -o pipefail`,
        `"$0" --format=custom --compress=0 --username="$4" --dbname="$2" --file="$6/copy.dump"`,
        `"$1" --list "$6/copy.dump" | { grep -v ' DEFAULT ACL ' || true; } > "$6/copy.list"`,
        `"$1" --exit-on-error --no-owner --username="$5" --dbname="$3" --use-list="$6/copy.list" "$6/copy.dump"`,
      ].join(" && ");
      await this.runTool(
        [...(await backgroundPriority()), "bash", "-c", script, dump, restore, serverDatabaseName(sourceId), serverDatabaseName(targetId), tenantRoleName(sourceId), tenantRoleName(targetId), dir],
        [sourceId, targetId],
        "pg_dump | pg_restore",
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const rows = await this.pool(sourceId).unsafe(DEFAULT_PRIVILEGES_SQL);
    const statements = defaultPrivilegeStatements(rows as unknown as DefaultPrivilege[], tenantRoleName(sourceId), tenantRoleName(targetId));
    if (statements.length) await this.pool(targetId).begin(async (tx) => {
      for (const stmt of statements) await tx.unsafe(stmt);
    });
  }

  /** A new empty database owned by tenant role `role` (made if missing), only that role connecting. */
  private async createEmpty(id: string, role: string): Promise<void> {
    await ensureTenantRole(this.admin, role, this.opts.tenantPassword(role), this.superuser);
    await this.dropServerDatabase(id);
    await this.admin.unsafe(`create database ${ident(serverDatabaseName(id))} owner ${ident(role)} template template0`);
    await this.admin.unsafe(lockDatabaseSql(serverDatabaseName(id)));
  }

  private async dropServerDatabase(id: string): Promise<void> {
    const p = this.pools.get(id);
    this.pools.delete(id);
    this.current.delete(id);
    await p?.end({ timeout: 1 }).catch(() => {});
    await this.admin.unsafe(`drop database if exists ${ident(serverDatabaseName(id))} with (force)`);
  }

  async copiesUnavailable(): Promise<string | null> {
    try {
      await this.pgTools();
      return null;
    } catch (err) {
      if (err instanceof EngineUnavailable) return err.message;
      throw err;
    }
  }

  async fork(parentId: string, childId: string): Promise<string> {
    await this.ensureCurrent(parentId);
    await this.copyInto(parentId, childId);
    return this.fingerprint(childId);
  }

  /**
   * Per table (and materialized view), a hash of each page's rows as text: the pages a branch has
   * changed since, whatever the server's own file layout. Read in one repeatable-read transaction.
   */
  private async pageHashes(id: string): Promise<Record<string, Record<string, number>>> {
    return (await this.pool(id).begin("isolation level repeatable read read only", async (tx) => {
      const rels = await tx.unsafe(
        `select format('%I.%I', n.nspname, c.relname) as rel from pg_class c join pg_namespace n on n.oid = c.relnamespace
          where c.relkind in ('r', 'm') and n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg\\_%'`,
      );
      const out: Record<string, Record<string, number>> = {};
      for (const { rel } of rels) {
        const pages: Record<string, number> = {};
        const rows = await tx.unsafe(`select (ctid::text::point)[0]::int8::text as blk, hashtext(string_agg(x::text, ',' order by x.ctid)) as h from ${rel} x group by 1`);
        for (const r of rows) pages[r.blk as string] = Number(r.h);
        out[rel as string] = pages;
      }
      return out;
    })) as Record<string, Record<string, number>>;
  }

  private async fingerprint(id: string): Promise<string> {
    return JSON.stringify(await this.pageHashes(id));
  }

  async divergenceBytes(id: string, fingerprint: string): Promise<number> {
    const before = JSON.parse(fingerprint) as Record<string, Record<string, number>>;
    const now = await this.pageHashes(id);
    const [{ bs }] = (await this.pool(id).unsafe(`select current_setting('block_size')::int as bs`)) as unknown as [{ bs: number }];
    let pages = 0;
    for (const [rel, blocks] of Object.entries(now)) {
      const old = before[rel] ?? {};
      for (const [blk, h] of Object.entries(blocks)) if (old[blk] !== h) pages++;
    }
    return pages * bs;
  }

  async disconnect(id: string, _reason: string): Promise<void> {
    const p = this.pools.get(id);
    this.pools.delete(id);
    this.current.delete(id);
    await p?.end({ timeout: 1 }).catch(() => {});
    // Proxied wire clients end with their server connections.
    await this.admin.unsafe(`select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()`, [serverDatabaseName(id)]);
  }

  async backup(id: string, path: string): Promise<number> {
    const { dump } = await this.pgTools();
    await this.ensureCurrent(id);
    try {
      await this.runTool([dump, "--format=custom", "--file", path], [id]);
    } catch (err) {
      rmSync(path, { force: true });
      throw err;
    }
    return statSync(path).size;
  }

  /** pg_dump as the database's tenant role (its own objects; a snapshot transaction, so it keeps serving). */
  async dump(id: string, format: DumpFormat, path: string): Promise<number> {
    const { dump } = await this.pgTools();
    await this.ensureCurrent(id);
    try {
      await this.runTool([dump, ...dumpArgs(format), "--file", path], [id]);
      if (format === "plain") await portablePlainDump(path);
    } catch (err) {
      rmSync(path, { force: true });
      throw err;
    }
    return statSync(path).size;
  }

  async restore(id: string, path: string, keepAt?: string): Promise<number | null> {
    // Into a database of its own first: until the swap, the database is untouched. The pre-restore
    // state (a pg_dump of the database as it is, no client connected) is taken meanwhile.
    const incoming = `${id}_restore`;
    try {
      if (!existsSync(path)) throw new Error("the backup no longer exists: its file is gone");
      const { dump, restore } = await this.pgTools();
      // The incoming copy belongs to the database's own role: the swap keeps owner and credentials.
      await this.ensureCurrent(id);
      await this.createEmpty(incoming, tenantRoleName(id));
      const results = await Promise.allSettled([
        this.runTool([restore, "--exit-on-error", "--no-owner", "--username", tenantRoleName(id), "--dbname", serverDatabaseName(incoming), path], [id]),
        keepAt
          ? (async () => {
              mkdirSync(dirname(keepAt), { recursive: true });
              await this.runTool([dump, "--format=custom", "--file", keepAt], [id]).catch((err) => {
                throw new Error(`the pre-restore state could not be kept: ${(err as Error).message}`);
              });
            })()
          : Promise.resolve(),
      ]);
      for (const r of results) if (r.status === "rejected") throw r.reason;
    } catch (err) {
      await this.dropServerDatabase(incoming).catch(() => {});
      if (keepAt) rmSync(keepAt, { force: true });
      throw new RestoreNotStarted((err as Error).message);
    }
    await this.dropServerDatabase(id);
    await this.admin.unsafe(`alter database ${ident(serverDatabaseName(incoming))} rename to ${ident(serverDatabaseName(id))}`);
    return keepAt ? statSync(keepAt).size : null;
  }

  async close(): Promise<void> {
    await this.pitr?.stop().catch(() => {});
    for (const p of this.pools.values()) await p.end({ timeout: 2 }).catch(() => {});
    this.pools.clear();
    await this.admin.end({ timeout: 2 });
  }
}
