import type { Principal } from "../auth/principal";
import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { DatabaseRouteDeps } from "./query-runner";
import { roleName } from "./service";
import { branchParams, databaseParams, sqlBody, sqlErrorSchema, sqlResultSchema } from "./schemas";
import { runSql, SQL_LIMITS } from "./sql";

const tag = "Database SQL (Kiln extension)";
// Read-only project tokens are let in: their statement runs in a READ ONLY transaction, rolled back.
const auth = { kind: "project", access: "read" } as const;
const responses = {
  200: { description: "the statement's result", schema: sqlResultSchema },
  400: { description: "bad request, or PostgreSQL's error with its SQLSTATE and position", schema: sqlErrorSchema },
  401: errorSchema,
  403: errorSchema,
  404: errorSchema,
  409: errorSchema,
};

const readOnly = (p: Principal) => p.kind === "project_token" && p.scope === "read_only";

async function run(deps: DatabaseRouteDeps, principal: Principal, id: string, body: { query: string; params?: (string | number | boolean | null)[]; max_rows?: number; timeout_ms?: number }) {
  const ro = readOnly(principal);
  const r = await runSql(deps.databases.engine, id, body.query, body.params ?? [], {
    readOnly: ro,
    maxRows: body.max_rows ?? SQL_LIMITS.maxRowsDefault,
    timeoutMs: body.timeout_ms ?? SQL_LIMITS.timeoutMsDefault,
  });
  // Counted in top queries as a wire client's statement is: its text, the database's own role (the
  // one it ran as), its time and the rows it returned.
  deps.databases.activity.recordQuery(id, body.query, roleName(id), r.computeMs, r.rows.length);
  deps.databases.activity.recordUsage(id, { computeMs: r.computeMs, activeMs: r.computeMs, transfer: r.transferBytes });
  return reply.ok({ command: r.command, row_count: r.row_count, columns: r.columns, rows: r.rows, truncated: r.truncated, notices: r.notices, read_only: ro });
}

/** One SQL statement on a database or a branch, as the database's own role (docs/databases.md). */
export function sqlRoutes(r: AreaRouter<DatabaseRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/projects/{projectId}/databases/{databaseName}/sql",
    tag,
    summary:
      "Run one SQL statement as the database's own role (full access, like its connection string); statement timeout, row and size caps; read-only project tokens: a READ ONLY transaction, rolled back",
    auth,
    params: databaseParams,
    body: sqlBody,
    responses,
    handler: async ({ deps, principal, project, params, body }) => {
      const d = await deps.databases.activeByName(project.id, params.databaseName);
      return run(deps, principal, d.id, body);
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/databases/{databaseName}/branches/{branchName}/sql",
    tag,
    summary: "Run one SQL statement on a branch, as its own role; the same rules as the database's",
    auth,
    params: branchParams,
    body: sqlBody,
    responses,
    handler: async ({ deps, principal, project, params, body }) => {
      const { branch } = await deps.branches.activeByName(project.id, params.databaseName, params.branchName);
      return run(deps, principal, branch.id, body);
    },
  });
}
