import { HttpError } from "../http/errors";
import { newId } from "../ids";
import type { ControlStore, Sql } from "../store/store";
import type { SandboxChoice } from "../../runtime-sandbox/isolation";
import type { BuildOptions } from "../../runtime-sandbox/build-runner";
import type { FunctionBuildConfig, NormalizedSource } from "./archive";
import type { BuildLogs } from "./builds";
import { DeploymentQueue } from "./deployment-queue";
import { FunctionRecords, type DeployFields, type FunctionKind, type FunctionRecord, type SettingsPatch } from "./records";
import { SharedCode } from "./shared-code";
import { SourceBlobs } from "./source-blobs";

export type { FunctionKind, FunctionRecord, FunctionStatus } from "./records";

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
  build: { hiddenPaths: string[]; sandbox: { want: SandboxChoice; allowUnsandboxed: boolean }; containers?: BuildOptions["containers"] };
  /** Why no build can run here (no sandbox and none allowed): deploys are then a 503 naming the fix. */
  sandboxProblem: () => string | null;
  log: { error: (m: string, e?: unknown) => void };
  /** Where build lines go and what the deployment history reads of them (the logs area). */
  buildLogs: BuildLogs;
  /**
   * Production profile: instances share the control store, each with its own data dir. Source
   * archives and built code are kept in the store too, and running deployments have leases
   * (`DeploymentQueueDeps.shared`). Null: the embedded profile.
   */
  shared: { instanceId: string; leaseMs: number; pollMs: number } | null;
}

/**
 * Standard functions, as routes, invocation and the project lifecycle see them. The work is done by
 * the function records (`records.ts`), the deployment queue (`deployment-queue.ts`, which runs
 * builds from `builds.ts`) and the stored source archives (`source-blobs.ts`); a deploy is the one
 * operation that spans them.
 */
export class FunctionsService {
  private readonly records: FunctionRecords;
  private readonly queue: DeploymentQueue;
  private readonly blobs: SourceBlobs;
  private readonly code: SharedCode | null;

  constructor(private readonly d: FunctionsDeps) {
    this.records = new FunctionRecords(d.store, d.now, d.maxFunctions);
    this.blobs = new SourceBlobs(d.blobDir, d.shared ? d.store : null);
    this.code = d.shared ? new SharedCode(d.store) : null;
    this.queue = new DeploymentQueue({
      store: d.store,
      now: d.now,
      blobs: this.blobs,
      codeDir: d.codeDir,
      forget: (id) => this.records.forget(id),
      retireWorkers: d.retireWorkers,
      build: d.build,
      log: d.log,
      buildLogs: d.buildLogs,
      shared: d.shared && this.code ? { code: this.code, ...d.shared } : null,
      onDeleted: async (tx, functionId) => {
        for (const hook of this.deletionHooks) await hook(tx, functionId);
      },
    });
  }

  private readonly deletionHooks: Array<(tx: Sql, functionId: string) => Promise<void>> = [];

  /**
   * What other areas keep per function (schedulers) is removed in the same transaction that marks
   * the function deleted, so a deleted function never leaves anything behind, even after a crash.
   */
  onDelete(hook: (tx: Sql, functionId: string) => Promise<void>): void {
    this.deletionHooks.push(hook);
  }

  get(projectId: string, functionId: string, kind: FunctionKind = "standard"): Promise<FunctionRecord> {
    return this.records.get(projectId, functionId, kind);
  }

  byId(functionId: string): Promise<FunctionRecord | null> {
    return this.records.byId(functionId);
  }

  byName(projectId: string, name: string, kind: FunctionKind = "standard"): Promise<FunctionRecord | null> {
    return this.records.byName(projectId, name, kind);
  }

  list(projectId: string, page: number, limit: number, kind: FunctionKind = "standard") {
    return this.records.list(projectId, page, limit, kind);
  }

