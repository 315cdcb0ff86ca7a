import type { KeysService } from "../keys/service";
import type { ProjectsService } from "../projects/service";
import type { AuthConfigService } from "./config";
import type { AuthRateLimits } from "./rate-limits";
import type { EndUsersService } from "./service";
import type { SigningKeys } from "./signing-keys";
import { errorSchema } from "../http/common-schemas";
import { badRequest, notFound } from "../http/errors";
import { DEFAULT_LIMIT, paginated } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { authConfigSchema, patchAuthConfigBody } from "./config";
import { withHeaders } from "./rate-limits";
import { resetPasswordPage } from "./reset-page";
import {
  adminCreateUserBody,
  adminUserSchema,
  forgotBody,
  jwksQuery,
  jwksSchema,
  listUsersQuery,
  messageSchema,
  refreshBody,
  resetBody,
  rotatedKeySchema,
  signinBody,
  signupBody,
  signupPendingSchema,
  tokenQuery,
  tokenResponseSchema,
  updatedUserSchema,
  updateUserBody,
  userListSchema,
  userParams,
  userSchema,
} from "./schemas";

const tag = "End-user auth";
const anon = { kind: "anon" } as const;
const user = { kind: "user" } as const;
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 429: errorSchema };


/** Rate-limit headers for one endpoint, then the handler; the headers go on errors too. */
async function limited<T>(deps: EndUserRouteDeps, endpoint: Parameters<AuthRateLimits["take"]>[0], projectId: string, ip: string, fn: () => Promise<T>) {
  const cfg = await deps.authConfig.get(projectId);
  const headers = deps.authLimits.take(endpoint, projectId, ip, cfg);
  return { headers, result: await withHeaders(headers, fn) };
}

/** What the end-user routes use. */
export interface EndUserRouteDeps {
  endUsers: EndUsersService;
  authConfig: AuthConfigService;
  authLimits: AuthRateLimits;
  signingKeys: SigningKeys;
  keys: KeysService;
  projects: ProjectsService;
}

