/**
 * Local OAuth / OpenID Connect providers: the interface Kiln (and tests) program against.
 *
 * One OpenID Connect provider per kind (`google`, `microsoft`, `apple`), each its own issuer with
 * discovery and JWKS, built on `oidc-provider` (a certified implementation), and GitHub's OAuth 2
 * shape (`github`: authorize, access_token, /user, /user/emails). All are served under one mount,
 * `/_emulators/oauth`, on Kiln's own port in the embedded profile, or alone by
 * `kiln emulators oauth [--port 8026] [--host 127.0.0.1] [--json]`.
 *
 * URLs, for a base `B` (Kiln's public URL, or the standalone server's URL):
 *
 * | provider  | issuer / base                     | endpoints                                                    |
 * |-----------|-----------------------------------|--------------------------------------------------------------|
 * | google    | `B/_emulators/oauth/google`       | `/.well-known/openid-configuration`, `/auth`, `/token`, `/me` (userinfo), `/jwks` |
 * | microsoft | `B/_emulators/oauth/microsoft`    | the same paths                                               |
 * | apple     | `B/_emulators/oauth/apple`        | the same paths                                               |
 * | github    | `B/_emulators/oauth/github`       | `/login/oauth/authorize`, `/login/oauth/access_token`, `/user`, `/user/emails` |
 *
 * Read the OIDC endpoints from discovery when you can; `oauthEmulatorEndpoints` computes the same URLs.
 *
 * **Clients.** Any `client_id` is accepted, so a Kiln OAuth config (client_id, client_secret,
 * redirect_url) works unchanged: a client never seen before is registered on first use; every
 * http(s) `redirect_uri` it sends is accepted, and the first `client_secret` it presents at the
 * token endpoint is pinned (a later, different secret is `invalid_client`, as at a real provider).
 * A client registered through the API (`registerClient`, `POST /_emulators/oauth/{provider}/clients`)
 * is strict from the start: its secret, and its redirect URIs when given.
 *
 * **PKCE.** The OIDC providers require PKCE with S256 on every authorization request (Kiln always
 * sends it); GitHub checks it when the authorize request carried a `code_challenge`.
 *
 * **Identities.** Test people, shared by the four providers: email, name, picture URL, and whether
 * the email is verified. A person picks one on the login page or types a new one, or denies consent
 * (`error=access_denied` to the redirect URI). Tests skip the page: they queue what the next
 * authorization on a provider does (`next`): sign in as an identity, or deny. The provider then
 * answers the authorize request with redirects only, so a plain HTTP client following redirects
 * completes the flow. Each provider's subject (`sub`, GitHub's `id`) is derived from the email, so it
 * stays the same for the same email across restarts and emulator instances.
 *
 * **Time.** Tokens carry wall-clock `iat`/`exp` (oidc-provider's own clock), not Kiln's
 * controllable clock: verify an id_token at wall time. Keys, codes and tokens live in memory and
 * change at every start; identities too (re-create them; the same email gives the same subject).
 */

/** The OpenID Connect providers. */
export type OidcProviderKind = "google" | "microsoft" | "apple";
/** Every emulated provider: the OIDC ones and GitHub (plain OAuth 2, no id_token). */
export type OAuthEmulatorKind = OidcProviderKind | "github";

export const OIDC_PROVIDER_KINDS: readonly OidcProviderKind[] = ["google", "microsoft", "apple"];
export const OAUTH_EMULATOR_KINDS: readonly OAuthEmulatorKind[] = ["google", "microsoft", "apple", "github"];

/** Where the emulators are mounted, on Kiln's port and on the standalone server alike. */
export const OAUTH_EMULATOR_MOUNT = "/_emulators/oauth";

/** The endpoints of one emulated OIDC provider (what discovery also says). */
export interface OidcEndpoints {
  kind: OidcProviderKind;
  /** The `iss` of its id_tokens; discovery is at `${issuer}/.well-known/openid-configuration`. */
  issuer: string;
  discovery: string;
  authorization: string;
  token: string;
  userinfo: string;
  jwks: string;
}