  /** The function as forInvocation has it in memory, else undefined (then call forInvocation). */
  cachedForInvocation(functionId: string): FunctionRecord | undefined {
    return this.records.cachedForInvocation(functionId);
  }

  forInvocation(functionId: string): Promise<FunctionRecord | null> {
    return this.records.forInvocation(functionId);
  }

  /** The build configuration when it is already in memory (the warm path), else undefined. */
  cachedBuildConfig(deploymentId: string): FunctionBuildConfig | undefined {
    return this.records.cachedBuildConfig(deploymentId);
  }

  buildConfig(deploymentId: string): Promise<FunctionBuildConfig | null> {
    return this.records.buildConfig(deploymentId);
  }

  /** A deployment's code folder, for invocation. */
  deploymentRoot(functionId: string, deploymentId: string): string {
    return this.queue.deploymentRoot(functionId, deploymentId);
  }

  /**
   * Null when the deployment's code folder is here (always, on the embedded profile); else a promise
   * that unpacks the code another instance built (production profile) before a worker starts on it.
   */
  codeReady(functionId: string, deploymentId: string): Promise<void> | null {
    return this.code ? this.code.ensure(deploymentId, this.deploymentRoot(functionId, deploymentId)) : null;
  }

  /**
   * POST functions: 201 for a new function, 200 for an existing one. The source archive is stored
   * first, then the function and its queued deployment are written in one transaction.
   */
  async deploy(projectId: string, fields: DeployFields, source: NormalizedSource, opts: { batchId?: string; kind?: FunctionKind } = {}): Promise<{ created: boolean; fn: FunctionRecord }> {
    const unsafe = this.d.sandboxProblem();
    if (unsafe) throw new HttpError(503, { error: unsafe });
    const at = this.d.now().toISOString();
    const deploymentId = newId();
    await this.blobs.write(deploymentId, source.tarGz);
    let result: { created: boolean; fn: FunctionRecord };
    try {
      result = await this.d.store.transaction(async (tx) => {
        const { id, created } = await this.records.upsertForDeploy(tx, projectId, fields, at, opts.kind);
        const build = { ...source.build, reserved_path: source.reservedPath, dropped: source.dropped };
        const item = { kind: "deploy", id: deploymentId, runtime: fields.runtime, handler: fields.handler ?? "handler", sourceSha256: source.sha256, build, batchId: opts.batchId } as const;
        return { created, fn: await this.queue.enqueue(tx, { id, project_id: projectId }, item, at) };
      });
    } catch (err) {
      await this.blobs.delete(deploymentId);
      throw err;
    }
    this.records.forget(result.fn.id);
    // The answer is the state at acceptance; the build may finish before the client reads it.
    this.queue.kick(result.fn.id);
    return result;
  }

  update(fn: FunctionRecord, patch: SettingsPatch): Promise<FunctionRecord> {
    return this.records.update(fn, patch);
  }

  /** DELETE: 202. Queued behind a running deployment (superseding queued deploys), or started now. */
  async requestDelete(fn: FunctionRecord): Promise<FunctionRecord> {
    const at = this.d.now().toISOString();
    const accepted = await this.d.store.transaction((tx) => this.queue.enqueue(tx, fn, { kind: "delete" }, at));
    this.records.forget(fn.id);
    this.queue.kick(fn.id);
    return accepted;
  }

  deployments(functionId: string) {
    return this.queue.history(functionId);
  }

  /** At start: builds cut short by a stop are failed, never left provisioning; queued work resumes. */
  resume(): Promise<void> {
    return this.queue.resume();
  }

  /** At stop: running builds end now as interrupted (their installers killed), queued ones stay queued. */
  drain(): Promise<void> {
    return this.queue.drain();
  }

  /** Project cleanup: every function of the project deleted, with its code and archives. */
  removeAll(projectId: string): Promise<void> {
    return this.queue.removeAll(projectId);
  }
}
