import { join } from "node:path";
import { rm } from "node:fs/promises";
import type { FrameworkContext, FrontendBuildResult, FrontendServer } from "../../runtime-sandbox/frontends/types";
import { FrontendBuildError } from "../../runtime-sandbox/frontends/types";
import type { Clock } from "../clock";
import { conflict, forbidden, notFound } from "../http/errors";
import { newId } from "../ids";
import type { Logger } from "../log";
import type { ControlStore, Sql } from "../store/store";
import { SourceBlobs } from "../functions/source-blobs";
import { buildDeployment, closeFrameworks, nextjsFramework, removeDir, scratchDir } from "./builds";
import { deploymentOf, frontendOf, type DeploymentRecord, type FrontendRecord } from "./records";
import type { DeployFields } from "./schemas";
import { readManifest } from "./static-files";
import type { ServedSite } from "./static-serve";
import type { ProxiedSocket } from "./websocket-proxy";
import { FrontendCode } from "./shared-code";

/** The spec's hard limit of frontends per project, for every plan. */
export const HARD_FRONTEND_LIMIT = 10_000;
/** Platform time between the attempts of a switch that could not complete (then the deployment fails, the frontend stays `degraded`). */
export const SWITCH_RETRY_DELAYS_MS = [5_000, 30_000, 120_000];
export const PLAN_CAP_MESSAGE = "frontend deployment limit exceeded for your plan";

/** A deployment that serves: its files loaded, and its framework's server when it has one. */
export interface Served {
  frontend: { id: string; name: string; project_id: string };
  deploymentId: string;
  site: ServedSite;
  result: FrontendBuildResult;
  server: FrontendServer | null;
  /** WebSockets open to its server (closed when it stops serving). */
  sockets: Set<ProxiedSocket>;
}

export interface FrontendsDeps {
  store: ControlStore;
  clock: Clock;
  log: Logger;
  /** `<data-dir>/frontends`: archives, deployments, scratch. */
  dir: string;
  variables: (projectId: string) => Promise<Readonly<Record<string, string>>>;
  buildLog: (ref: { id: string; name: string; project_id: string; deploymentId: string }, level: string, text: string) => void;
  /** A running server's own lines (output, exits, OOM kills): the frontend's runtime log stream. */
  serverLog: (ref: { id: string; name: string; project_id: string; deploymentId: string }, level: string, text: string) => void;
  flushLogs: () => Promise<void>;
  framework: FrameworkContext;
  /** How long a replaced deployment's files stay after the switch (requests that began on it, pages that load its assets). */
  keepPreviousMs: number;
  /** Fault injection (KILN_FAULTS=frontend_build_delay:<ms>): each build waits this long of platform time first, so tests can queue behind it. */
  buildDelayMs: number;
  /** Several instances share the control store (production profile): how often each looks at what the others changed. */
  shared: { pollMs: number; instanceId: string } | null;
  /** Takes one injected failure of that name (KILN_FAULTS), if any are left. */
  fault: (name: string) => boolean;
}

/**
 * Frontends and their deployments (spec: Frontend status, build and runtime rules 3-4). One
 * deployment runs per frontend at a time, in this process; newer deploys supersede queued ones; a
 * delete waits behind the running deployment and supersedes queued ones. A deployment builds into
 * its own folder and publishes its files before the switch, which is one assignment in the serving
 * table: requests already answering from the previous deployment finish there, the next ones see the
 * new one. The previous deployment's files stay `keepPreviousMs`.
 */
export class FrontendsService {
  private readonly blobs: SourceBlobs;
  /** The production profile's copies of archives and builds in the control store (null: one instance). */
  private readonly code: FrontendCode | null;
  private syncTimer: ReturnType<typeof setInterval> | null = null;
  private syncing: Promise<void> | null = null;
  /** Deployments another instance switched to that this one could not load (logged once each). */
  private readonly unloadable = new Set<string>();
  /** Frontend id → its runner, while one runs. */
  private readonly runners = new Map<string, Promise<void>>();
  /** `<project>/<name>` → what serves. */
  private readonly serving = new Map<string, Served>();
  private readonly aborts = new AbortController();
  private readonly retiring = new Set<ReturnType<typeof setTimeout>>();
  private readonly retirements = new Set<() => Promise<void>>();

  constructor(private readonly d: FrontendsDeps) {
    this.blobs = new SourceBlobs(join(d.dir, "archives"));
    this.code = d.shared ? new FrontendCode(d.store) : null;
  }

  private now(): string {
    return this.d.clock.now().toISOString();
  }