/** GitHub's shape: github.com's two OAuth URLs and api.github.com's two user URLs, under one base. */
export interface GithubEndpoints {
  kind: "github";
  /** Stands for both https://github.com and https://api.github.com. */
  base: string;
  /** GET: the login page (or a redirect, when `next` queued one). */
  authorization: string;
  /** POST: form or JSON body; answers form-encoded, or JSON with `Accept: application/json`. */
  token: string;
  /** GET with `Authorization: Bearer|token <access_token>`: `{id, login, name, email, avatar_url, ...}`. */
  user: string;
  /** GET: `[{email, primary, verified, visibility}]`. */
  emails: string;
}

export type OAuthEmulatorEndpoints = OidcEndpoints | GithubEndpoints;

function trimBase(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, "");
}

/** The URLs of one emulated provider for a base URL (Kiln's public URL or the standalone server's). */
export function oauthEmulatorEndpoints(baseUrl: string, kind: "github"): GithubEndpoints;
export function oauthEmulatorEndpoints(baseUrl: string, kind: OidcProviderKind): OidcEndpoints;
export function oauthEmulatorEndpoints(baseUrl: string, kind: OAuthEmulatorKind): OAuthEmulatorEndpoints;
export function oauthEmulatorEndpoints(baseUrl: string, kind: OAuthEmulatorKind): OAuthEmulatorEndpoints {
  const root = `${trimBase(baseUrl)}${OAUTH_EMULATOR_MOUNT}/${kind}`;
  if (kind === "github")
    return { kind, base: root, authorization: `${root}/login/oauth/authorize`, token: `${root}/login/oauth/access_token`, user: `${root}/user`, emails: `${root}/user/emails` };
  return {
    kind,
    issuer: root,
    discovery: `${root}/.well-known/openid-configuration`,
    authorization: `${root}/auth`,
    token: `${root}/token`,
    userinfo: `${root}/me`,
    jwks: `${root}/jwks`,
  };
}

/**
 * The real providers' endpoints, for a project switched from the emulators to the real thing.
 * Microsoft's `common` issuer is a template: its id_tokens carry the tenant's own issuer
 * (`https://login.microsoftonline.com/{tenantid}/v2.0`).
 */
export const REAL_PROVIDER_ENDPOINTS = {
  google: { issuer: "https://accounts.google.com", discovery: "https://accounts.google.com/.well-known/openid-configuration" },
  microsoft: { issuer: "https://login.microsoftonline.com/common/v2.0", discovery: "https://login.microsoftonline.com/common/v2.0/.well-known/openid-configuration" },
  apple: { issuer: "https://appleid.apple.com", discovery: "https://appleid.apple.com/.well-known/openid-configuration" },
  github: {
    base: "https://github.com",
    authorization: "https://github.com/login/oauth/authorize",
    token: "https://github.com/login/oauth/access_token",
    user: "https://api.github.com/user",
    emails: "https://api.github.com/user/emails",
  },
} as const;

/** A test person. The same identities serve every provider. */
export interface TestIdentity {
  /** `idn_…`, stable while the emulator runs. */
  id: string;
  /** Lowercased; unique among identities. */
  email: string;
  name: string;
  /** An image URL, or null. Apple never sends one (it has no picture claim). */
  picture: string | null;
  /** Whether the provider says the email is verified (`email_verified`; GitHub's `verified`). */
  email_verified: boolean;
  created_at: string;
}

/** What creates an identity (or updates the one with that email). */
export interface TestIdentityInput {
  email: string;
  /** Default: the email's local part. */
  name?: string;
  picture?: string | null;
  /** Default true. */
  email_verified?: boolean;
}

/**
 * What the next authorization request on a provider does, instead of showing the login page:
 * sign in as an identity (`identity`: its id or email; or `email`… to create/update it first), or
 * deny consent. One-shot, first queued first used; with `client_id`, only that client's request
 * takes it.
 */
