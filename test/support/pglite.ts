// Fresh PGlite clusters for unit tests without an initdb each: a fresh PGlite runs initdb for
// seconds (tens of seconds on a loaded runner), so an empty cluster is made once per machine in
// Kiln's template cache (server/store/template.ts) and each use is a copy of it (tens of ms).
import type { PGlite } from "@electric-sql/pglite";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "vitest";
import { openPglite, PGLITE_CONF, type PgliteExtensions } from "../../server/store/pglite-store";
import { createFromTemplate, type TemplateSpec } from "../../server/store/template";
import { removeDir } from "./dirs";

const EMPTY_CLUSTER: TemplateSpec = { kind: "test-empty-cluster", fingerprint: "1", prepare: async () => {}, drop: [] };

// Removed when the test file ends (a worker process is ended without its "exit" event, which left
// them behind).
const made: string[] = [];
afterAll(() => made.splice(0).forEach(removeDir));

/** A new data dir holding an empty cluster (removed when the test file ends). */
export async function freshDataDir(prefix = "kiln-test-pglite-"): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  rmSync(dir, { recursive: true });
  made.push(dir);
  await createFromTemplate(EMPTY_CLUSTER, dir);
  return dir;
}

/** An open PGlite with Kiln's embedded settings on a fresh data dir, its sessions in UTC (as an in-memory PGlite's). */
export async function freshPglite(extensions?: PgliteExtensions): Promise<PGlite> {
  return openPglite(await freshDataDir(), { postgresqlconf: [...PGLITE_CONF, "timezone=UTC"], ...(extensions ? { extensions } : {}) });
}
