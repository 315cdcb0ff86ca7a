import { errorSchema } from "../http/common-schemas";
import { DEFAULT_LIMIT, paginated } from "../http/pagination";
import { reply, type AreaRouter } from "../http/route";
import type { AccessTokensService } from "./service";
import { projectIdParams } from "../projects/schemas";
import {
  allTokensUsageSchema,
  createdTokenSchema,
  createTokenBody,
  daysQuery,
  listTokensQuery,
  tokenListSchema,
  tokenParams,
  tokenSchema,
  tokenUsageSchema,
} from "./schemas";

const tag = "Project access tokens";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };
/** Create, list, get and revoke are platform-token only; usage is an ordinary project read. */
const manage = { kind: "project", access: "write", platformOnly: true } as const;
const DEFAULT_USAGE_DAYS = 30;

/** What the access-token routes use. */
export interface AccessTokenRouteDeps {
  tokens: AccessTokensService;
}

export function accessTokenRoutes(r: AreaRouter<AccessTokenRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/access-tokens",
    tag,
    summary: "Create a project access token (the secret is returned once)",
    auth: manage,
    params: projectIdParams,
    body: createTokenBody,
    responses: { 201: { description: "created", schema: createdTokenSchema }, ...errors, 409: errorSchema },
    handler: async ({ deps, project, body }) => reply.created(await deps.tokens.create(project.id, body)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/access-tokens",
    tag,
    summary: "List project access tokens",
    auth: { ...manage, access: "read" },
    params: projectIdParams,
    query: listTokensQuery,
    responses: { 200: { description: "tokens", schema: tokenListSchema }, ...errors },
    handler: async ({ deps, project, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.tokens.list(project.id, { page, limit, search: q.search, includeRevoked: q.include_revoked ?? false });
      return reply.ok(
        paginated(res.data, {
          page,
          limit,
          total: res.total,
          path: `/projects/${project.id}/access-tokens`,
          query: { search: q.search, include_revoked: q.include_revoked ? "true" : undefined },
        }),
      );
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/access-tokens/usage",
    tag,
    summary: "Daily request counts of every token of the project",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    query: daysQuery,
    responses: { 200: { description: "usage", schema: allTokensUsageSchema }, ...errors },
    handler: async ({ deps, project, query: q }) =>
      reply.ok(await deps.tokens.usageAll(project.id, q.days ?? DEFAULT_USAGE_DAYS, q.include_revoked ?? false)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/access-tokens/{tokenId}",
    tag,
    summary: "Metadata of one token",
    auth: { ...manage, access: "read" },
    params: tokenParams,
    responses: { 200: { description: "token", schema: tokenSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await deps.tokens.get(project.id, params.tokenId)),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/access-tokens/{tokenId}",
    tag,
    summary: "Revoke a token (idempotent)",
    auth: manage,
    params: tokenParams,
    responses: { 204: { description: "revoked" }, ...errors, 409: errorSchema },
    handler: async ({ deps, project, params }) => {
      await deps.tokens.revoke(project.id, params.tokenId);
      return reply.noContent();
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/access-tokens/{tokenId}/usage",
    tag,
    summary: "Daily request counts of one token",
    auth: { kind: "project", access: "read" },
    params: tokenParams,
    query: daysQuery,
    responses: { 200: { description: "usage", schema: tokenUsageSchema }, ...errors },
    handler: async ({ deps, project, params, query: q }) =>
      reply.ok(await deps.tokens.usageOf(project.id, params.tokenId, q.days ?? DEFAULT_USAGE_DAYS)),
  });
}
