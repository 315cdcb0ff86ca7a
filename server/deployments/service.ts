import type { ManagementPrincipal } from "../auth/principal";
import { MSG } from "../auth/guard";
import { forbidden } from "../http/errors";
import { isoTime, isoTimeOrNull, type ControlStore } from "../store/store";

export interface DeploymentView {
  id: string;
  project_id: string;
  resource: { type: "function" | "durable_function" | "frontend"; id: string; name: string };
  kind: "deploy" | "delete";
  status: "queued" | "building" | "succeeded" | "failed" | "superseded";
  runtime: string | null;
  batch_id: string | null;
  error: string | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
}

/**
 * Deployments across the caller's projects (GET /deployments): every function deployment (deploys
 * and deletions) of the projects a platform token's account owns, or of a project token's one
 * project, newest first. Frontend deployments join this list when frontends exist.
 */
export class DeploymentsService {
  constructor(private readonly store: ControlStore) {}

  async list(principal: ManagementPrincipal, o: { projectId?: string; page: number; limit: number }): Promise<{ data: DeploymentView[]; total: number }> {
    const params: unknown[] = [principal.accountId];
    const where = [`p.account_id = $1`, `p.status not in ('deleting', 'deleted')`];
    if (principal.kind === "project_token") {
      if (o.projectId !== undefined && o.projectId !== principal.projectId) throw forbidden(MSG.wrongProject);
      params.push(principal.projectId);
      where.push(`d.project_id = $${params.length}`);
    } else if (o.projectId !== undefined) {
      params.push(o.projectId);
      where.push(`d.project_id = $${params.length}`);
    }
    const from = `from function_deployments d join projects p on p.id = d.project_id join functions f on f.id = d.function_id where ${where.join(" and ")}`;
    const [{ total }] = (await this.store.query(`select count(*)::int as total ${from}`, params)) as [{ total: number }];
    const rows = await this.store.query(
      `select d.id, d.project_id, d.function_id, f.name, f.kind as function_kind, d.kind, d.status, d.runtime, d.batch_id, d.error, d.created_at, d.started_at, d.finished_at ${from}
        order by d.created_at desc, d.id desc limit $${params.length + 1} offset $${params.length + 2}`,
      [...params, o.limit, (o.page - 1) * o.limit],
    );
    const data = rows.map((r) => ({
      id: r.id as string,
      project_id: r.project_id as string,
      resource: { type: r.function_kind === "durable" ? ("durable_function" as const) : ("function" as const), id: r.function_id as string, name: r.name as string },
      kind: r.kind as DeploymentView["kind"],
      status: r.status as DeploymentView["status"],
      runtime: (r.runtime as string | null) ?? null,
      batch_id: (r.batch_id as string | null) ?? null,
      error: (r.error as string | null) ?? null,
      created_at: isoTime(r.created_at),
      started_at: isoTimeOrNull(r.started_at),
      finished_at: isoTimeOrNull(r.finished_at),
    }));
    return { data, total };
  }
}
