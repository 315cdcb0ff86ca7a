import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { conflict, forbidden, HttpError, notFound } from "../http/errors";
import { newId } from "../ids";
import { isoTimeOrNull as iso, storableText, type ControlStore, type Row } from "../store/store";
import { TtlCache } from "../store/ttl-cache";
import type { SandboxChoice } from "../../runtime-sandbox/isolation";
import type { FunctionBuildConfig, NormalizedSource } from "./archive";

const INTERRUPTED = "interrupted: Kiln stopped during the build";

export type FunctionStatus = "provisioning" | "active" | "failed" | "deleting" | "deleted";

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
  created_at: string;
  updated_at: string;
}


function toRecord(r: Row): FunctionRecord {
  return {
    ...(r as FunctionRecord),
    openapi_spec: r.openapi_spec ?? null,
    created_at: iso(r.created_at)!,
    updated_at: iso(r.updated_at)!,
  };
}

export interface FunctionsDeps {
  store: ControlStore;
  now: () => Date;
  /** Normalized archives: `<dir>/<deployment>.tar.gz`. */
  blobDir: string;
  /** Built code: `<dir>/<function>/<deployment>/`. */
  codeDir: string;
  maxFunctions: () => number;
  /** Stops the workers of every version of a function except `keep` (a deployment id). */
  retireWorkers: (functionId: string, keep?: string) => Promise<void>;
  /** Where dependency installs run: the build sandbox, never seeing these paths. */
  build: { hiddenPaths: string[]; sandbox: { want: SandboxChoice; allowUnsandboxed: boolean } };
  /** Why no build can run here (no sandbox and none allowed): deploys are then a 503 naming the fix. */
  sandboxProblem: () => string | null;
  log: { error: (m: string, e?: unknown) => void };
}

/**
 * Standard functions: records, deployments (one running per function, newer ones queued and
 * superseding older queued ones), builds, and deletion.
 */
export class FunctionsService {
  private readonly running = new Map<string, Promise<void>>();
  /** Aborted by drain(): running installers are killed, queued work waits for the next start. */
  private readonly stopping = new AbortController();

  constructor(private readonly d: FunctionsDeps) {
    mkdirSync(d.blobDir, { recursive: true });
    mkdirSync(d.codeDir, { recursive: true });
  }

  async get(projectId: string, functionId: string): Promise<FunctionRecord> {
    const [r] = await this.d.store.query(`select * from functions where id = $1 and project_id = $2 and status <> 'deleted'`, [functionId, projectId]);
    if (!r) throw notFound("function not found");
    return toRecord(r);
  }

  /**
   * Invocations read the function from memory for up to 2 s; every change made here drops the copy at
   * once, and the TTL bounds how long another Kiln instance's change takes to arrive.
   */
  private readonly hot = new TtlCache<string, FunctionRecord>(() => 2000);

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

  private forget(functionId: string): void {
    this.hot.delete(functionId);
  }

  async byId(functionId: string): Promise<FunctionRecord | null> {
    const [r] = await this.d.store.query(`select * from functions where id = $1 and status <> 'deleted'`, [functionId]);
    return r ? toRecord(r) : null;
  }

  async byName(projectId: string, name: string): Promise<FunctionRecord | null> {
    const [r] = await this.d.store.query(`select * from functions where project_id = $1 and name = $2 and status <> 'deleted'`, [projectId, name]);
    return r ? toRecord(r) : null;
  }

  async list(projectId: string, page: number, limit: number) {
    const [{ total }] = (await this.d.store.query(`select count(*)::int as total from functions where project_id = $1 and status not in ('deleted', 'deleting')`, [projectId])) as [{ total: number }];
    const rows = await this.d.store.query(
      `select * from functions where project_id = $1 and status not in ('deleted', 'deleting') order by created_at, id limit ${limit} offset ${(page - 1) * limit}`,
      [projectId],
    );
    return { data: rows.map(toRecord), total };
  }

  /** The build configuration and code root of a deployment, for invocation. */
  deploymentRoot(functionId: string, deploymentId: string): string {
    return join(this.d.codeDir, functionId, deploymentId);
  }

  /** A deployment's build configuration never changes, so invocations read it from memory. */
  private readonly builds = new Map<string, FunctionBuildConfig>();

  /** The build configuration when it is already in memory (the warm path), else undefined. */
  cachedBuildConfig(deploymentId: string): FunctionBuildConfig | undefined {
    return this.builds.get(deploymentId);
  }

  async buildConfig(deploymentId: string): Promise<FunctionBuildConfig | null> {
    const hit = this.builds.get(deploymentId);
    if (hit) return hit;
    const [r] = await this.d.store.query(`select build from function_deployments where id = $1`, [deploymentId]);
    if (r?.build) this.builds.set(deploymentId, r.build as FunctionBuildConfig);
    return (r?.build as FunctionBuildConfig) ?? null;
  }

