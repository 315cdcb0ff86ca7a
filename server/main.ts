import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { accessTokenRoutes } from "./access-tokens/routes";
import { AccessTokensService } from "./access-tokens/service";
import { TokenUsage } from "./access-tokens/usage";
import { accountRoutes } from "./accounts/routes";
import { AccountsService } from "./accounts/service";
import { Credentials } from "./auth/credentials";
import { Guard } from "./auth/guard";
import { clock } from "./clock";
import { closeDataDir, lockDataDir, openCodeToSandboxUid } from "./data-dir";
import { takeFault, type Config } from "./config";
import type { Kiln } from "./context";
import { healthRoutes } from "./health/routes";
import { openApiRoutes } from "./http/openapi";
import { Router } from "./http/route";
import { renderError, serveHttp } from "./http/server";
import { keyRoutes } from "./keys/routes";
import { KeysService } from "./keys/service";
import { createLogger, type Logger } from "./log";
import { projectRoutes } from "./projects/routes";
import { ProjectsService } from "./projects/service";
import { openControlStore } from "./store/open-store";
import { variableRoutes } from "./variables/routes";
import type { MailCatcher } from "../emulators/mail/catcher";
import { createSmtpMailer } from "../emulators/mail/mailer";
import { AuthConfigService } from "./end-users/config";
import { AuthRateLimits } from "./end-users/rate-limits";
import { endUserRoutes } from "./end-users/routes";
import { EndUsersService } from "./end-users/service";
import { SigningKeys } from "./end-users/signing-keys";
import { mailCatcherRoutes } from "./emulators/mail-routes";
import { clockRoutes } from "./testing/clock-routes";
import { EmbeddedEngine } from "./backends/databases/embedded";
import type { DatabaseEngine } from "./backends/databases/engine";
import { startWireListener } from "./backends/databases/wire/listener";
import { DatabaseActivity } from "./databases/activity";
import { databaseRoutes } from "./databases/routes";
import { DatabasesService } from "./databases/service";
import { DatabaseWireRouter } from "./databases/wire-router";
import type { WorkerPool } from "../runtime-sandbox/worker-pool";
import { chooseIsolation, hideOwnProcEntries, noSandboxMessage } from "../runtime-sandbox/isolation";
import { FunctionLogs } from "./functions/invoke";
import { matchFunctionHost, serveFunctionHost } from "./functions/http-mode";
import { functionRoutes } from "./functions/routes";
import { FunctionsService } from "./functions/service";
import { VariablesService } from "./variables/service";

export interface RunningKiln {
  url: string;
  port: number;
  kiln: Kiln;
  stop(): Promise<void>;
}

/** `KILN_TRACE_STARTUP=1` prints how long each start-up phase took (bench/startup uses it). */
function startupTrace() {
  const on = process.env.KILN_TRACE_STARTUP === "1";
  let last = performance.now();
  return (phase: string) => {
    if (!on) return;
    const now = performance.now();
    console.error(`startup: ${phase} +${Math.round(now - last)} ms (${Math.round(now)} ms since process start)`);
    last = now;
  };
}

let smtpAddress = "";

/** Every area's routes, in the order the OpenAPI document lists them. */
export function buildRouter(config: Config, kiln?: Kiln): Router {
  const router = new Router();
  healthRoutes(router);
  accountRoutes(router);
  projectRoutes(router);
  accessTokenRoutes(router);
  keyRoutes(router);
  variableRoutes(router);
  endUserRoutes(router);
  databaseRoutes(router);
  functionRoutes(router);
  mailCatcherRoutes(
    router,
    () => kiln?.mailCatcher ?? null,
    () => smtpAddress,
  );
  clockRoutes(router, config.controllableClock);
  openApiRoutes(router, { fetchLimit: config.openapiFetchLimit, now: () => clock.nowMs() });
  return router;
}

