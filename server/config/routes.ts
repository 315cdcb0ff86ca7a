import { errorSchema } from "../http/common-schemas";
import { badRequest, HttpError } from "../http/errors";
import { readBodyText } from "../http/body";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { applyQuery, applyReportSchema, exportQuery, manifestSchema, MAX_MANIFEST_BYTES, validationErrorSchema } from "./schemas";
import type { ConfigService } from "./service";

const tag = "Configuration";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };

export interface ConfigRouteDeps {
  configuration: ConfigService;
}

/** The body within 4 MiB; a larger one is the spec's 400 (not the 413 of other routes). */
async function manifestText(request: Request): Promise<string> {
  try {
    return await readBodyText(request, { bytes: MAX_MANIFEST_BYTES, what: "configuration manifests" });
  } catch (err) {
    if (err instanceof HttpError && err.status === 413) throw badRequest("configuration manifest too large: apply bodies may be at most 4 MiB (4194304 bytes)");
    throw err;
  }
}

export function configRoutes(r: AreaRouter<ConfigRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/projects/{projectId}/config",
    tag,
    summary: "Export the project's configuration manifest: JSON, or YAML with Accept: application/yaml or ?format=yaml. Variable values only for full-scope credentials; no other credential is part of it",
    auth: { kind: "project", access: "read" },
    params: projectIdParams,
    query: exportQuery,
    responses: { 200: { description: "the manifest (application/json or application/yaml)", schema: manifestSchema }, ...errors },
    handler: async ({ deps, principal, project, query, request }) => {
      const yaml = query.format === "yaml" || (query.format === undefined && /\b(application|text)\/(x-)?yaml\b/i.test(request.headers.get("accept") ?? ""));
      const out = await deps.configuration.exportConfig(project.id, principal, yaml ? "yaml" : "json");
      return new Response(out.text, { status: 200, headers: { "Content-Type": out.contentType } });
    },
  });

  r.add({
    method: "PUT",
    path: "/projects/{projectId}/config",
    tag,
    summary: "Apply a configuration manifest (JSON or YAML, at most 4 MiB); dry_run=true returns the projected report and changes nothing",
    auth: { kind: "project", access: "write" },
    params: projectIdParams,
    query: applyQuery,
    body: manifestSchema,
    bodyValidation: "document",
    responses: {
      200: { description: "the apply report", schema: applyReportSchema },
      ...errors,
      409: errorSchema,
      422: { description: "the manifest does not validate: every problem, nothing applied", schema: validationErrorSchema },
    },
    handler: async ({ deps, principal, project, query, request }) => {
      const value = deps.configuration.parse(await manifestText(request), request.headers.get("content-type"));
      return reply.ok(await deps.configuration.applyConfig(project.id, principal, value, { dryRun: query.dry_run === "true" || query.dry_run === "1" }));
    },
  });
}
