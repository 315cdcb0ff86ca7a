import { join } from "node:path";
import type { Server } from "bun";
import type { AccountsService } from "../accounts/service";
import { defineArea } from "../area";
import { takeFault } from "../config";
import { dataDirId } from "../store/data-dir-id";
import type { LogsService } from "../logs/service";
import type { MetricsService } from "../metrics/service";
import type { Platform } from "../platform";
import type { VariablesService } from "../variables/service";
import { bridgeHandlers, isUpgradeRequest, UPGRADED, type Upgrade } from "../http/websocket-bridge";
import { DomainsService } from "./domains";
import { FRONTENDS_MIGRATIONS } from "./migrations";
import { frontendRoutes } from "./routes";
import { serveSite, type ServeDeps } from "./serve";
import { FrontendsService } from "./service";
import { matchSiteHost } from "./site-address";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log" | "address" | "secretKey"> & {
  accounts: AccountsService;
  variables: VariablesService;
  logs: LogsService;
  metrics: MetricsService;
};

/** How long a replaced deployment's files stay after the switch (KILN_FRONTEND_KEEP_PREVIOUS_MS). */
const KEEP_PREVIOUS_MS = Number(process.env.KILN_FRONTEND_KEEP_PREVIOUS_MS ?? 10 * 60_000);

/**
 * Frontend hosting: static sites (served by Kiln from each deployment's published files) and
 * Next.js apps (built and served by runtime-sandbox/frontends, sandboxed Node), at
 * `<name>--<project>.<frontends domain>` on Kiln's HTTP port, and on the HTTPS port
 * (`--frontends-tls-port`) with the local CA's certificate or a custom domain's own.
 */