  private deploymentDir(id: string): string {
    return join(this.d.dir, "deployments", id);
  }

  // --- reads

  async list(projectId: string, page: number, limit: number): Promise<{ data: FrontendRecord[]; total: number }> {
    const [{ total }] = (await this.d.store.query(`select count(*)::int as total from frontends where project_id = $1 and status <> 'deleted'`, [projectId])) as [{ total: number }];
    const rows = await this.d.store.query(`select * from frontends where project_id = $1 and status <> 'deleted' order by created_at, id limit $2 offset $3`, [projectId, limit, (page - 1) * limit]);
    return { data: rows.map(frontendOf), total };
  }

  /** A frontend by id (or by name); 404 once deleted. */
  async get(projectId: string, idOrName: string): Promise<FrontendRecord> {
    const [r] = await this.d.store.query(`select * from frontends where project_id = $1 and (id = $2 or name = $2) and status <> 'deleted' order by (id = $2) desc limit 1`, [projectId, idOrName]);
    if (!r) throw notFound("frontend not found");
    return frontendOf(r);
  }

  async deployments(projectId: string, idOrName: string, page: number, limit: number): Promise<{ data: DeploymentRecord[]; total: number }> {
    const f = await this.get(projectId, idOrName);
    const [{ total }] = (await this.d.store.query(`select count(*)::int as total from frontend_deployments where frontend_id = $1`, [f.id])) as [{ total: number }];
    const rows = await this.d.store.query(`select * from frontend_deployments where frontend_id = $1 order by created_at desc, id desc limit $2 offset $3`, [f.id, limit, (page - 1) * limit]);
    return { data: rows.map(deploymentOf), total };
  }

  /** What serves `<name>--<project>`; null when nothing does (yet, or any more). */
  served(projectId: string, name: string): Served | null {
    return this.serving.get(`${projectId}/${name}`) ?? null;
  }

  servedById(frontendId: string): Served | null {
    for (const s of this.serving.values()) if (s.frontend.id === frontendId) return s;
    return null;
  }

  // --- writes

  /**
   * Create or update (multipart POST): 201 with a new frontend in `provisioning`, 200 for an existing
   * one (its deployment started, or queued behind the running one), 409 while its deletion is queued
   * or running, 403 at the plan's cap. The archive is stored before the deployment row that names it.
   */
  async deploy(projectId: string, maxFrontends: number, fields: DeployFields, source: { tarGz: Uint8Array; sha256: string }): Promise<{ created: boolean; frontend: FrontendRecord }> {
    const deploymentId = newId();
    await this.blobs.write(deploymentId, source.tarGz);
    try {
      await this.code?.saveSource(deploymentId, source.tarGz);
      const out = await this.d.store.transaction(async (tx) => {
        await tx.query(`select id from projects where id = $1 for update`, [projectId]);
        const [row] = await tx.query(`select * from frontends where project_id = $1 and name = $2 and status <> 'deleted' for update`, [projectId, fields.name]);
        const at = this.now();
        let f: FrontendRecord;
        let created = false;
        if (row) {
          f = frontendOf(row);
          await this.refuseWhileDeleting(tx, f);
          const scope = fields.variable_scope ?? f.variable_scope;
          await tx.query(`update frontends set app_root = $2, variable_scope = $3, variables = $4, artifact_deployment_id = $5, updated_at = $6 where id = $1`, [
            f.id,
            fields.app_root ?? null,
            scope,
            JSON.stringify(fields.variables),
            deploymentId,
            at,
          ]);
        } else {
          const [{ n }] = (await tx.query(`select count(*)::int as n from frontends where project_id = $1 and status <> 'deleted'`, [projectId])) as [{ n: number }];
          if (n >= Math.min(maxFrontends, HARD_FRONTEND_LIMIT)) throw forbidden(PLAN_CAP_MESSAGE);
          const id = newId();
          await tx.query(
            `insert into frontends (id, project_id, name, status, framework, app_root, variable_scope, variables, artifact_deployment_id, created_at, updated_at)
             values ($1, $2, $3, 'provisioning', null, $4, $5, $6, $7, $8, $8)`,
            [id, projectId, fields.name, fields.app_root ?? null, fields.variable_scope ?? "scoped", JSON.stringify(fields.variables), deploymentId, at],
          );
          created = true;
          f = { id } as FrontendRecord;
        }
        await this.enqueue(tx, f.id, projectId, deploymentId, "deploy", { source: deploymentId, appRoot: fields.app_root ?? null, framework: fields.framework ?? null, sha256: source.sha256 });
        return { created, id: f.id };
      });
      this.kick(out.id);
      return { created: out.created, frontend: await this.get(projectId, out.id) };
    } catch (err) {
      await this.blobs.delete(deploymentId).catch(() => {});
      throw err;
    }
  }

