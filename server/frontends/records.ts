import { isoTime, isoTimeOrNull, type Row } from "../store/store";

export interface FrontendRecord {
  id: string;
  project_id: string;
  name: string;
  status: "provisioning" | "active" | "degraded" | "failed" | "deleting" | "deleted";
  framework: "nextjs" | "static" | null;
  app_root: string | null;
  variable_scope: "scoped" | "all";
  variables: string[];
  artifact_deployment_id: string | null;
  serving_deployment_id: string | null;
  current_deployment_id: string | null;
  pending_deployment_id: string | null;
  created_at: string;
  updated_at: string;
}

export interface DeploymentRecord {
  id: string;
  frontend_id: string;
  project_id: string;
  kind: "deploy" | "redeploy" | "delete";
  status: "queued" | "building" | "succeeded" | "failed" | "superseded";
  source_deployment_id: string | null;
  app_root: string | null;
  framework: "nextjs" | "static" | null;
  source_sha256: string | null;
  warnings: string[];
  error: string | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
}

export interface DomainRecord {
  frontend_id: string;
  project_id: string;
  domain: string;
  status: "pending_verification" | "provisioning" | "active" | "detaching" | "failed";
  verification_token: string;
  certificate_pem: string;
  private_key_pem: string;
  certificate_chain_pem: string | null;
  created_at: string;
  updated_at: string;
}

const json = <T>(v: unknown, fallback: T): T => (v === null || v === undefined ? fallback : typeof v === "string" ? (JSON.parse(v) as T) : (v as T));

export function frontendOf(r: Row): FrontendRecord {
  return {
    id: r.id,
    project_id: r.project_id,
    name: r.name,
    status: r.status,
    framework: r.framework ?? null,
    app_root: r.app_root ?? null,
    variable_scope: r.variable_scope,
    variables: json<string[]>(r.variables, []),
    artifact_deployment_id: r.artifact_deployment_id ?? null,
    serving_deployment_id: r.serving_deployment_id ?? null,
    current_deployment_id: r.current_deployment_id ?? null,
    pending_deployment_id: r.pending_deployment_id ?? null,
    created_at: isoTime(r.created_at),
    updated_at: isoTime(r.updated_at),
  };
}

export function deploymentOf(r: Row): DeploymentRecord {
  return {
    id: r.id,
    frontend_id: r.frontend_id,
    project_id: r.project_id,
    kind: r.kind,
    status: r.status,
    source_deployment_id: r.source_deployment_id ?? null,
    app_root: r.app_root ?? null,
    framework: r.framework ?? null,
    source_sha256: r.source_sha256 ?? null,
    warnings: json<string[]>(r.warnings, []),
    error: r.error ?? null,
    created_at: isoTime(r.created_at),
    started_at: isoTimeOrNull(r.started_at),
    finished_at: isoTimeOrNull(r.finished_at),
  };
}

export function domainOf(r: Row): DomainRecord {
  return {
    frontend_id: r.frontend_id,
    project_id: r.project_id,
    domain: r.domain,
    status: r.status,
    verification_token: r.verification_token,
    certificate_pem: r.certificate_pem,
    private_key_pem: r.private_key_pem,
    certificate_chain_pem: r.certificate_chain_pem ?? null,
    created_at: isoTime(r.created_at),
    updated_at: isoTime(r.updated_at),
  };
}
