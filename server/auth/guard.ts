import { timingSafeEqual } from "node:crypto";
import type { Clock } from "../clock";
import type { Config } from "../config";
import type { Logger } from "../log";
import { badRequest, conflictCode, forbidden, HttpError, notFound, tooManyRequests, unauthorized } from "../http/errors";
import { FixedWindowLimiter } from "../http/rate-limit";
import type { ProjectRecord } from "../projects/record";
import type { Credentials } from "./credentials";
import type { ApplicationPrincipal, AuthedBy, AuthRule, Principal } from "./principal";

export const MSG = {
  missing: "authentication required: send Authorization: Bearer <token>",
  invalid: "invalid token",
  validationFailed: "failed to validate token",
  tooMany: "too many requests with unrecognized credentials; retry later",
  wrongProject: "project access token is not valid for this project",
  readOnly: "project access token is read-only",
  credentialRead: "reading credentials requires a full-scope project access token",
  accountScoped: "project access tokens cannot be used on account-scoped endpoints; use a platform token",
  tokenManagement: "project access tokens cannot manage project access tokens; use a platform token",
  platformOnly: "this endpoint requires a platform token",
  management: "this endpoint requires a platform token or a project access token",
  projectNotFound: "project not found",
  anonOnly: "this endpoint requires the project's anon key (or a service key)",
  userOnly: "this endpoint requires an end-user access token",
  application: "this endpoint requires a service key, an end-user access token or an anon key; platform and project tokens are not accepted",
  projectIdRequired: "project_id query parameter is required with a platform token",
  projectTokenOnly: "this endpoint requires a project access token (pt-...); platform tokens, service keys, anon keys and end-user tokens are not accepted",
  serviceKeyOnly: "this endpoint requires a service key; anon keys, end-user tokens, platform and project tokens are not accepted",
} as const;

export function bearerOf(request: Request): string | null {
  const h = request.headers.get("authorization");
  if (!h) return null;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  return m ? m[1]! : "";
}

/** The application-credential rule: which kinds, and which permission a scoped credential needs. */
export function applicationPrincipal(rule: Extract<AuthRule, { kind: "application" }>, p: Principal): ApplicationPrincipal {
  if (p.kind === "service_key") {
    if (p.permissions === null) return p;
    if (rule.fullServiceRole) throw forbidden("this service key is scoped; this endpoint needs a service key with the full service role");
    if (rule.permission && !p.permissions.includes(rule.permission)) throw forbidden(`this service key is scoped without ${rule.permission}`);
    return p;
  }
  if (rule.serviceKeysOnly) throw forbidden(rule.refused ?? MSG.serviceKeyOnly);
  if (p.kind === "anon_key") {
    if (rule.permission && !p.permissions.includes(rule.permission)) throw forbidden(`this anon key does not hold the ${rule.permission} permission`);
    return p;
  }
  if (p.kind === "user") return p;
  throw forbidden(rule.refused ?? MSG.application);
}

/** What the guard consults: credentials, the projects it loads, and project-token usage. */
export interface GuardDeps {
  config: Config;
  clock: Clock;
  log: Logger;
  credentials: Credentials;
  projects: { findVisible(projectId: string): Promise<ProjectRecord | null> };
  tokenUsage: { record(tokenId: string): void };
}

/** Applies a route's AuthRule: who may call it, and which project it acts on. */
export class Guard {
  private readonly failures: FixedWindowLimiter;

  constructor(private readonly d: GuardDeps) {
    this.failures = new FixedWindowLimiter(d.config.authFailureLimit, 60_000, () => d.clock.nowMs());
  }

  /** The caller as the rule says (typed by it: AuthedBy), or the 401/403/404/429 that refuses it. */
  async authorize<const R extends AuthRule>(rule: R, request: Request, params: { projectId?: string }, ip: string): Promise<AuthedBy<R>> {
    return (await this.check(rule, request, params, ip)) as AuthedBy<R>;
  }

