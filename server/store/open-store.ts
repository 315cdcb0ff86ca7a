import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { LOG_SCHEMA } from "../backends/logs/migrations";
import { migrate, type Migration } from "./migrations";
import { openPglite, PgliteStore } from "./pglite-store";
import type { ControlStore } from "./store";
import { controlTemplate, createFromTemplate } from "./template";

/** Opens the control store the configuration names and brings its schema up to date. */
export async function openControlStore(opts: { dataDir: string; databaseUrl?: string; schema: readonly Migration[]; warn?: (m: string) => void }): Promise<ControlStore> {
  let store: ControlStore;
  if (opts.databaseUrl) {
    // Loaded only in the production profile: the embedded default never pays for it.
    const { PostgresStore } = await import("./postgres-store");
    const pg = new PostgresStore(opts.databaseUrl);
    store = pg;
    const warning = await pg.closeToPublic().catch(async (err) => {
      await pg.close().catch(() => {});
      throw err;
    });
    if (warning) opts.warn?.(warning);
  } else {
    const dir = join(opts.dataDir, "control");
    if (!existsSync(join(dir, "PG_VERSION"))) {
      mkdirSync(opts.dataDir, { recursive: true });
      await createFromTemplate(controlTemplate(opts.schema), dir);
    }
    store = new PgliteStore(await openPglite(dir));
  }
  // In the production profile the log store's schema records itself in the same table.
  await migrate(store, opts.schema, { refuseNewer: opts.databaseUrl ? LOG_SCHEMA : [] });
  return store;
}
