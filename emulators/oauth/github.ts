import { createHash, randomBytes } from "node:crypto";
import type { TestIdentity } from "./api";
import { OAUTH_EMULATOR_MOUNT } from "./api";
import type { ClientRegistry } from "./clients";
import { EmulatorInputError, subjectFor, type IdentityStore, type NextQueue, type QueuedAuthorization } from "./identities";
import { identityFromForm, renderErrorPage, renderLoginPage } from "./login-page";

const CODE_TTL_MS = 10 * 60_000;
const DOCS = "https://docs.github.com/rest";
const AUTH_FIELDS = ["client_id", "redirect_uri", "scope", "state", "code_challenge", "code_challenge_method", "login"] as const;

interface PendingCode {
  clientId: string;
  redirectUri: string;
  identityId: string;
  scopes: string[];
  challenge: string | null;
  expiresAt: number;
}

/**
 * GitHub's OAuth app flow (not OpenID Connect): github.com's `/login/oauth/authorize` and
 * `/login/oauth/access_token`, and api.github.com's `/user` and `/user/emails`, with GitHub's quirks
 * (token errors are 200s with an `error` field; the token answer is form-encoded unless JSON is
 * asked for; `/user/emails` needs the `user:email` or `user` scope).
 */
export class GithubEmulator {
  private codes = new Map<string, PendingCode>();
  private tokens = new Map<string, { identityId: string; scopes: string[]; clientId: string }>();
  private base = `${OAUTH_EMULATOR_MOUNT}/github`;

  constructor(
    private identities: IdentityStore,
    private next: NextQueue,
    private clients: ClientRegistry,
  ) {}

  async handle(request: Request, path: string): Promise<Response> {
    const url = new URL(request.url);
    if (path === "/login/oauth/authorize" && request.method === "GET") return this.authorize(url.searchParams);
    if ((path === "/login/oauth/authorize/login" || path === "/login/oauth/authorize/deny") && request.method === "POST") {
      const form = new URLSearchParams(await request.text());
      return this.decide(form, path.endsWith("/deny"));
    }
    if (path === "/login/oauth/access_token" && request.method === "POST") return this.accessToken(request);
    if ((path === "/user" || path === "/user/emails") && request.method === "GET") return this.api(request, path);
    return json(404, { message: "Not Found", documentation_url: DOCS });
  }

  private authorize(q: URLSearchParams): Response {
    const clientId = q.get("client_id") ?? "";
    const known = this.clients.get(clientId);
    // Without redirect_uri GitHub uses the app's callback URL: the one registered, when there is exactly one.
    const redirectUri = q.get("redirect_uri") || (known?.redirect_uris.length === 1 ? known.redirect_uris[0]! : "");
    const check = this.clients.authorize(clientId, redirectUri);
    if (!check.ok) return html(400, renderErrorPage("github", check.description));
    const fields: Record<string, string> = {};
    for (const f of AUTH_FIELDS) {
      const v = q.get(f);
      if (v) fields[f] = v;
    }
    fields.redirect_uri = redirectUri;
    if (fields.code_challenge && (fields.code_challenge_method ?? "plain") !== "S256")
      return this.redirect(fields, { error: "invalid_request", error_description: "code_challenge_method must be S256" });
    const queued = this.next.take("github", clientId);
    if (queued) return this.complete(fields, queued);
    return html(200, this.page(fields));
  }

  private page(fields: Record<string, string>, error?: string): string {
    return renderLoginPage({
      kind: "github",
      clientId: fields.client_id ?? "",
      scopes: scopesOf(fields.scope),
      identities: this.identities.list(),
      loginAction: `${this.base}/login/oauth/authorize/login`,
      denyAction: `${this.base}/login/oauth/authorize/deny`,
      fields,
      loginHint: fields.login,
      error,
    });
  }

  private decide(form: URLSearchParams, deny: boolean): Response {
    const fields: Record<string, string> = {};
    for (const f of AUTH_FIELDS) {
      const v = form.get(f);
      if (v) fields[f] = v;
    }
    // The page's hidden fields come back from the browser: check the client and redirect URI again.
    const check = this.clients.authorize(fields.client_id ?? "", fields.redirect_uri ?? "");
    if (!check.ok) return html(400, renderErrorPage("github", check.description));
    if (deny) return this.complete(fields, { identity: null, deny: true });
    const picked = identityFromForm(form);
    try {
      const identity = "identity" in picked ? this.identities.get(picked.identity) : this.identities.upsert(picked).identity;
      if (!identity) throw new EmulatorInputError(`no identity '${(picked as { identity: string }).identity}'`);
      return this.complete(fields, { identity, deny: false });
    } catch (err) {
      if (!(err instanceof EmulatorInputError)) throw err;
      return html(400, this.page(fields, err.message));
    }
  }

  private complete(fields: Record<string, string>, q: QueuedAuthorization): Response {
    if (q.deny || !q.identity)
      return this.redirect(fields, {
        error: "access_denied",
        error_description: "The user has denied your application access.",
        error_uri: "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-authorization-request-errors/#access-denied",
      });
    const code = randomBytes(10).toString("hex");
    for (const [c, p] of this.codes) if (p.expiresAt < Date.now()) this.codes.delete(c);
    this.codes.set(code, {
      clientId: fields.client_id!,
      redirectUri: fields.redirect_uri!,
      identityId: q.identity.id,
      scopes: scopesOf(fields.scope),
      challenge: fields.code_challenge ?? null,
      expiresAt: Date.now() + CODE_TTL_MS,
    });
    return this.redirect(fields, { code });
  }

