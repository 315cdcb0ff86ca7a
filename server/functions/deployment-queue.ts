import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { newId } from "../ids";
import { isoTimeOrNull as iso, type ControlStore, type Row, type Sql } from "../store/store";
import type { SandboxChoice } from "../../runtime-sandbox/isolation";
import type { BuildLogs, StoredBuildConfig } from "./builds";
import { toRecord, type FunctionRecord } from "./records";
import type { SourceBlobs } from "./source-blobs";

export const INTERRUPTED = "interrupted: Kiln stopped during the build";

export type DeploymentStatus = "queued" | "building" | "succeeded" | "failed" | "superseded";

/** What a deploy queues: the deployment's id (its source archive is already stored under it). */
export interface QueuedDeploy {
  kind: "deploy";
  id: string;
  runtime: string;
  handler: string;
  sourceSha256: string;
  build: StoredBuildConfig & { dropped?: unknown };
  /** The batch request that deployed it (POST .../functions/batch), if any. */
  batchId?: string;
}

export interface DeploymentQueueDeps {
  store: ControlStore;
  now: () => Date;
  blobs: SourceBlobs;
  /** Built code: `<dir>/<function>/<deployment>/`. */
  codeDir: string;
  /** Drops the cached function record; called after every committed change. */
  forget: (functionId: string) => void;
  /** Stops the workers of every version of a function except `keep` (a deployment id). */
  retireWorkers: (functionId: string, keep?: string) => Promise<void>;
  /** Where dependency installs run: the build sandbox, never seeing these paths. */
  build: { hiddenPaths: string[]; sandbox: { want: SandboxChoice; allowUnsandboxed: boolean } };
  log: { error: (m: string, e?: unknown) => void };
  /** Runs in the transaction that marks a function deleted: what hangs off it (schedulers) goes with it. */
  onDeleted: (tx: Sql, functionId: string) => Promise<void>;
  /** Build lines go to the log store; the history reads their counts from there. */
  buildLogs: BuildLogs;
}

/**
 * Every transaction here locks the function's row first, then touches its deployments: one order,
 * so two of them (or a deploy, which holds the function row too) never deadlock.
 */
async function lockFunction(tx: Sql, functionId: string): Promise<Row | undefined> {
  const [fn] = await tx.query(`select status, active_deployment_id from functions where id = $1 for update`, [functionId]);
  return fn;
}

/**
 * The deployment queue of each function: one deployment runs at a time; newer work waits `queued`
 * and supersedes older queued work. A deployment goes queued → building → succeeded | failed, or
 * queued → superseded; a deletion is a deployment of kind `delete`. Each change of a deployment's
 * state happens in one transaction with the matching change of its function (status, active and
 * pending deployment), so a crash between two steps never leaves a function `provisioning` with
 * nothing to finish it.
 */
export class DeploymentQueue {
  private readonly running = new Map<string, Promise<void>>();
  /** Aborted by drain(): running installers are killed, queued work waits for the next start. */
  private readonly stopping = new AbortController();

  constructor(private readonly d: DeploymentQueueDeps) {
    mkdirSync(d.codeDir, { recursive: true });
  }

  /** A deployment's code folder. */
  deploymentRoot(functionId: string, deploymentId: string): string {
    return join(this.d.codeDir, functionId, deploymentId);
  }

  /**
   * In the caller's transaction: queues a deploy or a deletion, superseding queued work. Behind a
   * running deployment it becomes the function's `pending_deployment_id`; otherwise the function
   * shows what is about to run (`provisioning` or `deleting`). Returns the function as it is then.
   */
  async enqueue(tx: Sql, fn: { id: string; project_id: string }, item: QueuedDeploy | { kind: "delete" }, at: string): Promise<FunctionRecord> {
    await lockFunction(tx, fn.id);
    const [busy] = await tx.query(`select id from function_deployments where function_id = $1 and status = 'building'`, [fn.id]);
    await tx.query(`update function_deployments set status = 'superseded', finished_at = $2 where function_id = $1 and status = 'queued'`, [fn.id, at]);
    let id: string;
    if (item.kind === "deploy") {
      id = item.id;
      await tx.query(
        `insert into function_deployments (id, function_id, project_id, kind, status, runtime, handler, source_sha256, build, created_at, batch_id)
         values ($1, $2, $3, 'deploy', 'queued', $4, $5, $6, $7::text::jsonb, $8, $9)`,
        [id, fn.id, fn.project_id, item.runtime, item.handler, item.sourceSha256, JSON.stringify(item.build), at, item.batchId ?? null],
      );
    } else {
      id = newId();
      await tx.query(`insert into function_deployments (id, function_id, project_id, kind, status, created_at) values ($1, $2, $3, 'delete', 'queued', $4)`, [id, fn.id, fn.project_id, at]);
    }
    // A deletion request stands: deploys are refused (409) until it has run.
    const marked = item.kind === "delete" ? "delete_requested = true, " : "";
    const [row] = busy
      ? await tx.query(`update functions set ${marked}pending_deployment_id = $2, updated_at = $3 where id = $1 returning *`, [fn.id, id, at])
      : await tx.query(`update functions set ${marked}status = $3, pending_deployment_id = null, updated_at = $2 where id = $1 returning *`, [
          fn.id,
          at,
          item.kind === "delete" ? "deleting" : "provisioning",
        ]);
    return toRecord(row!);
  }

