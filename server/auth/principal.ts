import type { PlanName } from "../config";
import type { ProjectRecord } from "../projects/record";

/** Who a request acts as, once its bearer credential has been verified. */
export type Principal =
  | { kind: "platform"; accountId: string; plan: PlanName; tokenId: string }
  | {
      kind: "project_token";
      tokenId: string;
      projectId: string;
      accountId: string;
      scope: "full" | "read_only";
      expiresAt: number | null;
    }
  | { kind: "service_key"; keyId: string; projectId: string; permissions: string[] | null }
  | { kind: "anon_key"; keyId: string; projectId: string; permissions: string[] }
  | {
      kind: "user";
      userId: string;
      projectId: string;
      email: string;
      role: "authenticated";
      sessionId: string;
      expiresAt: number;
      /** The bearer as presented (functions receive it in `__service_auth`). */
      accessToken: string;
    }
  | { kind: "admin" };

export type PrincipalKind = Principal["kind"];
export type PlatformPrincipal = Extract<Principal, { kind: "platform" }>;
export type ProjectTokenPrincipal = Extract<Principal, { kind: "project_token" }>;
export type ServiceKeyPrincipal = Extract<Principal, { kind: "service_key" }>;
export type AnonKeyPrincipal = Extract<Principal, { kind: "anon_key" }>;
export type UserPrincipal = Extract<Principal, { kind: "user" }>;
export type AdminPrincipal = Extract<Principal, { kind: "admin" }>;
/** The credentials an application holds: what invokes functions and queries databases. */
export type ApplicationPrincipal = ServiceKeyPrincipal | AnonKeyPrincipal | UserPrincipal;
/** Who manages a project: its owner's platform token or a project access token. */
export type ManagementPrincipal = PlatformPrincipal | ProjectTokenPrincipal;

/** What a route needs from the caller; the guard turns a rule into 401/403/404 answers. */
export type AuthRule =
  | { kind: "none" }
  /** `KILN_ADMIN_TOKEN` only; without it configured the route answers 404. */
  | { kind: "admin" }
  /** Account-scoped: platform tokens only. */
  | { kind: "account" }
  /**
   * Across the caller's projects without one in the path (GET /deployments): a platform token
   * (every project of its account) or a project access token (its own project only).
   */
  | { kind: "management" }
  /** Application credential of a project: an anon key (or a service key, which can do anything an anon key can). */
  | { kind: "anon" }
  /** An end user's access token. */
  | { kind: "user" }
  /**
   * A project access token only, its project taken from the token (POST /mcp): platform tokens,
   * keys and end-user tokens are refused with 403.
   */
  | { kind: "projectToken" }
  /**
   * Any application credential of a project: a service key, an end-user access token or an anon key.
   * `permission`: a scoped service key and an anon key must hold it (`functions.invoke`).
   * `fullServiceRole`: scoped service keys are refused outright. `serviceKeysOnly`: anon keys and
   * end-user tokens are refused too (project locks). `refused` and `unauthenticated`
   * replace the 403 and 401 messages where the spec words them for the area.
   */
  | { kind: "application"; permission?: string; fullServiceRole?: boolean; serviceKeysOnly?: boolean; refused?: string; unauthenticated?: string }
  /**
   * Project management under /projects/{projectId}: the owner's platform token or a project access
   * token bound to that project. `access` says what a read-only token may do:
   *  - read: allowed; write: refused; credential: refused (it returns secrets).
   * `platformOnly` refuses project tokens (token management).
   * `allowDeleting` lets the route see a project whose deletion is under way.
   */
  | {
      kind: "project";
      access: "read" | "write" | "credential";
      platformOnly?: boolean;
      allowDeleting?: boolean;
      /** Where the project comes from: the path (default) or, for `/auth/config`, the
       *  project token itself or a `project_id` query parameter with a platform token. */
      projectFrom?: "path" | "token-or-query";
    };

/**
 * What a route's auth rule guarantees its handler (and any caller of Guard.authorize): who the caller is and, for project routes, the
 * project, loaded and authorized. A handler never checks for null what its rule already decided.
 */
export type AuthedBy<R extends AuthRule> = R extends { kind: "none" }
  ? { principal: null; project: null }
  : R extends { kind: "admin" }
    ? { principal: AdminPrincipal; project: null }
    : R extends { kind: "account" }
      ? { principal: PlatformPrincipal; project: null }
      : R extends { kind: "management" }
        ? { principal: ManagementPrincipal; project: null }
      : R extends { kind: "anon" }
        ? { principal: AnonKeyPrincipal | ServiceKeyPrincipal; project: null }
        : R extends { kind: "user" }
          ? { principal: UserPrincipal; project: null }
          : R extends { kind: "projectToken" }
            ? { principal: ProjectTokenPrincipal; project: ProjectRecord }
          : R extends { kind: "application"; serviceKeysOnly: true }
            ? { principal: ServiceKeyPrincipal; project: null }
            : R extends { kind: "application" }
            ? { principal: ApplicationPrincipal; project: null }
            : R extends { kind: "project" }
              ? { principal: ManagementPrincipal; project: ProjectRecord }
              : never;

