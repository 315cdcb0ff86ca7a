/**
 * ECDSA signatures are malleable: if (r, s) verifies, so does (r, n - s), and JOSE libraries (jose,
 * WebCrypto) accept both. A token with the twin signature is a different string carrying the same
 * claims, so anything keyed by the token text (caches, replay or revocation lists, logs) could be
 * sidestepped. Kiln signs with low S only (s <= n/2) and refuses high S, so each set of claims has
 * exactly one valid token.
 */

/** The group order n of each JWS ECDSA algorithm's curve, and the byte length of r and s. */
const CURVES: Record<string, { n: bigint; size: number }> = {
  ES256: { n: 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n, size: 32 },
  ES384: { n: 0xffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973n, size: 48 },
  ES512: {
    n: 0x01fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffa51868783bf2f966b7fcc0148f709a5d03bb5c9b8899c47aebb6fb71e91386409n,
    size: 66,
  },
};

function toBigInt(bytes: Uint8Array): bigint {
  return bytes.length === 0 ? 0n : BigInt("0x" + Buffer.from(bytes).toString("hex"));
}

function toBytes(v: bigint, size: number): Buffer {
  return Buffer.from(v.toString(16).padStart(size * 2, "0"), "hex");
}

/** The JWS's algorithm's curve and its signature's s, or null when it is not a well-formed ECDSA JWS. */
function parse(jws: string, alg: string): { curve: { n: bigint; size: number }; head: string; r: Buffer; s: bigint } | null {
  const curve = CURVES[alg];
  const dot = jws.lastIndexOf(".");
  if (!curve || dot < 0) return null;
  const sig = Buffer.from(jws.slice(dot + 1), "base64url");
  if (sig.length !== curve.size * 2) return null;
  return { curve, head: jws.slice(0, dot), r: sig.subarray(0, curve.size), s: toBigInt(sig.subarray(curve.size)) };
}

/** False for an ECDSA JWS whose s is above n/2 (or that is not one of `alg` at all). */
export function hasLowS(jws: string, alg: string): boolean {
  const p = parse(jws, alg);
  return !!p && p.s <= p.curve.n >> 1n;
}

/** The same JWS with its signature's s replaced by n - s when it is above n/2 (still valid, now canonical). */
export function withLowS(jws: string, alg: string): string {
  const p = parse(jws, alg);
  if (!p) throw new Error(`not an ${alg} JWS`);
  if (p.s <= p.curve.n >> 1n) return jws;
  return `${p.head}.${Buffer.concat([p.r, toBytes(p.curve.n - p.s, p.curve.size)]).toString("base64url")}`;
}
