import { createHash, randomBytes } from "node:crypto";

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

/**
 * Resource ids: 20 lowercase letters and digits. DNS-safe so they can appear in host names
 * (function invoke addresses) and short enough to leave room for a function name beside them.
 */
export function newId(): string {
  return randomString(ID_ALPHABET, 20);
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
  return createHash("sha256").update(secret).digest("hex");
}