  /**
   * The settings the next deployment builds with (a configuration manifest: no archive, no
   * deployment): `app_root` (a redeploy's), `variable_scope` and `variables` (every deployment's). The
   * serving deployment and one already building keep what they were built with.
   */
  async updateSettings(projectId: string, idOrName: string, patch: { app_root?: string | null; variable_scope?: "scoped" | "all"; variables?: string[] }): Promise<FrontendRecord> {
    const f0 = await this.get(projectId, idOrName);
    await this.d.store.transaction(async (tx) => {
      const [row] = await tx.query(`select * from frontends where id = $1 for update`, [f0.id]);
      const f = frontendOf(row!);
      await this.refuseWhileDeleting(tx, f);
      await tx.query(`update frontends set app_root = $2, variable_scope = $3, variables = $4, updated_at = $5 where id = $1`, [
        f.id,
        patch.app_root === undefined ? f.app_root : patch.app_root,
        patch.variable_scope ?? f.variable_scope,
        JSON.stringify(patch.variables ?? f.variables),
        this.now(),
      ]);
    });
    return this.get(projectId, f0.id);
  }

  /** A new deployment of the latest archive with the stored app_root. */
  async redeploy(projectId: string, idOrName: string): Promise<FrontendRecord> {
    const f0 = await this.get(projectId, idOrName);
    const id = await this.d.store.transaction(async (tx) => {
      const [row] = await tx.query(`select * from frontends where id = $1 for update`, [f0.id]);
      const f = frontendOf(row!);
      await this.refuseWhileDeleting(tx, f);
      if (!f.artifact_deployment_id) throw conflict("frontend has no uploaded archive to redeploy");
      const [src] = await tx.query(`select framework from frontend_deployments where id = $1`, [f.artifact_deployment_id]);
      const deploymentId = newId();
      await this.enqueue(tx, f.id, projectId, deploymentId, "redeploy", { source: f.artifact_deployment_id, appRoot: f.app_root, framework: (src?.framework as "nextjs" | null) ?? null, sha256: null });
      return f.id;
    });
    this.kick(id);
    return this.get(projectId, id);
  }

  /** DELETE: 202; runs after the running deployment, superseding queued ones. */
  async delete(projectId: string, idOrName: string): Promise<FrontendRecord> {
    const f0 = await this.get(projectId, idOrName);
    await this.d.store.transaction(async (tx) => {
      const [row] = await tx.query(`select * from frontends where id = $1 for update`, [f0.id]);
      const f = frontendOf(row!);
      // A second DELETE while one is queued or running is the same request.
      const [pending] = await tx.query(`select id from frontend_deployments where frontend_id = $1 and kind = 'delete' and status in ('queued', 'building')`, [f.id]);
      if (pending) return;
      await this.enqueue(tx, f.id, projectId, newId(), "delete", { source: null, appRoot: null, framework: null, sha256: null });
    });
    this.kick(f0.id);
    return this.get(projectId, f0.id).catch(() => ({ ...f0, status: "deleting" as const }));
  }

  private async refuseWhileDeleting(tx: Sql, f: FrontendRecord): Promise<void> {
    if (f.status === "deleting") throw conflict("frontend deletion is running");
    const [d] = await tx.query(`select id from frontend_deployments where frontend_id = $1 and kind = 'delete' and status in ('queued', 'building')`, [f.id]);
    if (d) throw conflict("frontend deletion is queued");
  }

  /**
   * Records a deployment: older queued ones are superseded; it starts now when none runs (the frontend
   * shows it as current, status `provisioning` or `deleting`), else waits as `pending_deployment_id`.
   */
  private async enqueue(
    tx: Sql,
    frontendId: string,
    projectId: string,
    id: string,
    kind: DeploymentRecord["kind"],
    o: { source: string | null; appRoot: string | null; framework: "nextjs" | null; sha256: string | null },
  ): Promise<void> {
    const at = this.now();
    await tx.query(`update frontend_deployments set status = 'superseded', finished_at = $2 where frontend_id = $1 and status = 'queued'`, [frontendId, at]);
    await tx.query(
      `insert into frontend_deployments (id, frontend_id, project_id, kind, status, source_deployment_id, app_root, framework, source_sha256, created_at)
       values ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9)`,
      [id, frontendId, projectId, kind, o.source, o.appRoot, o.framework, o.sha256, at],
    );
    const [busy] = await tx.query(`select id from frontend_deployments where frontend_id = $1 and status = 'building'`, [frontendId]);
    if (busy) await tx.query(`update frontends set pending_deployment_id = $2, updated_at = $3 where id = $1`, [frontendId, id, at]);
    else
      await tx.query(`update frontends set current_deployment_id = $2, pending_deployment_id = null, status = $3, updated_at = $4 where id = $1`, [
        frontendId,
        id,
        kind === "delete" ? "deleting" : "provisioning",
        at,
      ]);
  }