  private async check(rule: AuthRule, request: Request, params: { projectId?: string }, ip: string): Promise<{ principal: Principal | null; project: ProjectRecord | null }> {
    if (rule.kind === "none") return { principal: null, project: null };
    if (rule.kind === "admin") return { principal: this.admin(request, ip), project: null };

    let principal: Principal;
    try {
      principal = await this.authenticate(request, ip);
    } catch (err) {
      if (rule.kind === "application" && rule.unauthenticated && err instanceof HttpError && err.status === 401) throw unauthorized(rule.unauthenticated);
      throw err;
    }
    if (rule.kind === "account") {
      if (principal.kind === "platform") return { principal, project: null };
      throw forbidden(principal.kind === "project_token" ? MSG.accountScoped : MSG.platformOnly);
    }

    if (rule.kind === "management") {
      if (principal.kind === "platform") return { principal, project: null };
      if (principal.kind === "project_token") {
        this.d.tokenUsage.record(principal.tokenId);
        return { principal, project: null };
      }
      throw forbidden(MSG.management);
    }

    if (rule.kind === "anon") {
      if (principal.kind === "anon_key" || principal.kind === "service_key") return { principal, project: null };
      throw forbidden(MSG.anonOnly);
    }
    if (rule.kind === "user") {
      if (principal.kind === "user") return { principal, project: null };
      throw forbidden(MSG.userOnly);
    }
    if (rule.kind === "projectToken") {
      if (principal.kind !== "project_token") throw forbidden(MSG.projectTokenOnly);
      this.d.tokenUsage.record(principal.tokenId);
      const project = await this.d.projects.findVisible(principal.projectId);
      if (!project || project.account_id !== principal.accountId) throw notFound(MSG.projectNotFound);
      return { principal, project };
    }
    if (rule.kind === "application") return { principal: applicationPrincipal(rule, principal), project: null };

    // Project-scoped management route.
    let projectId = params.projectId;
    if (rule.projectFrom === "token-or-query") {
      projectId =
        principal.kind === "project_token"
          ? (new URL(request.url).searchParams.get("project_id") ?? principal.projectId)
          : (new URL(request.url).searchParams.get("project_id") ?? undefined);
      if (!projectId) throw badRequest(MSG.projectIdRequired);
    }
    if (!projectId) throw new Error("project route without a project id");
    if (principal.kind === "project_token") {
      if (principal.projectId !== projectId) throw forbidden(MSG.wrongProject);
      if (rule.platformOnly) throw forbidden(MSG.tokenManagement);
      if (principal.scope === "read_only") {
        if (rule.access === "write") throw forbidden(MSG.readOnly);
        if (rule.access === "credential") throw forbidden(MSG.credentialRead);
      }
      this.d.tokenUsage.record(principal.tokenId);
    } else if (principal.kind !== "platform") {
      throw forbidden(rule.platformOnly ? MSG.platformOnly : MSG.management);
    }
    const project = await this.d.projects.findVisible(projectId);
    if (!project || project.account_id !== principal.accountId) throw notFound(MSG.projectNotFound);
    if (project.status === "deleting" && rule.access === "write" && !rule.allowDeleting) throw conflictCode("project_deleting");
    return { principal, project };
  }

  /** Any live credential, or 401/429. Exposed for routes with their own rules (functions, locks). */
  async authenticate(request: Request, ip: string): Promise<Principal> {
    const secret = bearerOf(request);
    if (secret === null) throw unauthorized(MSG.missing);
    let principal = secret ? this.d.credentials.cached(secret) : null;
    if (principal === undefined) {
      try {
        principal = await this.d.credentials.resolve(secret!);
      } catch (err) {
        this.d.log.error("credential validation failed", err);
        throw new HttpError(500, { error: MSG.validationFailed });
      }
    }
    if (principal) return principal;
    // Unrecognized credentials are rationed per source address; valid ones never reach this.
    const r = this.failures.hit(ip);
    if (!r.allowed) throw tooManyRequests(MSG.tooMany, r.retryAfterSeconds);
    throw unauthorized(MSG.invalid);
  }

  private admin(request: Request, ip: string): Principal {
    const configured = this.d.config.adminToken;
    if (!configured) throw notFound();
    const secret = bearerOf(request);
    if (secret === null) throw unauthorized(MSG.missing);
    const a = Buffer.from(secret);
    const b = Buffer.from(configured);
    if (a.length === b.length && timingSafeEqual(a, b)) return { kind: "admin" };
    const r = this.failures.hit(ip);
    if (!r.allowed) throw tooManyRequests(MSG.tooMany, r.retryAfterSeconds);
    throw unauthorized(MSG.invalid);
  }
}