export type NextAuthorization =
  | ({ identity: string; client_id?: string } & { deny?: false })
  | (TestIdentityInput & { identity?: undefined; client_id?: string; deny?: false })
  | { deny: true; client_id?: string };

/** A client as the emulator knows it. */
export interface EmulatorClient {
  client_id: string;
  /** Null until an auto-registered client first presents one at the token endpoint. */
  client_secret: string | null;
  /** Accepted redirect URIs; for an auto-registered client, those it has used so far. */
  redirect_uris: string[];
  /** `api`: registered up front, strict; `first-use`: auto-registered, accepts any http(s) redirect URI. */
  registered: "api" | "first-use";
}

export interface ClientRegistration {
  client_id: string;
  client_secret: string;
  /** When given, only these (exact match); when omitted, any http(s) redirect URI. */
  redirect_uris?: string[];
}

export interface OAuthEmulatorsOptions {
  /**
   * Kiln's (or the standalone server's) public base URL, e.g. `http://127.0.0.1:7070`: the issuers
   * are `${baseUrl}/_emulators/oauth/<kind>`. A function when it is known only once listening;
   * it is read when a provider first serves a request.
   */
  baseUrl: string | (() => string);
}

/**
 * The running emulators (in-process). Made by `createOAuthEmulators(options)` in
 * `emulators/oauth/emulators.ts`; Kiln's embedded profile makes one in `server/emulators/` and
 * routes `/_emulators/oauth/*` to it; `kiln emulators oauth` serves one alone
 * (`serveOAuthEmulators` in `server/emulators/standalone-oauth.ts`).
 */
export interface OAuthEmulators {
  /**
   * Answers a request whose path starts with `/_emulators/oauth/<kind>/` (protocol endpoints,
   * login pages); the JSON identities API is routed by Kiln's router onto the methods below.
   */
  handle(request: Request): Promise<Response>;
  endpoints(kind: "github"): GithubEndpoints;
  endpoints(kind: OidcProviderKind): OidcEndpoints;
  endpoints(kind: OAuthEmulatorKind): OAuthEmulatorEndpoints;
  identities: {
    list(): TestIdentity[];
    /** Creates, or updates the identity with that email; `created` says which. */
    upsert(input: TestIdentityInput): { identity: TestIdentity; created: boolean };
    /** By id or email. */
    get(idOrEmail: string): TestIdentity | null;
    remove(id: string): boolean;
  };
  /** Queues what the next authorization on `kind` does (see NextAuthorization); returns the identity used, if any. */
  queueNext(kind: OAuthEmulatorKind, next: NextAuthorization): { identity: TestIdentity | null; deny: boolean };
  /** Drops every queued authorization of `kind`. */
  clearNext(kind: OAuthEmulatorKind): void;
  registerClient(kind: OAuthEmulatorKind, client: ClientRegistration): EmulatorClient;
  clients(kind: OAuthEmulatorKind): EmulatorClient[];
  stop(): Promise<void>;
}

/*
 * HTTP identities API (JSON; open, like the mail catcher, and served only in the embedded profile
 * and standalone):
 *
 * - `GET    /_emulators/oauth` → `{providers: [{provider, issuer|base, endpoints…}]}`
 * - `GET    /_emulators/oauth/identities` → `{identities: TestIdentity[]}`
 * - `POST   /_emulators/oauth/identities` (TestIdentityInput) → 201 new / 200 updated, TestIdentity
 * - `DELETE /_emulators/oauth/identities/{id}` → 204
 * - `POST   /_emulators/oauth/{provider}/next` (NextAuthorization) → 200 `{provider, identity, deny}`
 * - `DELETE /_emulators/oauth/{provider}/next` → 204
 * - `POST   /_emulators/oauth/{provider}/clients` (ClientRegistration) → 201 EmulatorClient
 * - `GET    /_emulators/oauth/{provider}/clients` → `{clients: EmulatorClient[]}`
 */
