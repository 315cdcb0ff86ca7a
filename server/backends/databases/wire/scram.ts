import { createHash, createHmac, pbkdf2, randomBytes, timingSafeEqual } from "node:crypto";
import { promisify } from "node:util";

/**
 * The server side of SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL speaks it: no channel
 * binding (Kiln's listener has no TLS), the user name in the SCRAM messages is ignored (the startup
 * packet names the role), 4096 iterations like PostgreSQL's default.
 */

export const SCRAM_MECHANISM = "SCRAM-SHA-256";
const ITERATIONS = 4096;
const derive = promisify(pbkdf2);

export interface ScramVerifier {
  salt: Buffer;
  iterations: number;
  storedKey: Buffer;
  serverKey: Buffer;
}

const hmac = (key: Buffer, data: string) => createHmac("sha256", key).update(data).digest();
const sha256 = (data: Buffer) => createHash("sha256").update(data).digest();

/**
 * PBKDF2 with 4096 rounds costs a few milliseconds, and a pool opens many connections with one
 * password, so verifiers are kept per password (keyed by its hash) for the life of the listener.
 */
export class VerifierCache {
  private byPassword = new Map<string, Promise<ScramVerifier>>();
  constructor(private readonly limit = 512) {}

  get(password: string): Promise<ScramVerifier> {
    const key = createHash("sha256").update(password).digest("base64");
    let v = this.byPassword.get(key);
    if (!v) {
      v = makeVerifier(password);
      if (this.byPassword.size >= this.limit) this.byPassword.delete(this.byPassword.keys().next().value!);
      this.byPassword.set(key, v);
    }
    return v;
  }
}

async function makeVerifier(password: string): Promise<ScramVerifier> {
  const salt = randomBytes(16);
  const salted = await derive(password, salt, ITERATIONS, 32, "sha256");
  return { salt, iterations: ITERATIONS, storedKey: sha256(hmac(salted, "Client Key")), serverKey: hmac(salted, "Server Key") };
}

/** A verifier no proof can match, with a stable salt per user, so unknown roles look like real ones. */
export function mockVerifier(user: string, secret: Buffer): ScramVerifier {
  return {
    salt: hmac(secret, `salt:${user}`).subarray(0, 16),
    iterations: ITERATIONS,
    storedKey: randomBytes(32),
    serverKey: randomBytes(32),
  };
}

export class ScramError extends Error {}

/** One exchange: `first` answers the client-first message, `final` checks the proof. */
export class ScramExchange {
  private clientFirstBare = "";
  private serverFirst = "";
  private nonce = "";
  private gs2Header = "";

  constructor(private readonly verifier: ScramVerifier) {}

  first(clientFirst: string): string {
    const m = /^([ny]|p=[^,]*),(a=[^,]*)?,(.*)$/s.exec(clientFirst);
    if (!m) throw new ScramError("malformed SCRAM message");
    if (m[1]!.startsWith("p=")) throw new ScramError("channel binding is not supported");
    if (m[2]) throw new ScramError("client uses authorization identity, but it is not supported");
    this.gs2Header = `${m[1]},,`;
    this.clientFirstBare = m[3]!;
    const clientNonce = /(?:^|,)r=([^,]+)/.exec(this.clientFirstBare)?.[1];
    if (!clientNonce || !/^[\x21-\x2b\x2d-\x7e]+$/.test(clientNonce)) throw new ScramError("malformed SCRAM message");
    this.nonce = clientNonce + randomBytes(18).toString("base64");
    this.serverFirst = `r=${this.nonce},s=${this.verifier.salt.toString("base64")},i=${this.verifier.iterations}`;
    return this.serverFirst;
  }

  /** The server-final message, or null when the proof is wrong. */
  final(clientFinal: string): string | null {
    const proofAt = clientFinal.lastIndexOf(",p=");
    if (proofAt < 0) throw new ScramError("malformed SCRAM message");
    const withoutProof = clientFinal.slice(0, proofAt);
    const attrs = new Map(withoutProof.split(",").map((kv) => [kv.slice(0, 1), kv.slice(2)] as const));
    if (attrs.get("c") !== Buffer.from(this.gs2Header).toString("base64")) throw new ScramError("SCRAM channel binding check failed");
    if (attrs.get("r") !== this.nonce) throw new ScramError("SCRAM nonce mismatch");
    const proof = Buffer.from(clientFinal.slice(proofAt + 3), "base64");
    if (proof.length !== 32) throw new ScramError("malformed SCRAM message");

    const authMessage = `${this.clientFirstBare},${this.serverFirst},${withoutProof}`;
    const signature = hmac(this.verifier.storedKey, authMessage);
    const clientKey = Buffer.alloc(32);
    for (let i = 0; i < 32; i++) clientKey[i] = proof[i]! ^ signature[i]!;
    if (!timingSafeEqual(sha256(clientKey), this.verifier.storedKey)) return null;
    return `v=${hmac(this.verifier.serverKey, authMessage).toString("base64")}`;
  }
}
