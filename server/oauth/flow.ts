import type { AuthConfigService } from "../end-users/config";
import type { EndUsersService, TokenResponse } from "../end-users/service";
import { badRequest, conflict, forbidden, notFound } from "../http/errors";
import { hashSecret, newId } from "../ids";
import { isoTime, isUniqueViolation, type ControlStore, type Row } from "../store/store";
import type { OAuthConfig, OAuthConfigsService } from "./configs";
import type { ProviderClient, ProviderIdentity } from "./provider-client";
import { isProvider, PROVIDERS, type ProviderId, type RedirectProviderId } from "./providers";

/** The spec's state lifetime: 10 minutes, one use. */
export const STATE_TTL_MS = 10 * 60_000;
/** The code a redirect carries to the app: short, one use. */
export const CODE_TTL_MS = 5 * 60_000;

export function randomToken(bytes = 32): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(bytes))).toString("base64url");
}

/** Appends query parameters to a URL that may already have some (allowed URLs match with their query). */
export function withParams(url: string, params: Record<string, string | undefined>): string {
  const u = new URL(url);
  for (const [k, v] of Object.entries(params)) if (v !== undefined) u.searchParams.set(k, v);
  return u.toString();
}

export interface LinkedProvider {
  provider: string;
  linked_at: string;
  updated_at: string;
}

/** What the callback leads to. */
export type CallbackOutcome =
  | { kind: "redirect"; location: string }
  | { kind: "tokens"; created: boolean; tokens: TokenResponse }
  | { kind: "linked"; linked: LinkedProvider };

export interface OAuthFlowDeps {
  store: ControlStore;
  now: () => Date;
  configs: OAuthConfigsService;
  authConfig: AuthConfigService;
  endUsers: EndUsersService;
  client: ProviderClient;
  /** Kiln's managed pages a redirect_url may name besides the project's allowed URLs. */
  isManagedPage: (url: string) => boolean;
}

/**
 * End-user sign-in through a provider: authorize (state, PKCE, nonce) → the provider → callback
 * (the provider's code spent, the identity verified) → a single-use code for the app's redirect URL,
 * or the auth token response at once; linking a provider to a signed-in user; unlinking.
 * Sessions and tokens are the end-users area's, exactly as password sign-in makes them.
 */
export class OAuthFlowService {
  constructor(private readonly d: OAuthFlowDeps) {}

  /** The provider's config for an end-user route: 404 unconfigured, 400 disabled. */
  async usableConfig(projectId: string, provider: string): Promise<OAuthConfig> {
    if (!isProvider(provider)) throw notFound(`provider ${provider} is not configured for this project`);
    if (provider === "device") throw badRequest("the device provider signs in through the device flow (POST /auth/device/code), not a redirect");
    const cfg = await this.d.configs.forFlow(projectId, provider);
    if (!cfg) throw notFound(`provider ${provider} is not configured for this project`);
    if (!cfg.enabled) throw badRequest(`provider ${provider} is disabled for this project`);
    return cfg;
  }

  /** A redirect URL the project allows (exactly), or one of Kiln's managed pages; else 400. */
  async checkRedirect(projectId: string, url: string): Promise<void> {
    if (this.d.isManagedPage(url)) return;
    const cfg = await this.d.authConfig.get(projectId);
    if (!cfg.allowed_redirect_urls.includes(url)) throw badRequest("redirect_url is not in the project's allowed_redirect_urls");
  }

