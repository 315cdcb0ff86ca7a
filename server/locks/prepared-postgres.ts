import postgres from "postgres";
import type { Row, Sql } from "../store/store";
import type { LockStore } from "./postgres-lock-table";

function clean(params?: unknown[]): any[] {
  return (params ?? []).map((p) => (p === undefined ? null : p));
}

/**
 * The lock table's own connections to the production control store, with every statement kept
 * prepared. The lock table runs a dozen fixed statement texts, so each connection prepares each
 * once; planning them was most of an operation's cost (measured: the counted renew statement
 * 0.45 ms unprepared, 0.19 ms prepared). The control store's own pool does not prepare (most of
 * Kiln's SQL is not a fixed set of texts), so the locks keep this small pool beside it.
 */
export class PreparedPostgres implements LockStore {
  private readonly sql: postgres.Sql;

  constructor(url: string, max = 8) {
    this.sql = postgres(url, { max, onnotice: () => {}, idle_timeout: 30, connect_timeout: 10, prepare: true });
  }

  async query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]> {
    return (await this.sql.unsafe(text, clean(params), { prepare: true })) as unknown as T[];
  }

  async transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return (await this.sql.begin((tx) =>
      fn({ query: async <R extends Row>(text: string, params?: unknown[]) => (await tx.unsafe(text, clean(params), { prepare: true })) as unknown as R[] }),
    )) as T;
  }

  /**
   * Closed at stop, after the last HTTP request (the only source of lock statements) finished, so
   * nothing is left to wait for. After the server was unreachable for a while, postgres.js's end()
   * waits out its whole timeout on a connection left from the outage (measured: 5 s with nothing in
   * flight), which held every such stop: 1 s.
   */
  async close(): Promise<void> {
    await this.sql.end({ timeout: 1 });
  }
}
