import { createCipheriv, createDecipheriv, createHmac, randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

// Kiln's instance secret key: kept outside the control store, so a copy of the store alone reveals no
// secret in it. Everything secret Kiln writes to the store is encrypted with it; values Kiln must be
// able to recompute on every instance (tenant role passwords) are derived from it.

/** Where the key came from: the environment, a file named by the environment, or the data dir. */
export type SecretKeySource = "KILN_SECRET_KEY" | "KILN_SECRET_KEY_FILE" | "data-dir";

export interface SecretKey {
  /** Names the current key in every ciphertext it writes (not secret: a hash of the key). */
  readonly id: string;
  readonly source: SecretKeySource;
  /** The file the key was read from or generated into (KILN_SECRET_KEY_FILE or `<data-dir>/secret.key`). */
  readonly file?: string;
  /** Whether the data-dir key file was made by this start. */
  readonly generated: boolean;
  /** Ids of the previous keys given for rotation (KILN_SECRET_KEY_PREVIOUS). */
  readonly previousIds: readonly string[];
  /**
   * HMAC-SHA256 of `purpose` under the key, base64url: deterministic, so every Kiln given the same key
   * derives the same value (a tenant role's password from its name, say).
   */
  derive(purpose: string): string;
  /** AES-256-GCM with a fresh 96-bit nonce: `kiln:v1:<key id>:<base64url(nonce | ciphertext | tag)>`. */
  encrypt(plaintext: string): string;
  /** Decrypts what this key or a previous one wrote; throws on anything else (another key, tampering). */
  decrypt(ciphertext: string): string;
  /** The key id a ciphertext names, or null when the value is not in Kiln's ciphertext format. */
  keyIdOf(value: string): string | null;
  /** Whether `id` is the current key's or a previous key's. */
  knows(id: string): boolean;
}

const PREFIX = "kiln:v1:";
const NONCE_BYTES = 12;
const TAG_BYTES = 16;
const KEY_BYTES = 32;
const CIPHERTEXT_RE = /^kiln:v1:([0-9a-f]{12}):([A-Za-z0-9_-]+)$/;
const FORMAT_HINT = "32 random bytes written as base64 (44 characters) or hex (64 characters), e.g. the output of `openssl rand -base64 32`";

/** Reads the key from KILN_SECRET_KEY, else KILN_SECRET_KEY_FILE, else `<dataDir>/secret.key` (made on first start). */
export function loadSecretKey(dataDir: string, env: Record<string, string | undefined> = process.env): SecretKey {
  const inline = env.KILN_SECRET_KEY?.trim();
  const fileName = env.KILN_SECRET_KEY_FILE?.trim();
  if (inline && fileName) throw new Error("set KILN_SECRET_KEY or KILN_SECRET_KEY_FILE, not both");
  const previous = (env.KILN_SECRET_KEY_PREVIOUS ?? "")
    .split(/[\s,]+/)
    .filter(Boolean)
    .map((k, i) => parseKey(k, `KILN_SECRET_KEY_PREVIOUS (key ${i + 1})`));
  if (inline) return makeSecretKey(parseKey(inline, "KILN_SECRET_KEY"), previous, { source: "KILN_SECRET_KEY", generated: false });
  if (fileName) {
    let text: string;
    try {
      text = readFileSync(fileName, "utf8");
    } catch (err) {
      throw new Error(`KILN_SECRET_KEY_FILE ${fileName} cannot be read: ${(err as Error).message}`);
    }
    return makeSecretKey(parseKey(text.trim(), `KILN_SECRET_KEY_FILE ${fileName}`), previous, { source: "KILN_SECRET_KEY_FILE", file: fileName, generated: false });
  }
  const file = join(dataDir, "secret.key");
  if (existsSync(file)) {
    return makeSecretKey(parseKey(readFileSync(file, "utf8").trim(), `the key file ${file}`), previous, { source: "data-dir", file, generated: false });
  }
  const key = randomBytes(KEY_BYTES);
  // "wx": never overwrite a key another process wrote in between (the data dir lock makes that unlikely).
  writeFileSync(file, `${key.toString("base64")}\n`, { mode: 0o600, flag: "wx" });
  return makeSecretKey(key, previous, { source: "data-dir", file, generated: true });
}

/** 32 bytes as base64 (with or without padding), base64url or hex; anything shorter or patterned is refused. */
export function parseKey(text: string, what: string): Buffer {
  let key: Buffer | null = null;
  if (/^[0-9a-fA-F]{64}$/.test(text)) key = Buffer.from(text, "hex");
  else if (/^[A-Za-z0-9+/]{43}=?$/.test(text) || /^[A-Za-z0-9_-]{43}=?$/.test(text)) key = Buffer.from(text.replace(/=$/, ""), text.includes("-") || text.includes("_") ? "base64url" : "base64");
  if (!key || key.length !== KEY_BYTES) throw new Error(`${what} must be ${FORMAT_HINT}; got ${text.length} characters`);
  // 32 random bytes have ~30 distinct values; fewer than 16 is a typed pattern (zeros, a repeated word).
  if (new Set(key).size < 16) throw new Error(`${what} does not look random (too few distinct bytes); use ${FORMAT_HINT}`);
  return key;
}

function hmac(key: Buffer, data: string): Buffer {
  return createHmac("sha256", key).update(data).digest();
}

interface KeyMaterial {
  id: string;
  encryption: Buffer;
}

// Sub-keys are HMACs of labels starting with a NUL byte, which `derive` refuses as a purpose: no
// derived value can equal the encryption key or the key id.
function material(key: Buffer): KeyMaterial {
  return { id: hmac(key, "\0kiln key id").subarray(0, 6).toString("hex"), encryption: hmac(key, "\0kiln encryption v1") };
}

export function makeSecretKey(key: Buffer, previous: Buffer[] = [], meta: { source: SecretKeySource; file?: string; generated: boolean } = { source: "KILN_SECRET_KEY", generated: false }): SecretKey {
  const current = material(key);
  const byId = new Map<string, KeyMaterial>([[current.id, current]]);
  const previousIds: string[] = [];
  for (const p of previous) {
    const m = material(p);
    if (m.id === current.id) throw new Error("KILN_SECRET_KEY_PREVIOUS holds the current key; give the key being replaced");
    if (!byId.has(m.id)) previousIds.push(m.id);
    byId.set(m.id, m);
  }
  const keyIdOf = (value: string) => CIPHERTEXT_RE.exec(value)?.[1] ?? null;
  return {
    id: current.id,
    ...meta,
    previousIds,
    derive(purpose) {
      if (!purpose || purpose.includes("\0")) throw new Error("a derivation purpose must be a non-empty string without NUL bytes");
      return createHmac("sha256", key).update(purpose).digest("base64url");
    },
    encrypt(plaintext) {
      const nonce = randomBytes(NONCE_BYTES);
      const cipher = createCipheriv("aes-256-gcm", current.encryption, nonce);
      const body = Buffer.concat([nonce, cipher.update(plaintext, "utf8"), cipher.final(), cipher.getAuthTag()]);
      return `${PREFIX}${current.id}:${body.toString("base64url")}`;
    },
    decrypt(ciphertext) {
      const m = CIPHERTEXT_RE.exec(ciphertext);
      if (!m) throw new Error("not a Kiln ciphertext");
      const k = byId.get(m[1]!);
      if (!k) throw new Error(`written with another secret key (key id ${m[1]}; this Kiln has ${[...byId.keys()].join(", ")})`);
      const body = Buffer.from(m[2]!, "base64url");
      if (body.length < NONCE_BYTES + TAG_BYTES) throw new Error("a Kiln ciphertext too short to hold its nonce and tag");
      const decipher = createDecipheriv("aes-256-gcm", k.encryption, body.subarray(0, NONCE_BYTES));
      decipher.setAuthTag(body.subarray(body.length - TAG_BYTES));
      return Buffer.concat([decipher.update(body.subarray(NONCE_BYTES, body.length - TAG_BYTES)), decipher.final()]).toString("utf8");
    },
    keyIdOf,
    knows: (id) => byId.has(id),
  };
}