  /** POST functions: 201 for a new function, 200 for an existing one. */
  async deploy(
    projectId: string,
    fields: { name: string; runtime: string; handler?: string; is_public?: boolean; invocation_mode?: "rpc" | "http"; http_auth_mode?: "service" | "none"; openapi_spec?: unknown },
    source: NormalizedSource,
  ): Promise<{ created: boolean; fn: FunctionRecord }> {
    const unsafe = this.d.sandboxProblem();
    if (unsafe) throw new HttpError(503, { error: unsafe });
    const at = this.d.now().toISOString();
    const handler = fields.handler ?? "handler";
    const deploymentId = newId();
    const result = await this.d.store.transaction(async (tx) => {
      await tx.query(`select id from projects where id = $1 for update`, [projectId]);
      const [existing] = await tx.query(`select * from functions where project_id = $1 and name = $2 and status <> 'deleted'`, [projectId, fields.name]);
      if (existing?.delete_requested) throw conflict("the function is being deleted; deploy again once the deletion has finished");
      const merged = {
        is_public: fields.is_public ?? existing?.is_public ?? false,
        invocation_mode: fields.invocation_mode ?? existing?.invocation_mode ?? "rpc",
        http_auth_mode: fields.http_auth_mode ?? existing?.http_auth_mode ?? "service",
      };
      checkModes(merged);
      let fnId: string;
      if (!existing) {
        const [{ n }] = (await tx.query(`select count(*)::int as n from functions where project_id = $1 and status <> 'deleted'`, [projectId])) as [{ n: number }];
        const max = this.d.maxFunctions();
        if (n >= max) throw forbidden(`function limit reached: a project may have at most ${max} standard functions`);
        fnId = newId();
        await tx.query(
          `insert into functions (id, project_id, name, status, is_public, invocation_mode, http_auth_mode, openapi_spec, runtime, handler, created_at, updated_at)
           values ($1, $2, $3, 'provisioning', $4, $5, $6, $7::text::jsonb, $8, $9, $10, $10)`,
          [fnId, projectId, fields.name, merged.is_public, merged.invocation_mode, merged.http_auth_mode, fields.openapi_spec ? JSON.stringify(fields.openapi_spec) : null, fields.runtime, handler, at],
        );
      } else {
        fnId = existing.id;
        await tx.query(
          `update functions set is_public = $2, invocation_mode = $3, http_auth_mode = $4, openapi_spec = coalesce($5::text::jsonb, openapi_spec), updated_at = $6 where id = $1`,
          [fnId, merged.is_public, merged.invocation_mode, merged.http_auth_mode, fields.openapi_spec ? JSON.stringify(fields.openapi_spec) : null, at],
        );
      }
      const [busy] = await tx.query(`select id from function_deployments where function_id = $1 and status = 'building'`, [fnId]);
      // A newer deploy replaces any deploy still waiting.
      await tx.query(`update function_deployments set status = 'superseded', finished_at = $2 where function_id = $1 and status = 'queued'`, [fnId, at]);
      await tx.query(
        `insert into function_deployments (id, function_id, project_id, kind, status, runtime, handler, source_sha256, build, created_at)
         values ($1, $2, $3, 'deploy', 'queued', $4, $5, $6, $7::text::jsonb, $8)`,
        [deploymentId, fnId, projectId, fields.runtime, handler, source.sha256, JSON.stringify({ ...source.build, reserved_path: source.reservedPath, dropped: source.dropped }), at],
      );
      const [row] = busy
        ? await tx.query(`update functions set pending_deployment_id = $2, updated_at = $3 where id = $1 returning *`, [fnId, deploymentId, at])
        : await tx.query(`update functions set status = 'provisioning', pending_deployment_id = null, updated_at = $2 where id = $1 returning *`, [fnId, at]);
      return { created: !existing, fn: toRecord(row!) };
    });
    this.forget(result.fn.id);
    writeFileSync(join(this.d.blobDir, `${deploymentId}.tar.gz`), source.tarGz);
    // The answer is the state at acceptance; the build may finish before the client reads it.
    this.kick(result.fn.id);
    return result;
  }