export const frontendsArea = defineArea({
  name: "frontends",
  migrations: FRONTENDS_MIGRATIONS,
  secrets: [{ table: "frontend_domains", key: "frontend_id", column: "private_key_pem" }],
  start: ({ store, config, clock, log, address, secretKey, variables, logs, metrics }: Needs) => {
    const region = config.regions[0]!;
    const frontends = new FrontendsService({
      store,
      clock,
      log,
      dir: join(config.dataDir, "frontends"),
      variables: (projectId) => variables.values(projectId),
      buildLog: (ref, level, text) => logs.ingest.build({ ...ref, resourceType: "frontend" }, region, level, text),
      serverLog: (ref, level, text) => logs.ingest.frontendRequest(ref, ref.deploymentId, region, level, text),
      flushLogs: () => logs.ingest.flush(),
      framework: {
        hiddenPaths: [config.dataDir],
        sandbox: { want: config.functionSandbox, allowUnsandboxed: config.allowUnsandboxedFunctions },
        warn: (m) => log.warn(m),
        // A sandboxed Next.js server reaches Kiln's own HTTP port (and the internet), nothing else of the host.
        kiln: () => (address.httpPort() ? { host: config.host, port: address.httpPort(), publicUrl: address.publicUrl() } : null),
        // The production profile: the Next.js server in a container, like function workers.
        containers: config.functionRuntime === "docker" ? { host: config.dockerHost, image: config.functionImage } : null,
        // Idle stops on the platform clock: a test moves it rather than waiting ten minutes.
        after: (ms, run, label) => clock.after(ms, run, label),
      },
      keepPreviousMs: KEEP_PREVIOUS_MS,
      buildDelayMs: config.faults.frontend_build_delay ?? 0,
      fault: (name) => takeFault(config, name),
      // Several instances may share the PostgreSQL store, each with its own data dir (docs/frontends.md).
      shared: store.kind === "postgres" ? { pollMs: Number(process.env.KILN_FRONTEND_SYNC_MS ?? 1000), instanceId: dataDirId(join(config.dataDir, "frontends")) } : null,
    });
    const tls = { server: null as Server<unknown> | null, port: null as number | null };
    // The HTTPS listener starts after Kiln listens (its certificate may need two RSA keys first); custom
    // domain requests wait for it.
    let tlsStarted: Promise<void> = Promise.resolve();
    let listening: Promise<void> = Promise.resolve();
    const domains = new DomainsService({ store, clock, log, config, address, secretKey, tlsPort: async () => (await tlsStarted.catch(() => {}), tls.port) });
    const serveDeps: ServeDeps = {
      region,
      record: (s, status, ms) => metrics.record(s.frontend.project_id, "frontend", region, status, ms, s.frontend),
      accessLog: (s, level, line) => logs.ingest.frontendRequest(s.frontend, s.deploymentId, region, level, line),
    };
    // Usage names each frontend as it is now (its last recorded name only once its row is gone).
    metrics.frontendNames = async (projectId) => {
      const rows = await store.query(`select id, name from frontends where project_id = $1`, [projectId]);
      return new Map(rows.map((r) => [r.id as string, r.name as string]));
    };
    /** Custom domain → frontend id, refreshed whenever the listener is. */
    let domainRoutes = new Map<string, string>();
    frontends.onDetach = () => void domains.apply();
    const route = (request: Request, arrivedAt: number, upgrade?: Upgrade): Promise<Response> | null => {
      const host = request.headers.get("host");
      const site = matchSiteHost(host, config.frontendsDomain);
      if (site) return serveSite(serveDeps, frontends.served(site.projectId, site.name), request, arrivedAt, upgrade);
      if (host && domainRoutes.size) {
        const id = domainRoutes.get(host.toLowerCase().replace(/:\d+$/, ""));
        if (id) return serveSite(serveDeps, frontends.servedById(id), request, arrivedAt, upgrade);
      }
      return null;
    };
    const frontendTls = {
      route,
      port: () => tls.port,
      async close(): Promise<void> {
        await tlsStarted.catch(() => {});
        await tls.server?.stop(true);
        tls.server = null;
      },
      /** (Re)starts the HTTPS listener with the default site certificate first and every attached domain's; one at a time. */
      listen(): Promise<void> {
        return (listening = listening.catch(() => {}).then(() => this.restart()));
      },
      async restart(): Promise<void> {
        if (config.frontendsTlsPort === null) return;
        const { localServerCertificate } = await import("../backends/databases/wire/local-ca");
        const site = await localServerCertificate(join(config.dataDir, "tls"), "frontends", [`*.${config.frontendsDomain}`, config.frontendsDomain]);
        const entries = [{ serverName: `*.${config.frontendsDomain}`, cert: site.cert, key: site.key }, ...(await domains.tlsEntries())];
        domainRoutes = await domains.routes();
        // Bun's listener takes its certificates at start only: a change restarts it on the same port.
        const port = tls.port ?? config.frontendsTlsPort;
        if (tls.server) await tls.server.stop(true);
        tls.server = Bun.serve({
          hostname: config.host,
          port,
          tls: entries,
          websocket: bridgeHandlers,
          fetch: async (request, srv) => {
            const upgrade: Upgrade | undefined = isUpgradeRequest(request) ? (bridge, headers) => srv.upgrade(request, { data: bridge, headers }) : undefined;
            const res = (await route(request, performance.now(), upgrade)) ?? new Response("No frontend serves this address.\n", { status: 404, headers: { "Content-Type": "text/plain; charset=utf-8" } });
            return res === UPGRADED ? (undefined as unknown as Response) : res;
          },
        });
        if (tls.port === null) log.info(`frontends HTTPS on port ${tls.server.port} (site certificate from the local CA at ${site.caPath})`);
        tls.port = tls.server.port ?? null;
      },
    };
    domains.reload = () => frontendTls.listen();
    const startTls = () => {
      tlsStarted = frontendTls.listen();
      tlsStarted.catch((e) => log.error(`frontends: the HTTPS listener on port ${config.frontendsTlsPort} could not start`, e));
    };
    return { frontends, domains, frontendTls: { ...frontendTls, startTls } };
  },
  routes: frontendRoutes,
  hostRouter: (deps) => (request, m) => deps.frontendTls.route(request, m.arrivedAt, m.upgrade),
  project: { cleanup: (projectId, { frontends }) => frontends.removeAll(projectId) },
  resume: async ({ frontends, frontendTls }) => {
    await frontends.resume();
    frontendTls.startTls();
  },
  closing: ({ frontends }) => frontends.closing(),
  drain: ({ frontends }) => frontends.drain(),
  stop: ({ frontendTls }) => frontendTls.close(),
});