  /** Runs the frontend's queued deployments one after another, unless a runner already does. */
  private kick(frontendId: string): void {
    if (this.runners.has(frontendId) || this.aborts.signal.aborted) return;
    const run = (async () => {
      try {
        for (;;) {
          if (this.aborts.signal.aborted) return;
          const [next] = await this.d.store.query(`select * from frontend_deployments where frontend_id = $1 and status = 'queued' order by created_at, id limit 1`, [frontendId]);
          if (!next) return;
          // Another instance runs this frontend's deployments (production profile): it takes the queue.
          if (!(await this.runOne(deploymentOf(next)))) return;
        }
      } catch (err) {
        this.d.log.error(`frontend ${frontendId}: deployment runner failed`, err);
      } finally {
        this.runners.delete(frontendId);
      }
    })();
    this.runners.set(frontendId, run);
  }

  /** Runs one queued deployment; false when it was not this instance's to run (another one claimed it, or runs the frontend's). */
  private async runOne(dep: DeploymentRecord): Promise<boolean> {
    const at = this.now();
    const frontend = await this.d.store.transaction(async (tx) => {
      // The claim, under the frontend's row lock: one deployment at a time per frontend, whichever instance runs it.
      await tx.query(`select id from frontends where id = $1 for update`, [dep.frontend_id]);
      const [claimed] = await tx.query(
        `update frontend_deployments set status = 'building', started_at = $2, builder = $4 where id = $1 and status = 'queued'
           and not exists (select 1 from frontend_deployments b where b.frontend_id = $3 and b.status = 'building') returning id`,
        [dep.id, at, dep.frontend_id, this.d.shared?.instanceId ?? null],
      );
      if (!claimed) return null;
      // A degraded frontend stays degraded until a deployment switches (its previous one keeps serving meanwhile).
      const [row] = await tx.query(
        `update frontends set current_deployment_id = $2, pending_deployment_id = (select id from frontend_deployments where frontend_id = $1 and status = 'queued' order by created_at desc limit 1),
           status = case when $3 = 'provisioning' and status = 'degraded' then 'degraded' else $3 end, updated_at = $4 where id = $1 returning *`,
        [dep.frontend_id, dep.id, dep.kind === "delete" ? "deleting" : "provisioning", at],
      );
      return frontendOf(row!);
    });
    if (!frontend) return false;
    if (dep.kind === "delete") return (await this.runDelete(frontend, dep), true);
    const ref = { id: frontend.id, name: frontend.name, project_id: frontend.project_id, deploymentId: dep.id, resourceType: "frontend" as const };
    const log = async (level: string, text: string) => this.d.buildLog(ref, level, text);
    const outDir = this.deploymentDir(dep.id);
    let scratch: string | null = null;
    /** The new deployment's server once started: stopped again when its switch does not happen. */
    let started: FrontendServer | null = null;
    const t0 = performance.now();
    try {
      await log("info", `${dep.kind} ${dep.id} of frontend ${frontend.name} started`);
      if (this.d.buildDelayMs) {
        // On the platform clock, counted from the deploy request: a test holds builds for as long as it
        // wants and releases them by advancing it, however late the runner got here.
        const left = Date.parse(dep.created_at) + this.d.buildDelayMs - this.d.clock.nowMs();
        if (left > 0) await this.sleep(left, "frontend build delay (fault)");
        if (this.aborts.signal.aborted) throw new Error("stopped");
      }
      scratch = await scratchDir(join(this.d.dir, "scratch"));
      const src = join(scratch, "source");
      const { extractSource } = await import("../functions/archive");
      const { mkdir } = await import("node:fs/promises");
      await mkdir(src, { recursive: true });
      await extractSource(await this.readSource(dep.source_deployment_id!), src);
      await rm(join(src, ".service"), { recursive: true, force: true });
      const env = await this.selectedVariables(frontend, log);
      const { result, manifest } = await buildDeployment({
        sourceDir: src,
        appRoot: dep.app_root ?? "",
        framework: dep.framework === "nextjs" ? "nextjs" : null,
        outDir,
        env,
        log,
        signal: this.aborts.signal,
        ctx: this.d.framework,
      });
      const served: Served = {
        frontend: { id: frontend.id, name: frontend.name, project_id: frontend.project_id },
        deploymentId: dep.id,
        site: { dir: join(outDir, result.staticDir), manifest, spaFallback: result.kind === "static" },
        result,
        server: await this.startServer(outDir, result, frontend, dep.id),
        sockets: new Set(),
      };
      started = served.server;
      // A server that cannot start must not take the traffic: it is started (and answers once) before the
      // switch, so the first requests after it do not wait for a cold start, and a broken one fails the
      // deployment while the previous one keeps serving.
      if (served.server) await this.warm(served, log);
      // The switch: the record first (a restart serves what the store says), then the table.
      await this.switchWithRecovery(frontend, dep, served, log);
      started = null;
      await log("info", `deployment ${dep.id} serves (built and published in ${Math.round(performance.now() - t0)} ms)`);
      await log("info", "build succeeded");
    } catch (err) {
      const message = err instanceof FrontendBuildError ? err.message : this.aborts.signal.aborted ? "the build was stopped: Kiln is stopping" : `build failed: ${(err as Error).message}`;
      if (!(err instanceof FrontendBuildError) && !this.aborts.signal.aborted) this.d.log.error(`frontend ${frontend.name}: deployment ${dep.id} failed`, err);
      await log("error", message).catch(() => {});
      await started?.stop().catch(() => {});
      await removeDir(outDir);
      if (this.aborts.signal.aborted) {
        // Resumed at the next start: back in the queue.
        await this.d.store.query(`update frontend_deployments set status = 'queued', started_at = null where id = $1`, [dep.id]).catch(() => {});
        return true;
      }
      await this.d.store.transaction(async (tx) => {
        const done = this.now();
        await tx.query(`update frontend_deployments set status = 'failed', error = $2, finished_at = $3 where id = $1`, [dep.id, message, done]);
        // A failed redeploy leaves the previous deployment serving (and the frontend as it was).
        await tx.query(
          `update frontends set status = case when serving_deployment_id is null then 'failed' when status = 'degraded' then 'degraded' else 'active' end, framework = coalesce(framework, $3), updated_at = $2 where id = $1 and status <> 'deleted'`,
          [frontend.id, done, dep.framework],
        );
      });
    } finally {
      if (scratch) await removeDir(scratch);
      // At a stop the log store may already be draining (areas drain in order): the lines are flushed by it.
      if (!this.aborts.signal.aborted) await this.d.flushLogs().catch(() => {});
    }
    return true;
  }

