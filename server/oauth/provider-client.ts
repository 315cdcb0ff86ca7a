import { createRemoteJWKSet, decodeJwt, jwtVerify, type JWTPayload } from "jose";
import { oauthEmulatorEndpoints, REAL_PROVIDER_ENDPOINTS } from "../../emulators/oauth/api";
import { HttpError, badRequest } from "../http/errors";
import type { OAuthConfig } from "./configs";
import { PROVIDERS, type RedirectProviderId } from "./providers";

/** Who the provider says signed in. */
export interface ProviderIdentity {
  provider: RedirectProviderId;
  /** The provider's stable id of the person (`sub`; GitHub's numeric `id`). */
  subject: string;
  email: string;
  email_verified: boolean;
  name: string | null;
  picture: string | null;
}

/** Where one provider's endpoints are. */
type Endpoints =
  | { protocol: "oidc"; issuer: string; authorization: string; token: string; jwks: string }
  | { protocol: "github"; authorization: string; token: string; user: string; emails: string };

const DISCOVERY_TTL_MS = 5 * 60_000;
const PROVIDER_TIMEOUT_MS = 10_000;

export const badGateway = (error: string) => new HttpError(502, { error });

/**
 * The relying-party side of a sign-in: discovery, the authorization URL (PKCE S256, state, nonce),
 * the code exchange and the ID token's verification (jose: signature from the provider's JWKS,
 * issuer, audience, expiry at wall time, nonce). The same code runs against the local emulators
 * and the real providers; only the issuer differs. GitHub is plain OAuth 2: its REST API says who.
 */
export class ProviderClient {
  private readonly discovery = new Map<string, { at: number; doc: Promise<Record<string, any>> }>();
  private readonly jwks = new Map<string, ReturnType<typeof createRemoteJWKSet>>();

  constructor(
    /** Where the emulators answer (Kiln's public URL in the embedded profile). */
    private readonly emulatorBase: () => string,
    private readonly usesEmulator: (cfg: OAuthConfig) => boolean,
  ) {}

  private async endpoints(cfg: OAuthConfig): Promise<Endpoints> {
    const provider = cfg.provider as RedirectProviderId;
    const emulated = this.usesEmulator(cfg);
    if (PROVIDERS[provider].protocol === "github") {
      if (emulated) return { protocol: "github", ...oauthEmulatorEndpoints(this.emulatorBase(), "github") };
      const base = (cfg.issuer ?? REAL_PROVIDER_ENDPOINTS.github.base).replace(/\/+$/, "");
      if (base === REAL_PROVIDER_ENDPOINTS.github.base) return { protocol: "github", ...REAL_PROVIDER_ENDPOINTS.github };
      // Anything else of GitHub's shape (a standalone emulator): every path under the one base.
      return { protocol: "github", authorization: `${base}/login/oauth/authorize`, token: `${base}/login/oauth/access_token`, user: `${base}/user`, emails: `${base}/user/emails` };
    }
    const issuer = emulated ? oauthEmulatorEndpoints(this.emulatorBase(), provider as "google").issuer : (cfg.issuer ?? PROVIDERS[provider].realIssuer!);
    const doc = await this.discover(issuer);
    for (const f of ["authorization_endpoint", "token_endpoint", "jwks_uri", "issuer"])
      if (typeof doc[f] !== "string") throw badGateway(`the ${provider} provider's discovery document (${issuer}) has no ${f}`);
    return { protocol: "oidc", issuer: doc.issuer, authorization: doc.authorization_endpoint, token: doc.token_endpoint, jwks: doc.jwks_uri };
  }

  private discover(issuer: string): Promise<Record<string, any>> {
    const hit = this.discovery.get(issuer);
    if (hit && Date.now() - hit.at < DISCOVERY_TTL_MS) return hit.doc;
    const doc = (async () => {
      const url = `${issuer.replace(/\/+$/, "")}/.well-known/openid-configuration`;
      const res = await fetchProvider(url, {});
      if (!res.ok) throw badGateway(`the provider's discovery document ${url} answered ${res.status}`);
      return (await res.json()) as Record<string, any>;
    })();
    doc.catch(() => this.discovery.delete(issuer));
    this.discovery.set(issuer, { at: Date.now(), doc });
    return doc;
  }

  /** The provider's authorization URL for one sign-in. */
  async authorizationUrl(cfg: OAuthConfig, p: { state: string; codeVerifier: string; nonce: string }): Promise<string> {
    const ep = await this.endpoints(cfg);
    const scopes = [...cfg.scopes];
    // An ID token comes only with the openid scope (Apple's defaults, `email name`, leave it out).
    if (ep.protocol === "oidc" && !scopes.includes("openid")) scopes.unshift("openid");
    const u = new URL(ep.authorization);
    u.searchParams.set("response_type", "code");
    u.searchParams.set("client_id", cfg.clientId);
    u.searchParams.set("redirect_uri", cfg.redirectUrl!);
    u.searchParams.set("scope", scopes.join(" "));
    u.searchParams.set("state", p.state);
    u.searchParams.set("code_challenge", await s256(p.codeVerifier));
    u.searchParams.set("code_challenge_method", "S256");
    if (ep.protocol === "oidc") u.searchParams.set("nonce", p.nonce);
    // Apple requires form_post when name or email is asked for: it POSTs the callback (a form).
    if (cfg.provider === "apple") u.searchParams.set("response_mode", "form_post");
    return u.toString();
  }