export function endUserRoutes(r: AreaRouter<EndUserRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/auth/signup",
    tag,
    summary: "Create an end user with email and password (anon key)",
    auth: anon,
    body: signupBody,
    responses: {
      201: { description: "signed up: a session, or (email confirmation required) the user only", schema: tokenResponseSchema.or(signupPendingSchema) },
      ...errors,
      409: errorSchema,
    },
    handler: async ({ deps, principal, ip, body }) => {
      const projectId = principal.projectId;
      const { headers, result } = await limited(deps, "signup", projectId, ip, () =>
        deps.endUsers.signup(projectId, { email: body.email, password: body.password, data: body.data }, body.redirect_url),
      );
      const out = result.confirmationRequired ? { user: result.user, confirmation_sent: true as const } : result.tokens;
      return { status: 201, body: out, headers };
    },
  });

  r.add({
    method: "POST",
    path: "/auth/signin",
    tag,
    summary: "Sign in with email and password (anon key)",
    auth: anon,
    body: signinBody,
    responses: { 200: { description: "a new session", schema: tokenResponseSchema }, ...errors },
    handler: async ({ deps, principal, ip, body }) => {
      const projectId = principal.projectId;
      const { result } = await limited(deps, "signin", projectId, ip, () => deps.endUsers.signin(projectId, body.email, body.password));
      return reply.ok(result);
    },
  });

  r.add({
    method: "POST",
    path: "/auth/refresh",
    tag,
    summary: "Spend a refresh token for a new token pair (reuse revokes the session)",
    auth: anon,
    body: refreshBody,
    responses: { 200: { description: "a new pair", schema: tokenResponseSchema }, ...errors },
    handler: async ({ deps, principal, ip, body }) => {
      const projectId = principal.projectId;
      const { result } = await limited(deps, "refresh", projectId, ip, () => deps.endUsers.refresh(projectId, body.refresh_token));
      return reply.ok(result);
    },
  });

  r.add({
    method: "POST",
    path: "/auth/logout",
    tag,
    summary: "End the current session (end-user token)",
    auth: user,
    responses: { 204: { description: "signed out" }, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal }) => {
      await deps.endUsers.revokeSession(principal.sessionId, "logout");
      return reply.noContent();
    },
  });

  r.add({
    method: "POST",
    path: "/auth/forgot-password",
    tag,
    summary: "Mail a one-time password reset link (always 200: no account enumeration)",
    auth: anon,
    body: forgotBody,
    responses: { 200: { description: "accepted", schema: messageSchema }, ...errors },
    handler: async ({ deps, principal, ip, body }) => {
      const projectId = principal.projectId;
      const { headers } = await limited(deps, "forgot_password", projectId, ip, () => deps.endUsers.forgotPassword(projectId, body.email, body.redirect_url));
      return reply.ok({ message: "if an account exists for this email, a reset link has been sent" }, headers);
    },
  });

  r.add({
    method: "POST",
    path: "/auth/reset-password",
    tag,
    summary: "Set a new password with the token from a reset link; ends every session and starts a new one",
    auth: anon,
    body: resetBody,
    responses: { 200: { description: "password changed", schema: tokenResponseSchema }, ...errors },
    handler: async ({ deps, principal, ip, body }) => {
      const projectId = principal.projectId;
      const { headers, result } = await limited(deps, "reset_password", projectId, ip, () => deps.endUsers.resetPassword(projectId, body.token, body.password));
      return reply.ok(result, headers);
    },
  });

  r.add({
    method: "GET",
    path: "/auth/reset-password",
    tag,
    summary: "Hosted page behind a reset link without redirect_url: a form that posts to /auth/reset-password",
    auth: { kind: "none" },
    query: tokenQuery,
    responses: { 200: { description: "HTML page", contentType: "text/html" }, 400: errorSchema },
    handler: async ({ deps, query }) => {
      const projectId = await deps.endUsers.recoveryProject(query.token);
      if (!projectId) throw badRequest("invalid or expired token");
      const [anonKey] = await deps.keys.listAnonKeys(projectId);
      if (!anonKey) throw badRequest("the project has no anon key to reset passwords with");
      return new Response(resetPasswordPage(query.token, anonKey.key), { headers: { "Content-Type": "text/html; charset=utf-8" } });
    },
  });

  r.add({
    method: "GET",
    path: "/auth/confirm",
    tag,
    summary: "Follow an email confirmation link (sign-up or email change)",
    auth: { kind: "none" },
    query: tokenQuery,
    responses: { 200: { description: "confirmed", schema: userSchema }, 303: { description: "confirmed; on to the redirect URL" }, 400: errorSchema, 409: errorSchema },
    handler: async ({ deps, query }) => {
      const { user: u, redirectUrl } = await deps.endUsers.confirm(query.token);
      if (redirectUrl) return new Response(null, { status: 303, headers: { Location: `${redirectUrl}${redirectUrl.includes("?") ? "&" : "?"}type=email_confirmed` } });
      return reply.ok(u);
    },
  });

  r.add({
    method: "GET",
    path: "/auth/user",
    tag,
    summary: "The signed-in user",
    auth: user,
    responses: { 200: { description: "user", schema: userSchema }, 401: errorSchema, 403: errorSchema, 404: errorSchema },
    handler: async ({ deps, principal }) => {
      const u = principal;
      return reply.ok(await deps.endUsers.me(u.projectId, u.userId));
    },
  });

  r.add({
    method: "PUT",
    path: "/auth/user",
    tag,
    summary: "Change the signed-in user's metadata, password or email (a new email is confirmed by a mailed link)",
    auth: user,
    body: updateUserBody,
    responses: { 200: { description: "updated", schema: updatedUserSchema }, ...errors, 409: errorSchema },
    handler: async ({ deps, principal, ip, body }) => {
      const u = principal;
      const run = () => deps.endUsers.updateMe(u.projectId, u.userId, u.sessionId, body, body.redirect_url);
      const changingEmail = body.email !== undefined && body.email.toLowerCase() !== u.email.toLowerCase();
      const { headers, result } = changingEmail ? await limited(deps, "change_email", u.projectId, ip, run) : { headers: {}, result: await run() };
      return reply.ok({ ...result.user, ...(result.emailChangePending ? { new_email: body.email } : {}) }, headers);
    },
  });

  r.add({
    method: "GET",
    path: "/auth/jwks.json",
    tag,
    summary: "Public keys that verify a project's end-user access tokens (project_id query, or the project's anon key as bearer)",
    auth: { kind: "none" },
    query: jwksQuery,
    responses: { 200: { description: "JWKS", schema: jwksSchema }, 400: errorSchema, 401: errorSchema, 404: errorSchema },
    handler: async ({ deps, guard, request, ip, query }) => {
      let projectId = query.project_id;
      if (!projectId && request.headers.get("authorization")) {
        const p = await guard.authenticate(request, ip);
        // A platform token names no single project: then the query must (400 below).
        if (p && "projectId" in p) projectId = p.projectId;
      }
      if (!projectId) throw badRequest("send project_id, or the project's anon key as bearer");
      const project = await deps.projects.findVisible(projectId);
      if (!project || project.status !== "active") throw notFound("project not found");
      return reply.ok(await deps.signingKeys.jwks(projectId), { "Cache-Control": "public, max-age=300" });
    },
  });

  // ---- administration (platform or project token) --------------------------------------------

  r.add({
    method: "GET",
    path: "/auth/config",
    tag: "End-user administration",
    summary: "A project's end-user settings (project token, or platform token with ?project_id=)",
    auth: { kind: "project", access: "credential", projectFrom: "token-or-query" },
    responses: { 200: { description: "settings", schema: authConfigSchema }, ...errors, 404: errorSchema },
    handler: async ({ deps, project }) => reply.ok(await deps.authConfig.get(project.id)),
  });

  r.add({
    method: "PATCH",
    path: "/auth/config",
    tag: "End-user administration",
    summary: "Change a project's end-user settings (only given fields change)",
    auth: { kind: "project", access: "write", projectFrom: "token-or-query" },
    body: patchAuthConfigBody,
    responses: { 200: { description: "settings", schema: authConfigSchema }, ...errors, 404: errorSchema, 409: errorSchema },
    handler: async ({ deps, project, body }) => reply.ok(await deps.authConfig.update(project.id, body)),
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/auth/signing-keys/rotate",
    tag: "End-user administration",
    summary: "Start signing with a new key; the old one keeps verifying for a day",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    responses: { 200: { description: "the new key id", schema: rotatedKeySchema }, ...errors, 404: errorSchema },
    handler: async ({ deps, project }) => reply.ok(await deps.signingKeys.rotate(project.id)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/users",
    tag: "End-user administration",
    summary: "List a project's end users",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    query: listUsersQuery,
    responses: { 200: { description: "users", schema: userListSchema }, ...errors, 404: errorSchema },
    handler: async ({ deps, project, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.endUsers.list(project.id, { page, limit, search: q.search });
      return reply.ok(paginated(res.data, { page, limit, total: res.total, path: `/projects/${project.id}/users`, query: { search: q.search } }));
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/users",
    tag: "End-user administration",
    summary: "Create an end user (confirmed by default)",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    body: adminCreateUserBody,
    responses: { 201: { description: "created", schema: adminUserSchema }, ...errors, 404: errorSchema, 409: errorSchema },
    handler: async ({ deps, project, body }) => reply.created(await deps.endUsers.adminCreate(project.id, body)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/users/{userId}",
    tag: "End-user administration",
    summary: "Get an end user",
    auth: { kind: "project", access: "read" },
    params: userParams,
    responses: { 200: { description: "user", schema: adminUserSchema }, ...errors, 404: errorSchema },
    handler: async ({ deps, project, params }) => reply.ok(await deps.endUsers.adminGet(project.id, params.userId)),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/users/{userId}",
    tag: "End-user administration",
    summary: "Delete an end user; their sessions end at once",
    auth: { kind: "project", access: "write" },
    params: userParams,
    responses: { 204: { description: "deleted" }, ...errors, 404: errorSchema },
    handler: async ({ deps, project, params }) => {
      await deps.endUsers.adminDelete(project.id, params.userId);
      return reply.noContent();
    },
  });
}
