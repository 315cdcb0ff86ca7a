// The embedded log store on its own (server/backends/logs/file-store.ts, no Kiln, one thread): the write cost
// a line, the time to open (read every index) and the memory its index holds at N lines (default 1M),
// and search p50/p99 for the logs bench's queries. The lines are bench/logs.ts's kind.
// Run: bun bench/log-store-files.ts   (docs/observability.md has the figures)
import { mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FileLogStore } from "../server/backends/logs/file-store";
import { parseQuery } from "../server/logs/query";
import type { StoredLine } from "../server/backends/logs/log-store";
import { pct } from "./support";

const N = Number(process.env.N ?? 1_000_000);
const BATCH = 2000;
const words = "alpha beta gamma delta order customer payment invoice shipping user session cache miss hit request response timeout retry database query slow fast ok done start finish".split(" ");
const pick = () => words[Math.floor(Math.random() * words.length)];
let seq = 0;
let at = Date.UTC(2030, 0, 1);
function batch(): StoredLine[] {
  const out: StoredLine[] = [];
  let inv = "";
  for (let i = 0; i < BATCH; i++) {
    if (i % 200 === 0) inv = `inv-${seq}-${i}`;
    const body = pick() + " " + pick() + " id=" + Math.floor(Math.random() * 1e6) + " took " + Math.floor(Math.random() * 500) + "ms " + pick() + (Math.random() < 0.0005 ? " zebra-needle" : "");
    const err = Math.random() < 0.02;
    out.push({ id: `l${(seq++).toString(36).padStart(10, "0")}`, project_id: "prj1", resource_type: "function", resource_id: "fn1", resource_name: "hello", stream: "runtime", deployment_id: "dep1", invocation_id: inv, region: "local", level: err ? "error" : "info", structured: false, body, at: at++ });
  }
  return out;
}

const dir = mkdtempSync(join(tmpdir(), "bench-log-files-"));
try {
  const batches: StoredLine[][] = [];
  for (let i = 0; i < N / BATCH; i++) batches.push(batch());
  let store = new FileLogStore(dir);
  store.open();
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  for (const b of batches) await store.append(b);
  const c = process.cpuUsage(cpu0);
  const writeMs = performance.now() - t0;
  batches.length = 0;
  const bytes = readdirSync(dir, { recursive: true }).reduce((sum, f) => sum + statSync(join(dir, String(f))).size, 0);
  console.log(`write: ${N} lines; ${((writeMs * 1000) / N).toFixed(2)} us a line wall, ${((c.user + c.system) / N).toFixed(2)} us CPU; ${(bytes / 1e6).toFixed(0)} MB on disk (${(bytes / N).toFixed(0)} bytes a line)`);
  await store.close();
  Bun.gc(true);
  const heap0 = process.memoryUsage().heapUsed;
  const o0 = performance.now();
  store = new FileLogStore(dir);
  store.open();
  const openMs = performance.now() - o0;
  Bun.gc(true);
  const m = process.memoryUsage();
  console.log(`open: ${openMs.toFixed(0)} ms to read the index of ${N} lines; it holds ${((m.heapUsed - heap0) / 1e6).toFixed(1)} MB of heap (RSS ${(m.rss / 1e6).toFixed(0)} MB)`);
  for (const q of ["zebra-needle", "payment", "level:error", "level:error timeout", "absentword", "level:(error OR warn) -payment"]) {
    const limit = q.startsWith("level:(") ? 1000 : 100;
    const times: number[] = [];
    let found = 0;
    for (let i = 0; i < 50; i++) {
      const t = performance.now();
      found = (await store.search({ projectId: "prj1", resourceType: "function", where: parseQuery(q), limit })).length;
      times.push(performance.now() - t);
    }
    console.log(`search ${JSON.stringify(q)}, limit ${limit}: p50 ${pct(times, 50).toFixed(1)} ms, p99 ${pct(times, 99).toFixed(1)} ms; ${found} found`);
  }
  await store.close();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
