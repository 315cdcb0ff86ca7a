import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import postgres from "postgres";
import { copyText, type ControlStore, type Row, type Sql } from "./store";

function clean(params?: unknown[]): any[] {
  return (params ?? []).map((p) => (p === undefined ? null : p));
}

/**
 * The production control store: a real PostgreSQL server given by `--database-url`. Several Kiln
 * instances may share it; anything they must agree on lives in these tables.
 */
export class PostgresStore implements ControlStore {
  readonly kind = "postgres" as const;
  private readonly sql: postgres.Sql;

  constructor(url: string) {
    this.sql = postgres(url, { max: 10, onnotice: () => {}, idle_timeout: 30, connect_timeout: 10 });
  }

  async query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]> {
    return (await this.sql.unsafe(text, clean(params))) as unknown as T[];
  }

  async transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return (await this.sql.begin((tx) =>
      fn({ query: async <R extends Row>(text: string, params?: unknown[]) => (await tx.unsafe(text, clean(params))) as unknown as R[] }),
    )) as T;
  }

  /**
   * On a connection of its own: the pool pipelines queries onto busy connections, and one sent
   * behind the COPY statement reaches the server in COPY mode ("protocol synchronization was lost":
   * the connection dies with every query on it, and the COPY never settles).
   */
  async copyRows(table: string, columns: readonly string[], rows: ReadonlyArray<ReadonlyArray<string | null>>): Promise<void> {
    if (!rows.length) return;
    const conn = await this.sql.reserve();
    try {
      const target = await conn.unsafe(`copy ${table} (${columns.join(", ")}) from stdin`).writable();
      await pipeline(Readable.from([copyText(rows)]), target);
    } finally {
      conn.release();
    }
  }

  /**
   * Only Kiln's role may connect to the control database (it holds every project's tokens, keys and
   * passwords): PUBLIC's CONNECT goes when Kiln's role owns the database or is a superuser. Returns a
   * warning when PUBLIC keeps it (another role owns the database), null otherwise.
   */
  async closeToPublic(): Promise<string | null> {
    const [r] = await this.sql.unsafe(
      `select current_database() as db, current_user as me,
              (select rolsuper from pg_roles where rolname = current_user) or pg_has_role(current_user, datdba, 'USAGE') as can
         from pg_database where datname = current_database()`,
    );
    const { db, me, can } = r as unknown as { db: string; me: string; can: boolean };
    const ident = `"${db.replace(/"/g, '""')}"`;
    if (can) await this.sql.unsafe(`revoke connect, temporary on database ${ident} from public`);
    const [open] = await this.sql.unsafe(`select has_database_privilege('public', current_database(), 'CONNECT') as open`);
    return open!.open
      ? `every role of the server may connect to the control database "${db}" (PUBLIC has CONNECT) and Kiln's role "${me}" cannot revoke it: as its owner run REVOKE CONNECT ON DATABASE ${ident} FROM PUBLIC (docs/production.md)`
      : null;
  }

  async close(): Promise<void> {
    await this.sql.end({ timeout: 5 });
  }
}
