import type { PlanName } from "../config";

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

/** What a route needs from the caller; the guard turns a rule into 401/403/404 answers. */
export type AuthRule =
  | { kind: "none" }
  /** `KILN_ADMIN_TOKEN` only; without it configured the route answers 404. */
  | { kind: "admin" }
  /** Account-scoped: platform tokens only. */
  | { kind: "account" }
  /** Application credential of a project: an anon key (or a service key, which can do anything an anon key can). */
  | { kind: "anon" }
  /** An end user's access token. */
  | { kind: "user" }
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
