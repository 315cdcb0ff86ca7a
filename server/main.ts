import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hideOwnProcEntries } from "../runtime-sandbox/isolation";
import { startAreas, type AnyArea, type HostRouter } from "./area";
import { AREAS, SCHEMA } from "./areas";
import { Credentials } from "./auth/credentials";
import { Guard } from "./auth/guard";
import { PrincipalCache } from "./auth/principal-cache";
import { PlatformClock } from "./clock";
import { takeFault, type Config } from "./config";
import { closeDataDir, lockDataDir, openCodeToSandboxUid } from "./data-dir";
import { preloadMailCatcher } from "./emulators/area";
import { openApiRoutes } from "./http/openapi";
import { Router, type Transport } from "./http/route";
import { renderError, serveHttp, stopHttp } from "./http/server";
import { createLogger, type Logger } from "./log";
import type { Platform } from "./platform";
import { loadSecretKey } from "./secrets/secret-key";
import { secureStoredSecrets } from "./secrets/store-secrets";
import { openControlStore } from "./store/open-store";
import type { ControlStore } from "./store/store";
import { handleUnhandledRejections } from "./unhandled-rejections";
import { RequestGate } from "./http/gate";
import type { SecretKey } from "./secrets/secret-key";
import { Snapshots } from "./snapshots/controller";
import { readSavedToken } from "./accounts/service";
import { AreaReset } from "./snapshots/area-reset";

export type Services = Awaited<ReturnType<typeof startAreas<typeof AREAS>>>;

