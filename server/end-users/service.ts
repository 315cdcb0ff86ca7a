import type { Principal } from "../auth/principal";
import { badRequest, conflict, notFound, unauthorized } from "../http/errors";
import { likePattern } from "../http/pagination";
import { hashSecret } from "../ids";
import { isoTimeOrNull as iso, isUniqueViolation, type ControlStore, type Row, type Sql } from "../store/store";
import type { AuthConfig, AuthConfigService } from "./config";
import type { SigningKeys } from "./signing-keys";

export const MIN_PASSWORD_LENGTH = 8;
const RECOVERY_TTL_MS = 3_600_000;
const CONFIRM_TTL_MS = 86_400_000;
/** Hashed once at start so sign-in takes as long for an unknown email as for a wrong password. */
let dummyHash: Promise<string> | null = null;

export interface Mail {
  to: string;
  subject: string;
  text: string;
  html?: string;
}

export interface UserView {
  id: string;
  email: string;
  email_confirmed: boolean;
  raw_user_meta_data: Record<string, unknown>;
  status: string;
  created_at: string;
}

export interface AdminUserView extends UserView {
  updated_at: string;
  last_sign_in_at: string | null;
}

export interface TokenResponse {
  access_token: string;
  token_type: "bearer";
  expires_in: number;
  refresh_token: string;
  user: UserView;
}


function userView(r: Row): UserView {
  return {
    id: r.id,
    email: r.email,
    email_confirmed: !!r.email_confirmed_at,
    raw_user_meta_data: r.raw_user_meta_data ?? {},
    status: r.status,
    created_at: iso(r.created_at)!,
  };
}

function adminView(r: Row): AdminUserView {
  return { ...userView(r), updated_at: iso(r.updated_at)!, last_sign_in_at: iso(r.last_sign_in_at) };
}

function randomToken(bytes = 30): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(bytes))).toString("base64url");
}

/** argon2id with OWASP's minimum memory: strong enough, and fast enough for test suites. */
function hashPassword(pw: string): Promise<string> {
  return Bun.password.hash(pw, { algorithm: "argon2id", memoryCost: 19_456, timeCost: 2 });
}

export function passwordProblem(pw: string): string | null {
  if (pw.length < MIN_PASSWORD_LENGTH) return `password must be at least ${MIN_PASSWORD_LENGTH} characters`;
  if (pw.length > 256) return "password must be at most 256 characters";
  if (pw.trim().length === 0) return "password must not be only spaces";
  return null;
}

export interface EndUsersDeps {
  store: ControlStore;
  now: () => Date;
  keys: SigningKeys;
  config: AuthConfigService;
  sendMail: (m: Mail) => void;
  publicUrl: () => string;
  /** Forget cached credentials of a session (logout, reuse detection, password reset). */
  evictSession: (sessionId: string) => void;
}

/**
 * End users of a project: accounts, password sign-in, sessions with rotating refresh tokens, and
 * the one-time tokens behind password reset and email confirmation.
 */
export class EndUsersService {
  constructor(private readonly d: EndUsersDeps) {}

  // ---- accounts ------------------------------------------------------------------------------

  private checkEmailDomain(cfg: AuthConfig, email: string): void {
    if (cfg.allowed_email_domains.length === 0) return;
    const domain = email.split("@").pop()!.toLowerCase();
    if (!cfg.allowed_email_domains.includes(domain)) throw badRequest(`email domain '${domain}' is not allowed for this project`);
  }

  private checkPassword(pw: string): void {
    const p = passwordProblem(pw);
    if (p) throw badRequest(p);
  }

  private async insertUser(
    projectId: string,
    input: { email: string; password?: string; data?: Record<string, unknown>; confirmed: boolean },
  ): Promise<Row> {
    const at = this.d.now().toISOString();
    const hash = input.password ? await hashPassword(input.password) : null;
    try {
      const [row] = await this.d.store.query(
        `insert into auth_users (id, project_id, email, email_lower, email_confirmed_at, password_hash, raw_user_meta_data, status, created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, $7::text::jsonb, 'active', $8, $8) returning *`,
        [crypto.randomUUID(), projectId, input.email, input.email.toLowerCase(), input.confirmed ? at : null, hash, JSON.stringify(input.data ?? {}), at],
      );
      return row!;
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict("a user with this email already exists");
      throw err;
    }
  }

