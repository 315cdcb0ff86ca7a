import type { PrincipalCache } from "./auth/principal-cache";
import type { Clock } from "./clock";
import type { Config } from "./config";
import type { Logger } from "./log";
import type { SecretKey } from "./secrets/secret-key";
import type { Snapshots } from "./snapshots/controller";
import type { ControlStore } from "./store/store";

/** Where Kiln answers, known once it listens (function addresses and email links carry it). */
export interface ListeningAddress {
  /** The base of links Kiln sends out (`KILN_PUBLIC_URL`, else the listening address). */
  publicUrl(): string;
  /** The port Kiln's HTTP server listens on. */
  httpPort(): number;
}

/**
 * The shared infrastructure every area may ask for, made before any area starts. Everything else
 * an area uses comes from the areas before it in `server/main.ts`, declared in its `start`.
 */
export interface Platform {
  config: Config;
  clock: Clock;
  log: Logger;
  store: ControlStore;
  /** The instance secret key (kept outside the store): encrypts the store's secrets, derives per-instance-stable values. */
  secretKey: SecretKey;
  /** Verified credentials in memory; areas evict what they revoke. */
  principals: PrincipalCache;
  address: ListeningAddress;
  /** Snapshots of the whole platform and reset (server/snapshots); they outlive the areas they restart. */
  snapshots: Snapshots;
}
