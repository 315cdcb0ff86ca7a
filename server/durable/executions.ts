import { notFound } from "../http/errors";
import { isoTimeOrNull as isoOrNull, isoTime as iso, type ControlStore, type Row } from "../store/store";
import type { ExecutionStatus } from "./schemas";

/** The 202 of a start or a re-run. */
export function startedView(r: Row) {
  return { id: r.id as string, durable_function_id: r.function_id as string, status: r.status as ExecutionStatus, created_at: iso(r.created_at) };
}

function summary(r: Row) {
  return {
    id: r.id as string,
    durable_function_id: r.function_id as string,
    status: r.status as ExecutionStatus,
    input: r.input ?? null,
    output: r.output ?? null,
    error: (r.error as string | null) ?? null,
    rerun_of: (r.rerun_of as string | null) ?? null,
    wake_at: r.status === "queued" || r.status === "sleeping" ? isoOrNull(r.wake_at) : null,
    created_at: iso(r.created_at),
    updated_at: iso(r.updated_at),
    finished_at: isoOrNull(r.finished_at),
  };
}

function stepView(s: Row) {
  const err = s.error as { message?: string; type?: string } | null;
  return {
    name: s.name as string,
    type: s.op as "run" | "sleep",
    status: s.status as "completed" | "failed" | "retrying" | "sleeping",
    attempts: s.attempts as number,
    started_at: isoOrNull(s.started_at),
    finished_at: isoOrNull(s.finished_at),
    output: s.status === "completed" ? (s.output ?? null) : null,
    error: err ? `${err.type ?? "Error"}: ${err.message ?? ""}` : null,
    wake_at: s.status === "sleeping" || s.status === "retrying" ? isoOrNull(s.wake_at) : null,
  };
}

export function executionView(r: Row, steps: Row[]) {
  return { ...summary(r), steps: steps.map(stepView) };
}

/** Reading executions and their journals, for the routes. */
export class ExecutionsReader {
  constructor(private readonly store: ControlStore) {}

  async list(functionId: string, o: { page: number; limit: number; status?: ExecutionStatus }) {
    const params: unknown[] = [functionId];
    let where = `function_id = $1`;
    if (o.status) {
      params.push(o.status);
      where += ` and status = $2`;
    }
    const [{ total }] = (await this.store.query(`select count(*)::int as total from durable_executions where ${where}`, params)) as [{ total: number }];
    const rows = await this.store.query(`select * from durable_executions where ${where} order by created_at desc, id desc limit ${o.limit} offset ${(o.page - 1) * o.limit}`, params);
    return { data: rows.map(summary), total };
  }

  async row(functionId: string, executionId: string): Promise<Row> {
    const [r] = await this.store.query(`select * from durable_executions where id = $1 and function_id = $2`, [executionId, functionId]);
    if (!r) throw notFound("execution not found");
    return r;
  }

  async get(functionId: string, executionId: string) {
    const r = await this.row(functionId, executionId);
    const steps = await this.store.query(`select * from durable_steps where execution_id = $1 order by seq`, [executionId]);
    return executionView(r, steps);
  }

  /** The position of the first step of that name, or null. */
  async stepSeq(executionId: string, name: string): Promise<number | null> {
    const [s] = await this.store.query(`select min(seq) as seq from durable_steps where execution_id = $1 and name = $2`, [executionId, name]);
    return s?.seq === null || s?.seq === undefined ? null : Number(s.seq);
  }

  /** Project cleanup: every execution and journal of the project. */
  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from durable_steps where execution_id in (select id from durable_executions where project_id = $1)`, [projectId]);
    await this.store.query(`delete from durable_executions where project_id = $1`, [projectId]);
  }
}
