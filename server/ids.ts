import { randomBytes } from "node:crypto";

const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";
const SECRET_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

function randomString(alphabet: string, length: number): string {
  // Rejection sampling keeps every character uniformly likely.
  const limit = 256 - (256 % alphabet.length);
  let out = "";
  while (out.length < length) {
    for (const b of randomBytes(length * 2)) {
      if (b < limit) out += alphabet[b % alphabet.length];
      if (out.length === length) break;
    }
  }
  return out;
}

// Ids are made per invocation and per log line: their random bytes come from a block refilled
// every few hundred ids instead of one randomBytes call each. Each byte is used once.
let idBytes = Buffer.alloc(0);
let idPos = 0;
const ID_LIMIT = 256 - (256 % ID_ALPHABET.length);

function idChars(length: number): string {
  let out = "";
  while (out.length < length) {
    if (idPos === idBytes.length) {
      idBytes = randomBytes(4096);
      idPos = 0;
    }
    const b = idBytes[idPos++]!;
    if (b < ID_LIMIT) out += ID_ALPHABET[b % ID_ALPHABET.length];
  }
  return out;
}

/**
 * Resource ids: 20 lowercase letters and digits. DNS-safe so they can appear in host names
 * (function invoke addresses) and short enough to leave room for a function name beside them.
 */
export function newId(): string {
  return idChars(20);
}

/**
 * An id of the same shape whose order follows creation time (9 base-36 characters of milliseconds,
 * then 11 random ones), for rows written at a high rate: the primary-key index then grows at its
 * end instead of at random pages.
 */
export function newTimeOrderedId(): string {
  return Date.now().toString(36).padStart(9, "0") + idChars(11);
}

/** An id of the same shape that starts with `prefix` (letters and digits) and ends in random characters. */
export function newIdWithPrefix(prefix: string): string {
  return prefix + idChars(20 - prefix.length);
}

export type SecretKind = "pk" | "pt" | "sk" | "ak";

/** A credential secret: `<kind>-` followed by 40 random base62 characters (~238 bits). */
export function newSecret(kind: SecretKind): string {
  return `${kind}-${randomString(SECRET_ALPHABET, 40)}`;
}

/** Leading characters shown in listings so people can tell secrets apart without seeing them. */
export function secretPrefix(secret: string): string {
  return secret.slice(0, 11);
}

/**
 * Secrets are 238-bit random strings, so a fast hash is enough: there is nothing to brute-force.
 * Only this hash is stored.
 */
export function hashSecret(secret: string): string {
  // Bun's one-shot SHA-256: the same digest as node:crypto's, at a quarter of the cost per request.
  return Bun.SHA256.hash(secret, "hex");
}