/** A start that fails half way releases what it took, and says which port is taken. */
export async function startKiln(config: Config, out: { print: (line: string) => void; log?: Logger } = { print: console.log }): Promise<RunningKiln> {
  const undo: (() => unknown)[] = [];
  try {
    return await boot(config, out, undo);
  } catch (err) {
    for (const u of undo.reverse()) await Promise.resolve().then(u).catch(() => {});
    const e = err as { code?: string; message?: string; port?: number };
    if (e?.code === "EADDRINUSE" || /EADDRINUSE|address already in use/i.test(e?.message ?? "")) {
      const pg = (e.message ?? "").includes(`:${config.pgPort}`) && config.pgPort !== config.port;
      throw new Error(
        pg
          ? `the PostgreSQL wire port ${config.pgPort} is in use (another Kiln?); pass --pg-port N, or --pg-port 0 for a free one`
          : `port ${config.port} is in use (another Kiln?); pass --port N, or --port 0 for a free one`,
      );
    }
    throw err;
  }
}

async function boot(config: Config, out: { print: (line: string) => void; log?: Logger }, undo: (() => unknown)[]): Promise<RunningKiln> {
  const log = out.log ?? createLogger();
  const trace = startupTrace();
  if (config.ephemeral) {
    config.dataDir = mkdtempSync(join(tmpdir(), "kiln-ephemeral-"));
    const dir = config.dataDir;
    undo.push(() => rmSync(dir, { recursive: true, force: true }));
  }
  mkdirSync(config.dataDir, { recursive: true });
  closeDataDir(config);
  const unlock = lockDataDir(config.dataDir);
  undo.push(unlock);
  // Processes of Kiln's own uid (function code without a sandbox, say) cannot read its environment
  // (KILN_PLATFORM_TOKEN, KILN_ADMIN_TOKEN) or memory through /proc.
  hideOwnProcEntries();
  const now = () => clock.now();

  // The mail catcher (smtp-server) loads and binds while the control store opens.
  const catcherReady: Promise<{ catcher: MailCatcher; host: string; port: number }> | null = config.smtpUrl
    ? null
    : import("../emulators/mail/catcher").then(async ({ MailCatcher }) => {
        const catcher = new MailCatcher();
        const smtp = await catcher.start({ host: "127.0.0.1", port: config.smtpPort });
        undo.push(() => catcher.stop());
        return { catcher, ...smtp };
      });
  catcherReady?.catch(() => {}); // awaited below; this only keeps an early failure from going unhandled
  const store = await openControlStore({ dataDir: config.dataDir, databaseUrl: config.databaseUrl });
  undo.push(() => store.close());
  trace("control store open");
  const credentials = new Credentials(store, config, () => clock.nowMs());
  const usage = new TokenUsage(store, now, log);
  const kiln = { config, clock, log, store, credentials, usage } as Kiln;
  kiln.http = { renderError: (err, req) => renderError(kiln, err, req) };
  kiln.accounts = new AccountsService(store, now);
  kiln.projects = new ProjectsService(store, config, now, (id) => credentials.evictProject(id), log);
  kiln.tokens = new AccessTokensService(store, config, now, usage, (id) => credentials.evict((p) => "tokenId" in p && p.tokenId === id));
  kiln.keys = new KeysService(store, now, (id) => credentials.evict((p) => "keyId" in p && p.keyId === id));
  kiln.variables = new VariablesService(store, now, Number(process.env.KILN_VARIABLE_PROPAGATION_MS ?? 200));
  kiln.guard = new Guard(kiln);

  // Email: over SMTP to the built-in catcher, or to a real server when KILN_SMTP_URL is set.
  if (!catcherReady) {
    kiln.mailCatcher = null;
    kiln.mailer = createSmtpMailer({ url: config.smtpUrl!, from: config.mailFrom });
  } else {
    const smtp = await catcherReady;
    kiln.mailCatcher = smtp.catcher;
    smtpAddress = `${smtp.host}:${smtp.port}`;
    log.info(`mail catcher: SMTP on ${smtpAddress}, messages at /_emulators/mail`);
    kiln.mailer = createSmtpMailer({ url: `smtp://${smtpAddress}`, from: config.mailFrom });
  }
  kiln.authConfig = new AuthConfigService(store, now);
  kiln.authLimits = new AuthRateLimits(() => clock.nowMs());
  kiln.signingKeys = new SigningKeys(store, now);
  kiln.endUsers = new EndUsersService({
    store,
    now,
    keys: kiln.signingKeys,
    config: kiln.authConfig,
    sendMail: (m) => void kiln.mailer.send(m).catch((e) => log.error(`sending mail to ${m.to} failed`, e)),
    publicUrl: () => kiln.publicUrl,
    evictSession: (id) => credentials.evict((p) => p.kind === "user" && p.sessionId === id),
  });
  credentials.userTokens = (jwt) => kiln.endUsers.principalOf(jwt);

  // Managed databases: the engine, and the wire listener every connection string points at.
  let engine: DatabaseEngine;
  if (config.postgresUrl) {
    const { PostgresEngine } = await import("./backends/databases/production");
    const pg = new PostgresEngine(config.postgresUrl);
    await pg.init();
    engine = pg;
  } else {
    engine = new EmbeddedEngine({ dir: join(config.dataDir, "databases"), maxOpen: config.dbMaxOpen, memoryBudgetMb: config.dbMemoryBudgetMb, idleCloseMs: config.dbIdleCloseMs, idleInTransactionTimeoutMs: config.dbIdleInTransactionTimeoutMs });
  }
  undo.push(() => engine.close());
  const activity = new DatabaseActivity(store, now, log);
  let wireAddress = { host: config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host, port: 0 };
  kiln.databases = new DatabasesService(store, engine, now, activity, () => wireAddress, log, (name) => takeFault(config, name));
  const wire = await startWireListener({
    host: config.host,
    port: config.pgPort,
    router: new DatabaseWireRouter(kiln.databases, store),
    onError: (e) => log.error("database wire listener", e),
  });
  wireAddress = { ...wireAddress, port: wire.port };
  undo.push(() => wire.close());
  activity.start();

  // Functions: warm sandboxed workers; Kiln's own data dir is never visible to them.
  // Made at the first invocation: a Kiln that runs no functions never pays for the sandbox. The
  // container engine, when asked for, is checked now: a wrong socket should fail the start.
  const containers = config.functionRuntime === "docker" ? await connectContainerEngine(config, log) : null;
  const sandbox = { want: config.functionSandbox, allowUnsandboxed: config.allowUnsandboxedFunctions };
  /** Why user code cannot run here (no sandbox, none allowed), or null. */
  const sandboxProblem = () => {
    const c = chooseIsolation(sandbox);
    return c.isolation ? null : noSandboxMessage(c.problems);
  };
  let pool: Promise<WorkerPool> | null = null;
  kiln.functionPool = () =>
    (pool ??= import("../runtime-sandbox/worker-pool").then(
      (m) =>
        new m.WorkerPool({
          hiddenPaths: [config.dataDir],
          containers: containers ?? undefined,
          sandbox: sandbox.want,
          allowUnsandboxed: sandbox.allowUnsandboxed,
          log: (msg) => log.warn(msg),
        }),
    ));
  undo.push(async () => {
    await (await pool)?.close();
    await containers?.settle();
  });
  kiln.functionLogs = new FunctionLogs(store, log);
  kiln.functions = new FunctionsService({
    store,
    now,
    blobDir: join(config.dataDir, "blobs", "functions"),
    codeDir: join(config.dataDir, "functions"),
    maxFunctions: () => config.maxFunctions,
    build: { hiddenPaths: [config.dataDir], sandbox },
    // With containers a deploy is accepted; a build that needs a local sandbox and finds none fails
    // with the same message (builds run on this host).
    sandboxProblem: () => (containers ? null : sandboxProblem()),
    retireWorkers: async (functionId, keep) => {
      const deps = await store.query<{ id: string }>(`select id from function_deployments where function_id = $1`, [functionId]);
      if (!pool) return; // no worker has ever run
      const p = await pool;
      for (const d of deps) if (d.id !== keep) await p.retire(`${functionId}:${d.id}:`);
    },
    log,
  });

  // What a project owns, set up with it and removed with it.
  kiln.projects.registerSetup((tx, projectId) => kiln.keys.createAnonKey(projectId, { name: "default" }, tx).then(() => {}));
  kiln.projects.registerCleanup("keys", (id) => kiln.keys.removeAll(id));
  kiln.projects.registerSetup((tx, projectId) => kiln.signingKeys.create(projectId, tx).then(() => {}));
  kiln.projects.registerCleanup("variables", (id) => kiln.variables.removeAll(id));
  kiln.projects.registerCleanup("functions", (id) => kiln.functions.removeAll(id));
  kiln.projects.registerCleanup("databases", (id) => kiln.databases.removeAll(id));
  kiln.projects.registerCleanup("end users", (id) => kiln.endUsers.removeAll(id));
  kiln.projects.registerCleanup("auth settings", async (id) => {
    await kiln.authConfig.remove(id);
    await kiln.signingKeys.removeAll(id);
  });

  await kiln.accounts.ensureDefault(config, out.print);
  await kiln.variables.settlePending();
  await kiln.projects.resumeDeletions();
  await kiln.databases.resumeProvisioning();
  await kiln.functions.resume();
  usage.start();
  const sampler = setInterval(() => void kiln.databases.sampleStorage().catch((e) => log.error("database storage sampling failed", e)), 60_000);
  sampler.unref?.();
  trace("state ready");

  // Function addresses are routed by host name before the path routes.
  const server = serveHttp(kiln, buildRouter(config, kiln), (request, m) => {
    const target = matchFunctionHost(request.headers.get("host"), config.functionsDomain);
    return target ? serveFunctionHost(kiln, request, m.ip, m.arrivedAt, target) : null;
  });
  trace("listening");
  openCodeToSandboxUid(config);
  // Say at start how function code is isolated (the probes take a few ms, after listening).
  if (!containers) {
    setTimeout(() => {
      const c = chooseIsolation(sandbox);
      if (!c.isolation) log.warn(noSandboxMessage(c.problems).replace("function code cannot run here", "functions and builds will be refused (503)"));
      else if (c.isolation.kind === "none") log.warn(`functions are NOT sandboxed: ${c.isolation.description}`);
      else log.info(`functions are sandboxed: ${c.isolation.description}`);
    }, 0).unref?.();
  }
  const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${server.port}`;
  kiln.publicUrl = config.publicUrl ?? url;
  kiln.httpPort = server.port!;

  let stopping: Promise<void> | null = null;
  const stop = () =>
    (stopping ??= (async () => {
      await server.stop(false); // stop accepting; in-flight requests finish
      await kiln.projects.drain();
      clearInterval(sampler);
      await wire.close().catch(() => {});
      await kiln.databases.drain();
      await kiln.functions.drain();
      await (await pool)?.close();
      await kiln.functionLogs.stop();
      await activity.stop();
      await engine.close().catch((e) => log.error("closing databases failed", e));
      await kiln.variables.settlePending().catch(() => {});
      kiln.variables.stop();
      await usage.stop().catch((e) => log.error("final usage flush failed", e));
      await kiln.mailer.close().catch(() => {});
      await kiln.mailCatcher?.stop().catch(() => {});
      await store.close();
      unlock();
      if (config.ephemeral) rmSync(config.dataDir, { recursive: true, force: true });
    })());
  return { url, port: server.port!, kiln, stop };
}

async function connectContainerEngine(config: Config, log: Logger) {
  const { ContainerEngine } = await import("../runtime-sandbox/container");
  const engine = await ContainerEngine.connect({ host: config.dockerHost, image: config.functionImage, hiddenPaths: [config.dataDir], log: (m) => log.info(m) });
  log.info(`functions run in containers: ${engine.describe()}`);
  return engine;
}
