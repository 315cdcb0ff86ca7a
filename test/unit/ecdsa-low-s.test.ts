// Low-S ECDSA for JWS on every curve JOSE names: withLowS keeps the signature valid and canonical,
// hasLowS refuses the high-S twin that jose itself still accepts.
import { compactVerify, CompactSign, generateKeyPair } from "jose";
import { describe, expect, test } from "vitest";
import { hasLowS, withLowS } from "../../server/end-users/ecdsa-low-s";

const ORDERS = {
  ES256: { n: 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n, size: 32 },
  ES384: { n: 0xffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973n, size: 48 },
  ES512: { n: (1n << 521n) - 1n - 0x5ae79787c40d069948033feb708f65a2fc44a36477663b851449048e16ec79bf6n, size: 66 },
} as const;

describe("ecdsa low S", () => {
  for (const [alg, { n, size }] of Object.entries(ORDERS)) {
    test(`${alg}: 16 signatures come out low-S and still verify; their twins verify with jose but fail hasLowS`, async () => {
      const { privateKey, publicKey } = await generateKeyPair(alg);
      let sawHigh = false;
      for (let i = 0; i < 16; i++) {
        const jws = await new CompactSign(new TextEncoder().encode(`payload ${i}`)).setProtectedHeader({ alg }).sign(privateKey);
        sawHigh ||= !hasLowS(jws, alg);
        const low = withLowS(jws, alg);
        expect(hasLowS(low, alg)).toBe(true);
        await compactVerify(low, publicKey);
        const [head, payload, sig] = low.split(".");
        const raw = Buffer.from(sig!, "base64url");
        const s = BigInt("0x" + raw.subarray(size).toString("hex"));
        const twin = `${head}.${payload}.${Buffer.concat([raw.subarray(0, size), Buffer.from((n - s).toString(16).padStart(size * 2, "0"), "hex")]).toString("base64url")}`;
        await compactVerify(twin, publicKey); // what hasLowS is for: jose takes it
        expect(hasLowS(twin, alg)).toBe(false);
        expect(withLowS(twin, alg)).toBe(low);
      }
      expect(sawHigh).toBe(true); // 2^-16 to miss by chance: the signer really does pick high S
    });
  }

  test("not an ECDSA JWS of the algorithm: hasLowS is false, withLowS throws", () => {
    expect(hasLowS("a.b.c", "ES256")).toBe(false);
    expect(hasLowS("a.b." + Buffer.alloc(64).toString("base64url"), "RS256")).toBe(false);
    expect(hasLowS("no-dots", "ES256")).toBe(false);
    expect(() => withLowS("a.b.c", "ES256")).toThrow(/not an ES256 JWS/);
  });
});
