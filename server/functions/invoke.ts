import { posix } from "node:path";
import type { ApplicationPrincipal, AuthRule, Principal } from "../auth/principal";
import type { Config } from "../config";
import type { Logger } from "../log";
import type { ListeningAddress } from "../platform";
import { forbidden, HttpError } from "../http/errors";
import { newId } from "../ids";
import type { FunctionError, FunctionVersion, LogLine, WorkerPool } from "../../runtime-sandbox/worker-pool";
import type { LogIngest } from "../logs/ingest";
import type { MetricsService } from "../metrics/service";
import type { FunctionBuildConfig } from "./archive";
import type { VariablesService, VariablesSnapshot } from "../variables/service";
import type { FunctionsService } from "./service";
import type { FunctionRecord } from "./records";

/** What running an invocation uses (the functions area provides the last three). */
export interface InvokeDeps {
  config: Config;
  log: Logger;
  address: ListeningAddress;
  variables: VariablesService;
  functions: FunctionsService;
  /** The sandboxed worker pool, made on first use. */
  functionPool(): Promise<WorkerPool>;
  /** Where invocation lines go (the logs area's ingest: buffered, never a store write per call). */
  logs: { ingest: LogIngest };
  /** Where finished invocations are counted (in memory, per minute). */
  metrics: Pick<MetricsService, "record">;
}

/** Headers only the platform sets; a function's own copies are dropped, as are hop-by-hop ones. */
const PLATFORM_OWNED = new Set([
  "x-service-version",
  "x-service-region",
  "x-service-health",
  "x-service-function-invoked",
  "x-service-proxy-ms",
  "x-service-proxy-handler-ms",
  "x-service-compute-ms",
  "connection",
  "keep-alive",
  "transfer-encoding",
  "content-length",
  "upgrade",
]);

const FAILURE_KINDS = new Set(["timeout", "crash", "out_of_memory", "runtime_missing", "init_error", "sandbox_unavailable"]);

/** The pool is loaded lazily, so its error class is recognized by shape, not by instanceof. */
function isFunctionError(err: unknown): err is FunctionError {
  return err instanceof Error && FAILURE_KINDS.has((err as { kind?: string }).kind ?? "") && Array.isArray((err as { logs?: unknown }).logs);
}

/**
 * Who may invoke (the spec's token rules 1-3): the application-credential rule checks the kind of
 * credential and the functions.invoke permission of scoped service keys and anon keys; the RPC route,
 * the function's own address and name resolution all use it.
 */
export const INVOKE_AUTH = {
  kind: "application",
  permission: "functions.invoke",
  refused: "invoking a function needs a service key, an end-user access token or an anon key",
} as const satisfies AuthRule;

/** The end user's identity as handlers receive it (`__service_auth` in the event), for user principals. */
export function withIdentity(principal: Principal | null, payload: unknown): unknown {
  if (principal?.kind === "user" && (payload === undefined || (typeof payload === "object" && payload !== null && !Array.isArray(payload)))) {
    return {
      ...((payload as object) ?? {}),
      __service_auth: { user_id: principal.userId, email: principal.email, project_id: principal.projectId, role: principal.role, access_token: principal.accessToken },
    };
  }
  return payload;
}

/** What depends on the function itself: anon keys reach public functions only. */
export function mayInvoke(p: ApplicationPrincipal, fn: FunctionRecord): void {
  if (p.kind === "anon_key" && !fn.is_public) throw forbidden("anon keys may only invoke public functions");
}

function failure(err: FunctionError, invocationId: string): HttpError {
  // No sandbox here: the message names the fix, with nothing to prefix.
  if (err.kind === "sandbox_unavailable") return new HttpError(503, { error: err.message }, { "X-Service-Invocation-Id": invocationId });
  const status = err.kind === "timeout" ? 504 : err.kind === "runtime_missing" ? 503 : 502;
  const what =
    err.kind === "timeout"
      ? "the function timed out"
      : err.kind === "out_of_memory"
        ? "the function ran out of memory"
        : err.kind === "init_error"
          ? "the function failed to start"
          : err.kind === "runtime_missing"
            ? "the function's runtime is not available"
            : "the function crashed";
  return new HttpError(status, { error: `${what}: ${err.message}` }, { "X-Service-Invocation-Id": invocationId });
}

/**
 * A function's environment: the project's variables plus PYTHONPATH. Built once per variables
 * snapshot (i.e. once per change of the project's variables) and shared by every function of the
 * project with the same PYTHONPATH, never per invocation.
 */
const envs = new WeakMap<VariablesSnapshot, Map<string, Record<string, string>>>();

function envOf(vars: VariablesSnapshot, pythonPath: string): Record<string, string> {
  let byPath = envs.get(vars);
  if (!byPath) envs.set(vars, (byPath = new Map()));
  let env = byPath.get(pythonPath);
  if (!env) byPath.set(pythonPath, (env = { ...vars.values, PYTHONPATH: pythonPath }));
  return env;
}

/**
 * What the pool is given for a function version. Kept per function record (itself cached for up to
 * 2 s) and rebuilt when the record, its build or the project's variables snapshot are other objects;
 * a rebuild reuses the environment object, and the pool tells a changed environment by `envVersion`
 * (the snapshot's revision), so neither side ever compares or copies the variables per call.
 */
