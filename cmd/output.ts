/** Tables for people, JSON for scripts. */
export function printTable(rows: Record<string, unknown>[], columns: string[]): void {
  if (rows.length === 0) {
    console.log("(none)");
    return;
  }
  const cell = (v: unknown) => (v === null || v === undefined ? "-" : Array.isArray(v) ? v.join(",") || "-" : String(v));
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((r) => cell(r[c]).length)));
  const line = (vals: string[]) => vals.map((v, i) => v.padEnd(widths[i]!)).join("  ").trimEnd();
  console.log(line(columns.map((c) => c.toUpperCase())));
  for (const r of rows) console.log(line(columns.map((c) => cell(r[c]))));
}

export function printObject(obj: Record<string, unknown>): void {
  const width = Math.max(...Object.keys(obj).map((k) => k.length));
  for (const [k, v] of Object.entries(obj))
    console.log(`${k.padEnd(width)}  ${v === null || v === undefined ? "-" : typeof v === "object" ? JSON.stringify(v) : String(v)}`);
}

export function output(json: boolean | undefined, data: unknown, human: () => void): void {
  if (json) console.log(JSON.stringify(data, null, 2));
  else human();
}
