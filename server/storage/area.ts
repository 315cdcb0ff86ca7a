import { join } from "node:path";
import type { BlobStore } from "../backends/blobs/blob-store";
import { defineArea } from "../area";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { BucketsService } from "./buckets";
import { StorageLimits, type StorageSettings } from "./limits";
import { STORAGE_MIGRATIONS } from "./migrations";
import { ObjectsService } from "./objects";
import { ORPHAN_GRACE_MS, sweepOrphanBlobs } from "./orphans";
import { PoliciesService } from "./policies";
import { bucketRoutes, objectRoutes, policyRoutes } from "./routes";
import { UploadsService } from "./uploads";

type Needs = Pick<Platform, "store" | "config" | "clock" | "log"> & { projects: ProjectsService };

const num = (v: string | undefined) => (v && /^\d+$/.test(v) ? Number(v) : undefined);

/** The blob backend the configuration names: S3 (`--s3-endpoint`) or files under the data dir. */
async function openBlobStore(config: Needs["config"]): Promise<BlobStore> {
  if (config.s3) {
    const { S3BlobStore } = await import("../backends/blobs/s3");
    const s3 = new S3BlobStore({ ...config.s3, spool: { dir: join(config.dataDir, "tmp", "s3-downloads"), maxBytes: config.s3SpoolMaxBytes, keepMs: config.s3SpoolKeepMs } });
    await s3.init();
    return s3;
  }
  const { FilesystemBlobStore } = await import("../backends/blobs/filesystem");
  const fs = new FilesystemBlobStore(join(config.dataDir, "blobs", "storage"));
  await fs.sweep();
  return fs;
}

/** Object storage: buckets, SQL policies, objects with ranges, resumable uploads (docs/storage.md). */
export const storageArea = defineArea({
  name: "storage",
  migrations: STORAGE_MIGRATIONS,
  start: async ({ store, config, clock, log }: Needs) => {
    const blobs = await openBlobStore(config);
    const settings: StorageSettings = {
      fileLimitBytes: num(process.env.KILN_STORAGE_FILE_LIMIT_BYTES),
      quotaBytes: num(process.env.KILN_STORAGE_QUOTA_BYTES),
      bandwidthBytes: num(process.env.KILN_STORAGE_BANDWIDTH_BYTES),
    };
    const limits = new StorageLimits(store, clock, settings);
    const storagePolicies = new PoliciesService(store, clock, log);
    const storageObjects = new ObjectsService(store, clock, blobs, storagePolicies, limits);
    const uploads = new UploadsService(store, clock, blobs, storageObjects, limits, log);
    return {
      blobs,
      buckets: new BucketsService(store, clock, blobs),
      storagePolicies,
      storageObjects,
      uploads,
      storageJobs: {
        expiry: null as { cancel(): void } | null,
        analyze: null as ReturnType<typeof setInterval> | null,
        orphans: null as { cancel(): void } | null,
        /** The sweep of unreferenced blobs under way, and whether Kiln is stopping. */
        sweeping: null as Promise<void> | null,
        stopping: false,
      },
    };
  },
  routes: (r) => {
    bucketRoutes(r);
    policyRoutes(r);
    objectRoutes(r);
  },
  project: { cleanup: (projectId, { buckets }) => buckets.removeAll(projectId) },
  // Expired upload sessions go hourly, on the platform clock (a test moves it 7 days and sees them gone).
  resume: async ({ uploads, clock, log, storageJobs, store, storageObjects, blobs }) => {
    await uploads.removeExpired().catch((e) => log.error("removing expired upload sessions failed", e));
    storageJobs.expiry = clock.every(3_600_000, () => uploads.removeExpired(), "storage upload expiry");
    // Blobs a crash left without a row: at start (in the background: it lists every blob) and daily.
    const graceMs = num(process.env.KILN_STORAGE_ORPHAN_GRACE_MS) ?? ORPHAN_GRACE_MS;
    const sweep = () => {
      if (storageJobs.sweeping || storageJobs.stopping) return;
      storageJobs.sweeping = sweepOrphanBlobs({ store, blobs, graceMs, stopped: () => storageJobs.stopping })
        .then(
          (r) => {
            if (r.removed || r.aborted)
              log.warn(`storage: removed ${r.removed} blob${r.removed === 1 ? "" : "s"} no object or upload session refers to, and aborted ${r.aborted} unfinished upload${r.aborted === 1 ? "" : "s"}, older than ${graceMs} ms (left by a crash or an interrupted removal); ${r.seen} looked at`);
          },
          (e) => log.error("sweeping unreferenced blobs failed", e),
        )
        .finally(() => (storageJobs.sweeping = null));
    };
    sweep();
    storageJobs.orphans = clock.every(86_400_000, sweep, "storage orphan sweep");
    // PGlite has no autovacuum, so nothing gathers statistics: without them the planner sorts a
    // whole bucket for a listing's first page (66 ms at 20k objects, 0.13 ms after ANALYZE). The
    // embedded store analyzes the objects table after every 500 writes (a PostgreSQL server's
    // autovacuum does this itself). Wall time: this keeps a measurement fresh, it is no rule.
    if (store.kind === "pglite") {
      storageJobs.analyze = setInterval(() => {
        if (storageObjects.writesSinceAnalyze < 500) return;
        storageObjects.writesSinceAnalyze = 0;
        void store.query("analyze storage_objects").catch((e) => log.error("analyzing storage_objects failed", e));
      }, 5000);
      storageJobs.analyze.unref?.();
    }
  },
  drain: async ({ storageJobs }) => {
    storageJobs.expiry?.cancel();
    storageJobs.orphans?.cancel();
    storageJobs.stopping = true;
    await storageJobs.sweeping;
    if (storageJobs.analyze) clearInterval(storageJobs.analyze);
  },
  stop: ({ blobs }) => blobs.close(),
});
