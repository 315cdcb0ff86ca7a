import postgres from "postgres";
import type { ControlStore, Row, Sql } from "./store";

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

  async close(): Promise<void> {
    await this.sql.end({ timeout: 5 });
  }
}