  async signup(projectId: string, input: { email: string; password: string; data?: Record<string, unknown> }, redirectUrl?: string) {
    const cfg = await this.d.config.get(projectId);
    this.checkEmailDomain(cfg, input.email);
    this.checkPassword(input.password);
    if (redirectUrl) this.checkRedirect(cfg, redirectUrl);
    const row = await this.insertUser(projectId, { ...input, confirmed: !cfg.require_email_confirmation });
    if (cfg.require_email_confirmation) {
      await this.mailConfirmation(projectId, row, "confirm_signup", row.email, redirectUrl);
      return { confirmationRequired: true as const, user: userView(row) };
    }
    return { confirmationRequired: false as const, tokens: await this.startSession(projectId, row, cfg) };
  }

  async signin(projectId: string, email: string, password: string): Promise<TokenResponse> {
    const [row] = await this.d.store.query(`select * from auth_users where project_id = $1 and email_lower = $2`, [projectId, email.toLowerCase()]);
    dummyHash ??= hashPassword(randomToken());
    const ok = await Bun.password.verify(password, row?.password_hash ?? (await dummyHash));
    if (!row || !row.password_hash || !ok) throw badRequest("invalid credentials");
    if (row.status !== "active") throw badRequest("invalid credentials");
    const cfg = await this.d.config.get(projectId);
    if (!row.email_confirmed_at && cfg.require_email_confirmation) throw badRequest("email not confirmed");
    return this.startSession(projectId, row, cfg);
  }

  // ---- other sign-in methods (OAuth, the device flow) ------------------------------------------

  /** A user who signs in another way (no password), confirmed when the provider verified the email. 409 if the email is taken. */
  async createExternalUser(projectId: string, input: { email: string; data: Record<string, unknown>; confirmed: boolean }): Promise<UserView> {
    return userView(await this.insertUser(projectId, input));
  }

  /**
   * A new session for a user another method has authenticated: the same token response, session and
   * refresh rules as password sign-in. `created` users answer 201 where the route says so.
   */
  async startSessionFor(projectId: string, userId: string): Promise<TokenResponse> {
    const row = await this.userRow(projectId, userId);
    if (row.status !== "active") throw badRequest("this user cannot sign in");
    return this.startSession(projectId, row, await this.d.config.get(projectId));
  }

  // ---- sessions ------------------------------------------------------------------------------

  private async startSession(projectId: string, user: Row, cfg: AuthConfig): Promise<TokenResponse> {
    const sessionId = crypto.randomUUID();
    const at = this.d.now().toISOString();
    const refresh = `rt-${randomToken()}`;
    await this.d.store.transaction(async (tx) => {
      await tx.query(`insert into auth_sessions (id, project_id, user_id, created_at) values ($1, $2, $3, $4)`, [sessionId, projectId, user.id, at]);
      await tx.query(`insert into auth_refresh_tokens (token_hash, session_id, created_at) values ($1, $2, $3)`, [hashSecret(refresh), sessionId, at]);
      await tx.query(`update auth_users set last_sign_in_at = $2 where id = $1`, [user.id, at]);
    });
    return this.tokenResponse(projectId, user, sessionId, refresh, cfg);
  }

  private async tokenResponse(projectId: string, user: Row, sessionId: string, refresh: string, cfg: AuthConfig): Promise<TokenResponse> {
    const ttl = cfg.access_token_ttl_seconds;
    const access_token = await this.d.keys.sign(projectId, { sub: user.id, email: user.email, role: "authenticated", session_id: sessionId }, ttl);
    return { access_token, token_type: "bearer", expires_in: ttl, refresh_token: refresh, user: userView(user) };
  }

