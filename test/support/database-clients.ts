// postgres.js clients for the database suites, closed after the file's tests.
import { connect as tcpConnect } from "node:net";
import type pg from "pg";
import postgres from "postgres";
import { afterAll } from "vitest";

const clients: postgres.Sql[] = [];
afterAll(async () => {
  for (const c of clients.splice(0)) await c.end({ timeout: 1 }).catch(() => {});
});

/** One connection to `url`, ended after the file's tests. */
export function connect(url: string, opts: postgres.Options<{}> = {}) {
  // postgres.js's own default connect timeout: a database's first connection opens it (a branch's
  // replays its WAL first), which takes seconds on a loaded 2-core runner.
  const c = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 30, ...opts });
  clients.push(c);
  return c;
}

/** The connection string with an application_name (Kiln's access modes key off it). */
export function withApp(url: string, app: string): string {
  const u = new URL(url);
  u.searchParams.set("application_name", app);
  return u.toString();
}

/**
 * A real CancelRequest for node-postgres client `c`: a new plaintext connection to the listener of
 * `url` carrying the client's BackendKeyData (what libpq before 17 sends, also for TLS sessions).
 */
export function cancelRequest(url: string, c: pg.Client): Promise<void> {
  const { processID, secretKey } = c as unknown as { processID: number; secretKey: number };
  const u = new URL(url);
  return new Promise((ok, fail) => {
    const s = tcpConnect(Number(u.port), u.hostname, () => {
      const m = Buffer.alloc(16);
      m.writeInt32BE(16, 0);
      m.writeInt32BE(80877102, 4);
      m.writeInt32BE(processID, 8);
      m.writeInt32BE(secretKey, 12);
      s.end(m);
    });
    s.on("error", fail);
    s.on("close", () => ok());
  });
}