  /** A deployment's archive: this instance's file, else (production profile) the control store's copy. */
  private async readSource(deploymentId: string): Promise<Buffer> {
    try {
      return await this.blobs.read(deploymentId);
    } catch (err) {
      const copy = await this.code?.readSource(deploymentId);
      if (copy) return copy;
      throw err;
    }
  }

  /**
   * The switch to a built deployment, and its bounded recovery (spec: Frontend status, `degraded`):
   * when it cannot complete, the frontend is `degraded` and the previous deployment keeps serving,
   * while the switch alone (no rebuild) is tried again after each of SWITCH_RETRY_DELAYS_MS on the
   * platform clock. Recovery stands down as soon as a newer deployment is queued. Once the retries
   * are exhausted the deployment fails and the frontend stays `degraded` until a deployment switches.
   */
  private async switchWithRecovery(frontend: FrontendRecord, dep: DeploymentRecord, served: Served, log: (level: string, text: string) => Promise<void>): Promise<void> {
    const result = served.result;
    // Production profile: the built folder goes into the control store with the switch, for the other instances.
    const packed = this.code ? await this.code.pack(this.deploymentDir(dep.id)) : null;
    for (let attempt = 0; ; attempt++) {
      try {
        // Fault injection (KILN_FAULTS=frontend_switch:<n>): the next n switches away from a serving deployment fail.
        if (this.served(frontend.project_id, frontend.name) && this.d.fault("frontend_switch")) throw new Error("injected fault: frontend_switch");
        await this.d.store.transaction(async (tx) => {
          const done = this.now();
          await tx.query(`update frontend_deployments set status = 'succeeded', finished_at = $2, framework = $3, result = $4, warnings = $5 where id = $1`, [
            dep.id,
            done,
            result.kind,
            JSON.stringify(result),
            JSON.stringify(result.warnings),
          ]);
          const [prev] = await tx.query(`select serving_deployment_id from frontends where id = $1`, [frontend.id]);
          if (packed) await this.code!.saveBuilt(tx, frontend.id, dep.id, packed, (prev?.serving_deployment_id as string | null) ?? null);
          await tx.query(`update frontends set serving_deployment_id = $2, status = 'active', framework = $3, updated_at = $4 where id = $1 and status <> 'deleted'`, [frontend.id, dep.id, result.kind, done]);
        });
        this.switchTo(served);
        if (attempt > 0) await log("info", `the switch to deployment ${dep.id} completed at attempt ${attempt + 1}: the frontend is active again`);
        return;
      } catch (err) {
        if (this.aborts.signal.aborted) throw err;
        const why = (err as Error).message;
        if (attempt === 0) {
          await this.d.store.query(`update frontends set status = 'degraded', updated_at = $2 where id = $1 and status <> 'deleted'`, [frontend.id, this.now()]);
          this.d.log.warn(`frontend ${frontend.name}: the switch to deployment ${dep.id} could not complete (${why}); recovering`);
        }
        if (attempt >= SWITCH_RETRY_DELAYS_MS.length)
          throw new FrontendBuildError(`built, but the switch to it could not complete after ${attempt + 1} attempts (${why}): the previous deployment keeps serving and the frontend is degraded; a redeploy retries`);
        const delay = SWITCH_RETRY_DELAYS_MS[attempt]!;
        await log("warn", `the switch to this deployment could not complete (${why}): the previous deployment keeps serving; trying the switch again in ${delay / 1000} s (attempt ${attempt + 2} of ${SWITCH_RETRY_DELAYS_MS.length + 1})`);
        await this.sleep(delay, "frontend switch recovery");
        if (this.aborts.signal.aborted) throw new Error("stopped");
        const [newer] = await this.d.store.query(`select id from frontend_deployments where frontend_id = $1 and status = 'queued' limit 1`, [frontend.id]);
        if (newer) throw new FrontendBuildError(`built, but its switch could not complete (${why}) and recovery stood down: deployment ${newer.id} was queued after it`);
      }
    }
  }

