import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { ConnectionOptions } from "node:tls";

/**
 * TLS between Kiln and the production engine's PostgreSQL server, as libpq's `sslmode` and
 * `sslrootcert` in `--postgres-url` say, for every path to the server: Kiln's own connections
 * (postgres.js), the wire proxy's sessions (pg-proxy.ts) and pg_dump/pg_restore (libpq's environment).
 * No `sslmode`: plaintext, as before (postgres.js's default; libpq's would be `prefer`).
 */
export type SslMode = "disable" | "allow" | "prefer" | "require" | "verify-ca" | "verify-full";

export interface ServerTls {
  mode: SslMode;
  /** PEM of the certificate authorities `verify-ca` / `verify-full` trust (sslrootcert); the system's when absent. */
  ca?: string;
  rootCertPath?: string;
  host: string;
}

const MODES: readonly SslMode[] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];

/** The URL's TLS settings (null without sslmode), and the URL without them (postgres.js would send unknown ones to the server as settings). */
export function serverTlsOf(url: string): { tls: ServerTls | null; url: string } {
  const u = new URL(url);
  const mode = u.searchParams.get("sslmode");
  const rootCertPath = u.searchParams.get("sslrootcert") ?? undefined;
  u.searchParams.delete("sslmode");
  u.searchParams.delete("sslrootcert");
  if (!mode) return { tls: null, url: u.toString() };
  if (!MODES.includes(mode as SslMode)) throw new Error(`--postgres-url: sslmode must be one of ${MODES.join(", ")}; got ${mode}`);
  let ca: string | undefined;
  if (rootCertPath) {
    try {
      ca = readFileSync(rootCertPath, "utf8");
    } catch (err) {
      throw new Error(`--postgres-url: sslrootcert ${rootCertPath} cannot be read: ${(err as Error).message}`);
    }
  }
  return { tls: { mode: mode as SslMode, ca, rootCertPath, host: u.hostname }, url: u.toString() };
}

/** Whether the mode asks for TLS at all (an SSLRequest first). */
export function wantsTls(t: ServerTls | null): t is ServerTls {
  return !!t && t.mode !== "disable" && t.mode !== "allow";
}

/** Node's TLS options for the mode: `require` encrypts without checking, `verify-ca` checks the chain, `verify-full` the host name too. */
export function tlsConnectOptions(t: ServerTls): ConnectionOptions {
  const verify = t.mode === "verify-ca" || t.mode === "verify-full";
  return {
    servername: isIP(t.host) ? undefined : t.host,
    rejectUnauthorized: verify,
    ...(t.ca ? { ca: t.ca } : {}),
    ...(t.mode === "verify-ca" ? { checkServerIdentity: () => undefined } : {}),
  };
}

/** postgres.js's `ssl` option for the mode. */
export function postgresJsSsl(t: ServerTls | null): false | "prefer" | "require" | ConnectionOptions {
  if (!t || t.mode === "disable" || t.mode === "allow") return false;
  if (t.mode === "prefer") return "prefer";
  if (t.mode === "require") return "require";
  return tlsConnectOptions(t);
}

/** libpq's environment for the mode (pg_dump, pg_restore, pg_basebackup). */
export function libpqTlsEnv(t: ServerTls | null): Record<string, string> {
  if (!t) return {};
  return { PGSSLMODE: t.mode, ...(t.rootCertPath ? { PGSSLROOTCERT: t.rootCertPath } : {}) };
}
