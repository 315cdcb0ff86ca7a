import { createHash } from "node:crypto";
import { classify } from "../logs/ingest";
import type { LogsService } from "../logs/service";
import type { StoredLine } from "../backends/logs/log-store";
import type { ControlStore } from "../store/store";

const BATCH = 5000;

/**
 * A moved build line's id: its time, its seq (so lines of one instant keep their order), then
 * characters of a hash of the deployment, so moving the same row twice gives the same id (the log
 * store skips lines it has).
 */
function buildLineId(atMs: number, deploymentId: string, seq: number): string {
  const h = BigInt(`0x${createHash("sha256").update(deploymentId).digest("hex").slice(0, 16)}`).toString(36).padStart(5, "0").slice(-5);
  return Math.max(0, atMs).toString(36).padStart(9, "0").slice(-9) + Math.max(0, seq).toString(36).padStart(6, "0").slice(-6) + h;
}

/**
 * Earlier versions kept invocation lines in `function_logs` and build lines in
 * `function_build_logs` (this area's tables in the control store). At start they move into the
 * log store: each batch is written there with its position in one transaction, then deleted
 * here, so a move cut short resumes where it stopped, without duplicates. Build lines go first
 * and are awaited (the deployment history reads them); invocation lines move in the background.
 */
export async function moveLegacyLogs(control: ControlStore, logs: LogsService, region: string): Promise<{ runtime: Promise<void> }> {
  const [has] = await control.query<{ logs: boolean; builds: boolean }>(
    `select exists (select 1 from function_logs) as logs, exists (select 1 from function_build_logs) as builds`,
  );
  if (has?.builds) await moveBuildLines(control, logs, region);
  return { runtime: has?.logs ? moveRuntimeLines(control, logs) : Promise.resolve() };
}

async function moveRuntimeLines(control: ControlStore, logs: LogsService): Promise<void> {
  let after = (await logs.importPosition("function_logs")) ?? "";
  // What a move cut short wrote there and did not yet delete here.
  await control.query(`delete from function_logs where id <= $1`, [after]);
  for (;;) {
    const rows = await control.query(
      `select l.*, coalesce(f.name, l.function_id) as name from function_logs l left join functions f on f.id = l.function_id where l.id > $1 order by l.id limit ${BATCH}`,
      [after],
    );
    if (!rows.length) return;
    const lines: StoredLine[] = rows.map((r) => ({
      ...classify(r.body as string, r.level as string),
      id: r.id,
      project_id: r.project_id,
      resource_type: "function",
      resource_id: r.function_id,
      resource_name: r.name,
      stream: "runtime",
      deployment_id: r.deployment_id ?? null,
      invocation_id: r.invocation_id ?? null,
      region: r.region,
      body: r.body,
      at: new Date(r.at).getTime(),
    }));
    after = rows[rows.length - 1]!.id as string;
    await logs.importBatch("function_logs", lines, after);
    await control.query(`delete from function_logs where id <= $1`, [after]);
  }
}

async function moveBuildLines(control: ControlStore, logs: LogsService, region: string): Promise<void> {
  const saved = await logs.importPosition("function_build_logs");
  let after: [string, number] = saved ? (JSON.parse(saved) as [string, number]) : ["", -1];
  await control.query(`delete from function_build_logs where (deployment_id, seq) <= ($1::text, $2::integer)`, after);
  for (;;) {
    const rows = await control.query(
      `select b.*, d.project_id, d.function_id, coalesce(f.name, d.function_id) as name
         from function_build_logs b join function_deployments d on d.id = b.deployment_id left join functions f on f.id = d.function_id
        where (b.deployment_id, b.seq) > ($1::text, $2::integer) order by b.deployment_id, b.seq limit ${BATCH}`,
      after,
    );
    if (!rows.length) break;
    const lines: StoredLine[] = rows.map((r) => ({
      id: buildLineId(new Date(r.at).getTime(), r.deployment_id as string, r.seq as number),
      project_id: r.project_id,
      resource_type: "function",
      resource_id: r.function_id,
      resource_name: r.name,
      stream: "build",
      deployment_id: r.deployment_id,
      invocation_id: null,
      region,
      level: classify("", r.level as string).level,
      structured: false,
      body: r.line,
      at: new Date(r.at).getTime(),
    }));
    const last = rows[rows.length - 1]!;
    after = [last.deployment_id as string, last.seq as number];
    await logs.importBatch("function_build_logs", lines, JSON.stringify(after));
    await control.query(`delete from function_build_logs where (deployment_id, seq) <= ($1::text, $2::integer)`, after);
  }
  // Lines of deployments that no longer exist have nothing to show under.
  await control.query(`delete from function_build_logs where deployment_id not in (select id from function_deployments)`);
}
