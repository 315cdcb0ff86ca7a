import { badRequest } from "../http/errors";

export const MAX_SQL_CHARS = 100_000;

/** What `run_readonly_sql` accepts: queries (SELECT, VALUES, TABLE, WITH ... SELECT), EXPLAIN and SHOW. */
const READ_STATEMENTS = new Set(["SelectStmt", "ExplainStmt", "VariableShowStmt"]);

/**
 * Checks that `sql` is one read-only statement, by PostgreSQL's own parser (libpg-query): a 400
 * naming what is wrong otherwise. This is for a clear message; what makes it read-only is the
 * READ ONLY transaction the statement runs in (a data-modifying WITH or a function that writes is
 * refused by PostgreSQL itself).
 */
export async function checkReadOnlySql(sql: string): Promise<void> {
  // Loaded with the first SQL statement, not at start: its WebAssembly costs ~50 ms to load.
  const { parse } = await import("libpg-query");
  let tree: { stmts?: { stmt: Record<string, { intoClause?: unknown }> }[] };
  try {
    tree = await parse(sql);
  } catch (err) {
    throw badRequest(`invalid SQL: ${(err as Error).message}`);
  }
  const stmts = tree.stmts ?? [];
  if (stmts.length !== 1) throw badRequest(`send exactly one statement (this has ${stmts.length})`);
  const [kind, node] = Object.entries(stmts[0]!.stmt)[0] ?? [];
  if (!kind || !READ_STATEMENTS.has(kind))
    throw badRequest(`only read-only statements run here (SELECT, VALUES, TABLE, WITH ... SELECT, EXPLAIN, SHOW); this is ${kind ?? "empty"}: use modify_rows, or a full-scope connection string for other SQL`);
  if (kind === "SelectStmt" && node?.intoClause) throw badRequest("SELECT ... INTO creates a table: only read-only statements run here");
}