  /**
   * Spends a refresh token and issues a new pair in the same session. Presenting a spent token means
   * it leaked: the whole session is revoked, so neither the thief nor the owner can continue it.
   */
  async refresh(projectId: string, refreshToken: string): Promise<TokenResponse> {
    const hash = hashSecret(refreshToken);
    const [rt] = await this.d.store.query(
      `select r.session_id, r.spent_at, s.revoked_at, s.user_id, s.project_id
         from auth_refresh_tokens r join auth_sessions s on s.id = r.session_id where r.token_hash = $1`,
      [hash],
    );
    if (!rt || rt.project_id !== projectId || rt.revoked_at) throw unauthorized("invalid refresh token");
    const at = this.d.now().toISOString();
    const spent = await this.d.store.query(
      `update auth_refresh_tokens set spent_at = $2 where token_hash = $1 and spent_at is null returning session_id`,
      [hash, at],
    );
    if (spent.length === 0) {
      await this.revokeSession(rt.session_id, "refresh_token_reuse");
      throw unauthorized("refresh token already used; the session has been revoked");
    }
    const [user] = await this.d.store.query(`select * from auth_users where id = $1`, [rt.user_id]);
    if (!user || user.status !== "active") throw unauthorized("invalid refresh token");
    const next = `rt-${randomToken()}`;
    await this.d.store.query(`insert into auth_refresh_tokens (token_hash, session_id, created_at) values ($1, $2, $3)`, [hashSecret(next), rt.session_id, at]);
    return this.tokenResponse(projectId, user, rt.session_id, next, await this.d.config.get(projectId));
  }

  async revokeSession(sessionId: string, reason: string, tx: Sql = this.d.store): Promise<void> {
    await tx.query(`update auth_sessions set revoked_at = $2, revoked_reason = $3 where id = $1 and revoked_at is null`, [
      sessionId,
      this.d.now().toISOString(),
      reason,
    ]);
    this.d.evictSession(sessionId);
  }

  private async revokeAllSessions(userId: string, reason: string, exceptSessionId?: string): Promise<void> {
    const rows = await this.d.store.query(
      `update auth_sessions set revoked_at = $2, revoked_reason = $3 where user_id = $1 and revoked_at is null and id <> $4 returning id`,
      [userId, this.d.now().toISOString(), reason, exceptSessionId ?? ""],
    );
    for (const r of rows) this.d.evictSession(r.id);
  }

  /** The shared verifier's end-user branch: a valid JWT whose session is still live. */
  async principalOf(jwt: string): Promise<Principal | null> {
    const claims = await this.d.keys.verify(jwt);
    if (!claims) return null;
    const [s] = await this.d.store.query(`select revoked_at from auth_sessions where id = $1`, [claims.session_id]);
    if (!s || s.revoked_at) return null;
    return {
      kind: "user",
      userId: claims.sub,
      projectId: claims.project_id,
      email: claims.email,
      role: "authenticated",
      sessionId: claims.session_id,
      expiresAt: (claims.exp ?? 0) * 1000,
      accessToken: jwt,
    };
  }

  // ---- the signed-in user --------------------------------------------------------------------

  private async userRow(projectId: string, userId: string): Promise<Row> {
    const [row] = await this.d.store.query(`select * from auth_users where id = $1 and project_id = $2`, [userId, projectId]);
    if (!row) throw notFound("user not found");
    return row;
  }

  async me(projectId: string, userId: string): Promise<UserView> {
    return userView(await this.userRow(projectId, userId));
  }

  /**
   * Changes the signed-in user's data, password or email. `data` is merged into the metadata (a
   * null value removes a key); a new password ends the user's other sessions; a new email takes
   * effect when the link mailed to it is followed.
   */
  async updateMe(
    projectId: string,
    userId: string,
    sessionId: string,
    input: { email?: string; password?: string; data?: Record<string, unknown> },
    redirectUrl?: string,
  ): Promise<{ user: UserView; emailChangePending: boolean }> {
    const cur = await this.userRow(projectId, userId);
    const cfg = await this.d.config.get(projectId);
    if (input.password !== undefined) this.checkPassword(input.password);
    let changingEmail = false;
    if (input.email !== undefined && input.email.toLowerCase() !== cur.email_lower) {
      this.checkEmailDomain(cfg, input.email);
      if (redirectUrl) this.checkRedirect(cfg, redirectUrl);
      const [taken] = await this.d.store.query(`select 1 from auth_users where project_id = $1 and email_lower = $2`, [projectId, input.email.toLowerCase()]);
      if (taken) throw conflict("a user with this email already exists");
      changingEmail = true;
    }
    const meta = { ...(cur.raw_user_meta_data ?? {}) };
    for (const [k, v] of Object.entries(input.data ?? {})) {
      if (v === null) delete meta[k];
      else meta[k] = v;
    }
    const hash = input.password !== undefined ? await hashPassword(input.password) : cur.password_hash;
    const [row] = await this.d.store.query(
      `update auth_users set raw_user_meta_data = $2::text::jsonb, password_hash = $3, pending_email = $4, updated_at = $5 where id = $1 returning *`,
      [userId, JSON.stringify(meta), hash, changingEmail ? input.email : cur.pending_email, this.d.now().toISOString()],
    );
    if (input.password !== undefined) await this.revokeAllSessions(userId, "password_changed", sessionId);
    if (changingEmail) await this.mailConfirmation(projectId, row!, "email_change", input.email!, redirectUrl);
    return { user: userView(row!), emailChangePending: changingEmail };
  }