  /** Deployment history, newest first, with build-log counts and times. */
  async history(functionId: string) {
    const rows = await this.d.store.query(`select d.* from function_deployments d where d.function_id = $1 order by d.created_at desc, d.id desc`, [functionId]);
    const logs = await this.d.buildLogs.summaries(rows.filter((r) => r.kind === "deploy").map((r) => r.id as string));
    return rows.map((r) => ({
      id: r.id as string,
      function_id: r.function_id as string,
      kind: r.kind as "deploy" | "delete",
      status: r.status as DeploymentStatus,
      runtime: r.runtime ?? null,
      handler: r.handler ?? null,
      source_sha256: r.source_sha256 ?? null,
      batch_id: r.batch_id ?? null,
      error: r.error ?? null,
      build_log: logs.get(r.id as string) ?? { lines: 0, first_at: null, last_at: null },
      created_at: iso(r.created_at)!,
      started_at: iso(r.started_at),
      finished_at: iso(r.finished_at),
    }));
  }

  /** Runs the function's queued work, one item at a time. */
  kick(functionId: string): void {
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
      const next = await this.start(functionId);
      if (!next) return;
      if (next.kind === "delete") await this.runDelete(functionId, next.id);
      else await this.runBuild(functionId, next);
    }
  }

  /**
   * queued → building, with the function `provisioning` (or `deleting`) and nothing pending. A
   * deleted function's queued work has nothing left to do (a deletion of it is done, a deploy
   * superseded).
   */
  private async start(functionId: string): Promise<Row | null> {
    const at = this.d.now().toISOString();
    const next = await this.d.store.transaction(async (tx) => {
      const fn = await lockFunction(tx, functionId);
      if (!fn || fn.status === "deleted") {
        await tx.query(
          `update function_deployments set status = case when kind = 'delete' then 'succeeded' else 'superseded' end, finished_at = $2 where function_id = $1 and status = 'queued'`,
          [functionId, at],
        );
        return null;
      }
      const [item] = await tx.query(`select * from function_deployments where function_id = $1 and status = 'queued' order by created_at, id limit 1`, [functionId]);
      if (!item) return null;
      await tx.query(`update function_deployments set status = 'building', started_at = $2 where id = $1`, [item.id, at]);
      await tx.query(`update functions set pending_deployment_id = null, status = $2, updated_at = $3 where id = $1`, [
        functionId,
        item.kind === "delete" ? "deleting" : "provisioning",
        at,
      ]);
      return item;
    });
    if (next) this.d.forget(functionId);
    return next;
  }

  private async runBuild(functionId: string, dep: Row): Promise<void> {
    const root = this.deploymentRoot(functionId, dep.id);
    const [fn] = await this.d.store.query<{ name: string }>(`select name from functions where id = $1`, [functionId]);
    // The archive and build code (tar, the runtime resolver) load with the first build.
    const error = await import("./builds").then(
      ({ buildDeployment }) =>
        buildDeployment({
          logs: this.d.buildLogs,
          fn: { id: functionId, name: fn?.name ?? functionId, project_id: dep.project_id as string },
          deploymentId: dep.id,
          root,
          build: dep.build as StoredBuildConfig,
          source: () => this.d.blobs.read(dep.id),
          options: { ...this.d.build, signal: this.stopping.signal },
          interrupted: INTERRUPTED,
        }),
      (err: Error) => `build failed: ${err.message}`,
    );
    const at = this.d.now().toISOString();
    if (error) {
      // building → failed, and the function failed with it: a new function has nothing to serve; an
      // existing one keeps serving its last good deployment.
      await this.d.store.transaction(async (tx) => {
        await lockFunction(tx, functionId);
        await tx.query(`update function_deployments set status = 'failed', error = $2, finished_at = $3 where id = $1`, [dep.id, error, at]);
        await tx.query(`update functions set status = 'failed', updated_at = $2 where id = $1`, [functionId, at]);
      });
      this.d.forget(functionId);
      return;
    }
    // building → succeeded, and the function serves it.
    const previous = await this.d.store.transaction(async (tx) => {
      const fn = await lockFunction(tx, functionId);
      await tx.query(`update function_deployments set status = 'succeeded', finished_at = $2 where id = $1`, [dep.id, at]);
      await tx.query(`update functions set status = 'active', active_deployment_id = $2, runtime = $3, handler = $4, updated_at = $5 where id = $1`, [
        functionId,
        dep.id,
        dep.runtime,
        dep.handler,
        at,
      ]);
      return fn?.active_deployment_id as string | null | undefined;
    });
    this.d.forget(functionId);
    await this.d.retireWorkers(functionId, dep.id);
    if (previous && previous !== dep.id) rmSync(this.deploymentRoot(functionId, previous), { recursive: true, force: true });
  }

  /** Workers, built code and source archives of a function: gone (idempotent). */
  private async removeFiles(functionId: string): Promise<void> {
    this.d.forget(functionId);
    await this.d.retireWorkers(functionId);
    rmSync(join(this.d.codeDir, functionId), { recursive: true, force: true });
    const deps = await this.d.store.query<{ id: string }>(`select id from function_deployments where function_id = $1`, [functionId]);
    for (const x of deps) await this.d.blobs.delete(x.id);
  }

  /** A deletion: files removed, then the deletion succeeded and the function deleted together. */
  private async runDelete(functionId: string, deploymentId: string): Promise<void> {
    await this.removeFiles(functionId);
    const at = this.d.now().toISOString();
    await this.d.store.transaction(async (tx) => {
      await lockFunction(tx, functionId);
      await tx.query(`update function_deployments set status = 'succeeded', finished_at = $2 where id = $1`, [deploymentId, at]);
      await tx.query(`update functions set status = 'deleted', updated_at = $2 where id = $1`, [functionId, at]);
      await this.d.onDeleted(tx, functionId);
    });
    this.d.forget(functionId);
  }

  /**
   * Project deletion: every function of the project goes, once its running deployment has ended;
   * work still queued for it is superseded.
   */
  async removeAll(projectId: string): Promise<void> {
    const rows = await this.d.store.query<{ id: string }>(`select id from functions where project_id = $1 and status <> 'deleted'`, [projectId]);
    for (const r of rows) {
      await this.running.get(r.id)?.catch(() => {});
      await this.removeFiles(r.id);
      const at = this.d.now().toISOString();
      await this.d.store.transaction(async (tx) => {
        await lockFunction(tx, r.id);
        await tx.query(`update function_deployments set status = 'superseded', finished_at = $2 where function_id = $1 and status = 'queued'`, [r.id, at]);
        await tx.query(`update functions set status = 'deleted', pending_deployment_id = null, updated_at = $2 where id = $1`, [r.id, at]);
        await this.d.onDeleted(tx, r.id);
      });
      this.d.forget(r.id);
    }
  }

  /**
   * At start: builds cut short by a stop or a crash are failed (their installers killed), never left
   * provisioning; deletions cut short run again (they are idempotent); queued work resumes.
   */
  async resume(): Promise<void> {
    const cut = await this.d.store.query<{ id: string; function_id: string }>(`select id, function_id from function_deployments where status = 'building'`);
    if (cut.length) {
      const { killLeftoverInstaller } = await import("../../runtime-sandbox/build-runner");
      for (const c of cut) killLeftoverInstaller(this.deploymentRoot(c.function_id, c.id));
    }
    const at = this.d.now().toISOString();
    for (const functionId of new Set(cut.map((c) => c.function_id)))
      await this.d.store.transaction(async (tx) => {
        await lockFunction(tx, functionId);
        await tx.query(`update function_deployments set status = 'queued', started_at = null where function_id = $1 and status = 'building' and kind = 'delete'`, [functionId]);
        const failed = await tx.query(`update function_deployments set status = 'failed', error = $2, finished_at = $3 where function_id = $1 and status = 'building' returning id`, [
          functionId,
          INTERRUPTED,
          at,
        ]);
        if (failed.length)
          await tx.query(
            `update functions set status = case when active_deployment_id is null then 'failed' else 'active' end, updated_at = $2 where id = $1 and status in ('provisioning', 'deleting')`,
            [functionId, at],
          );
      });
    for (const functionId of new Set(cut.map((c) => c.function_id))) this.d.forget(functionId);
    const queued = await this.d.store.query<{ function_id: string }>(`select distinct function_id from function_deployments where status = 'queued'`);
    for (const q of queued) this.kick(q.function_id);
  }

  /** At stop: running builds end now as interrupted (their installers killed), queued ones stay queued. */
  async drain(): Promise<void> {
    this.stopping.abort();
    await Promise.allSettled([...this.running.values()]);
  }
}