const versions = new WeakMap<FunctionRecord, { build: FunctionBuildConfig; vars: VariablesSnapshot; version: FunctionVersion }>();

function versionOf(deps: Pick<InvokeDeps, "config" | "functions">, fn: FunctionRecord, deploymentId: string, build: FunctionBuildConfig, vars: VariablesSnapshot): FunctionVersion {
  const hit = versions.get(fn);
  if (hit && hit.build === build && hit.vars === vars) return hit.version;
  const region = deps.config.regions[0]!;
  const root = build.function_root === "." ? "" : `${build.function_root}/`;
  const pythonPath = [build.function_root, posix.join(build.install_root, "python_deps")].join(":");
  const version: FunctionVersion = {
    key: `${fn.id}:${deploymentId}:${region}`,
    functionName: fn.name,
    region,
    runtime: fn.runtime,
    codeDir: deps.functions.deploymentRoot(fn.id, deploymentId),
    entry: `${root}${build.entry}`,
    handler: fn.handler,
    env: envOf(vars, pythonPath),
    envVersion: `${vars.revision}:${pythonPath}`,
    limits: { memoryMb: deps.config.functionMemoryMb, timeoutMs: deps.config.functionTimeoutMs, cpuSeconds: deps.config.functionCpuSeconds },
    network: false,
  };
  versions.set(fn, { build, vars, version });
  return version;
}

/** What the pool runs for the function's active deployment (a 409 when it has none). */
export async function activeVersion(deps: Pick<InvokeDeps, "config" | "functions" | "variables">, fn: FunctionRecord): Promise<{ version: FunctionVersion; deploymentId: string }> {
  const deploymentId = fn.active_deployment_id;
  if (!deploymentId) throw new HttpError(409, { error: `the function has no successful deployment yet (status ${fn.status})` });
  // Warm invocations find both in memory; the awaits are only for a miss.
  const build = deps.functions.cachedBuildConfig(deploymentId) ?? (await deps.functions.buildConfig(deploymentId));
  if (!build?.entry) throw new HttpError(409, { error: "the function's deployment has no entry file" });
  const vars = deps.variables.cachedSnapshot(fn.project_id) ?? (await deps.variables.snapshot(fn.project_id));
  // Code another instance built is unpacked here once (production profile); null when it is here.
  const code = deps.functions.codeReady(fn.id, deploymentId);
  if (code) await code;
  return { version: versionOf(deps, fn, deploymentId, build, vars), deploymentId };
}

/**
 * Runs one invocation of the function's active deployment and answers with what the function
 * returned, plus the platform's timing headers.
 */
export async function invoke(
  deps: InvokeDeps,
  fn: FunctionRecord,
  principal: Principal | null,
  payload: unknown,
  arrivedAt: number,
  handlerStart: number,
  opts: { head?: boolean } = {},
): Promise<Response> {
  const { version, deploymentId } = await activeVersion(deps, fn);
  const region = deps.config.regions[0]!;
  const invocationId = newId();
  const event = withIdentity(principal, payload);
  const started = performance.now();
  let logs: LogLine[] = [];
  let status = 0;
  /** What the finish line tells of the run beyond its status (the console's invocation timeline reads it). */
  let detail = "";
  try {
    const out = await (await deps.functionPool()).invoke(version, event, { invocationId });
    logs = out.logs;
    status = out.status;
    detail = `, ${out.coldStart ? `new worker started in ${(out.initMs ?? 0).toFixed(1)} ms` : "worker reused"}, compute ${out.computeMs.toFixed(1)} ms`;
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(out.headers)) if (!PLATFORM_OWNED.has(k.toLowerCase())) headers[k] = v;
    headers["X-Service-Proxy-Ms"] = String(Math.round(started - arrivedAt));
    headers["X-Service-Proxy-Handler-Ms"] = String(Math.round(started - handlerStart));
    headers["X-Service-Compute-Ms"] = String(Math.round(out.computeMs));
    headers["X-Service-Invocation-Id"] = invocationId;
    return new Response(opts.head ? null : (out.body as BodyInit), { status: out.status, headers });
  } catch (err) {
    if (isFunctionError(err)) {
      logs = err.logs;
      const e = failure(err, invocationId);
      status = e.status;
      logs = [...logs, { level: "error", message: String((e.body as { error?: string }).error), at: Date.now() }];
      throw e;
    }
    status = 500;
    throw err;
  } finally {
    const ms = performance.now() - started;
    // Counted at finish, with the whole time Kiln spent on the request (from its arrival).
    deps.metrics.record(fn.project_id, "function", region, status, performance.now() - arrivedAt);
    try {
      deps.logs.ingest.invocation(fn, deploymentId, region, invocationId, [
        ...logs,
        { level: status >= 500 ? "error" : "info", message: `invocation ${invocationId} finished with status ${status} in ${ms.toFixed(1)} ms (proxy ${(started - arrivedAt).toFixed(1)} ms${detail})`, at: Date.now() },
      ]);
    } catch (e) {
      deps.log.error("recording function logs failed", e);
    }
  }
}