  // ---- one-time links ------------------------------------------------------------------------

  private checkRedirect(cfg: AuthConfig, url: string): void {
    if (!cfg.allowed_redirect_urls.includes(url)) throw badRequest("redirect_url is not in the project's allowed_redirect_urls");
  }

  private async oneTimeToken(projectId: string, userId: string, purpose: string, ttlMs: number, extra: { newEmail?: string; redirectUrl?: string }) {
    const token = randomToken();
    const at = this.d.now();
    await this.d.store.query(
      `insert into auth_one_time_tokens (token_hash, project_id, user_id, purpose, new_email, redirect_url, expires_at, created_at)
       values ($1, $2, $3, $4, $5, $6, $7, $8)`,
      [hashSecret(token), projectId, userId, purpose, extra.newEmail ?? null, extra.redirectUrl ?? null, new Date(at.getTime() + ttlMs).toISOString(), at.toISOString()],
    );
    return token;
  }

  private async mailConfirmation(projectId: string, user: Row, purpose: "confirm_signup" | "email_change", to: string, redirectUrl?: string) {
    const token = await this.oneTimeToken(projectId, user.id, purpose, CONFIRM_TTL_MS, {
      newEmail: purpose === "email_change" ? to : undefined,
      redirectUrl,
    });
    const link = `${this.d.publicUrl()}/auth/confirm?token=${token}`;
    const what = purpose === "email_change" ? "confirm your new email address" : "confirm your email address";
    this.d.sendMail({
      to,
      subject: purpose === "email_change" ? "Confirm your new email address" : "Confirm your email address",
      text: `Follow this link to ${what}:\n\n${link}\n\nThe link works once and expires in 24 hours.`,
      html: `<p>Follow this link to ${what}:</p><p><a href="${link}">${link}</a></p><p>The link works once and expires in 24 hours.</p>`,
    });
  }

  /** Always succeeds from the caller's view, so it cannot be used to learn who has an account. */
  async forgotPassword(projectId: string, email: string, redirectUrl?: string): Promise<void> {
    const cfg = await this.d.config.get(projectId);
    if (redirectUrl) this.checkRedirect(cfg, redirectUrl);
    const [row] = await this.d.store.query(`select * from auth_users where project_id = $1 and email_lower = $2 and status = 'active'`, [
      projectId,
      email.toLowerCase(),
    ]);
    if (!row) return;
    const token = await this.oneTimeToken(projectId, row.id, "recovery", RECOVERY_TTL_MS, { redirectUrl });
    const link = redirectUrl
      ? `${redirectUrl}${redirectUrl.includes("?") ? "&" : "?"}token=${token}&type=recovery`
      : `${this.d.publicUrl()}/auth/reset-password?token=${token}`;
    this.d.sendMail({
      to: row.email,
      subject: "Reset your password",
      text: `Someone asked to reset the password of this account. If it was you, follow this link:\n\n${link}\n\nThe link works once and expires in 1 hour. If it was not you, ignore this email.`,
      html: `<p>Someone asked to reset the password of this account. If it was you, follow this link:</p><p><a href="${link}">${link}</a></p><p>The link works once and expires in 1 hour. If it was not you, ignore this email.</p>`,
    });
  }

  /** Spends a one-time token of the given purpose, or fails with 400. */
  private async spend(token: string, purposes: string[], projectId?: string): Promise<Row> {
    const rows = await this.d.store.query(
      `update auth_one_time_tokens set used_at = $2
        where token_hash = $1 and used_at is null and expires_at > $2::timestamptz and purpose = any($3::text[])
        returning *`,
      [hashSecret(token), this.d.now().toISOString(), purposes],
    );
    const row = rows[0];
    if (!row || (projectId && row.project_id !== projectId)) throw badRequest("invalid or expired token");
    return row;
  }

