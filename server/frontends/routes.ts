import { plan as planOf } from "../accounts/plans";
import type { AccountsService } from "../accounts/service";
import type { Config } from "../config";
import { readMultipartBody } from "../http/body";
import { errorSchema } from "../http/common-schemas";
import { badRequest, forbidden } from "../http/errors";
import { DEFAULT_LIMIT, paginated } from "../http/pagination";
import { parseInput, reply, type AreaRouter } from "../http/route";
import type { ListeningAddress } from "../platform";
import { projectIdParams } from "../projects/schemas";
import type { DomainsService } from "./domains";
import type { DeploymentRecord, FrontendRecord } from "./records";
import { customDomainBody, customDomainSchema, deployFields, deploymentListSchema, frontendListSchema, frontendParams, frontendSchema, pageQuery } from "./schemas";
import { siteUrl } from "./site-address";
import type { FrontendsService } from "./service";

export interface RouteDeps {
  config: Config;
  address: ListeningAddress;
  accounts: AccountsService;
  frontends: FrontendsService;
  domains: DomainsService;
}

const tag = "Frontends";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const MB = 1_048_576;

export async function frontendView(deps: RouteDeps, f: FrontendRecord) {
  const domain = await deps.domains.record(f.id);
  return {
    id: f.id,
    project_id: f.project_id,
    name: f.name,
    status: f.status === "deleted" ? ("deleting" as const) : f.status,
    framework: f.framework,
    ...(f.app_root ? { app_root: f.app_root } : {}),
    ...(f.serving_deployment_id ? { site_url: siteUrl(deps.config, deps.address, f) } : {}),
    custom_domain: domain?.domain ?? null,
    ...(domain ? { custom_domain_status: domain.status } : {}),
    current_deployment_id: f.current_deployment_id,
    ...(f.pending_deployment_id ? { pending_deployment_id: f.pending_deployment_id } : {}),
    variable_scope: f.variable_scope,
    variables: f.variables,
    created_at: f.created_at,
    updated_at: f.updated_at,
  };
}

function deploymentView(d: DeploymentRecord) {
  return {
    id: d.id,
    frontend_id: d.frontend_id,
    project_id: d.project_id,
    kind: d.kind,
    status: d.status,
    framework: d.framework,
    app_root: d.app_root,
    source_sha256: d.source_sha256,
    warnings: d.warnings,
    error: d.error,
    created_at: d.created_at,
    started_at: d.started_at,
    finished_at: d.finished_at,
  };
}

/** The multipart create/update: text fields through the zod schema (variables repeatable), the archive normalized like a function's source. */
async function readDeploy(deps: RouteDeps, request: Request, limit: Parameters<typeof readMultipartBody>[1]) {
  if (!/multipart\/form-data/i.test(request.headers.get("content-type") ?? "")) throw badRequest("deploy with multipart/form-data (fields name, archive, framework, app_root, variable_scope, variables)");
  const form = await readMultipartBody(request, limit);
  const fields: Record<string, unknown> = { variables: [] as string[] };
  for (const [k, v] of form.entries()) {
    if (typeof v !== "string") continue;
    if (k === "variables") (fields.variables as string[]).push(...v.split(",").map((s) => s.trim()).filter(Boolean));
    else fields[k] = v;
  }
  const parsed = parseInput(deployFields, fields, "body");
  const archive = form.get("archive");
  if (!archive || typeof archive === "string") throw badRequest("invalid request: body field 'archive': an archive file (ZIP or tar.gz) is required");
  const { ArchiveError, normalizeSource } = await import("../functions/archive");
  const max = deps.config.sourceArchiveLimitMb * MB;
  try {
    // A frontend's installed dependencies are rebuilt from its lockfile; `vendor/` and the like are site content.
    const source = await normalizeSource(new Uint8Array(await archive.arrayBuffer()), {
      runtime: "nodejs22.x",
      handler: "handler",
      limits: { uploadBytes: max, normalizedBytes: max, extractedBytes: max * 10 },
      dependencyDirs: ["node_modules"],
    });
    return { fields: parsed, source };
  } catch (err) {
    if (err instanceof ArchiveError) throw badRequest(err.message.replace(/^code (archive )?/, "archive "));
    throw err;
  }
}

