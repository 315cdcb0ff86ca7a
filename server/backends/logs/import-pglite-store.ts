import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "../../log";
import { LogDbThread } from "./log-db";
import { fromRow, LINE_COLUMNS, type LogImports } from "./log-store";

const SOURCE = "pglite-log-store";
const BATCH = 5000;
const DONE = "done";

/**
 * Kiln before session 11 kept the embedded profile's log lines in a PGlite database of their own
 * (`<data-dir>/logs`). At the first open of the segment-file store they move there: project by
 * project, oldest first, each batch written with its position (a move cut short resumes where it
 * stopped, without duplicates); then the old database is removed. Searches wait for the move (it
 * runs at the store's first use), so no line is missing from any answer.
 */
export async function importPgliteLogStore(dir: string, into: LogImports, log: Logger): Promise<void> {
  if (!existsSync(join(dir, "PG_VERSION"))) return;
  const saved = await into.importPosition(SOURCE);
  if (saved !== DONE) {
    const started = Date.now();
    let moved = 0;
    // Opening it brings an older store's schema up to date first (logs/002, 003).
    const db = new LogDbThread(dir);
    try {
      let pos = saved ? (JSON.parse(saved) as { project: string; at: string; id: string }) : null;
      const projects = (await db.query<{ p: string }>(`select distinct project_id as p from log_lines order by 1`)).map((r) => r.p).filter((p) => !pos || p >= pos.project);
      if (projects.length) log.info(`moving log lines of ${projects.length} projects from the previous log store (${dir})`);
      for (const project of projects) {
        let after = pos?.project === project ? { at: pos.at, id: pos.id } : null;
        for (;;) {
          const params: unknown[] = [project, BATCH];
          const where = after ? `and (at, id) > ($3::timestamptz, $4::text)` : "";
          if (after) params.push(after.at, after.id);
          // The position keeps PostgreSQL's own text of the time (microseconds, where a line has them).
          const rows = await db.query(`select ${LINE_COLUMNS.join(", ")}, at::text as at_pos from log_lines where project_id = $1 ${where} order by at, id limit $2`, params);
          if (!rows.length) break;
          const lines = rows.map(fromRow);
          after = { at: rows[rows.length - 1]!.at_pos as string, id: lines[lines.length - 1]!.id };
          await into.importBatch(SOURCE, lines, JSON.stringify({ project, ...after }));
          moved += lines.length;
        }
        pos = null;
      }
      await into.importBatch(SOURCE, [], DONE);
      if (moved) log.info(`moved ${moved} log lines from the previous log store in ${Date.now() - started} ms`);
    } finally {
      await db.close();
    }
  }
  rmSync(dir, { recursive: true, force: true });
}