  /** Starts a sign-in (or a link, with `userId`): the provider's authorization URL. */
  async authorize(projectId: string, provider: string, o: { redirectUrl?: string; clientState?: string; linkUserId?: string }): Promise<string> {
    const cfg = await this.usableConfig(projectId, provider);
    if (o.redirectUrl !== undefined) await this.checkRedirect(projectId, o.redirectUrl);
    if (o.linkUserId) {
      const [linked] = await this.d.store.query(`select 1 from oauth_identities where user_id = $1 and provider = $2`, [o.linkUserId, provider]);
      if (linked) throw conflict(`provider ${provider} is already linked to this user`);
    }
    const state = randomToken();
    const codeVerifier = randomToken();
    const nonce = randomToken(16);
    const now = this.d.now();
    const url = await this.d.client.authorizationUrl(cfg, { state, codeVerifier, nonce });
    await this.d.store.query(
      `insert into oauth_states (state_hash, project_id, provider, purpose, user_id, redirect_url, client_state, code_verifier, nonce, expires_at, created_at)
       values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
      [
        hashSecret(state),
        projectId,
        provider,
        o.linkUserId ? "link" : "signin",
        o.linkUserId ?? null,
        o.redirectUrl ?? null,
        o.clientState ?? null,
        codeVerifier,
        nonce,
        new Date(now.getTime() + STATE_TTL_MS).toISOString(),
        now.toISOString(),
      ],
    );
    // Old states are of no use to anyone: cleared as new ones are made.
    await this.d.store.query(`delete from oauth_states where project_id = $1 and expires_at < $2::timestamptz`, [projectId, new Date(now.getTime() - STATE_TTL_MS).toISOString()]);
    return url;
  }

  /** Spends a state once; 400 for an unknown, used or expired one (10 minutes on the platform clock). */
  private async spendState(provider: string, state: string): Promise<Row> {
    const hash = hashSecret(state);
    const now = this.d.now().toISOString();
    const [row] = await this.d.store.query(`select * from oauth_states where state_hash = $1`, [hash]);
    if (!row || row.provider !== provider) throw badRequest("invalid state: no sign-in in progress has it");
    if (row.used_at) throw badRequest("invalid state: it has been used already");
    if (new Date(row.expires_at).getTime() <= this.d.now().getTime()) throw badRequest("expired state: a sign-in must complete within 10 minutes");
    const spent = await this.d.store.query(`update oauth_states set used_at = $2 where state_hash = $1 and used_at is null returning state_hash`, [hash, now]);
    if (!spent.length) throw badRequest("invalid state: it has been used already");
    return row;
  }

  async callback(provider: string, q: { code?: string; state?: string; error?: string; error_description?: string; user?: string }): Promise<CallbackOutcome> {
    if (!q.state) throw badRequest("missing state");
    const st = await this.spendState(provider, q.state);
    const projectId: string = st.project_id;
    const redirectUrl: string | null = st.redirect_url;
    const back = (params: Record<string, string | undefined>) => withParams(redirectUrl!, { ...params, client_state: st.client_state ?? undefined });
    if (redirectUrl) await this.checkRedirect(projectId, redirectUrl).catch(() => {
      throw badRequest("redirect_url is no longer in the project's allowed_redirect_urls");
    });
    if (q.error) {
      // The person denied consent, or the provider refused: the app hears it the OAuth way.
      const description = q.error_description ?? (q.error === "access_denied" ? "the user denied the sign-in" : undefined);
      if (redirectUrl) return { kind: "redirect", location: back({ error: q.error, error_description: description }) };
      throw badRequest(`the ${provider} provider refused the sign-in: ${q.error}${description ? ` (${description})` : ""}`);
    }
    if (!q.code) throw badRequest("missing code");
    const cfg = await this.usableConfig(projectId, provider);
    const identity = await this.d.client.identity(cfg, q.code, { codeVerifier: st.code_verifier, nonce: st.nonce });
    // Apple puts the person's name in the form it posts (first authorization only), not in the id_token.
    if (!identity.name && q.user) identity.name = appleName(q.user);

    if (st.purpose === "link") {
      const linked = await this.link(projectId, st.user_id, identity);
      if (redirectUrl) return { kind: "redirect", location: back({ linked: provider }) };
      return { kind: "linked", linked };
    }
    if (!redirectUrl) return { kind: "tokens", ...(await this.signIn(projectId, identity)) };
    const code = randomToken();
    const now = this.d.now();
    await this.d.store.query(
      `insert into oauth_codes (code_hash, project_id, provider, redirect_url, identity, expires_at, created_at) values ($1, $2, $3, $4, $5::text::jsonb, $6, $7)`,
      [hashSecret(code), projectId, provider, redirectUrl, JSON.stringify(identity), new Date(now.getTime() + CODE_TTL_MS).toISOString(), now.toISOString()],
    );
    await this.d.store.query(`delete from oauth_codes where project_id = $1 and expires_at < $2::timestamptz`, [projectId, new Date(now.getTime() - CODE_TTL_MS).toISOString()]);
    return { kind: "redirect", location: back({ code }) };
  }

  /** Spends the code a redirect carried (once; the redirect URL must be the authorization's) and signs the user in. */
  async exchange(projectId: string, code: string, redirectUrl: string): Promise<{ created: boolean; tokens: TokenResponse }> {
    const hash = hashSecret(code);
    const [row] = await this.d.store.query(`select * from oauth_codes where code_hash = $1`, [hash]);
    if (!row || row.project_id !== projectId) throw badRequest("invalid code");
    if (row.used_at) throw badRequest("invalid code: it has been exchanged already");
    if (new Date(row.expires_at).getTime() <= this.d.now().getTime()) throw badRequest("expired code: exchange it within 5 minutes");
    if (row.redirect_url !== redirectUrl) throw badRequest("redirect_url does not match the one the sign-in started with");
    const spent = await this.d.store.query(`update oauth_codes set used_at = $2 where code_hash = $1 and used_at is null returning code_hash`, [hash, this.d.now().toISOString()]);
    if (!spent.length) throw badRequest("invalid code: it has been exchanged already");
    return this.signIn(projectId, row.identity as ProviderIdentity);
  }

  /**
   * The user an identity signs in as: the one it is linked to, or a new user. An email that already
   * has a user (password sign-up or another provider) is 409: sign in that way, then link.
   */
  async signIn(projectId: string, id: ProviderIdentity): Promise<{ created: boolean; tokens: TokenResponse }> {
    const cfg = await this.d.authConfig.get(projectId);
    const domain = id.email.split("@").pop()!.toLowerCase();
    if (cfg.allowed_email_domains.length && !cfg.allowed_email_domains.includes(domain))
      throw forbidden(`email domain '${domain}' is not allowed for this project`);
    if (!id.email_verified) throw forbidden(`the ${id.provider} provider has not verified the email address ${id.email}`);
    const now = this.d.now().toISOString();
    const [known] = await this.d.store.query(`select user_id from oauth_identities where project_id = $1 and provider = $2 and subject = $3`, [
      projectId,
      id.provider,
      id.subject,
    ]);
    if (known) {
      await this.d.store.query(`update oauth_identities set email = $2, updated_at = $3 where project_id = $1 and provider = $4 and subject = $5`, [
        projectId,
        id.email,
        now,
        id.provider,
        id.subject,
      ]);
      return { created: false, tokens: await this.d.endUsers.startSessionFor(projectId, known.user_id) };
    }
    const [taken] = await this.d.store.query(`select 1 from auth_users where project_id = $1 and email_lower = $2`, [projectId, id.email.toLowerCase()]);
    if (taken) throw conflict(`a user with the email ${id.email} already exists: sign in as that user, then link ${id.provider}`);
    const user = await this.d.endUsers.createExternalUser(projectId, {
      email: id.email,
      confirmed: true,
      data: { name: id.name, picture: id.picture, provider: id.provider, email_verified: id.email_verified },
    });
    try {
      await this.insertIdentity(projectId, user.id, id, now);
    } catch (err) {
      // The same identity signed up twice at once: the other one won.
      await this.d.endUsers.adminDelete(projectId, user.id).catch(() => {});
      if (isUniqueViolation(err)) throw conflict("this sign-in completed twice at once; sign in again");
      throw err;
    }
    return { created: true, tokens: await this.d.endUsers.startSessionFor(projectId, user.id) };
  }

  private async insertIdentity(projectId: string, userId: string, id: ProviderIdentity, at: string): Promise<Row> {
    const [row] = await this.d.store.query(
      `insert into oauth_identities (id, project_id, user_id, provider, subject, email, linked_at, updated_at) values ($1, $2, $3, $4, $5, $6, $7, $7) returning *`,
      [newId(), projectId, userId, id.provider, id.subject, id.email, at],
    );
    return row!;
  }

  /** Attaches a provider identity to a signed-in user. */
  private async link(projectId: string, userId: string, id: ProviderIdentity): Promise<LinkedProvider> {
    const cfg = await this.d.authConfig.get(projectId);
    const domain = id.email.split("@").pop()!.toLowerCase();
    if (cfg.allowed_email_domains.length && !cfg.allowed_email_domains.includes(domain))
      throw forbidden(`email domain '${domain}' is not allowed for this project`);
    // The user who started the link may have been deleted since.
    const [user] = await this.d.store.query(`select 1 from auth_users where id = $1 and project_id = $2`, [userId, projectId]);
    if (!user) throw notFound("user not found");
    const [owner] = await this.d.store.query(`select user_id from oauth_identities where project_id = $1 and provider = $2 and subject = $3`, [projectId, id.provider, id.subject]);
    if (owner) throw conflict(owner.user_id === userId ? `provider ${id.provider} is already linked to this user` : `this ${id.provider} account is linked to another user`);
    try {
      return linkedView(await this.insertIdentity(projectId, userId, id, this.d.now().toISOString()));
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`provider ${id.provider} is already linked to this user`);
      throw err;
    }
  }

  async linked(projectId: string, userId: string): Promise<LinkedProvider[]> {
    const rows = await this.d.store.query(`select * from oauth_identities where project_id = $1 and user_id = $2 order by linked_at, provider`, [projectId, userId]);
    return rows.map(linkedView);
  }

  /** Unlinks a provider; the last way to sign in (no password, no other provider) stays (400). */
  async unlink(projectId: string, userId: string, provider: string): Promise<void> {
    if (!isProvider(provider) || provider === "device") throw notFound(`provider ${provider} is not linked to this user`);
    await this.d.store.transaction(async (tx) => {
      const [user] = await tx.query(`select password_hash from auth_users where id = $1 and project_id = $2 for update`, [userId, projectId]);
      if (!user) throw notFound("user not found");
      const rows = await tx.query(`select provider from oauth_identities where user_id = $1`, [userId]);
      if (!rows.some((r) => r.provider === provider)) throw notFound(`provider ${provider} is not linked to this user`);
      if (!user.password_hash && rows.length === 1) throw badRequest(`cannot unlink ${provider}: it is this user's last way to sign in (set a password or link another provider first)`);
      await tx.query(`delete from oauth_identities where user_id = $1 and provider = $2`, [userId, provider]);
    });
  }

  async removeAll(projectId: string): Promise<void> {
    for (const t of ["oauth_states", "oauth_codes", "oauth_device_codes", "oauth_identities"]) await this.d.store.query(`delete from ${t} where project_id = $1`, [projectId]);
  }
}

/** `{"name": {"firstName", "lastName"}, "email"}`, as Apple posts it; null when it says no name. */
function appleName(user: string): string | null {
  try {
    const u = JSON.parse(user) as { name?: { firstName?: string; lastName?: string } };
    return [u.name?.firstName, u.name?.lastName].filter((x) => typeof x === "string" && x).join(" ") || null;
  } catch {
    return null;
  }
}

function linkedView(r: Row): LinkedProvider {
  return { provider: r.provider, linked_at: isoTime(r.linked_at), updated_at: isoTime(r.updated_at) };
}

export type { ProviderId, RedirectProviderId };
export { PROVIDERS };
