import { join } from "node:path";
import { dataDirId } from "../store/data-dir-id";
import { chooseIsolation, noSandboxMessage } from "../../runtime-sandbox/isolation";
import type { WorkerPool } from "../../runtime-sandbox/worker-pool";
import { defineArea } from "../area";
import type { Config } from "../config";
import type { Logger } from "../log";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import type { LogsService } from "../logs/service";
import type { MetricsService } from "../metrics/service";
import type { VariablesService } from "../variables/service";
import { matchFunctionHost, matchFunctionPath, serveFunctionHost } from "./http-mode";
import { moveLegacyLogs } from "./legacy-logs";
import { FUNCTIONS_MIGRATIONS } from "./migrations";
import { functionRoutes } from "./routes";
import { FunctionsService } from "./service";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log" | "address"> & { projects: ProjectsService; variables: VariablesService; logs: LogsService; metrics: MetricsService };

/**
 * Standard functions: deploys and builds, and invocations on warm sandboxed workers (local
 * processes, or containers with `--function-runtime docker`). Kiln's own data dir is never
 * visible to function code.
 */
export const functionsArea = defineArea({
  name: "functions",
  migrations: FUNCTIONS_MIGRATIONS,
  start: async ({ store, config, clock, log, logs }: Needs) => {
    // The container engine, when asked for, is checked now: a wrong socket should fail the start.
    const containers = config.functionRuntime === "docker" ? await connectContainerEngine(config, log) : null;
    const sandbox = { want: config.functionSandbox, allowUnsandboxed: config.allowUnsandboxedFunctions };
    // Made at the first invocation: a Kiln that runs no functions never pays for the sandbox.
    let pool: Promise<WorkerPool> | null = null;
    const functionPool = () =>
      (pool ??= import("../../runtime-sandbox/worker-pool").then(
        (m) => new m.WorkerPool({ hiddenPaths: [config.dataDir], containers: containers ?? undefined, sandbox: sandbox.want, allowUnsandboxed: sandbox.allowUnsandboxed, initTimeoutMs: config.functionInitTimeoutMs, log: (msg) => log.warn(msg) }),
      ));
    const functions = new FunctionsService({
      store,
      now: () => clock.now(),
      blobDir: join(config.dataDir, "blobs", "functions"),
      codeDir: join(config.dataDir, "functions"),
      maxFunctions: () => config.maxFunctions,
      build: { hiddenPaths: [config.dataDir], sandbox, containers: containers ?? undefined },
      // With containers a deploy is accepted; a build that needs a local sandbox and finds none fails
      // with the same message (builds run on this host).
      sandboxProblem: () => {
        if (containers) return null;
        const c = chooseIsolation(sandbox);
        return c.isolation ? null : noSandboxMessage(c.problems);
      },
      // Pool keys are `<function>:<deployment>:<region>`; no pool yet means no worker ever ran.
      retireWorkers: async (functionId, keep) => void (pool && (await (await pool).retire(`${functionId}:`, keep ? `${functionId}:${keep}:` : undefined))),
      log,
      buildLogs: {
        line: (ref, level, text) => logs.ingest.build(ref, config.regions[0]!, level, text),
        flush: () => logs.ingest.flush(),
        summaries: (ids) => logs.buildSummaries(ids),
      },
      // Several instances may share the PostgreSQL store, each with its own data dir (docs/functions.md).
      shared:
        store.kind === "postgres"
          ? { instanceId: dataDirId(join(config.dataDir, "functions")), leaseMs: Number(process.env.KILN_DEPLOY_LEASE_MS ?? 30_000), pollMs: Number(process.env.KILN_DEPLOY_POLL_MS ?? 1000) }
          : null,
    });
    const functionRuntime = {
      containers,
      sandbox,
      async close() {
        await (await pool)?.close();
        await containers?.settle();
        if (containers) (await import("../../runtime-sandbox/runtimes")).setRuntimeImageResolver(null);
      },
    };
    return { functions, functionPool, functionRuntime };
  },
  routes: functionRoutes,
  hostRouter: (deps, guard) => (request, m) => {
    const target = matchFunctionHost(request.headers.get("host"), deps.config.functionsDomain) ?? matchFunctionPath(new URL(request.url).pathname);
    return target ? serveFunctionHost(deps, guard, request, m.ip, m.arrivedAt, target) : null;
  },
  project: { cleanup: (projectId, { functions }) => functions.removeAll(projectId) },
  resume: async ({ functions, functionRuntime, log, store, logs, config }) => {
    // Logs kept by earlier versions in this area's tables move to the log store (builds first).
    const moved = await moveLegacyLogs(store, logs, config.regions[0]!);
    void moved.runtime.catch((e) => log.error("moving earlier invocation logs failed", e));
    await functions.resume();
    // Say at start how function code is isolated. The probes spawn a sandbox (blocking, tens of ms of
    // CPU): a second after start, so they never hold up the first /healthz.
    if (!functionRuntime.containers) {
      setTimeout(() => {
        const c = chooseIsolation(functionRuntime.sandbox);
        if (!c.isolation) log.warn(noSandboxMessage(c.problems).replace("function code cannot run here", "functions and builds will be refused (503)"));
        else if (c.isolation.kind === "none") log.warn(`functions are NOT sandboxed: ${c.isolation.description}`);
        else log.info(`functions are sandboxed: ${c.isolation.description}`);
      }, 1000).unref?.();
    }
  },
  drain: ({ functions }) => functions.drain(),
  stop: async ({ functionRuntime }) => {
    await functionRuntime.close();
  },
});


async function connectContainerEngine(config: Config, log: Logger) {
  const { ContainerEngine } = await import("../../runtime-sandbox/container");
  const engine = await ContainerEngine.connect({ host: config.dockerHost, image: config.functionImage, hiddenPaths: [config.dataDir], log: (m) => log.info(m) });
  log.info(`functions run in containers: ${engine.describe()}`);
  // --runtime-image names resolve to their image on this engine.
  const { setRuntimeImageResolver } = await import("../../runtime-sandbox/runtimes");
  setRuntimeImageResolver((name, kind, version, image) => engine.runtimeFromImage(name, kind, version, image));
  return engine;
}