  async update(fn: FunctionRecord, patch: { is_public?: boolean; invocation_mode?: "rpc" | "http"; http_auth_mode?: "service" | "none"; openapi_spec?: unknown }) {
    const merged = {
      is_public: patch.is_public ?? fn.is_public,
      invocation_mode: patch.invocation_mode ?? fn.invocation_mode,
      http_auth_mode: patch.http_auth_mode ?? fn.http_auth_mode,
    };
    checkModes(merged);
    const spec = patch.openapi_spec === undefined ? fn.openapi_spec : patch.openapi_spec;
    this.forget(fn.id);
    const [r] = await this.d.store.query(
      `update functions set is_public = $2, invocation_mode = $3, http_auth_mode = $4, openapi_spec = $5::text::jsonb, updated_at = $6 where id = $1 returning *`,
      [fn.id, merged.is_public, merged.invocation_mode, merged.http_auth_mode, spec === null ? null : JSON.stringify(spec), this.d.now().toISOString()],
    );
    return toRecord(r!);
  }

  /** DELETE: 202. Queued behind a running deployment (superseding queued deploys), or started now. */
  async requestDelete(fn: FunctionRecord): Promise<FunctionRecord> {
    const at = this.d.now().toISOString();
    const accepted = await this.d.store.transaction(async (tx) => {
      const [busy] = await tx.query(`select id from function_deployments where function_id = $1 and status = 'building'`, [fn.id]);
      await tx.query(`update function_deployments set status = 'superseded', finished_at = $2 where function_id = $1 and status = 'queued'`, [fn.id, at]);
      const id = newId();
      await tx.query(`insert into function_deployments (id, function_id, project_id, kind, status, created_at) values ($1, $2, $3, 'delete', 'queued', $4)`, [
        id,
        fn.id,
        fn.project_id,
        at,
      ]);
      const [row] = busy
        ? await tx.query(`update functions set delete_requested = true, pending_deployment_id = $2, updated_at = $3 where id = $1 returning *`, [fn.id, id, at])
        : await tx.query(`update functions set delete_requested = true, status = 'deleting', pending_deployment_id = null, updated_at = $2 where id = $1 returning *`, [fn.id, at]);
      return toRecord(row!);
    });
    this.forget(fn.id);
    this.kick(fn.id);
    return accepted;
  }

  async deployments(functionId: string) {
    const rows = await this.d.store.query(
      `select d.*, (select count(*)::int from function_build_logs l where l.deployment_id = d.id) as lines,
              (select min(at) from function_build_logs l where l.deployment_id = d.id) as first_at,
              (select max(at) from function_build_logs l where l.deployment_id = d.id) as last_at
         from function_deployments d where d.function_id = $1 order by d.created_at desc, d.id desc`,
      [functionId],
    );
    return rows.map((r) => ({
      id: r.id as string,
      function_id: r.function_id as string,
      kind: r.kind as "deploy" | "delete",
      status: r.status as "queued" | "building" | "succeeded" | "failed" | "superseded",
      runtime: r.runtime ?? null,
      handler: r.handler ?? null,
      source_sha256: r.source_sha256 ?? null,
      error: r.error ?? null,
      build_log: { lines: r.lines as number, first_at: iso(r.first_at), last_at: iso(r.last_at) },
      created_at: iso(r.created_at)!,
      started_at: iso(r.started_at),
      finished_at: iso(r.finished_at),
    }));
  }

  /** Runs the function's queued work, one item at a time. */
  private kick(functionId: string): void {
    if (this.running.has(functionId)) return;
    const run = this.drainQueue(functionId)
      .catch((e) => this.d.log.error(`function ${functionId}: deployment queue failed`, e))
      .finally(() => {
        this.running.delete(functionId);
      });
    this.running.set(functionId, run);
  }

  private async drainQueue(functionId: string): Promise<void> {
    for (;;) {
      if (this.stopping.signal.aborted) return; // queued work resumes at the next start
      const [next] = await this.d.store.query(
        `select * from function_deployments where function_id = $1 and status = 'queued' order by created_at, id limit 1`,
        [functionId],
      );
      if (!next) return;
      const at = this.d.now().toISOString();
      this.forget(functionId);
      await this.d.store.query(`update function_deployments set status = 'building', started_at = $2 where id = $1`, [next.id, at]);
      await this.d.store.query(`update functions set pending_deployment_id = null, status = case when $2 = 'delete' then 'deleting' else 'provisioning' end, updated_at = $3 where id = $1`, [
        functionId,
        next.kind,
        at,
      ]);
      if (next.kind === "delete") await this.runDelete(functionId, next.id);
      else await this.runBuild(functionId, next);
    }
  }

