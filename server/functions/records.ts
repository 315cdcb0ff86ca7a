import { conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import { isoTimeOrNull as iso, type ControlStore, type Row, type Sql } from "../store/store";
import { TtlCache } from "../store/ttl-cache";
import type { FunctionBuildConfig } from "./archive";

export type FunctionStatus = "provisioning" | "active" | "failed" | "deleting" | "deleted";
/** Standard and durable functions are separate collections (own names, own cap) on one table and pipeline. */
export type FunctionKind = "standard" | "durable";

export interface FunctionRecord {
  id: string;
  project_id: string;
  name: string;
  status: FunctionStatus;
  is_public: boolean;
  invocation_mode: "rpc" | "http";
  http_auth_mode: "service" | "none";
  openapi_spec: Record<string, unknown> | null;
  runtime: string;
  handler: string;
  active_deployment_id: string | null;
  pending_deployment_id: string | null;
  delete_requested: boolean;
  kind: FunctionKind;
  created_at: string;
  updated_at: string;
}

/** The settings a deploy may give (PATCH takes the invocation ones). */
export interface DeployFields {
  name: string;
  runtime: string;
  handler?: string;
  is_public?: boolean;
  invocation_mode?: "rpc" | "http";
  http_auth_mode?: "service" | "none";
  openapi_spec?: unknown;
}

export type SettingsPatch = Pick<DeployFields, "is_public" | "invocation_mode" | "http_auth_mode" | "openapi_spec">;

export function toRecord(r: Row): FunctionRecord {
  return {
    ...(r as FunctionRecord),
    openapi_spec: r.openapi_spec ?? null,
    created_at: iso(r.created_at)!,
    updated_at: iso(r.updated_at)!,
  };
}

/**
 * Function records: lookups, settings, the name hold and the per-project cap, and the two caches
 * invocations read from (the record for up to 2 s, a deployment's build configuration for good).
 * The deployment queue owns the status fields; it tells this class to `forget` after each change.
 */
export class FunctionRecords {
  /**
   * Invocations read the function from memory for up to 2 s; every change made here drops the copy at
   * once, and the TTL bounds how long another Kiln instance's change takes to arrive.
   */
  private readonly hot: TtlCache<string, FunctionRecord>;
  /** A deployment's build configuration never changes, so invocations read it from memory. */
  private readonly builds = new Map<string, FunctionBuildConfig>();

  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    private readonly maxFunctions: () => number,
  ) {
    this.hot = new TtlCache<string, FunctionRecord>(() => 2000, () => now().getTime());
  }

  /** A function of the collection `kind`: the other collection's ids are not found (the spec's 404). */
  async get(projectId: string, functionId: string, kind: FunctionKind = "standard"): Promise<FunctionRecord> {
    const [r] = await this.store.query(`select * from functions where id = $1 and project_id = $2 and kind = $3 and status <> 'deleted'`, [functionId, projectId, kind]);
    if (!r) throw notFound(kind === "durable" ? "durable function not found" : "function not found");
    return toRecord(r);
  }

  async byId(functionId: string): Promise<FunctionRecord | null> {
    const [r] = await this.store.query(`select * from functions where id = $1 and status <> 'deleted'`, [functionId]);
    return r ? toRecord(r) : null;
  }

  async byName(projectId: string, name: string, kind: FunctionKind = "standard"): Promise<FunctionRecord | null> {
    const [r] = await this.store.query(`select * from functions where project_id = $1 and name = $2 and kind = $3 and status <> 'deleted'`, [projectId, name, kind]);
    return r ? toRecord(r) : null;
  }

  async list(projectId: string, page: number, limit: number, kind: FunctionKind = "standard") {
    const [{ total }] = (await this.store.query(`select count(*)::int as total from functions where project_id = $1 and kind = $2 and status not in ('deleted', 'deleting')`, [projectId, kind])) as [
      { total: number },
    ];
    const rows = await this.store.query(
      `select * from functions where project_id = $1 and kind = $2 and status not in ('deleted', 'deleting') order by created_at, id limit ${limit} offset ${(page - 1) * limit}`,
      [projectId, kind],
    );
    return { data: rows.map(toRecord), total };
  }

  /** The function as forInvocation has it in memory, else undefined (then call forInvocation). */
  cachedForInvocation(functionId: string): FunctionRecord | undefined {
    return this.hot.get(functionId);
  }

  async forInvocation(functionId: string): Promise<FunctionRecord | null> {
    const hit = this.hot.get(functionId);
    if (hit) return hit;
    const fn = await this.byId(functionId);
    if (fn) this.hot.set(functionId, fn);
    else this.hot.delete(functionId);
    return fn;
  }

  /** Drops the in-memory copy: called after every committed change of the function. */
  forget(functionId: string): void {
    this.hot.delete(functionId);
  }

  /** The build configuration when it is already in memory (the warm path), else undefined. */
  cachedBuildConfig(deploymentId: string): FunctionBuildConfig | undefined {
    return this.builds.get(deploymentId);
  }

  async buildConfig(deploymentId: string): Promise<FunctionBuildConfig | null> {
    const hit = this.builds.get(deploymentId);
    if (hit) return hit;
    const [r] = await this.store.query(`select build from function_deployments where id = $1`, [deploymentId]);
    if (r?.build) this.builds.set(deploymentId, r.build as FunctionBuildConfig);
    return (r?.build as FunctionBuildConfig) ?? null;
  }

  /**
   * In a deploy's transaction: the function of that name, created (`provisioning`, within the cap)
   * or with its settings updated. Refused while a deletion is requested.
   */
  async upsertForDeploy(tx: Sql, projectId: string, fields: DeployFields, at: string, kind: FunctionKind = "standard"): Promise<{ id: string; created: boolean }> {
    await tx.query(`select id from projects where id = $1 for update`, [projectId]);
    const [existing] = await tx.query(`select * from functions where project_id = $1 and name = $2 and kind = $3 and status <> 'deleted'`, [projectId, fields.name, kind]);
    if (existing?.delete_requested) throw conflict("the function is being deleted; deploy again once the deletion has finished");
    const merged = {
      is_public: fields.is_public ?? existing?.is_public ?? false,
      invocation_mode: fields.invocation_mode ?? existing?.invocation_mode ?? "rpc",
      http_auth_mode: fields.http_auth_mode ?? existing?.http_auth_mode ?? "service",
    };
    checkModes(merged);
    const spec = fields.openapi_spec ? JSON.stringify(fields.openapi_spec) : null;
    if (existing) {
      await tx.query(
        `update functions set is_public = $2, invocation_mode = $3, http_auth_mode = $4, openapi_spec = coalesce($5::text::jsonb, openapi_spec), updated_at = $6 where id = $1`,
        [existing.id, merged.is_public, merged.invocation_mode, merged.http_auth_mode, spec, at],
      );
      return { id: existing.id as string, created: false };
    }
    const [{ n }] = (await tx.query(`select count(*)::int as n from functions where project_id = $1 and kind = $2 and status <> 'deleted'`, [projectId, kind])) as [{ n: number }];
    const max = this.maxFunctions();
    if (n >= max) throw forbidden(`function limit reached: a project may have at most ${max} ${kind} functions`);
    const id = newId();
    await tx.query(
      `insert into functions (id, project_id, name, status, is_public, invocation_mode, http_auth_mode, openapi_spec, runtime, handler, created_at, updated_at, kind)
       values ($1, $2, $3, 'provisioning', $4, $5, $6, $7::text::jsonb, $8, $9, $10, $10, $11)`,
      [id, projectId, fields.name, merged.is_public, merged.invocation_mode, merged.http_auth_mode, spec, fields.runtime, fields.handler ?? "handler", at, kind],
    );
    return { id, created: true };
  }

  /** PATCH: the invocation settings. */
  async update(fn: FunctionRecord, patch: SettingsPatch): Promise<FunctionRecord> {
    const merged = {
      is_public: patch.is_public ?? fn.is_public,
      invocation_mode: patch.invocation_mode ?? fn.invocation_mode,
      http_auth_mode: patch.http_auth_mode ?? fn.http_auth_mode,
    };
    checkModes(merged);
    const spec = patch.openapi_spec === undefined ? fn.openapi_spec : patch.openapi_spec;
    const [r] = await this.store.query(
      `update functions set is_public = $2, invocation_mode = $3, http_auth_mode = $4, openapi_spec = $5::text::jsonb, updated_at = $6 where id = $1 returning *`,
      [fn.id, merged.is_public, merged.invocation_mode, merged.http_auth_mode, spec === null ? null : JSON.stringify(spec), this.now().toISOString()],
    );
    this.forget(fn.id);
    return toRecord(r!);
  }
}

function checkModes(m: { is_public: boolean; invocation_mode: string; http_auth_mode: string }): void {
  if (m.http_auth_mode === "none" && !(m.is_public && m.invocation_mode === "http"))
    throw new HttpError(400, { error: "http_auth_mode none requires a public function (is_public true) in http invocation mode" });
}
