import type { ManagementPrincipal } from "../auth/principal";
import { MSG } from "../auth/guard";
import { forbidden } from "../http/errors";
import { isoTime, isoTimeOrNull, type ControlStore } from "../store/store";

export interface DeploymentView {
  id: string;
  project_id: string;
  resource: { type: "function" | "durable_function" | "frontend"; id: string; name: string };
  kind: "deploy" | "redeploy" | "delete";
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
 * project, newest first, with the frontends' deployments (deploys, redeploys, deletions).
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
    const all = `(select d.id, d.project_id, d.function_id as resource_id, f.name, case when f.kind = 'durable' then 'durable_function' else 'function' end as resource_type,
                         d.kind, d.status, d.runtime, d.batch_id, d.error, d.created_at, d.started_at, d.finished_at
                    from function_deployments d join functions f on f.id = d.function_id
                  union all
                  select d.id, d.project_id, d.frontend_id, fe.name, 'frontend', d.kind, d.status, null, null, d.error, d.created_at, d.started_at, d.finished_at
                    from frontend_deployments d join frontends fe on fe.id = d.frontend_id)`;
    const from = `from ${all} d join projects p on p.id = d.project_id where ${where.join(" and ")}`;
    const [{ total }] = (await this.store.query(`select count(*)::int as total ${from}`, params)) as [{ total: number }];
    const rows = await this.store.query(
      `select d.id, d.project_id, d.resource_id, d.name, d.resource_type, d.kind, d.status, d.runtime, d.batch_id, d.error, d.created_at, d.started_at, d.finished_at ${from}
        order by d.created_at desc, d.id desc limit $${params.length + 1} offset $${params.length + 2}`,
      [...params, o.limit, (o.page - 1) * o.limit],
    );
    const data = rows.map((r) => ({
      id: r.id as string,
      project_id: r.project_id as string,
      resource: { type: r.resource_type as DeploymentView["resource"]["type"], id: r.resource_id as string, name: r.name as string },
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
