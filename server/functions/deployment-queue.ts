import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { newId } from "../ids";
import { isoTimeOrNull as iso, type ControlStore, type Row, type Sql } from "../store/store";
import type { SandboxChoice } from "../../runtime-sandbox/isolation";
import type { BuildOptions } from "../../runtime-sandbox/build-runner";
import type { BuildLogs, StoredBuildConfig } from "./builds";
import { toRecord, type FunctionRecord } from "./records";
import type { SharedCode } from "./shared-code";
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
  build: { hiddenPaths: string[]; sandbox: { want: SandboxChoice; allowUnsandboxed: boolean }; containers?: BuildOptions["containers"] };
  log: { error: (m: string, e?: unknown) => void };
  /** Runs in the transaction that marks a function deleted: what hangs off it (schedulers) goes with it. */
  onDeleted: (tx: Sql, functionId: string) => Promise<void>;
  /** Build lines go to the log store; the history reads their counts from there. */
  buildLogs: BuildLogs;
  /**
   * Production profile (several instances on one control store): built code is shared through the
   * store, and a running deployment has an owner and a lease (wall time) that it renews every third
   * of `leaseMs`. Every `pollMs` an instance fails the running deployments whose lease lapsed (their
   * instance died) and starts queued work nobody runs. Null: the embedded profile's one instance.
   */
  shared: {
    code: SharedCode;
    /** The data dir's id: one Kiln at a time per data dir, so at start its deployments still running are its previous life's. */
    instanceId: string;
    leaseMs: number;
    pollMs: number;
  } | null;
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
  private poll: ReturnType<typeof setInterval> | null = null;
  private sweeping: Promise<void> | null = null;

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
      const renew = this.d.shared && setInterval(() => void this.renewLease(next.id as string), Math.max(200, this.d.shared.leaseMs / 3));
      try {
        if (next.kind === "delete") await this.runDelete(functionId, next.id);
        else await this.runBuild(functionId, next);
      } finally {
        if (renew) clearInterval(renew);
      }
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
      // Another instance is running this function's deployment: it starts the queued work after it.
      const [busy] = await tx.query(`select id from function_deployments where function_id = $1 and status = 'building'`, [functionId]);
      if (busy) return null;
      const [item] = await tx.query(`select * from function_deployments where function_id = $1 and status = 'queued' order by created_at, id limit 1`, [functionId]);
      if (!item) return null;
      await tx.query(`update function_deployments set status = 'building', started_at = $2, builder = $3, lease_until = $4 where id = $1`, [
        item.id,
        at,
        this.d.shared?.instanceId ?? null,
        this.d.shared ? new Date(Date.now() + this.d.shared.leaseMs).toISOString() : null,
      ]);
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

  private async renewLease(deploymentId: string): Promise<void> {
    const s = this.d.shared!;
    await this.d.store
      .query(`update function_deployments set lease_until = $3 where id = $1 and builder = $2 and status = 'building'`, [deploymentId, s.instanceId, new Date(Date.now() + s.leaseMs).toISOString()])
      .catch((e) => this.d.log.error(`deployment ${deploymentId}: its lease could not be renewed`, e));
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
        const [mine] = await tx.query(`update function_deployments set status = 'failed', error = $2, finished_at = $3 where id = $1 and status = 'building' returning id`, [dep.id, error, at]);
        if (mine) await tx.query(`update functions set status = 'failed', updated_at = $2 where id = $1`, [functionId, at]);
      });
      this.d.forget(functionId);
      return;
    }
    // Other instances run the code from the store (packed before the transaction: it takes a while).
    const packed = this.d.shared ? await this.d.shared.code.pack(root) : null;
    // building → succeeded, and the function serves it.
    const previous = await this.d.store.transaction(async (tx) => {
      const fn = await lockFunction(tx, functionId);
      const [mine] = await tx.query(`update function_deployments set status = 'succeeded', finished_at = $2 where id = $1 and status = 'building' returning id`, [dep.id, at]);
      // Failed meanwhile by another instance (this one's lease lapsed): its verdict stands.
      if (!mine) return undefined;
      if (packed) await this.d.shared!.code.save(tx, dep.id as string, packed);
      await tx.query(`update functions set status = 'active', active_deployment_id = $2, runtime = $3, handler = $4, updated_at = $5 where id = $1`, [
        functionId,
        dep.id,
        dep.runtime,
        dep.handler,
        at,
      ]);
      if (packed && fn?.active_deployment_id && fn.active_deployment_id !== dep.id) await tx.query(`delete from function_code where deployment_id = $1 and kind = 'built'`, [fn.active_deployment_id]);
      return (fn?.active_deployment_id as string | null) ?? null;
    });
    this.d.forget(functionId);
    if (previous === undefined) return;
    await this.d.retireWorkers(functionId, dep.id);
    if (previous && previous !== dep.id) {
      rmSync(this.deploymentRoot(functionId, previous), { recursive: true, force: true });
      this.d.shared?.code.forget(previous);
    }
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
   * provisioning; deletions cut short run again (they are idempotent); queued work resumes. With
   * several instances (shared) only deployments whose lease lapsed are cut short: the others are
   * running on a live instance; and from then on every `pollMs` the same sweep takes over the work
   * of instances that died.
   */
  async resume(): Promise<void> {
    await this.sweep(true);
    if (this.d.shared && !this.stopping.signal.aborted) {
      void this.shareOlderBuilds().catch((e) => this.d.log.error("deployment queue: storing built code of earlier deployments failed", e));
      this.poll = setInterval(() => {
        this.sweeping ??= this.sweep()
          .catch((e) => this.d.log.error("deployment queue: looking for other instances' work failed", e))
          .finally(() => (this.sweeping = null));
      }, this.d.shared.pollMs);
      this.poll.unref?.();
    }
  }

  /**
   * Active deployments built before their code was kept in the store (an older Kiln) whose folder is
   * here: stored now, so that other instances can run them without a redeploy.
   */
  private async shareOlderBuilds(): Promise<void> {
    const rows = await this.d.store.query<{ id: string; function_id: string }>(
      `select d.id, d.function_id from functions f join function_deployments d on d.id = f.active_deployment_id
         where f.status <> 'deleted' and not exists (select 1 from function_code c where c.deployment_id = d.id and c.kind = 'built')`,
    );
    for (const r of rows) {
      const root = this.deploymentRoot(r.function_id, r.id);
      if (this.stopping.signal.aborted || !existsSync(root)) continue;
      const packed = await this.d.shared!.code.pack(root);
      await this.d.store.query(`insert into function_code (deployment_id, kind, bytes) values ($1, 'built', $2) on conflict do nothing`, [r.id, packed]);
    }
  }

  private async sweep(atStart = false): Promise<void> {
    // Lapsed leases, and at start this data dir's own (its previous life's: one Kiln per data dir).
    const mine = atStart ? this.d.shared?.instanceId ?? "" : "";
    const cut = await this.d.store.query<{ id: string; function_id: string }>(
      this.d.shared
        ? `select id, function_id from function_deployments where status = 'building' and (lease_until is null or lease_until < $1 or builder = $2)`
        : `select id, function_id from function_deployments where status = 'building'`,
      this.d.shared ? [new Date().toISOString(), mine] : [],
    );
    if (cut.length) {
      const { killLeftoverInstaller } = await import("../../runtime-sandbox/build-runner");
      for (const c of cut) killLeftoverInstaller(this.deploymentRoot(c.function_id, c.id));
    }
    const at = this.d.now().toISOString();
    for (const functionId of new Set(cut.map((c) => c.function_id)))
      await this.d.store.transaction(async (tx) => {
        await lockFunction(tx, functionId);
        const ids = cut.filter((c) => c.function_id === functionId).map((c) => c.id);
        // Checked again under the function's lock: the owner may have finished or renewed meanwhile.
        const lapsed = this.d.shared ? `and (lease_until is null or lease_until < $4 or builder = $5)` : "";
        const args = this.d.shared ? [new Date().toISOString(), mine] : [];
        await tx.query(`update function_deployments set status = 'queued', started_at = null where id = any($1::text[]) and status = 'building' and kind = 'delete' ${lapsed.replace("$4", "$2").replace("$5", "$3")}`, [ids, ...args]);
        const failed = await tx.query(`update function_deployments set status = 'failed', error = $2, finished_at = $3 where id = any($1::text[]) and status = 'building' ${lapsed} returning id`, [
          ids,
          INTERRUPTED,
          at,
          ...args,
        ]);
        if (failed.length)
          await tx.query(
            `update functions set status = case when active_deployment_id is null then 'failed' else 'active' end, updated_at = $2 where id = $1 and status in ('provisioning', 'deleting')`,
            [functionId, at],
          );
      });
    for (const functionId of new Set(cut.map((c) => c.function_id))) this.d.forget(functionId);
    // Queued work nobody runs (with several instances: none of them is running the function's deployment).
    const queued = await this.d.store.query<{ function_id: string }>(
      `select distinct q.function_id from function_deployments q where q.status = 'queued'
         and not exists (select 1 from function_deployments b where b.function_id = q.function_id and b.status = 'building')`,
    );
    for (const q of queued) this.kick(q.function_id);
  }

  /** At stop: running builds end now as interrupted (their installers killed), queued ones stay queued. */
  async drain(): Promise<void> {
    this.stopping.abort();
    if (this.poll) clearInterval(this.poll);
    await this.sweeping;
    await Promise.allSettled([...this.running.values()]);
  }
}
