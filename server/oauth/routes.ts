import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import type { OAuthConfigsService } from "./configs";
import { PROVIDER_IDS, PROVIDERS } from "./providers";
import {
  configParams,
  createConfigBody,
  deviceClientQuery,
  oauthConfigListSchema,
  oauthConfigSchema,
  providerCatalogueSchema,
  updateConfigBody,
} from "./schemas";

const tag = "OAuth administration";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };

/** What the OAuth admin routes use. */
export interface OAuthAdminRouteDeps {
  oauthConfigs: OAuthConfigsService;
}

/** Provider configurations of a project (platform token or project access token; full scope to write). */
export function oauthAdminRoutes(r: AreaRouter<OAuthAdminRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/projects/{projectId}/oauth/providers",
    tag,
    summary: "The providers Kiln can sign end users in with, and their default scopes",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    responses: { 200: { description: "catalogue", schema: providerCatalogueSchema }, ...errors },
    handler: () => reply.ok({ providers: PROVIDER_IDS.map((id) => ({ id, name: PROVIDERS[id].name, default_scopes: PROVIDERS[id].default_scopes })) }),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/oauth/configs",
    tag,
    summary: "A project's provider configurations (no secrets)",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    responses: { 200: { description: "configs", schema: oauthConfigListSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok({ configs: await deps.oauthConfigs.list(project.id) }),
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/oauth/configs",
    tag,
    summary: "Configure a provider (client_secret and redirect_url required but for device; scopes default to the provider's)",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    body: createConfigBody,
    responses: { 201: { description: "configured; the secret masked", schema: oauthConfigSchema }, ...errors, 409: errorSchema },
    handler: async ({ deps, project, body }) => reply.created(await deps.oauthConfigs.create(project.id, body)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/oauth/configs/{provider}",
    tag,
    summary: "A provider's configuration, the secret masked (device: ?client_id= when there are several)",
    auth: { kind: "project", access: "read" },
    params: configParams,
    query: deviceClientQuery,
    responses: { 200: { description: "config", schema: oauthConfigSchema }, ...errors },
    handler: async ({ deps, project, params, query }) => reply.ok(await deps.oauthConfigs.get(project.id, params.provider, query.client_id)),
  });

  r.add({
    method: "PUT",
    path: "/projects/{projectId}/oauth/configs/{provider}",
    tag,
    summary: "Change a provider's configuration: only the fields given (device: ?client_id=, and only client_id and enabled)",
    auth: { kind: "project", access: "write" },
    params: configParams,
    query: deviceClientQuery,
    body: updateConfigBody,
    responses: { 200: { description: "config", schema: oauthConfigSchema }, ...errors, 409: errorSchema },
    handler: async ({ deps, project, params, query, body }) => reply.ok(await deps.oauthConfigs.update(project.id, params.provider, query.client_id, body)),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/oauth/configs/{provider}",
    tag,
    summary: "Remove a provider's configuration (device: ?client_id=)",
    auth: { kind: "project", access: "write" },
    params: configParams,
    query: deviceClientQuery,
    responses: { 204: { description: "removed" }, ...errors },
    handler: async ({ deps, project, params, query }) => {
      await deps.oauthConfigs.remove(project.id, params.provider, query.client_id);
      return reply.noContent();
    },
  });
}
