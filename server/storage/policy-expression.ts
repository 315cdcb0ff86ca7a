
/**
 * Storage policy definitions are SQL boolean expressions over the object, evaluated by PostgreSQL.
 * Before one is stored it is parsed by PostgreSQL's own parser (libpg-query) and walked against an
 * allow-list: the object's columns, constants, operators, CASE/COALESCE/NULLIF, casts to plain
 * types, array subscripts, and a short list of pure functions (the auth.* and storage.* helpers,
 * text and JSON functions). Subqueries, table references, other functions (side effects, file
 * access, sleeps, settings) and every other construct are refused with a 400 naming it and its
 * position, so a policy can neither read other tables nor change anything. Request data never
 * enters the SQL text: it reaches the expression only as the bound columns of the candidate object
 * and as transaction-local settings behind auth.uid(), auth.role() and auth.email().
 */

/** The object as policies see it. */
export const POLICY_COLUMNS = ["bucket_id", "name", "owner_id", "size", "mime_type", "is_public", "metadata"] as const;

const FUNCTIONS = new Set([
  "auth.uid",
  "auth.role",
  "auth.email",
  "storage.foldername",
  "storage.filename",
  "storage.extension",
  "lower",
  "upper",
  "length",
  "char_length",
  "starts_with",
  "split_part",
  "substring",
  "substr",
  "left",
  "right",
  "trim",
  "btrim",
  "ltrim",
  "rtrim",
  "replace",
  "position",
  "strpos",
  "concat",
  "array_length",
  "cardinality",
  "array_position",
  "jsonb_typeof",
  "jsonb_extract_path_text",
  "abs",
  "greatest",
  "least",
]);

const TYPES = new Set(["text", "varchar", "int4", "int8", "int2", "integer", "bigint", "smallint", "numeric", "bool", "boolean", "jsonb", "uuid", "float8", "float4"]);

/** Operators by name; `~` and friends are POSIX regex matches (PostgreSQL's engine bounds them). */
const OPERATORS = new Set(["=", "<>", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "||", "~~", "!~~", "~~*", "!~~*", "~", "~*", "!~", "!~*", "->", "->>", "#>", "#>>", "?", "?|", "?&", "@>", "<@", "&&"]);

const EXPR_KINDS = new Set(["AEXPR_OP", "AEXPR_IN", "AEXPR_LIKE", "AEXPR_ILIKE", "AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN", "AEXPR_DISTINCT", "AEXPR_NOT_DISTINCT", "AEXPR_NULLIF", "AEXPR_OP_ANY", "AEXPR_OP_ALL"]);

export type PolicyCheck = { ok: true; sql: string } | { ok: false; error: string };

const MAX_DEFINITION = 4096;
const MAX_DEPTH = 64;

/** Position (1-based character) of a libpg-query `location` within the definition. */
function at(location: unknown, offset: number): string {
  return typeof location === "number" && location >= offset ? ` at character ${location - offset + 1}` : "";
}

function names(list: unknown): string[] {
  return ((list as Array<{ String?: { sval: string } }>) ?? []).map((n) => n.String?.sval ?? "?");
}

/**
 * Parses and checks a definition; on success returns it as the SQL Kiln evaluates (the text as
 * given, in parentheses: it was checked whole, so it cannot close the parenthesis and add more).
 */
export async function checkPolicyDefinition(definition: string): Promise<PolicyCheck> {
  const def = definition.trim();
  if (!def) return { ok: false, error: "definition is empty: write a boolean SQL expression, e.g. owner_id = auth.uid()" };
  if (def.length > MAX_DEFINITION) return { ok: false, error: `definition is longer than ${MAX_DEFINITION} characters` };
  if (def.includes(";")) return { ok: false, error: "definition must be one expression (no ';')" };
  const prefix = "SELECT (";
  const sql = `${prefix}${def}\n)`;
  let tree: any;
  try {
    // Loaded at the first policy written, not at every start: its WebAssembly costs ~50 ms to load.
    const { parse } = await import("libpg-query");
    tree = await parse(sql);
  } catch (err) {
    const e = err as { message?: string; sqlDetails?: { cursorPosition?: number } };
    const pos = e.sqlDetails?.cursorPosition;
    const where = typeof pos === "number" && pos > prefix.length ? ` at character ${Math.min(pos - prefix.length, def.length + 1)}` : "";
    return { ok: false, error: `definition is not a valid SQL expression: ${e.message ?? err}${where}` };
  }
  const stmts = tree?.stmts ?? [];
  const select = stmts[0]?.stmt?.SelectStmt;
  if (stmts.length !== 1 || !select || select.fromClause || select.whereClause || select.targetList?.length !== 1 || select.groupClause || select.sortClause || select.limitCount)
    return { ok: false, error: "definition must be one boolean expression" };
  try {
    walk(select.targetList[0].ResTarget.val, prefix.length, 0);
  } catch (err) {
    if (err instanceof PolicyRefused) return { ok: false, error: err.message };
    throw err;
  }
  return { ok: true, sql: `(${def}\n)` };
}