  private redirect(fields: Record<string, string>, params: Record<string, string>): Response {
    const to = new URL(fields.redirect_uri!);
    for (const [k, v] of Object.entries(params)) to.searchParams.set(k, v);
    if (fields.state) to.searchParams.set("state", fields.state);
    return new Response(null, { status: 302, headers: { location: to.href, "cache-control": "no-store" } });
  }

  private async accessToken(request: Request): Promise<Response> {
    const type = request.headers.get("content-type") ?? "";
    const raw = await request.text();
    const p = new Map<string, string>();
    if (type.includes("application/json")) {
      try {
        for (const [k, v] of Object.entries(JSON.parse(raw || "{}") as Record<string, unknown>)) if (typeof v === "string") p.set(k, v);
      } catch {
        return json(400, { message: "Problems parsing JSON", documentation_url: DOCS });
      }
    } else for (const [k, v] of new URLSearchParams(raw)) p.set(k, v);
    const [basicId, basicSecret] = basicCredentials(request.headers.get("authorization"));
    const clientId = p.get("client_id") ?? basicId ?? "";
    const secret = p.get("client_secret") ?? basicSecret;
    const wantsJson = (request.headers.get("accept") ?? "").includes("json");
    const answer = (body: Record<string, string>) =>
      wantsJson ? json(200, body) : new Response(new URLSearchParams(body).toString(), { status: 200, headers: { "content-type": "application/x-www-form-urlencoded; charset=utf-8" } });
    const fail = (error: string, error_description: string) => answer({ error, error_description, error_uri: "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors" });

    const auth = this.clients.authenticate(clientId, secret);
    if (!auth.ok) return fail("incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect.");
    const code = p.get("code") ?? "";
    const pending = this.codes.get(code);
    // One use, like GitHub: a code is gone once presented, whatever the outcome.
    this.codes.delete(code);
    if (!pending || pending.expiresAt < Date.now() || pending.clientId !== clientId) return fail("bad_verification_code", "The code passed is incorrect or expired.");
    const redirectUri = p.get("redirect_uri");
    if (redirectUri && redirectUri !== pending.redirectUri) return fail("redirect_uri_mismatch", "The redirect_uri MUST match the registered callback URL for this application.");
    if (pending.challenge) {
      const verifier = p.get("code_verifier") ?? "";
      if (createHash("sha256").update(verifier).digest("base64url") !== pending.challenge) return fail("invalid_grant", "The code_verifier does not match the code_challenge.");
    }
    const token = `gho_${randomBytes(18).toString("base64url").replace(/[-_]/g, "0")}`;
    this.tokens.set(token, { identityId: pending.identityId, scopes: pending.scopes, clientId });
    return answer({ access_token: token, token_type: "bearer", scope: pending.scopes.join(",") });
  }

  private api(request: Request, path: string): Response {
    const m = /^(?:bearer|token)\s+(\S+)$/i.exec(request.headers.get("authorization") ?? "");
    const grant = m ? this.tokens.get(m[1]!) : undefined;
    if (!grant) return json(401, { message: m ? "Bad credentials" : "Requires authentication", documentation_url: DOCS, status: "401" });
    const identity = this.identities.get(grant.identityId);
    if (!identity) return json(401, { message: "Bad credentials", documentation_url: DOCS, status: "401" });
    const headers = { "x-oauth-scopes": grant.scopes.join(", "), "x-accepted-oauth-scopes": path === "/user" ? "" : "user, user:email" };
    if (path === "/user") return json(200, githubUser(identity), headers);
    if (!grant.scopes.some((s) => s === "user" || s === "user:email")) return json(404, { message: "Not Found", documentation_url: DOCS, status: "404" }, headers);
    const { id, login } = githubIds(identity);
    return json(
      200,
      [
        { email: identity.email, primary: true, verified: identity.email_verified, visibility: "public" },
        { email: `${id}+${login}@users.noreply.github.com`, primary: false, verified: true, visibility: null },
      ],
      headers,
    );
  }
}

function githubIds(i: TestIdentity): { id: number; login: string } {
  const login = i.email.split("@")[0]!.replace(/[^A-Za-z0-9-]/g, "-").replace(/^-+|-+$/g, "") || "user";
  return { id: Number(subjectFor("github", i.email)), login };
}

/** The fields of api.github.com's authenticated user that sign-in code reads. */
export function githubUser(i: TestIdentity) {
  const { id, login } = githubIds(i);
  return {
    login,
    id,
    node_id: Buffer.from(`04:User${id}`).toString("base64"),
    avatar_url: i.picture ?? `https://avatars.githubusercontent.com/u/${id}?v=4`,
    html_url: `https://github.com/${login}`,
    type: "User",
    site_admin: false,
    name: i.name,
    email: i.email,
    created_at: i.created_at,
    updated_at: i.created_at,
  };
}

function scopesOf(s: string | undefined): string[] {
  return (s ?? "").split(/[\s,]+/).filter(Boolean);
}

function basicCredentials(header: string | null): [string | undefined, string | undefined] {
  const m = /^basic\s+(\S+)$/i.exec(header ?? "");
  if (!m) return [undefined, undefined];
  const text = Buffer.from(m[1]!, "base64").toString("utf8");
  const at = text.indexOf(":");
  if (at < 0) return [undefined, undefined];
  const dec = (s: string) => decodeURIComponent(s.replace(/\+/g, " "));
  try {
    return [dec(text.slice(0, at)), dec(text.slice(at + 1))];
  } catch {
    return [text.slice(0, at), text.slice(at + 1)];
  }
}
export { basicCredentials };

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json; charset=utf-8", ...headers } });
}

function html(status: number, body: string): Response {
  return new Response(body, { status, headers: { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" } });
}
