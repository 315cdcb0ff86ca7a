import { join } from "node:path";
import type { AccountsService } from "../accounts/service";
import { defineArea } from "../area";
import { EmbeddedEngine } from "../backends/databases/embedded";
import type { DatabaseEngine } from "../backends/databases/engine";
import { startWireListener } from "../backends/databases/wire/listener";
import { takeFault } from "../config";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { DatabaseActivity } from "./activity";
import { DATABASES_MIGRATIONS } from "./migrations";
import { databaseRoutes } from "./routes";
import { DatabasesService } from "./service";
import { DatabaseWireRouter } from "./wire-router";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log"> & { projects: ProjectsService; accounts: AccountsService };

/** Managed PostgreSQL: the engine, and the wire listener every connection string points at. */
export const databasesArea = defineArea({
  name: "databases",
  migrations: DATABASES_MIGRATIONS,
  start: async ({ store, config, clock, log }: Needs) => {
    const now = () => clock.now();
    let engine: DatabaseEngine;
    if (config.postgresUrl) {
      // Loaded only in the production profile: the embedded default never pays for it.
      const { PostgresEngine } = await import("../backends/databases/production");
      const pg = new PostgresEngine(config.postgresUrl);
      await pg.init();
      engine = pg;
    } else {
      engine = new EmbeddedEngine({
        dir: join(config.dataDir, "databases"),
        maxOpen: config.dbMaxOpen,
        memoryBudgetMb: config.dbMemoryBudgetMb,
        idleCloseMs: config.dbIdleCloseMs,
        idleInTransactionTimeoutMs: config.dbIdleInTransactionTimeoutMs,
      });
    }
    const activity = new DatabaseActivity(store, now, log);
    const wireAddress = { host: config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host, port: 0 };
    const databases = new DatabasesService(store, engine, now, activity, () => wireAddress, log, (name) => takeFault(config, name));
    try {
      const databaseWire = await startWireListener({
        host: config.host,
        port: config.pgPort,
        router: new DatabaseWireRouter(databases, store),
        onError: (e) => log.error("database wire listener", e),
      });
      wireAddress.port = databaseWire.port;
      // Storage is sampled on wall time: it measures the disk, it applies no rule of the platform's.
      const sampler = setInterval(() => void databases.sampleStorage().catch((e) => log.error("database storage sampling failed", e)), 60_000);
      sampler.unref?.();
      return { databases, databaseWire, databaseSampler: sampler };
    } catch (err) {
      await engine.close().catch(() => {});
      throw err;
    }
  },
  routes: databaseRoutes,
  project: { cleanup: (projectId, { databases }) => databases.removeAll(projectId) },
  resume: async ({ databases }) => {
    await databases.resumeProvisioning();
    databases.activity.start();
  },
  drain: async ({ databases, databaseWire, databaseSampler }) => {
    clearInterval(databaseSampler);
    await databaseWire.close().catch(() => {});
    await databases.drain();
  },
  stop: async ({ databases, databaseWire, log }) => {
    await databaseWire.close().catch(() => {});
    await databases.activity.stop();
    await databases.engine.close().catch((e) => log.error("closing databases failed", e));
  },
});
