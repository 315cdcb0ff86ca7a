import type { JWK, JWTPayload } from "jose";

/** jose loads with the first key operation, not with Kiln (start-up time and memory). */
const jose = () => import("jose");
import { newId } from "../ids";
import { hasLowS, withLowS } from "./ecdsa-low-s";
import type { SecretKey } from "../secrets/secret-key";
import type { ControlStore, Sql } from "../store/store";

const ALG = "ES256";
/** A rotated key keeps verifying tokens for this long (longer than the longest access-token TTL). */
const ROTATED_KEY_GRACE_MS = 86_400_000;

export interface AccessClaims extends JWTPayload {
  sub: string;
  email: string;
  role: "authenticated";
  session_id: string;
  project_id: string;
}

export function issuerOf(projectId: string): string {
  return `kiln:project:${projectId}`;
}
export const AUDIENCE = "authenticated";

type Key = CryptoKey | Uint8Array;

/**
 * Per-project ES256 keys for end-user access tokens. Asymmetric so anyone can verify tokens with the
 * published JWKS without holding a secret. The newest key signs; rotated keys keep verifying for a
 * day so tokens issued just before a rotation stay valid until they expire.
 */
export class SigningKeys {
  private readonly privateKeys = new Map<string, Key>();
  private readonly publicKeys = new Map<string, { key: Key; projectId: string; usableUntil: number | null }>();

  /** Forgets every cached key (a snapshot restore put back the rows they were read from). */
  forgetAll(): void {
    this.privateKeys.clear();
    this.publicKeys.clear();
  }

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    /** The private JWK is stored encrypted with it (a JSON string in the jsonb column). */
    private readonly secretKey: SecretKey,
  ) {}

  async create(projectId: string, tx: Sql = this.store): Promise<string> {
    const { exportJWK, generateKeyPair } = await jose();
    const { privateKey, publicKey } = await generateKeyPair(ALG, { extractable: true });
    const kid = newId();
    const pub = { ...(await exportJWK(publicKey)), kid, alg: ALG, use: "sig" };
    await tx.query(
      `insert into auth_signing_keys (kid, project_id, private_jwk, public_jwk, created_at) values ($1, $2, to_jsonb($3::text), $4::text::jsonb, $5)`,
      [kid, projectId, this.secretKey.encrypt(JSON.stringify(await exportJWK(privateKey))), JSON.stringify(pub), this.now().toISOString()],
    );
    return kid;
  }

  /** Makes a new signing key; the previous ones stop signing at once and stop verifying after a day. */
  async rotate(projectId: string): Promise<{ kid: string }> {
    const at = this.now().toISOString();
    await this.store.query(`update auth_signing_keys set rotated_at = $2 where project_id = $1 and rotated_at is null`, [projectId, at]);
    for (const [kid, k] of this.publicKeys) if (k.projectId === projectId) this.publicKeys.delete(kid);
    return { kid: await this.create(projectId) };
  }

  private async current(projectId: string): Promise<{ kid: string; key: Key }> {
    let [row] = await this.store.query(
      `select kid, private_jwk from auth_signing_keys where project_id = $1 and rotated_at is null order by created_at desc limit 1`,
      [projectId],
    );
    if (!row) {
      // Projects made before end users existed get their first key on first use.
      await this.create(projectId);
      [row] = await this.store.query(`select kid, private_jwk from auth_signing_keys where project_id = $1 and rotated_at is null`, [projectId]);
    }
    let key = this.privateKeys.get(row!.kid);
    if (!key) {
      key = (await (await jose()).importJWK(JSON.parse(this.secretKey.decrypt(row!.private_jwk as string)) as JWK, ALG)) as Key;
      this.privateKeys.set(row!.kid, key);
    }
    return { kid: row!.kid, key };
  }

  async sign(projectId: string, claims: Omit<AccessClaims, "project_id">, ttlSeconds: number): Promise<string> {
    const { kid, key } = await this.current(projectId);
    const iat = Math.floor(this.now().getTime() / 1000);
    const { SignJWT } = await jose();
    const jwt = await new SignJWT({ ...claims, project_id: projectId })
      .setProtectedHeader({ alg: ALG, kid, typ: "JWT" })
      .setIssuer(issuerOf(projectId))
      .setAudience(AUDIENCE)
      .setIssuedAt(iat)
      .setExpirationTime(iat + ttlSeconds)
      .sign(key);
    // WebCrypto picks either S; verify() accepts only the low one (see ecdsa-low-s.ts).
    return withLowS(jwt, ALG);
  }

  /** The claims of a valid token signed by one of the project's usable keys, or null. */
  async verify(jwt: string): Promise<AccessClaims | null> {
    const { decodeProtectedHeader, importJWK, jwtVerify } = await jose();
    let kid: string | undefined;
    try {
      kid = decodeProtectedHeader(jwt).kid;
    } catch {
      return null;
    }
    if (!kid) return null;
    // jose accepts both (r, s) and its twin (r, n - s); only the canonical low-S form is a token.
    if (!hasLowS(jwt, ALG)) return null;
    let entry = this.publicKeys.get(kid);
    if (!entry) {
      const [row] = await this.store.query(`select project_id, public_jwk, rotated_at from auth_signing_keys where kid = $1`, [kid]);
      if (!row) return null;
      entry = {
        key: (await importJWK(row.public_jwk as JWK, ALG)) as Key,
        projectId: row.project_id,
        usableUntil: row.rotated_at ? new Date(row.rotated_at).getTime() + ROTATED_KEY_GRACE_MS : null,
      };
      this.publicKeys.set(kid, entry);
    }
    if (entry.usableUntil !== null && entry.usableUntil <= this.now().getTime()) return null;
    try {
      const { payload } = await jwtVerify(jwt, entry.key, {
        issuer: issuerOf(entry.projectId),
        audience: AUDIENCE,
        algorithms: [ALG],
        currentDate: this.now(),
      });
      if (payload.project_id !== entry.projectId) return null;
      return payload as AccessClaims;
    } catch {
      return null;
    }
  }

  /** Public keys that verify this project's tokens (JWKS). */
  async jwks(projectId: string): Promise<{ keys: JWK[] }> {
    await this.current(projectId); // make sure a key exists
    const since = new Date(this.now().getTime() - ROTATED_KEY_GRACE_MS).toISOString();
    const rows = await this.store.query(
      `select public_jwk from auth_signing_keys where project_id = $1 and (rotated_at is null or rotated_at > $2::timestamptz) order by created_at desc`,
      [projectId, since],
    );
    return { keys: rows.map((r) => r.public_jwk as JWK) };
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from auth_signing_keys where project_id = $1`, [projectId]);
    for (const [kid, k] of this.publicKeys) if (k.projectId === projectId) this.publicKeys.delete(kid);
  }
}