  /** Waits on the platform clock; ends early when Kiln stops. */
  private sleep(ms: number, label: string): Promise<void> {
    const signal = this.aborts.signal;
    return new Promise<void>((resolve) => {
      if (signal.aborted) return resolve();
      const t = this.d.clock.after(ms, resolve, label);
      signal.addEventListener("abort", () => (t.cancel(), resolve()), { once: true });
    });
  }

  /** Selected variables: all of the project's, or the named ones (`scoped`; a name not set is skipped with a warning). */
  private async selectedVariables(f: FrontendRecord, log: (level: string, text: string) => Promise<void>): Promise<Record<string, string>> {
    const all = await this.d.variables(f.project_id);
    if (f.variable_scope === "all") return { ...all };
    const out: Record<string, string> = {};
    for (const name of f.variables) {
      if (name in all) out[name] = all[name]!;
      else await log("warn", `variable ${name} is selected but not set in the project: skipped`);
    }
    return out;
  }

  private async startServer(outDir: string, result: FrontendBuildResult, f: FrontendRecord, deploymentId: string): Promise<FrontendServer | null> {
    if (result.kind === "static") return null;
    const fw = await nextjsFramework(this.d.framework);
    const ref = { id: f.id, name: f.name, project_id: f.project_id };
    // The server's own lines (output, exits, OOM kills): runtime logs of the deployment that runs it.
    return fw.serve({ deploymentDir: outDir, result, log: (level, line) => this.d.serverLog({ ...ref, deploymentId }, level, line) });
  }

  private async warm(served: Served, log: (level: string, text: string) => Promise<void>): Promise<void> {
    const t0 = performance.now();
    let res: Response;
    try {
      // A path no app has: the framework's not-found page, which calls none of the app's backends.
      res = await served.server!.fetch(new Request(`http://${served.frontend.name}--${served.frontend.project_id}.localhost/_kiln/warm-up`, { headers: { "user-agent": "kiln-warm-up" } }));
      await res.arrayBuffer().catch(() => {});
    } catch (err) {
      await served.server!.stop().catch(() => {});
      throw new FrontendBuildError(`the server did not start: ${(err as Error).message}`);
    }
    if (res.status >= 500) {
      await served.server!.stop().catch(() => {});
      throw new FrontendBuildError(`the server did not start: its first request answered ${res.status}`);
    }
    await log("info", `server started and answering (${Math.round(performance.now() - t0)} ms)`);
  }

