// Reading PostgreSQL backend messages in tests that speak the wire protocol directly.
import { fromUtf8, readInt16, readInt32 } from "../../server/backends/databases/wire/protocol";

/** The values of a DataRow payload as text ("NULL" for SQL NULL). */
export function dataRowValues(payload: Uint8Array): string[] {
  const row: string[] = [];
  let at = 2;
  for (let i = readInt16(payload, 0); i > 0; i--) {
    const len = readInt32(payload, at);
    row.push(len < 0 ? "NULL" : fromUtf8(payload.subarray(at + 4, at + 4 + len)));
    at += 4 + Math.max(len, 0);
  }
  return row;
}
