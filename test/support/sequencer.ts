// The order the suite's files start in. On a clean clone vitest has no durations cached, so its own
// sequencer runs the projects one after another (alphabetically: unit last) and, within one, larger
// files first; the run then ended on long unit files with the other workers idle. Here every file of
// every project is ordered by how long it took alone (wall seconds, `test/support/cpu-per-file.sh`,
// 2026-11-26; refresh them when files grow), longest first, so the long ones overlap and the short
// ones fill the end. Files not listed count as 10 s; the container projects wait on their engine and
// start first.
import { BaseSequencer, type TestSpecification } from "vitest/node";

const SECONDS: Record<string, number> = {
  "embedded:test/http/functions.test.ts": 134,
  "embedded:test/http/cli.test.ts": 91,
  "postgres:test/http/database-branches.test.ts": 61,
  "postgres:test/http/database-restores.test.ts": 58,
  "postgres:test/http/database-clients.test.ts": 56,
  "embedded:test/http/database-clients.test.ts": 52,
  "postgres:test/http/functions.test.ts": 48,
  "embedded:test/http/database-backups.test.ts": 46,
  "embedded:test/http/logs.test.ts": 43,
  "postgres:test/http/database-backups.test.ts": 42,
  "postgres:test/http/metrics-usage.test.ts": 38,
  "embedded:test/http/database-branches.test.ts": 37,
  "s3:test/http/storage-memory.test.ts": 36,
  "embedded:test/http/databases.test.ts": 34,
  "embedded:test/http/durable-crash.test.ts": 32,
  "unit:test/unit/blob-stores.test.ts": 30,
  "unit:test/unit/runtime-sandbox.test.ts": 29,
  "postgres:test/http/start.test.ts": 29,
  "embedded:test/http/start.test.ts": 28,
  "embedded:test/http/durable-cli.test.ts": 27,
  "unit:test/unit/migrations.test.ts": 26,
  "postgres:test/http/logs.test.ts": 26,
  "postgres:test/http/durable-crash.test.ts": 25,
  "embedded:test/http/schedulers.test.ts": 24,
  "postgres:test/http/database-privileges.test.ts": 23,
  "embedded:test/http/storage-cli.test.ts": 22,
  "postgres:test/http/locks.test.ts": 22,
  "embedded:test/http/limits.test.ts": 20,
  "embedded:test/http/variables-scale.test.ts": 20,
  "postgres:test/http/scheduler-run-owners.test.ts": 20,
  "embedded:test/http/metrics-usage.test.ts": 20,
  "embedded:test/http/storage.test.ts": 19,
  "postgres:test/http/variables-scale.test.ts": 19,
  "embedded:test/http/function-archives.test.ts": 18,
  "postgres:test/http/schedulers.test.ts": 17,
  "embedded:test/http/durable-functions.test.ts": 17,
  "embedded:test/http/database-privileges.test.ts": 17,
  "unit:test/unit/fuzz-routes.test.ts": 16,
  "unit:test/unit/lock-counted.test.ts": 16,
  "postgres:test/http/durable-functions.test.ts": 15,
  "embedded:test/http/function-sandbox.test.ts": 15,
  "postgres:test/http/databases.test.ts": 15,
  "unit:test/unit/wire-listener.test.ts": 13,
  "s3:test/http/storage.test.ts": 13,
  "postgres:test/http/projects.test.ts": 13,
  "embedded:test/http/projects.test.ts": 13,
  "embedded:test/http/database-restores.test.ts": 12,
  "unit:test/unit/copy-rows.test.ts": 12,
  "unit:test/unit/lock-table.test.ts": 12,
};

function weight(spec: TestSpecification): number {
  const project = spec.project.name;
  if (project.startsWith("containers")) return 1000;
  const file = spec.moduleId.slice(spec.project.config.root.length + 1);
  return SECONDS[`${project}:${file}`] ?? 10;
}

export default class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = [...files].sort((a, b) => weight(b) - weight(a));
    if (process.env.KILN_TEST_PRINT_ORDER) console.log(sorted.map((s) => `${s.project.name}:${s.moduleId.slice(s.project.config.root.length + 1)} ${weight(s)}`).join("\n"));
    return sorted;
  }
}