export interface RunningKiln {
  url: string;
  port: number;
  /** The running areas' services (a snapshot restore replaces them). */
  readonly services: Services;
  snapshots: Snapshots;
  stop(): Promise<void>;
  /** What a stop in progress is waiting for (a phase and an area), for a stop that takes too long. */
  stopPhase(): string;
  /**
   * Settles once the work a start defers past listening is done (the areas' resume, the reset
   * point): requests but /healthz wait for it. Rejected: Kiln could not start (the caller stops it).
   */
  ready: Promise<void>;
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

/** Every area's routes, in the order the OpenAPI document lists them, then the document itself. */
export function buildRouter(config: Config, now: () => number = Date.now): Router {
  const router = new Router();
  for (const area of AREAS as readonly AnyArea[]) area.routes?.(router.area());
  openApiRoutes(router, { fetchLimit: config.openapiFetchLimit, now });
  return router;
}

/** A start that fails half way releases what it took, and says which port is taken. */
export async function startKiln(config: Config, out: { print: (line: string) => void; log?: Logger } = { print: console.log }): Promise<RunningKiln> {
  const undo: (() => unknown)[] = [];
  try {
    return await boot(config, out, undo);
  } catch (err) {
    for (const u of undo.reverse()) await Promise.resolve().then(u).catch(() => {});
    const e = err as { code?: string; message?: string; wirePort?: number };
    if (e?.code === "EADDRINUSE" || /EADDRINUSE|address already in use/i.test(e?.message ?? "")) {
      // The databases area marks its wire listener's failure; `--port 0` can never be taken.
      const pg = e.wirePort !== undefined || config.port === 0;
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
  // A seed is checked whole (with every file it names) before anything is opened.
  // (Its module, with the YAML parser and a PostgreSQL client, loads only when there is one.)
  const seeds = config.seed ? await import("./snapshots/seed") : null;
  let seed = config.seed ? seeds!.loadSeed(config.seed) : null;
  // What a stop is waiting for, named when it takes too long (RunningKiln.stopPhase).
  let phase = "running";
  if (config.ephemeral) {
    config.dataDir = mkdtempSync(join(tmpdir(), "kiln-ephemeral-"));
    const dir = config.dataDir;
    undo.push(() => rmSync(dir, { recursive: true, force: true }));
  }
  mkdirSync(config.dataDir, { recursive: true });
  closeDataDir(config);
  undo.push(lockDataDir(config.dataDir));
  // The key that encrypts the store's secrets lives outside it (environment, a file, or the data dir).
  const secretKey = loadSecretKey(config.dataDir);
  if (config.databaseUrl && secretKey.source === "data-dir")
    log.warn(
      `the secret key that encrypts the control store's secrets is ${secretKey.generated ? "new, in" : "read from"} ${secretKey.file}: ` +
        "every Kiln instance sharing this store needs the same key; give each one KILN_SECRET_KEY_FILE (or KILN_SECRET_KEY), and keep a copy: without it the store's secrets cannot be read",
    );
  // Processes of Kiln's own uid (function code without a sandbox, say) cannot read its environment
  // (KILN_PLATFORM_TOKEN, KILN_ADMIN_TOKEN) or memory through /proc.
  hideOwnProcEntries();
  handleUnhandledRejections(log);
  if (!config.smtpUrl) preloadMailCatcher();

  // The shared infrastructure, then every area in order (server/areas.ts).
  const clock = new PlatformClock((label, err) => log.error(`${label} failed`, err), config.clockStartMs);
  undo.push(() => clock.stop());
  const gate = new RequestGate();
  let listening = { publicUrl: "", httpPort: 0 };
  const address = { publicUrl: () => listening.publicUrl, httpPort: () => listening.httpPort };
  const snapshots: Snapshots = new Snapshots({
    config,
    clock,
    gate,
    stopState: (keepStore) => state.stop(keepStore),
    store: () => state.store,
    openStore: () => openControlStore({ dataDir: config.dataDir, databaseUrl: config.databaseUrl, schema: SCHEMA, warn: (m) => log.warn(m) }),
    startState: async (store) => {
      state = await openState({ config, clock, log, secretKey, address, snapshots, print: out.print, trace, setPhase: (p) => (phase = p), store });
      transport.deps = state.services;
      transport.guard = state.guard;
    },
    closing: () => state.closing(),
    resetState: (detect, putBack) => state.resetState(detect, putBack),
  });
  // A seed goes into a fresh data dir (checked whole first); a failed one leaves no state behind.
  const seeding = { done: false };
  if (seed) {
    const why = snapshots.unavailable();
    if (why) throw new Error(`--seed: ${why}`);
    if (existsSync(join(config.dataDir, "control", "PG_VERSION"))) {
      // Seeded at an earlier start: its snapshot is the reset point; the seed is not applied twice.
      if (!snapshots.has("seed")) throw new Error(`--seed ${config.seed}: the data dir ${config.dataDir} already holds state that was not seeded; seed a new data dir (or --ephemeral)`);
      snapshots.resetPoint = "seed";
      seed = null;
    } else {
      undo.push(() => seeding.done || snapshots.removeState());
    }
  }
  let state = await openState({ config, clock, log, secretKey, address, snapshots, print: out.print, trace, setPhase: (p) => (phase = p), deferResume: true });
  undo.push(() => state.stop());
  const transport: Transport = { config, log, guard: state.guard, deps: state.services, renderError: (err, req) => renderError(log, err, req), gate };
  // A restore starts the areas again: the listeners they open come back on the ports they first got.
  config.pgPort = state.services.databaseWire.port;
  if (state.services.smtpAddress) config.smtpPort = Number(state.services.smtpAddress.split(":").pop());
  // What the areas resume (interrupted work, timers) and the reset point wait until Kiln listens:
  // /healthz answers meanwhile, every other request waits for it (server/http/server.ts), so a
  // healthy /healthz still means every route answers as it will later.
  const deferred = state.resume;
  const hold = takeFault(config, "start-hold") ? holdStart(config.dataDir) : null;
  const afterListening = async () => {
    await new Promise((r) => setImmediate(r));
    await hold?.();
    await deferred();
    if (config.resettable && !config.seed) {
      await snapshots.takeResetPoint("start");
      trace("reset point kept");
    }
  };

  const byHost: HostRouter = (request, m) => {
    for (const route of state.hostRouters) {
      const res = route(request, m);
      if (res) return res;
    }
    return null;
  };
  // A seed is applied through the API once it listens, with the door closed to everyone else.
  if (seed) gate.closeNow();
  let readyNow!: () => void;
  const listened = new Promise<void>((r) => (readyNow = r));
  const ready = listened.then(afterListening);
  gate.holdUntil(ready);
  const server = serveHttp(transport, buildRouter(config, () => clock.nowMs()), byHost);
  trace("listening");
  readyNow();
  openCodeToSandboxUid(config);
  const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${server.port}`;
  listening = { publicUrl: config.publicUrl ?? url, httpPort: server.port! };
  if (seed) {
    undo.push(() => stopHttp(server));
    await ready;
    const pass = gate.pass();
    const token = config.platformToken ?? readSavedToken(config.dataDir) ?? "";
    try {
      await seeds!.applySeed(
        seed,
        async (method, path, body, bearer) => {
          const headers: Record<string, string> = { authorization: `Bearer ${bearer ?? token}`, [pass.header]: pass.value };
          let payload: BodyInit | undefined;
          if (body instanceof FormData) payload = body;
          else if (typeof body === "string") (payload = body), (headers["content-type"] = "application/yaml");
          else if (body !== undefined) (payload = JSON.stringify(body)), (headers["content-type"] = "application/json");
          const res = await fetch(url + path, { method, headers, body: payload });
          const text = await res.text();
          let parsed: unknown = text;
          try {
            parsed = text ? JSON.parse(text) : undefined;
          } catch {}
          return { status: res.status, body: parsed };
        },
        (ms) => new Promise((r) => setTimeout(r, ms)),
      );
    } finally {
      pass.done();
      gate.open();
    }
    trace("seed applied");
    await snapshots.takeResetPoint("seed");
    seeding.done = true;
    undo.pop(); // the server is stopped by stop() itself
  }

  let stopping: Promise<void> | null = null;
  const stop = () =>
    (stopping ??= (async () => {
      // The deferred part of the start finishes first (its work must not run on stopped areas).
      phase = "start-up's deferred work";
      await ready.catch(() => {});
      // A snapshot or restore under way finishes first: its new state is the one to stop.
      phase = "a snapshot or restore in progress";
      await snapshots.settled();
      // Streams that never end by themselves (live log tails) end first: in-flight requests finish.
      state.closing();
      phase = "in-flight HTTP requests";
      await stopHttp(server); // stop accepting; in-flight requests finish
      // What boot took, released in reverse: areas, the store, the clock, the data-dir lock.
      if (takeFault(config, "stop-hang")) {
        phase = "an injected fault (stop-hang)";
        await new Promise(() => {});
      }
      phase = "releasing what start-up took";
      for (const u of undo.splice(0).reverse()) await Promise.resolve().then(u).catch((e) => log.error("stopping failed", e));
      phase = "stopped";
    })());
  return {
    url,
    port: server.port!,
    get services() {
      return state.services;
    },
    snapshots,
    stop,
    stopPhase: () => phase,
    ready,
  };
}

/**
 * Fault injection (KILN_FAULTS=start-hold): the start's deferred work waits until the file
 * `<data-dir>/start-hold`, made here, is removed; tests see requests wait for it meanwhile.
 */
function holdStart(dataDir: string): () => Promise<void> {
  const file = join(dataDir, "start-hold");
  writeFileSync(file, "remove this file to let the start finish\n");
  return async () => {
    while (existsSync(file)) await new Promise((r) => setTimeout(r, 20));
  };
}

interface StateOptions {
  config: Config;
  clock: PlatformClock;
  log: Logger;
  secretKey: SecretKey;
  address: Platform["address"];
  snapshots: Snapshots;
  print: (line: string) => void;
  trace: (phase: string) => void;
  setPhase: (p: string) => void;
  /** A control store already open (a snapshot restore keeps it across the areas' restart). */
  store?: ControlStore;
  /** The areas' resume is left to the caller (`State.resume`), to run once Kiln listens. */
  deferResume?: boolean;
}

/** The control store and every area on it: what boot starts, and what a snapshot restore stops and starts again. */
interface State {
  store: ControlStore;
  services: Services;
  guard: Guard;
  hostRouters: HostRouter[];
  closing(): void;
  /** The areas' resume (interrupted work, timers), when openState was asked to defer it; else a no-op. */
  resume(): Promise<void>;
  /** Stops the areas, and closes the control store unless `keepStore`. */
  stop(keepStore?: boolean): Promise<void>;
  /** A snapshot restore under the running areas (server/snapshots/controller.ts `resetState`). */
  resetState(detect: () => Promise<{ tables: string[]; files: string[] }>, putBack: (changes: { tables: string[]; files: string[] }) => Promise<string[]>): Promise<"unhooked" | "in place" | "restart">;
}

const areaReset = new AreaReset(AREAS as readonly AnyArea[]);

async function openState(o: StateOptions): Promise<State> {
  const { config, clock, log, secretKey, trace } = o;
  const undo: (() => unknown)[] = [];
  let keepStore = false;
  const stop = async (keep = false) => {
    keepStore = keep;
    for (const u of undo.splice(0).reverse()) await Promise.resolve().then(u).catch((e) => log.error("stopping failed", e));
  };
  try {
    const store = o.store ?? (await openControlStore({ dataDir: config.dataDir, databaseUrl: config.databaseUrl, schema: SCHEMA, warn: (m) => log.warn(m) }));
    undo.push(() => {
      if (keepStore) return;
      o.setPhase("closing the control store");
      return store.close();
    });
    trace("control store open");
    const secured = await secureStoredSecrets(store, secretKey, (AREAS as readonly AnyArea[]).flatMap((a) => a.secrets ?? []));
    if (secured.encrypted || secured.reencrypted)
      log.info(`secret key ${secretKey.id}: encrypted ${secured.encrypted} stored secrets kept in plaintext, re-encrypted ${secured.reencrypted} written with a previous key`);
    trace("stored secrets checked");
    const platform: Platform = {
      config,
      clock,
      log,
      store,
      secretKey,
      principals: new PrincipalCache(() => config.credentialCacheMs, () => clock.nowMs()),
      address: o.address,
      snapshots: o.snapshots,
    };
    const started: AnyArea[] = [];
    let services: Services | null = null;
    undo.push(() => services && stopAreas(started, services, o.setPhase));
    services = await startAreas(AREAS, platform, (area) => started.push(area));
    const s = services;

    // Credentials and the guard sit over the areas that issue credentials and own projects.
    const credentials = new Credentials(store, config, platform.principals, () => clock.nowMs(), (jwt) => s.endUsers.principalOf(jwt));
    const guard = new Guard({ config, clock, log, credentials, projects: s.projects, tokenUsage: s.tokenUsage });

    // What a project owns, set up with it and removed with it (dependents first).
    for (const area of started) {
      if (area.project?.setup) s.projects.registerSetup((tx, projectId) => area.project!.setup!(tx, projectId, s));
    }
    for (const area of [...started].reverse()) {
      if (area.project?.cleanup) s.projects.registerCleanup(area.name, (projectId) => area.project!.cleanup!(projectId, s));
    }

    await s.accounts.ensureDefault(config, o.print);
    trace("default account");
    const resume = async () => {
      for (const area of started) {
        // Deferred past listening: between two areas, requests that came in meanwhile are read
        // (a PGlite query runs on this thread, and a chain of them never yields to I/O by itself),
        // so /healthz answers during the resumes, not after them.
        if (o.deferResume && area.resume) await new Promise((r) => setImmediate(r));
        await area.resume?.(s);
        if (area.resume) trace(`resumed ${area.name}`);
      }
      trace("state ready");
    };
    if (!o.deferResume) await resume();
    const hostRouters = started.flatMap((a) => (a.hostRouter ? [a.hostRouter(s, guard)] : []));
    const resetState: State["resetState"] = async (detect, putBack) => {
      const traceOn = process.env.KILN_TRACE_SNAPSHOTS === "1";
      await areaReset.flush(s, traceOn);
      const changes = await detect();
      const why = areaReset.unhooked(changes.tables, changes.files);
      if (why) {
        if (traceOn) console.error(`snapshot: areas restart: ${why} has no reset hook`);
        return "unhooked";
      }
      const put = async () => {
        const tables = await putBack(changes);
        // Credentials resolved since the snapshot may name tokens, keys or sessions it does not have.
        platform.principals.evict(() => true);
        return tables;
      };
      return areaReset.run(s, changes.tables, changes.files, put, traceOn, (a, e) => log.error(`resetting ${a.name} in place failed; restarting every area`, e));
    };
    return { store, services: s, guard, hostRouters, closing: () => started.forEach((a) => a.closing?.(s)), stop, resetState, resume: o.deferResume ? resume : async () => {} };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * Drains in list order (project deletions finish while the areas they clean up still run; builds
 * end), then stops in reverse order (engines, files and sockets released after their users).
 */
async function stopAreas(areas: AnyArea[], services: Services, phase: (p: string) => void): Promise<void> {
  const trace = process.env.KILN_TRACE_SNAPSHOTS === "1";
  for (const area of areas) {
    phase(`draining ${area.name}`);
    const t0 = performance.now();
    await Promise.resolve(area.drain?.(services)).catch((e) => services.log.error(`draining ${area.name} failed`, e));
    if (trace && area.drain) console.error(`stop: drained ${area.name} +${Math.round(performance.now() - t0)} ms`);
  }
  for (const area of [...areas].reverse()) {
    phase(`stopping ${area.name}`);
    const t0 = performance.now();
    await Promise.resolve(area.stop?.(services)).catch((e) => services.log.error(`stopping ${area.name} failed`, e));
    if (trace && area.stop) console.error(`stop: stopped ${area.name} +${Math.round(performance.now() - t0)} ms`);
  }
}
