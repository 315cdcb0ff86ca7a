// A candidate design for the embedded log store, measured (issue 14; not Kiln code): segments of
// lines appended as JSON to one file, an in-memory index of each segment's span and keys (keys.ts),
// searches walking the index newest first and parsing only candidate segments. Prints the write cost
// a line on one thread and search p50/p99 over N lines (default 1M) for the bench's queries.
// Run: bun bench/log-store-files.ts   (docs/observability.md has the figures against the SQL store)
import { closeSync, openSync, readSync, writeSync, rmSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { segmentsOf, type StoredLine } from "../server/logs/store";
import { requiredKeys, keysSatisfy } from "../server/logs/keys";
import { parseQuery, toPredicate } from "../server/logs/query";

const N = Number(process.env.N ?? 1_000_000);
const BATCH = 2000;
const words = "alpha beta gamma delta order customer payment invoice shipping user session cache miss hit request response timeout retry database query slow fast ok done start finish".split(" ");
const pick = () => words[Math.floor(Math.random() * words.length)];
let seq = 0;
let at = Date.UTC(2030, 0, 1);
function batch(): StoredLine[] {
  const out: StoredLine[] = [];
  let inv = `inv${seq}`;
  for (let i = 0; i < BATCH; i++) {
    if (i % 200 === 0) inv = `inv-${seq}-${i}`;
    const body = pick() + " " + pick() + " id=" + Math.floor(Math.random() * 1e6) + " took " + Math.floor(Math.random() * 500) + "ms " + pick() + (Math.random() < 0.0005 ? " zebra-needle" : "");
    const err = Math.random() < 0.02;
    out.push({ id: `l${(seq++).toString(36).padStart(10, "0")}`, project_id: "prj1", resource_type: "function", resource_id: "fn1", resource_name: "hello", stream: "runtime", deployment_id: null, invocation_id: inv, region: "local", level: err ? "error" : "info", structured: false, body, at: at++ });
  }
  return out;
}

interface Entry { off: number; len: number; keys: Uint32Array }
const dir = mkdtempSync(join(tmpdir(), "proto-logs-"));
const fd = openSync(join(dir, "seg"), "a+");
const index: Entry[] = [];
let fileOff = 0;
let segs = 0;
const batches: StoredLine[][] = [];
for (let i = 0; i < N / BATCH; i++) batches.push(batch());
const t0 = performance.now();
const cpu0 = process.cpuUsage();
for (const b of batches) {
  const ss = segmentsOf(b, () => String(segs++));
  let text = "";
  const ents: Entry[] = [];
  for (const s of ss) {
    const t = JSON.stringify(s.lines) + "\n";
    const len = Buffer.byteLength(t);
    const keys = Uint32Array.from(s.keys).sort();
    ents.push({ off: fileOff, len, keys });
    fileOff += len;
    text += t;
  }
  writeSync(fd, text);
  index.push(...ents);
}
const c = process.cpuUsage(cpu0);
const writeMs = performance.now() - t0;
console.log(`write: ${N} lines, ${index.length} segments, ${(fileOff / 1e6).toFixed(0)} MB; ${(writeMs * 1000 / N).toFixed(2)} us/line wall, ${((c.user + c.system) / N).toFixed(2)} us/line cpu`);

function has(keys: Uint32Array, k: number): boolean {
  let lo = 0, hi = keys.length - 1;
  while (lo <= hi) { const m = (lo + hi) >> 1; const v = keys[m]!; if (v === k) return true; if (v < k) lo = m + 1; else hi = m - 1; }
  return false;
}
function search(q: string, limit = 100): { found: number; segsRead: number } {
  const node = parseQuery(q)!;
  const cond = requiredKeys(node);
  const pred = toPredicate(node);
  const found: StoredLine[] = [];
  let segsRead = 0;
  for (let i = index.length - 1; i >= 0 && found.length < limit; i--) {
    const e = index[i]!;
    if (cond && !keysSatisfy(cond, (k) => has(e.keys, k >>> 0))) continue;
    const buf = Buffer.allocUnsafe(e.len);
    readSync(fd, buf, 0, e.len, e.off);
    segsRead++;
    const lines = JSON.parse(buf.toString("utf8")) as StoredLine[];
    for (let j = lines.length - 1; j >= 0 && found.length < limit; j--) if (pred(lines[j]!)) found.push(lines[j]!);
  }
  return { found: found.length, segsRead };
}
for (const q of ["zebra-needle", "payment", "level:error", "level:error timeout", "absentword", "level:(error OR warn) -payment"]) {
  const times: number[] = [];
  let r = { found: 0, segsRead: 0 };
  for (let i = 0; i < 30; i++) { const t = performance.now(); r = search(q, q.startsWith("level:(") ? 1000 : 100); times.push(performance.now() - t); }
  times.sort((a, b) => a - b);
  console.log(`search ${JSON.stringify(q)}: p50 ${times[15]!.toFixed(1)} ms, p99 ${times[29]!.toFixed(1)} ms; found ${r.found}, segments read ${r.segsRead}`);
}
closeSync(fd);
rmSync(dir, { recursive: true, force: true });