  private async runBuild(functionId: string, dep: Row): Promise<void> {
    const root = this.deploymentRoot(functionId, dep.id);
    let seq = 0;
    const log = async (level: "info" | "error", line: string) => {
      await this.d.store.query(`insert into function_build_logs (deployment_id, seq, at, level, line) values ($1, $2, $3, $4, $5)`, [
        dep.id,
        seq++,
        this.d.now().toISOString(),
        level,
        storableText(line.slice(0, 4000)),
      ]);
    };
    let error: string | null = null;
    try {
      rmSync(root, { recursive: true, force: true });
      mkdirSync(root, { recursive: true });
      // The archive and build code (tar, the runtime resolver) load with the first build.
      const [{ extractSource }, { buildFunction }] = await Promise.all([import("./archive"), import("./builds")]);
      await extractSource(readFileSync(join(this.d.blobDir, `${dep.id}.tar.gz`)), root);
      error = await buildFunction(root, dep.build as FunctionBuildConfig & { reserved_path?: boolean }, { ...this.d.build, signal: this.stopping.signal }, log);
      if (error && this.stopping.signal.aborted) error = INTERRUPTED;
    } catch (err) {
      error = `build failed: ${(err as Error).message}`;
    }
    const at = this.d.now().toISOString();
    this.forget(functionId);
    if (error) {
      await log("error", error).catch(() => {});
      rmSync(root, { recursive: true, force: true });
      await this.d.store.query(`update function_deployments set status = 'failed', error = $2, finished_at = $3 where id = $1`, [dep.id, error, at]);
      // A new function has nothing to serve; an existing one keeps its last good deployment.
      await this.d.store.query(`update functions set status = 'failed', updated_at = $2 where id = $1`, [functionId, at]);
      return;
    }
    await log("info", "build succeeded");
    await this.d.store.query(`update function_deployments set status = 'succeeded', finished_at = $2 where id = $1`, [dep.id, at]);
    const [prev] = await this.d.store.query(`select active_deployment_id from functions where id = $1`, [functionId]);
    await this.d.store.query(`update functions set status = 'active', active_deployment_id = $2, runtime = $3, handler = $4, updated_at = $5 where id = $1`, [
      functionId,
      dep.id,
      dep.runtime,
      dep.handler,
      at,
    ]);
    this.forget(functionId);
    await this.d.retireWorkers(functionId, dep.id);
    if (prev?.active_deployment_id && prev.active_deployment_id !== dep.id) rmSync(this.deploymentRoot(functionId, prev.active_deployment_id), { recursive: true, force: true });
  }

  private async runDelete(functionId: string, depId: string): Promise<void> {
    this.forget(functionId);
    await this.d.retireWorkers(functionId);
    rmSync(join(this.d.codeDir, functionId), { recursive: true, force: true });
    const deps = await this.d.store.query(`select id from function_deployments where function_id = $1`, [functionId]);
    for (const x of deps) rmSync(join(this.d.blobDir, `${x.id}.tar.gz`), { force: true });
    const at = this.d.now().toISOString();
    await this.d.store.query(`update function_deployments set status = 'succeeded', finished_at = $2 where id = $1`, [depId, at]);
    await this.d.store.query(`update functions set status = 'deleted', updated_at = $2 where id = $1`, [functionId, at]);
    this.forget(functionId);
  }

  /** At start: builds cut short by a stop are failed, never left provisioning; queued work resumes. */
  async resume(): Promise<void> {
    const at = this.d.now().toISOString();
    const cut = await this.d.store.query(
      `update function_deployments set status = 'failed', error = $2, finished_at = $1 where status = 'building' returning id, function_id, kind`,
      [at, INTERRUPTED],
    );
    if (cut.length) {
      const { killLeftoverInstaller } = await import("../../runtime-sandbox/build-runner");
      for (const c of cut) killLeftoverInstaller(join(this.d.codeDir, c.function_id, c.id));
    }
    for (const c of cut)
      await this.d.store.query(
        `update functions set status = case when active_deployment_id is null then 'failed' else 'active' end, updated_at = $2 where id = $1 and status in ('provisioning', 'deleting')`,
        [c.function_id, at],
      );
    const queued = await this.d.store.query<{ function_id: string }>(`select distinct function_id from function_deployments where status = 'queued'`);
    for (const q of queued) this.kick(q.function_id);
  }

  /** At stop: running builds end now as interrupted (their installers killed), queued ones stay queued. */
  async drain(): Promise<void> {
    this.stopping.abort();
    await Promise.allSettled([...this.running.values()]);
  }

  async removeAll(projectId: string): Promise<void> {
    const rows = await this.d.store.query<{ id: string }>(`select id from functions where project_id = $1 and status <> 'deleted'`, [projectId]);
    for (const r of rows) {
      await this.running.get(r.id)?.catch(() => {});
      await this.runDelete(r.id, "");
    }
  }
}

function checkModes(m: { is_public: boolean; invocation_mode: string; http_auth_mode: string }): void {
  if (m.http_auth_mode === "none" && !(m.is_public && m.invocation_mode === "http"))
    throw new HttpError(400, { error: "http_auth_mode none requires a public function (is_public true) in http invocation mode" });
}
