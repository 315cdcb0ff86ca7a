// The relying-party side against providers the local emulators do not imitate: Microsoft's
// multi-tenant issuer (`{tenantid}` in discovery, the tenant's own issuer in the id_token), a token
// of another audience or nonce, and the real GitHub's two hosts.
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { afterAll, describe, expect, test } from "vitest";
import type { OAuthConfig } from "../../server/oauth/configs";
import { ProviderClient } from "../../server/oauth/provider-client";

const { privateKey, publicKey } = await generateKeyPair("RS256");
const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "RS256", use: "sig" };
let idToken = "";
const server = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  fetch(req): Response {
    const path = new URL(req.url).pathname;
    if (path === "/common/v2.0/.well-known/openid-configuration")
      return Response.json({
        issuer: `${base}/{tenantid}/v2.0`,
        authorization_endpoint: `${base}/authorize`,
        token_endpoint: `${base}/token`,
        jwks_uri: `${base}/keys`,
      });
    if (path === "/keys") return Response.json({ keys: [jwk] });
    if (path === "/token") return Response.json({ access_token: "at", token_type: "Bearer", id_token: idToken });
    return new Response("no", { status: 404 });
  },
});
const base: string = `http://127.0.0.1:${server.port}`;
afterAll(() => server.stop(true));

const cfg = (over: Partial<OAuthConfig> = {}): OAuthConfig => ({
  id: "c",
  projectId: "p",
  provider: "microsoft",
  clientId: "client-1",
  clientSecret: "s",
  enabled: true,
  redirectUrl: "http://localhost:7070/auth/oauth/microsoft/callback",
  scopes: ["openid", "email", "profile"],
  issuer: `${base}/common/v2.0`,
  ...over,
});
const client = new ProviderClient(() => "http://unused", () => false);

async function sign(claims: Record<string, unknown>) {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: "RS256", kid: "k1" })
    .setIssuedAt()
    .setExpirationTime("10m")
    .sign(privateKey);
}

describe("ProviderClient", () => {
  test("Microsoft's common endpoint: the id_token's issuer is its tenant's, checked against the template", async () => {
    const tid = "9188040d-6c67-4c5b-b112-36a304b66dad";
    idToken = await sign({ iss: `${base}/${tid}/v2.0`, aud: "client-1", sub: "abc", tid, nonce: "n1", email: "ada@example.com", email_verified: true, name: "Ada" });
    const id = await client.identity(cfg(), "code", { codeVerifier: "v", nonce: "n1" });
    expect(id).toEqual({ provider: "microsoft", subject: "abc", email: "ada@example.com", email_verified: true, name: "Ada", picture: null });
    // Another tenant's issuer than the token's own tid does not verify.
    idToken = await sign({ iss: `${base}/another-tenant/v2.0`, aud: "client-1", sub: "abc", tid, nonce: "n1", email: "ada@example.com" });
    await expect(client.identity(cfg(), "code", { codeVerifier: "v", nonce: "n1" })).rejects.toThrow(/id_token does not verify/);
  });

  test("a token for another client, or with another sign-in's nonce, is refused", async () => {
    const tid = "t";
    idToken = await sign({ iss: `${base}/${tid}/v2.0`, aud: "someone-else", sub: "abc", tid, nonce: "n1", email: "ada@example.com" });
    await expect(client.identity(cfg(), "code", { codeVerifier: "v", nonce: "n1" })).rejects.toThrow(/does not verify/);
    idToken = await sign({ iss: `${base}/${tid}/v2.0`, aud: "client-1", sub: "abc", tid, nonce: "other", email: "ada@example.com" });
    await expect(client.identity(cfg(), "code", { codeVerifier: "v", nonce: "n1" })).rejects.toThrow(/nonce/);
    // Apple's string "true" counts as verified; anything else does not.
    idToken = await sign({ iss: `${base}/${tid}/v2.0`, aud: "client-1", sub: "abc", tid, nonce: "n1", email: "ada@example.com", email_verified: "true" });
    expect((await client.identity(cfg(), "code", { codeVerifier: "v", nonce: "n1" })).email_verified).toBe(true);
  });

  test("GitHub with issuer https://github.com: authorize on github.com (API calls go to api.github.com)", async () => {
    const url = new URL(
      await client.authorizationUrl(cfg({ provider: "github", issuer: "https://github.com", scopes: ["read:user", "user:email"] }), { state: "s", codeVerifier: "v".repeat(43), nonce: "n" }),
    );
    expect(`${url.origin}${url.pathname}`).toBe("https://github.com/login/oauth/authorize");
    expect(url.searchParams.get("scope")).toBe("read:user user:email");
    expect(url.searchParams.get("nonce")).toBeNull();
    expect(url.searchParams.get("code_challenge_method")).toBe("S256");
  });
});
