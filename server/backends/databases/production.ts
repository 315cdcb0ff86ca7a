import postgres from "postgres";
import {
  DATABASE_SETUP_SQL,
  DatabaseQueryError,
  PRIVILEGES_UPGRADE_SQL,
  sessionInitSql,
  transactionInitSql,
  type AccessMode,
  type DatabaseEngine,
  type QueryResult,
} from "./engine";
import { openProxy } from "./pg-proxy";
import type { WireBackend, WireClient, WireControl } from "./wire/listener";

/** Server-side name of a Kiln database. */
export function serverDatabaseName(id: string): string {
  return `kiln_${id}`;
}

function ident(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * Production engine: every Kiln database is a database on a real PostgreSQL server (`--postgres-url`,
 * a role allowed to create databases and roles). Kiln's wire listener still authenticates clients
 * with their per-database credentials and proxies them with the server credentials; internal
 * credentials never leave Kiln.
 */
export class PostgresEngine implements DatabaseEngine {
  readonly kind = "postgres" as const;
  private readonly admin: postgres.Sql;
  private readonly pools = new Map<string, postgres.Sql>();
  private readonly url: URL;
  private version: number | null = null;

  constructor(adminUrl: string) {
    this.url = new URL(adminUrl);
    this.admin = postgres(adminUrl, { max: 2, onnotice: () => {}, idle_timeout: 30 });
  }

  async init(): Promise<void> {
    const [r] = await this.admin.unsafe(`select current_setting('server_version_num')::int / 10000 as v`);
    this.version = Number(r!.v);
  }

  serverVersions(): number[] {
    return this.version ? [this.version] : [];
  }

  private urlFor(id: string): string {
    const u = new URL(this.url.toString());
    u.pathname = `/${serverDatabaseName(id)}`;
    return u.toString();
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
      p = this.pool(id)
        .unsafe(PRIVILEGES_UPGRADE_SQL)
        .then(() => undefined);
      p.catch(() => this.current.delete(id));
      this.current.set(id, p);
    }
    return p;
  }

  private pool(id: string): postgres.Sql {
    let p = this.pools.get(id);
    if (!p) {
      p = postgres(this.urlFor(id), { max: 5, onnotice: () => {}, idle_timeout: 30 });
      this.pools.set(id, p);
    }
    return p;
  }

  async create(id: string): Promise<void> {
    const exists = await this.admin.unsafe(`select 1 from pg_database where datname = $1`, [serverDatabaseName(id)]);
    if (exists.length === 0) await this.admin.unsafe(`create database ${ident(serverDatabaseName(id))}`);
    const db = postgres(this.urlFor(id), { max: 1, onnotice: () => {} });
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
        user: decodeURIComponent(this.url.username),
        password: decodeURIComponent(this.url.password),
        database: serverDatabaseName(id),
        applicationName: client.applicationName,
        // The client's DateStyle, TimeZone, options (-c ...) and the like: the session starts as asked,
        // and a parameter the server refuses refuses the connection with the server's own error.
        params: client.params,
      },
      sessionInitSql(mode),
    );
    let send: ((d: Uint8Array) => void) | null = null;
    conn.onData((d) => send?.(d));
    conn.onClose(() => control.terminate("the database connection was closed"));
    return {
      parameters: async () => ({ ...conn.parameters, application_name: client.applicationName }),
      handle: async (msg, s) => {
        send = s;
        conn.write(msg);
      },
      close: async () => conn.end(),
      cancel: () => conn.cancel(),
    };
  }

  async sizeBytes(id: string): Promise<number> {
    const [r] = await this.admin.unsafe(`select pg_database_size($1)::float8 as n`, [serverDatabaseName(id)]);
    return Number(r?.n ?? 0);
  }

  async close(): Promise<void> {
    for (const p of this.pools.values()) await p.end({ timeout: 2 }).catch(() => {});
    this.pools.clear();
    await this.admin.end({ timeout: 2 });
  }
}
