// What Kiln does with a promise rejection nobody handled. Bun's default ends the process.
//
// postgres.js leaves one kind unhandled by design: a connection fetches its array types right after
// it connects (connection.js: `return fetchArrayTypes()` from a socket data handler, its promise
// dropped), and when the server resets that connection meanwhile (PostgreSQL stopped, restarted, a
// proxy cut), the rejection reaches nobody; the query that opened the connection has already been
// failed and retried on its own. Ending Kiln for it turned a database outage of the production
// profile into a crash. A lost connection is logged and Kiln goes on; anything else is a bug, still
// ends the process (exit 1), and says so.
import type { Logger } from "./log";

/** Error codes of a database connection that went away (node, postgres.js, PostgreSQL's shutdown states). */
const CONNECTION_LOST = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED",
  "CONNECTION_ENDED",
  "CONNECT_TIMEOUT",
  "57P01", // admin_shutdown
  "57P02", // crash_shutdown
  "57P03", // cannot_connect_now
]);

export function isConnectionLoss(reason: unknown): boolean {
  const code = (reason as { code?: unknown } | null)?.code;
  return typeof code === "string" && CONNECTION_LOST.has(code);
}

let installed = false;

export function handleUnhandledRejections(log: Logger): void {
  if (installed) return;
  installed = true;
  process.on("unhandledRejection", (reason) => {
    if (isConnectionLoss(reason)) {
      log.warn(`a background database connection was lost (${(reason as { code: string }).code}: ${(reason as Error).message}); continuing`);
      return;
    }
    log.error("unhandled promise rejection; exiting", reason);
    process.exit(1);
  });
}
