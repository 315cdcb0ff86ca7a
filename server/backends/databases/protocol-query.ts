import { types } from "@electric-sql/pglite";
import { DatabaseQueryError, type QueryResult } from "./engine";
import type { PgliteSession } from "./pglite-thread";
import { B, concatBytes, eachMessage, errorFields, fromUtf8, MessageBuilder, readInt16, readInt32, simpleQuery, sync, utf8 } from "./wire/protocol";

/**
 * One query-API statement as a single protocol exchange with the database thread: its role set-up,
 * the statement (Parse/Bind/Describe/Execute, parameters as text) and the commit go in one call, and
 * the answer is read here with PGlite's own type parsers. PGlite's `query()` makes several calls
 * into WebAssembly per statement and runs slower on a worker thread: ~500 µs for a point select
 * through the thread against ~150 µs this way.
 */
export async function runOverProtocol(db: PgliteSession, init: string[], text: string, params: unknown[]): Promise<QueryResult> {
  const m = () => new MessageBuilder();
  const bind = m().cstring("").cstring("").int16(0).int16(params.length);
  for (const p of params) {
    if (p === null || p === undefined) bind.int32(-1);
    else {
      const bytes = utf8(typeof p === "string" ? p : String(p));
      bind.int32(bytes.length).bytes(bytes);
    }
  }
  bind.int16(0);
  const statement = [
    m().cstring("").cstring(text).int16(0).build(0x50), // Parse
    bind.build(0x42),
    m().byte(0x50).cstring("").build(0x44), // Describe the portal: its columns and their types
    m().cstring("").int32(0).build(0x45), // Execute
    sync(),
  ];
  // With a role to set up, one transaction around it all; COMMIT after a failure rolls back.
  const parts = init.length ? [simpleQuery(`BEGIN;\n${init.join(";\n")}`), ...statement, simpleQuery("COMMIT")] : statement;
  const t0 = performance.now();
  const out = await db.exec(concatBytes(parts));
  const computeMs = performance.now() - t0;

  let columns: { name: string; type: number }[] = [];
  const rows: Record<string, unknown>[] = [];
  let error: Record<string, string> | null = null;
  // The role set-up answers first (its set_config rows are not the statement's): read from ParseComplete on.
  let reached = false;
  eachMessage(out, (type, start, end) => {
    if (type === B.parseComplete) reached = true;
    else if (type === B.error && !error) error = errorFields(out.subarray(start, end));
    else if (!reached) return;
    else if (type === 0x54) columns = rowDescription(out, start); // T
    else if (type === B.dataRow) {
      const row: Record<string, unknown> = {};
      let at = start + 2;
      for (let i = 0; i < columns.length; i++) {
        const len = readInt32(out, at);
        at += 4;
        row[columns[i]!.name] = len < 0 ? null : parseValue(fromUtf8(out.subarray(at, at + len)), columns[i]!.type);
        if (len > 0) at += len;
      }
      rows.push(row);
    }
  });
  if (error) {
    const e = error as Record<string, string>;
    throw new DatabaseQueryError(e.M ?? "query failed", e.C);
  }
  return { rows, computeMs };
}

function rowDescription(out: Uint8Array, start: number): { name: string; type: number }[] {
  const columns: { name: string; type: number }[] = [];
  let at = start + 2;
  for (let i = readInt16(out, start); i > 0; i--) {
    const end = out.indexOf(0, at);
    const name = fromUtf8(out.subarray(at, end));
    at = end + 1 + 6; // table oid (4), column number (2)
    columns.push({ name, type: readInt32(out, at) });
    at += 4 + 2 + 4 + 2; // type oid, size, modifier, format
  }
  return columns;
}

/** Array types of the built-in element types, as PGlite's query() parses them. */
const ARRAY_ELEMENTS: Record<number, number> = {
  1000: 16, 1001: 17, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1231: 1700, 1009: 25, 1015: 1043,
  1014: 1042, 1115: 1114, 1185: 1184, 1182: 1082, 1183: 1083, 2951: 2950, 199: 114, 3807: 3802, 1028: 26,
};

function parseValue(text: string, type: number): unknown {
  const element = ARRAY_ELEMENTS[type];
  if (element !== undefined) return types.arrayParser(text, (x: string) => types.parseType(x, element), type);
  return types.parseType(text, type);
}