export function frontendRoutes(r: AreaRouter<RouteDeps>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/frontends",
    tag,
    summary: "Create or update a frontend from an archive (multipart: name, archive, framework, app_root, variable_scope, variables)",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    bodyLimit: "deploy",
    responses: { 200: { description: "existing frontend, its deployment started or queued", schema: frontendSchema }, 201: { description: "new frontend, provisioning", schema: frontendSchema }, ...errors },
    handler: async ({ deps, principal, project, request, bodyLimit }) => {
      const { fields, source } = await readDeploy(deps, request, bodyLimit);
      const plan = planOf(await deps.accounts.ownerPlan(principal, project.account_id));
      const { created, frontend } = await deps.frontends.deploy(project.id, plan.name === "hobby" ? 1 : Number.POSITIVE_INFINITY, fields, source);
      return { status: created ? 201 : 200, body: await frontendView(deps, frontend) };
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/frontends",
    tag,
    summary: "List frontends",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    query: pageQuery,
    responses: { 200: { description: "frontends", schema: frontendListSchema }, ...errors },
    handler: async ({ deps, project, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.frontends.list(project.id, page, limit);
      const data = await Promise.all(res.data.map((f) => frontendView(deps, f)));
      return reply.ok(paginated(data, { page, limit, total: res.total, path: `/projects/${project.id}/frontends` }));
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/frontends/{frontendId}",
    tag,
    summary: "Get a frontend (by id or name)",
    auth: { kind: "project", access: "read" },
    params: frontendParams,
    responses: { 200: { description: "the frontend", schema: frontendSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await frontendView(deps, await deps.frontends.get(project.id, params.frontendId))),
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/frontends/{frontendId}/redeploy",
    tag,
    summary: "Redeploy the latest archive with the stored app_root (started, or queued with pending_deployment_id, superseding older queued ones)",
    auth: { kind: "project", access: "write" },
    params: frontendParams,
    responses: { 200: { description: "the frontend", schema: frontendSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await frontendView(deps, await deps.frontends.redeploy(project.id, params.frontendId))),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/frontends/{frontendId}",
    tag,
    summary: "Delete a frontend: 202; runs after the running deployment (queued ones are superseded); afterwards GET answers 404",
    auth: { kind: "project", access: "write" },
    params: frontendParams,
    responses: { 202: { description: "deletion queued or started", schema: frontendSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.accepted(await frontendView(deps, await deps.frontends.delete(project.id, params.frontendId))),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/frontends/{frontendId}/deployments",
    tag,
    summary: "A frontend's deployments (deploy, redeploy, delete), newest first",
    auth: { kind: "project", access: "read" },
    params: frontendParams,
    query: pageQuery,
    responses: { 200: { description: "deployments", schema: deploymentListSchema }, ...errors },
    handler: async ({ deps, project, params, query: q }) => {
      const page = q.page ?? 1;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const res = await deps.frontends.deployments(project.id, params.frontendId, page, limit);
      return reply.ok(paginated(res.data.map(deploymentView), { page, limit, total: res.total, path: `/projects/${project.id}/frontends/${params.frontendId}/deployments` }));
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/frontends/{frontendId}/domain",
    tag,
    summary: "Attach a custom domain with your own certificate (SUPERAGENT; tls.mode byoc): 201 new, 200 the same domain again",
    auth: { kind: "project", access: "write" },
    params: frontendParams,
    body: customDomainBody,
    responses: { 200: { description: "same domain already configured", schema: customDomainSchema }, 201: { description: "domain queued", schema: customDomainSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, principal, project, params, body }) => {
      const plan = planOf(await deps.accounts.ownerPlan(principal, project.account_id));
      if (plan.name === "hobby") throw forbidden(`custom domains are not available on the ${plan.label} plan`);
      const f = await deps.frontends.get(project.id, params.frontendId);
      const { created, view } = await deps.domains.attach(f, body);
      return { status: created ? 201 : 200, body: view };
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/frontends/{frontendId}/domain",
    tag,
    summary: "The custom domain, or JSON null when none is configured",
    auth: { kind: "project", access: "read" },
    params: frontendParams,
    responses: { 200: { description: "the custom domain or null", schema: customDomainSchema.nullable() }, ...errors },
    handler: async ({ deps, project, params }) => {
      const f = await deps.frontends.get(project.id, params.frontendId);
      return reply.ok(await deps.domains.view(f));
    },
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/frontends/{frontendId}/domain",
    tag,
    summary: "Detach the custom domain: 204 once the detach is queued",
    auth: { kind: "project", access: "write" },
    params: frontendParams,
    responses: { 204: { description: "detach queued" }, ...errors },
    handler: async ({ deps, project, params }) => {
      const f = await deps.frontends.get(project.id, params.frontendId);
      await deps.domains.detach(f);
      return reply.noContent();
    },
  });
}