  /** Points the frontend's address at `served`; the previous deployment retires after keepPreviousMs. */
  private switchTo(served: Served): void {
    const key = `${served.frontend.project_id}/${served.frontend.name}`;
    const previous = this.serving.get(key);
    this.serving.set(key, served);
    if (previous && previous.deploymentId !== served.deploymentId) {
      // Its WebSockets close now (1012: service restart), so clients reconnect to the new deployment;
      // its HTTP requests in flight finish where they began.
      closeSockets(previous, 1012, "the site was redeployed: reconnect");
      this.retire(previous, this.d.keepPreviousMs);
    }
  }

  private retire(s: Served, afterMs: number): void {
    const go = async () => {
      this.retirements.delete(go);
      await s.server?.stop().catch(() => {});
      await removeDir(this.deploymentDir(s.deploymentId));
    };
    this.retirements.add(go);
    const t = setTimeout(() => {
      this.retiring.delete(t);
      void go();
    }, afterMs);
    t.unref?.();
    this.retiring.add(t);
  }

  private async runDelete(f: FrontendRecord, dep: DeploymentRecord): Promise<void> {
    const key = `${f.project_id}/${f.name}`;
    const s = this.serving.get(key);
    this.serving.delete(key);
    this.onDetach?.(f.id);
    if (s) {
      closeSockets(s, 1001, "the frontend was deleted");
      await s.server?.stop().catch(() => {});
      await removeDir(this.deploymentDir(s.deploymentId));
    }
    const rows = await this.d.store.query(`select id from frontend_deployments where frontend_id = $1`, [f.id]);
    for (const r of rows) {
      await this.blobs.delete(r.id as string).catch(() => {});
      await removeDir(this.deploymentDir(r.id as string));
    }
    await this.d.store.transaction(async (tx) => {
      const done = this.now();
      await tx.query(`delete from frontend_domains where frontend_id = $1`, [f.id]);
      await this.code?.removeFrontend(tx, f.id);
      await tx.query(`update frontend_deployments set status = 'succeeded', started_at = coalesce(started_at, $2), finished_at = $2 where id = $1`, [dep.id, done]);
      await tx.query(`update frontends set status = 'deleted', serving_deployment_id = null, pending_deployment_id = null, updated_at = $2 where id = $1`, [f.id, done]);
    });
  }

  /** Set by the domains service: a deleted frontend's custom domain leaves the TLS listener. */
  onDetach: ((frontendId: string) => void) | null = null;

  /** Every project frontend goes (project deletion): queued work superseded, then removed. */
  async removeAll(projectId: string): Promise<void> {
    const rows = await this.d.store.query(`select * from frontends where project_id = $1 and status <> 'deleted'`, [projectId]);
    for (const r of rows) {
      const f = frontendOf(r);
      await this.runners.get(f.id);
      await this.d.store.query(`update frontend_deployments set status = 'superseded', finished_at = $2 where frontend_id = $1 and status in ('queued', 'building')`, [f.id, this.now()]);
      await this.runDelete(f, { id: newId() } as DeploymentRecord);
    }
  }

  /** At start: serve what served, and run what was queued (a deployment interrupted mid-build runs again). */
  async resume(): Promise<void> {
    // A build this instance (its data dir) was running when it stopped runs again; with several
    // instances (production profile) another one's build is left to it.
    await this.d.store.query(`update frontend_deployments set status = 'queued', started_at = null where status = 'building' and ($1::text is null or builder = $1 or builder is null)`, [
      this.d.shared?.instanceId ?? null,
    ]);
    const rows = await this.d.store.query(
      `select f.*, d.result from frontends f join frontend_deployments d on d.id = f.serving_deployment_id where f.status not in ('deleted') and f.serving_deployment_id is not null`,
    );
    for (const r of rows) {
      const f = frontendOf(r);
      try {
        this.switchTo(await this.load(f, r.result));
      } catch (err) {
        this.d.log.error(`frontend ${f.name}: its deployment ${f.serving_deployment_id} cannot serve (redeploy it)`, err);
        await this.d.store.query(`update frontends set status = 'degraded' where id = $1`, [f.id]);
      }
    }
    const queued = await this.d.store.query(`select distinct frontend_id from frontend_deployments where status = 'queued'`);
    for (const q of queued) this.kick(q.frontend_id as string);
    if (this.d.shared) {
      this.syncTimer = setInterval(() => {
        if (this.syncing || this.aborts.signal.aborted) return;
        this.syncing = this.sync()
          .catch((err) => this.d.log.error("frontends: syncing with the other instances failed", err))
          .finally(() => (this.syncing = null));
      }, this.d.shared.pollMs);
      this.syncTimer.unref?.();
    }
  }