  /** Spends the provider's code and says who signed in. */
  async identity(cfg: OAuthConfig, code: string, p: { codeVerifier: string; nonce: string }): Promise<ProviderIdentity> {
    const ep = await this.endpoints(cfg);
    const form = new URLSearchParams({
      grant_type: "authorization_code",
      code,
      redirect_uri: cfg.redirectUrl!,
      client_id: cfg.clientId,
      client_secret: cfg.clientSecret ?? "",
      code_verifier: p.codeVerifier,
    });
    const res = await fetchProvider(ep.token, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
      body: form.toString(),
    });
    const text = await res.text();
    let body: Record<string, any> = {};
    try {
      body = JSON.parse(text);
    } catch {
      body = Object.fromEntries(new URLSearchParams(text));
    }
    // GitHub answers a refused code with 200 and an error field.
    if (!res.ok || body.error) {
      const why = `${body.error ?? res.status}${body.error_description ? `: ${body.error_description}` : ""}`;
      if (res.status >= 500) throw badGateway(`the ${cfg.provider} token endpoint failed (${why})`);
      throw badRequest(`invalid callback code: the ${cfg.provider} provider refused it (${why})`);
    }
    return ep.protocol === "oidc" ? this.fromIdToken(cfg, ep, body, p.nonce) : this.fromGithub(cfg, ep, body);
  }

  private async fromIdToken(cfg: OAuthConfig, ep: Extract<Endpoints, { protocol: "oidc" }>, body: Record<string, any>, nonce: string): Promise<ProviderIdentity> {
    if (typeof body.id_token !== "string") throw badGateway(`the ${cfg.provider} provider sent no id_token`);
    let jwks = this.jwks.get(ep.jwks);
    if (!jwks) this.jwks.set(ep.jwks, (jwks = createRemoteJWKSet(new URL(ep.jwks))));
    // Microsoft's multi-tenant issuer names the tenant as {tenantid}: the token carries its own.
    const tid = ep.issuer.includes("{tenantid}") ? String(decodeJwt(body.id_token).tid ?? "") : "";
    let claims: JWTPayload;
    try {
      // Wall time, not the platform clock: the provider stamps its tokens with its own clock.
      ({ payload: claims } = await jwtVerify(body.id_token, jwks, { issuer: ep.issuer.replace("{tenantid}", tid), audience: cfg.clientId, clockTolerance: 60 }));
    } catch (err) {
      throw badRequest(`the ${cfg.provider} id_token does not verify: ${(err as Error).message}`);
    }
    if (claims.nonce !== nonce) throw badRequest(`the ${cfg.provider} id_token does not carry this sign-in's nonce`);
    if (!claims.sub) throw badRequest(`the ${cfg.provider} id_token has no subject`);
    const email = typeof claims.email === "string" ? claims.email : null;
    if (!email) throw badRequest(`the ${cfg.provider} provider sent no email address (is the email scope granted?)`);
    // Apple sends "true"/"false" as strings.
    const verified = claims.email_verified === true || claims.email_verified === "true";
    return {
      provider: cfg.provider as RedirectProviderId,
      subject: claims.sub,
      email,
      email_verified: verified,
      name: typeof claims.name === "string" ? claims.name : null,
      picture: typeof claims.picture === "string" ? claims.picture : null,
    };
  }

  private async fromGithub(cfg: OAuthConfig, ep: Extract<Endpoints, { protocol: "github" }>, body: Record<string, any>): Promise<ProviderIdentity> {
    if (typeof body.access_token !== "string") throw badGateway("the github token endpoint sent no access_token");
    const headers = { authorization: `Bearer ${body.access_token}`, accept: "application/vnd.github+json", "user-agent": "kiln" };
    const [u, e] = await Promise.all([fetchProvider(ep.user, { headers }), fetchProvider(ep.emails, { headers })]);
    if (!u.ok) throw badGateway(`github ${ep.user} answered ${u.status}`);
    const user = (await u.json()) as Record<string, any>;
    const emails = e.ok ? ((await e.json()) as Array<{ email: string; primary: boolean; verified: boolean }>) : [];
    const primary = emails.find((x) => x.primary) ?? emails.find((x) => x.verified) ?? null;
    const email = primary?.email ?? user.email;
    if (!email) throw badRequest("the github provider sent no email address (is the user:email scope granted?)");
    return {
      provider: "github",
      subject: String(user.id),
      email,
      email_verified: primary ? primary.verified : false,
      name: user.name ?? user.login ?? null,
      picture: user.avatar_url ?? null,
    };
  }
}

async function fetchProvider(url: string, init: RequestInit): Promise<Response> {
  try {
    return await fetch(url, { ...init, redirect: "manual", signal: AbortSignal.timeout(PROVIDER_TIMEOUT_MS) });
  } catch (err) {
    throw badGateway(`the provider at ${new URL(url).origin} could not be reached: ${(err as Error).message}`);
  }
}

async function s256(verifier: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  return Buffer.from(digest).toString("base64url");
}