  /** Sets a new password from a recovery link; every session of the user ends, and a new one starts. */
  async resetPassword(projectId: string, token: string, password: string): Promise<TokenResponse> {
    this.checkPassword(password);
    const t = await this.spend(token, ["recovery"], projectId);
    const [row] = await this.d.store.query(
      `update auth_users set password_hash = $2, email_confirmed_at = coalesce(email_confirmed_at, $3), updated_at = $3 where id = $1 returning *`,
      [t.user_id, await hashPassword(password), this.d.now().toISOString()],
    );
    await this.revokeAllSessions(t.user_id, "password_reset");
    return this.startSession(projectId, row!, await this.d.config.get(projectId));
  }

  /** Follows a confirmation link (sign-up or email change). */
  async confirm(token: string): Promise<{ user: UserView; redirectUrl: string | null }> {
    const t = await this.spend(token, ["confirm_signup", "email_change"]);
    const at = this.d.now().toISOString();
    let row: Row | undefined;
    if (t.purpose === "email_change") {
      try {
        [row] = await this.d.store.query(
          `update auth_users set email = $2, email_lower = $3, email_confirmed_at = $4, pending_email = null, updated_at = $4 where id = $1 returning *`,
          [t.user_id, t.new_email, t.new_email.toLowerCase(), at],
        );
      } catch (err) {
        if (isUniqueViolation(err)) throw conflict("a user with this email already exists");
        throw err;
      }
    } else {
      [row] = await this.d.store.query(`update auth_users set email_confirmed_at = coalesce(email_confirmed_at, $2), updated_at = $2 where id = $1 returning *`, [
        t.user_id,
        at,
      ]);
    }
    if (!row) throw badRequest("invalid or expired token");
    return { user: userView(row), redirectUrl: t.redirect_url };
  }

  /** The project a recovery token belongs to (the hosted reset page needs its anon key). */
  async recoveryProject(token: string): Promise<string | null> {
    const [row] = await this.d.store.query(
      `select project_id from auth_one_time_tokens where token_hash = $1 and purpose = 'recovery' and used_at is null and expires_at > $2::timestamptz`,
      [hashSecret(token), this.d.now().toISOString()],
    );
    return row?.project_id ?? null;
  }

  // ---- administration ------------------------------------------------------------------------

  async list(projectId: string, o: { page: number; limit: number; search?: string }) {
    const params: unknown[] = [projectId];
    let where = `project_id = $1`;
    if (o.search) {
      params.push(likePattern(o.search.toLowerCase()));
      where += ` and email_lower like $2`;
    }
    const [{ total }] = (await this.d.store.query(`select count(*)::int as total from auth_users where ${where}`, params)) as [{ total: number }];
    const rows = await this.d.store.query(
      `select * from auth_users where ${where} order by created_at desc, id desc limit ${o.limit} offset ${(o.page - 1) * o.limit}`,
      params,
    );
    return { data: rows.map(adminView), total };
  }

  async adminCreate(projectId: string, input: { email: string; password?: string; data?: Record<string, unknown>; email_confirmed?: boolean }) {
    if (input.password !== undefined) this.checkPassword(input.password);
    return adminView(await this.insertUser(projectId, { ...input, confirmed: input.email_confirmed ?? true }));
  }

  async adminGet(projectId: string, userId: string) {
    return adminView(await this.userRow(projectId, userId));
  }

  async adminDelete(projectId: string, userId: string): Promise<void> {
    const sessions = await this.d.store.query(`select id from auth_sessions where user_id = $1 and project_id = $2`, [userId, projectId]);
    const rows = await this.d.store.query(`delete from auth_users where id = $1 and project_id = $2 returning id`, [userId, projectId]);
    if (!rows.length) throw notFound("user not found");
    for (const s of sessions) this.d.evictSession(s.id);
  }

  async removeAll(projectId: string): Promise<void> {
    await this.d.store.query(`delete from auth_one_time_tokens where project_id = $1`, [projectId]);
    const sessions = await this.d.store.query(`select id from auth_sessions where project_id = $1`, [projectId]);
    await this.d.store.query(`delete from auth_users where project_id = $1`, [projectId]);
    for (const s of sessions) this.d.evictSession(s.id);
  }
}

