import { join } from "node:path";
import { hostname } from "node:os";
import type { AccountsService } from "../accounts/service";
import { defineArea } from "../area";
import { EmbeddedEngine } from "../backends/databases/embedded";
import type { DatabaseEngine } from "../backends/databases/engine";
import { startWireListener } from "../backends/databases/wire/listener";
import type { WireTlsMaterial } from "../backends/databases/wire/local-ca";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { DatabaseActivity } from "./activity";
import { DATABASES_MIGRATIONS } from "./migrations";
import { backupRoutes } from "./backup-routes";
import { BackupsService } from "./backups";
import { branchRoutes } from "./branch-routes";
import { RestoresService } from "./restores";
import { BranchesService } from "./branches";
import { ClockJournal } from "./clock-journal";
import { databaseRoutes } from "./routes";
import { sqlRoutes } from "./sql-routes";
import { DatabasesService } from "./service";
import { DumpsService } from "./dumps";
import { DueTimers } from "./timers";
import { DatabaseWireRouter } from "./wire-router";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log" | "secretKey"> & { projects: ProjectsService; accounts: AccountsService };

/** Managed PostgreSQL: the engine, and the wire listener every connection string points at. */
export const databasesArea = defineArea({
  name: "databases",
  migrations: DATABASES_MIGRATIONS,
  // The client password of every database and branch (the connection strings' password).
  secrets: [
    { table: "databases", key: "id", column: "client_password" },
    { table: "database_branches", key: "id", column: "client_password" },
  ],
  start: async ({ store, config, clock, log, secretKey }: Needs) => {
    const now = () => clock.now();
    let engine: DatabaseEngine;
    if (config.postgresUrl) {
      // Loaded only in the production profile: the embedded default never pays for it.
      const { PostgresEngine } = await import("../backends/databases/production");
      // Point-in-time restore archives the whole server's WAL: on only when asked for (docs/databases.md).
      const pitr = /^(1|on|true|yes)$/i.test(process.env.KILN_POSTGRES_PITR ?? "");
      const pg = new PostgresEngine(config.postgresUrl, {
        pitrDir: pitr ? join(config.dataDir, "database-pitr") : undefined,
        log,
        tenantPassword: (role) => secretKey.derive(`postgres tenant role ${role}`),
      });
      await pg.init();
      engine = pg;
    } else {
      engine = new EmbeddedEngine({
        dir: join(config.dataDir, "databases"),
        maxOpen: config.dbMaxOpen,
        memoryBudgetMb: config.dbMemoryBudgetMb,
        idleCloseMs: config.dbIdleCloseMs,
        idleInTransactionTimeoutMs: config.dbIdleInTransactionTimeoutMs,
        clockOffset: () => clock.offsetMs(),
      });
    }
    const activity = new DatabaseActivity(store, now, log);
    const wireAddress = { host: config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host, port: 0 };
    const fault = (name: string) => takeFault(config, name);
    const databases = new DatabasesService(store, engine, now, activity, () => wireAddress, log, secretKey, fault, (ms) => clock.sleep(ms));
    const branches = new BranchesService(store, engine, clock, databases, log, fault);
    const backups = new BackupsService(store, engine, clock, join(config.dataDir, "database-backups"), log);
    const dumps = new DumpsService(databases, join(config.dataDir, "database-dumps"), log);
    // The production engine's point in time maps platform instants to the server's real time.
    const journal = engine.serverPointInTime && engine.serverPointInTime.status().state !== "off" ? new ClockJournal(clock, join(config.dataDir, "database-pitr", "clock-journal.jsonl")) : null;
    const restores = new RestoresService(store, engine, clock, backups, log, fault, journal);
    restores.onDatabaseChange = (id) => databases.forget(id);
    databases.onDelete.push((id) => branches.removeForDatabase(id), (id) => backups.removeForDatabase(id));
    const databaseTimers = new DueTimers(
      clock,
      [branches.expiry, backups.scheduled, backups.retention, restores.attempts],
      (label, e) => log.error(`${label} failed`, e),
      // One instance (embedded store) knows every change itself; several must look for each other's.
      store.kind === "postgres" ? Number(process.env.KILN_DATABASE_TIMER_POLL_MS ?? 1000) : null,
      config.controllableClock,
    );
    branches.onExpiryChange = () => void databaseTimers.rearm(branches.expiry.label).catch((e) => log.error("branch expiry", e));
    backups.onChange = restores.onChange = () => void databaseTimers.rearmAll();
    // TLS material (two RSA keys and node-forge's certificates the first time) is made at the first
    // SSLRequest or CA download, not at start: most starts (every test Kiln, a laptop whose clients
    // never ask for TLS) would pay its CPU and node-forge's loading for nothing.
    const tlsDir = join(config.dataDir, "tls");
    const tlsHosts = ["localhost", "127.0.0.1", "::1", config.host, hostname(), ...config.pgTlsHosts];
    let tlsMaterial: Promise<WireTlsMaterial> | null = null;
    const wireTls = () =>
      (tlsMaterial ??= import("../backends/databases/wire/local-ca").then(({ localWireTls }) => localWireTls(tlsDir, tlsHosts)).then(
        (m) => (log.info(`database wire TLS: certificate for ${m.hosts.join(", ")}; CA (sslrootcert) at ${m.caPath}`), m),
        (e) => ((tlsMaterial = null), Promise.reject(e)),
      ));
    try {
      const databaseWire = await startWireListener({
        host: config.host,
        port: config.pgPort,
        router: new DatabaseWireRouter(databases, branches, store),
        onError: (e) => log.error("database wire listener", e),
        tls: wireTls,
        requireSsl: config.pgRequireSsl,
      });
      wireAddress.port = databaseWire.port;
      // Storage is sampled on wall time: it measures the disk, it applies no rule of the platform's.
      const sampler = setInterval(
        () =>
          void (async () => {
            await branches.sample();
            await restores.pruneWal();
            await databases.sampleStorage(async (id) => (await branches.divergenceTotal(id)) + (await backups.totalBytes(id)));
          })().catch((e) => log.error("database storage sampling failed", e)),
        60_000,
      );
      sampler.unref?.();
      return { databases, branches, backups, restores, dumps, databaseTimers, databaseWire, databaseWireTls: wireTls, databaseSampler: sampler, clockJournal: journal };
    } catch (err) {
      await engine.close().catch(() => {});
      // Which port was taken: the start's error names the wire port's flag (the message may not hold the port).
      if ((err as { code?: string })?.code === "EADDRINUSE" || /EADDRINUSE|address already in use/i.test((err as Error)?.message ?? "")) (err as { wirePort?: number }).wirePort = config.pgPort;
      throw err;
    }
  },
  routes: (r) => {
    databaseRoutes(r);
    branchRoutes(r);
    backupRoutes(r);
    sqlRoutes(r);
  },
  project: { cleanup: (projectId, { databases }) => databases.removeAll(projectId) },
  resume: async ({ databases, branches, restores, databaseTimers }) => {
    await databases.resumeProvisioning();
    await branches.resume();
    await restores.resume();
    await databaseTimers.start();
    databases.activity.start();
  },
  // In place: only databases whose files changed are closed (their clients disconnected) before the
  // files are put back, and open again at their next use; the others keep their open engine.
  reset: {
    files: ["databases", "database-backups", "database-dumps"],
    flush: ({ databases }) => databases.activity.flush(),
    release: async ({ databases, branches, databaseTimers }, changed) => {
      if (!changed.tables.size && !changed.files.length) return;
      await databaseTimers.stop();
      await databases.settle();
      await branches.settle();
      const ids = new Set(changed.files.filter((f) => f.startsWith("databases/")).map((f) => f.split("/")[1]!));
      for (const id of ids) await databases.engine.disconnect(id, "the database was put back to a snapshot");
    },
    resume: async ({ databases, branches, restores, databaseTimers }, changed) => {
      if (!changed.tables.size && !changed.files.length) return;
      databases.forgetAll();
      await databases.resumeProvisioning();
      await branches.resume();
      await restores.resume();
      await databaseTimers.restart();
    },
  },
  drain: async ({ databases, branches, databaseTimers, databaseWire, databaseSampler }) => {
    clearInterval(databaseSampler);
    await databaseTimers.stop();
    await databaseWire.close().catch(() => {});
    await databases.drain();
    await branches.drain();
  },
  stop: async ({ databases, databaseWire, clockJournal, log }) => {
    clockJournal?.stop();
    await databaseWire.close().catch(() => {});
    await databases.activity.stop();
    await databases.engine.close().catch((e) => log.error("closing databases failed", e));
  },
});
