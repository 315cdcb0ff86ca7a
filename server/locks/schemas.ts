import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { LOCK_KEY_MAX_LENGTH, LOCK_TTL_MAX_SECONDS, LOCK_TTL_MIN_SECONDS } from "./lock-table";

export const LOCK_TOKEN_HEADER = "X-Service-Lock-Token";
export const REQUEST_ID_HEADER = "X-Service-Request-Id";

/** 8-4-4-4-12 hexadecimal digits, either case (RFC 9562 UUIDs compare case-insensitively). */
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The key is documented here but checked by the handler, so that a request refused for its key
 * still counts against the project's quota (every request counts): a pattern in the schema would
 * refuse it before authentication, uncounted.
 */
export const lockParams = z.object({
  key: z.string().meta({
    description: `the lock key: 1-${LOCK_KEY_MAX_LENGTH} letters, digits, '.', '_', ':' or '-'; scoped to the service key's project`,
    pattern: `^[A-Za-z0-9._:-]{1,${LOCK_KEY_MAX_LENGTH}}$`,
    minLength: 1,
    maxLength: LOCK_KEY_MAX_LENGTH,
  }),
});

const ttlSeconds = z
  .number({ error: "ttl_seconds is required: an integer number of seconds" })
  .int("ttl_seconds must be an integer number of seconds")
  .min(LOCK_TTL_MIN_SECONDS, `ttl_seconds must be at least ${LOCK_TTL_MIN_SECONDS}`)
  .max(LOCK_TTL_MAX_SECONDS, `ttl_seconds must be at most ${LOCK_TTL_MAX_SECONDS} (90 days)`)
  .describe(`lease length in seconds, ${LOCK_TTL_MIN_SECONDS} to ${LOCK_TTL_MAX_SECONDS}`);

/** Acquire and renew: `{ttl_seconds}` (validated by the handler, so that a refused body still counts). */
export const leaseBody = z.object({ ttl_seconds: ttlSeconds });

export const leaseSchema = z.object({
  expires_at: timestamp,
  fencing_token: z.number().int().describe("rises whenever the lock changes hands; equal across renewals of one lease"),
});

export const lockStateSchema = z.union([
  z.strictObject({ held: z.literal(false) }),
  z.object({ held: z.literal(true), expires_at: timestamp, fencing_token: z.number().int() }),
]);
