import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema } from "../http/pagination";

/**
 * A frontend's name is one DNS label with its project's id: `<name>--<project-id>` (20 characters)
 * must fit the 63 a label may hold, hence 41 (docs/frontends.md, Site URLs).
 */
export const MAX_NAME = 41;
export const NAME_PATTERN = /^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$/;

export const frontendParams = z.object({ projectId: z.string().min(1), frontendId: z.string().min(1) });
export const pageQuery = z.object({ page: pageParam.optional(), limit: limitParam.optional() });

export const FRONTEND_STATUSES = ["provisioning", "active", "degraded", "failed", "deleting"] as const;
export const DEPLOYMENT_STATUSES = ["queued", "building", "succeeded", "failed", "superseded"] as const;
export const DOMAIN_STATUSES = ["pending_verification", "provisioning", "active", "detaching", "failed"] as const;

export const frontendSchema = z.object({
  id: z.string(),
  project_id: z.string(),
  name: z.string(),
  status: z.enum(FRONTEND_STATUSES),
  framework: z.enum(["nextjs", "static"]).nullable().describe("what the serving (or, before one serves, the latest) deployment built; null before any build ran"),
  app_root: z.string().optional(),
  site_url: z.string().optional().describe("http://<name>--<project-id>.app.localhost:<port> by default (KILN_FRONTENDS_DOMAIN, KILN_FRONTENDS_URL); present while a deployment serves"),
  custom_domain: z.string().nullable(),
  custom_domain_status: z.enum(DOMAIN_STATUSES).optional(),
  current_deployment_id: z.string().nullable().describe("the latest deployment operation started"),
  pending_deployment_id: z.string().optional().describe("a deployment or deletion waiting behind the running one"),
  variable_scope: z.enum(["scoped", "all"]),
  variables: z.array(z.string()),
  created_at: timestamp,
  updated_at: timestamp,
});
export const frontendListSchema = paginatedSchema(frontendSchema);

export const deploymentSchema = z.object({
  id: z.string(),
  frontend_id: z.string(),
  project_id: z.string(),
  kind: z.enum(["deploy", "redeploy", "delete"]),
  status: z.enum(DEPLOYMENT_STATUSES),
  framework: z.enum(["nextjs", "static"]).nullable(),
  app_root: z.string().nullable(),
  source_sha256: z.string().nullable().describe("sha256 of the normalized archive built"),
  warnings: z.array(z.string()),
  error: z.string().nullable(),
  created_at: timestamp,
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
});
export const deploymentListSchema = paginatedSchema(deploymentSchema);

/** A relative POSIX path inside the archive: no leading '/', no '..', no backslashes. */
const appRoot = z
  .string()
  .max(1024, "must be at most 1024 characters")
  .refine((p) => !p.startsWith("/") && !p.includes("\\") && !p.includes("\0") && p.split("/").every((s) => s !== ".."), "must be a relative POSIX path inside the archive (no leading '/', no '..')")
  .transform((p) => p.split("/").filter((s) => s && s !== ".").join("/"));

/** Multipart text fields of a create or update (`variables` repeatable; the archive is checked separately). */
export const deployFields = z.object({
  name: z
    .string()
    .min(1, "is required")
    .max(MAX_NAME, `must be at most ${MAX_NAME} characters (the site's host name holds it with the project id)`)
    .regex(NAME_PATTERN, "must be DNS-safe: lowercase letters, digits and hyphens, starting and ending with a letter or digit"),
  framework: z.enum(["nextjs"], { error: "must be 'nextjs' (omit it for a static site)" }).optional(),
  app_root: appRoot.optional(),
  variable_scope: z.enum(["scoped", "all"], { error: "must be 'scoped' or 'all'" }).optional(),
  variables: z.array(z.string().min(1, "must not be empty").max(256)).max(1000),
});
export type DeployFields = z.infer<typeof deployFields>;

export const verificationRecordSchema = z.object({ type: z.literal("TXT"), name: z.string(), value: z.string() });
export const customDomainSchema = z.object({
  domain: z.string(),
  domain_status: z.enum(DOMAIN_STATUSES),
  tls_mode: z.literal("byoc"),
  verification_status: z.enum(["pending", "verified", "failed"]),
  verification_records: z.array(verificationRecordSchema),
  required_routing_record: z.object({ type: z.literal("CNAME"), name: z.string(), value: z.string() }),
  effective_urls: z.array(z.string()),
  certificate: z.object({ subject: z.string(), issuer: z.string(), not_after: timestamp, fingerprint_sha256: z.string() }).describe("the uploaded certificate's (the key is never returned)"),
  created_at: timestamp,
  updated_at: timestamp,
});

const HOSTNAME = /^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,61}[a-z0-9]$/;
export const customDomainBody = z.object({
  domain: z
    .string()
    .transform((d) => d.trim().toLowerCase().replace(/\.$/, ""))
    .refine((d) => HOSTNAME.test(d), "must be a fully-qualified host name (e.g. www.example.com)"),
  tls: z.object({
    mode: z.literal("byoc", { error: "must be 'byoc' (bring your own certificate)" }),
    certificate_pem: z.string().min(1, "is required").max(65_536),
    private_key_pem: z.string().min(1, "is required").max(65_536),
    certificate_chain_pem: z.string().max(262_144).optional(),
  }),
});
export type CustomDomainBody = z.infer<typeof customDomainBody>;