  /** The serving deployment of a frontend, from its folder here (unpacked from the control store when another instance built it). */
  private async load(f: FrontendRecord, rawResult: unknown): Promise<Served> {
    const result = (typeof rawResult === "string" ? JSON.parse(rawResult) : rawResult) as FrontendBuildResult;
    const outDir = this.deploymentDir(f.serving_deployment_id!);
    if (this.code && !(await this.code.unpackBuilt(f.serving_deployment_id!, outDir))) throw new Error(`deployment ${f.serving_deployment_id} is neither here nor in the control store`);
    const site: ServedSite = { dir: join(outDir, result.staticDir), manifest: await readManifest(join(outDir, result.staticDir)), spaFallback: result.kind === "static" };
    return { frontend: { id: f.id, name: f.name, project_id: f.project_id }, deploymentId: f.serving_deployment_id!, site, result, server: await this.startServer(outDir, result, f, f.serving_deployment_id!), sockets: new Set() };
  }

  /**
   * Production profile, every `pollMs`: what the other instances switched, this one serves too (the
   * built folder unpacked from the control store), what they deleted it stops serving, and a queued
   * deployment that no instance runs (its runner ended just as it was queued elsewhere) is started.
   */
  private async sync(): Promise<void> {
    const rows = await this.d.store.query(
      `select f.*, d.result from frontends f join frontend_deployments d on d.id = f.serving_deployment_id where f.status <> 'deleted' and f.serving_deployment_id is not null`,
    );
    const live = new Set<string>();
    for (const r of rows) {
      const f = frontendOf(r);
      const key = `${f.project_id}/${f.name}`;
      live.add(key);
      // This instance's own runner switches it itself.
      if (this.runners.has(f.id) || this.serving.get(key)?.deploymentId === f.serving_deployment_id || this.unloadable.has(f.serving_deployment_id!)) continue;
      try {
        const served = await this.load(f, r.result);
        if (this.aborts.signal.aborted) return void (await served.server?.stop().catch(() => {}));
        this.switchTo(served);
      } catch (err) {
        this.unloadable.add(f.serving_deployment_id!);
        this.d.log.error(`frontend ${f.name}: deployment ${f.serving_deployment_id}, switched to by another instance, cannot serve here`, err);
      }
    }
    for (const [key, s] of [...this.serving]) {
      if (live.has(key) || this.runners.has(s.frontend.id)) continue;
      this.serving.delete(key);
      this.onDetach?.(s.frontend.id);
      closeSockets(s, 1001, "the frontend was deleted");
      await s.server?.stop().catch(() => {});
      await removeDir(this.deploymentDir(s.deploymentId));
    }
    const idle = await this.d.store.query(
      `select distinct q.frontend_id from frontend_deployments q where q.status = 'queued' and not exists (select 1 from frontend_deployments b where b.frontend_id = q.frontend_id and b.status = 'building')`,
    );
    for (const q of idle) this.kick(q.frontend_id as string);
  }

  /** Stopping begins: open WebSockets close (1001) before Kiln's listener waits for what is in flight. */
  closing(): void {
    for (const s of this.serving.values()) closeSockets(s, 1001, "Kiln is stopping");
  }

  /** Stopping: builds end (their deployments run again at the next start); servers stop. */
  async drain(): Promise<void> {
    this.closing();
    if (this.syncTimer) clearInterval(this.syncTimer);
    await this.syncing;
    this.aborts.abort();
    await Promise.allSettled([...this.runners.values()]);
    for (const t of this.retiring) clearTimeout(t);
    this.retiring.clear();
    await Promise.allSettled([...this.serving.values()].map((s) => s.server?.stop()));
    await Promise.allSettled([...this.retirements].map((go) => go()));
    await closeFrameworks().catch((e) => this.d.log.error("frontends: stopping the Next.js servers failed", e));
  }

  /** Waits for the frontend's queued and running deployments (tests, the CLI's --wait use polling instead). */
  async settled(frontendId: string): Promise<void> {
    await this.runners.get(frontendId);
  }
}

function closeSockets(s: Served, code: number, reason: string): void {
  for (const socket of [...s.sockets]) socket.close(code, reason);
}