class PolicyRefused extends Error {}
const refuse = (msg: string): never => {
  throw new PolicyRefused(msg);
};

function walk(node: any, offset: number, depth: number): void {
  if (depth > MAX_DEPTH) refuse(`definition nests deeper than ${MAX_DEPTH} levels`);
  if (node === null || node === undefined) return;
  if (Array.isArray(node)) {
    for (const n of node) walk(n, offset, depth + 1);
    return;
  }
  const [kind] = Object.keys(node);
  const v = node[kind!];
  const next = (x: unknown) => walk(x, offset, depth + 1);
  switch (kind) {
    case "A_Const":
      return;
    case "ColumnRef": {
      const fields = v.fields as Array<{ String?: { sval: string }; A_Star?: unknown }>;
      const name = fields.length === 1 ? fields[0]!.String?.sval : undefined;
      if (!name || !(POLICY_COLUMNS as readonly string[]).includes(name))
        refuse(`unknown column '${fields.map((f) => f.String?.sval ?? "*").join(".")}'${at(v.location, offset)}: a policy can use ${POLICY_COLUMNS.join(", ")}`);
      return;
    }
    case "A_Expr": {
      if (!EXPR_KINDS.has(v.kind)) refuse(`operator kind ${v.kind} is not allowed in a policy${at(v.location, offset)}`);
      for (const op of names(v.name)) if (!OPERATORS.has(op)) refuse(`operator '${op}' is not allowed in a policy${at(v.location, offset)}`);
      next(v.lexpr);
      next(v.rexpr);
      return;
    }
    case "BoolExpr":
    case "NullTest":
    case "BooleanTest":
      next(v.args ?? v.arg);
      return;
    case "List":
      next(v.items);
      return;
    case "A_ArrayExpr":
      next(v.elements);
      return;
    case "CoalesceExpr":
    case "MinMaxExpr":
      next(v.args);
      return;
    case "CaseExpr":
      next(v.arg);
      next(v.args);
      next(v.defresult);
      return;
    case "CaseWhen":
      next(v.expr);
      next(v.result);
      return;
    case "A_Indirection":
      next(v.arg);
      for (const i of v.indirection ?? []) {
        if (!i.A_Indices) refuse(`only array subscripts are allowed after an expression${at(v.location, offset)}`);
        next(i.A_Indices.lidx);
        next(i.A_Indices.uidx);
      }
      return;
    case "TypeCast": {
      const type = names(v.typeName?.names).filter((n) => n !== "pg_catalog").join(".");
      if (!TYPES.has(type)) refuse(`cast to '${type}' is not allowed in a policy${at(v.location, offset)}`);
      next(v.arg);
      return;
    }
    case "FuncCall": {
      const fn = names(v.funcname).filter((n) => n !== "pg_catalog").join(".");
      if (!FUNCTIONS.has(fn)) refuse(`function ${fn}() is not allowed in a policy${at(v.location, offset)}: use ${[...FUNCTIONS].slice(0, 6).join("(), ")}() or plain operators`);
      if (v.agg_filter || v.over || v.agg_order || v.agg_star || v.agg_distinct) refuse(`aggregates and window functions are not allowed in a policy${at(v.location, offset)}`);
      next(v.args);
      return;
    }
    case "SubLink":
      return refuse(`subqueries are not allowed in a policy${at(v.location, offset)}: a policy sees only the object`);
    default:
      return refuse(`${kind} is not allowed in a policy${at(v?.location, offset)}`);
  }
}
