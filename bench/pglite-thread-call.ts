// The database thread's hand-over alone (issue 26, "make the hand-over cheaper"): `PgliteThread.exec`
// of a prepared point select (Bind/Execute/Sync of one statement, as the session mux sends a client's
// batch) in a loop, no wire, no mux; this process's CPU per call by thread (main "bun", the database
// thread "Worker", the rest: JSC's GC helpers and JIT), next to the same calls on PGlite in process.
// Run: bun bench/pglite-thread-call.ts   (CALLS=20000, ROUNDS=3)
import { PGlite } from "@electric-sql/pglite";
import { rmSync } from "node:fs";
import { loadavg } from "node:os";
import { InProcessSession, PgliteThread, type PgliteSession } from "../server/backends/databases/pglite-thread";
import { concatBytes, simpleQuery, sync, utf8 } from "../server/backends/databases/wire/protocol";
import { PGLITE_CONF } from "../server/store/pglite-store";
import { pgliteFileOptions } from "../server/store/pglite-wasm";
import { emptyClusterDir } from "./pglite-in-process";
import { cpuByRole } from "./thread-cpu";

const CALLS = Number(process.env.CALLS ?? 20000);
const ROUNDS = Number(process.env.ROUNDS ?? 3);


/** A frontend message: type, int32 length, payload. */
function message(type: string, payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + payload.length);
  out[0] = type.charCodeAt(0);
  new DataView(out.buffer).setInt32(1, 4 + payload.length);
  out.set(payload, 5);
  return out;
}
const cstr = (s: string) => concatBytes([utf8(s), new Uint8Array(1)]);
const int16 = (n: number) => new Uint8Array([n >> 8, n & 0xff]);
const int32 = (n: number) => new Uint8Array([n >>> 24, (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff]);

/** Bind("", "point", one text parameter) + Execute + Sync. */
function pointSelect(id: number): Uint8Array {
  const v = utf8(String(id));
  const bind = message("B", concatBytes([cstr(""), cstr("point"), int16(0), int16(1), int32(v.length), v, int16(0)]));
  return concatBytes([bind, message("E", concatBytes([cstr(""), int32(0)])), sync()]);
}


async function main() {
  const dirs = [await emptyClusterDir("kiln-bench-threadcall-"), await emptyClusterDir("kiln-bench-threadcall-")];
  const sessions: Record<string, PgliteSession> = {
    thread: await PgliteThread.open(dirs[0]!, PGLITE_CONF),
    "in process": new InProcessSession(new PGlite(dirs[1]!, { ...pgliteFileOptions(), postgresqlconf: PGLITE_CONF } as ConstructorParameters<typeof PGlite>[0])),
  };
  await (sessions["in process"] as InProcessSession).db.waitReady;
  const calls = Array.from({ length: 1000 }, (_, i) => pointSelect(i + 1));
  for (const s of Object.values(sessions)) {
    await s.exec(simpleQuery("create table t (id int primary key, v text); insert into t select g, md5(g::text) from generate_series(1, 1000) g"));
    await s.exec(concatBytes([message("P", concatBytes([cstr("point"), cstr("select v from t where id = $1"), int16(0)])), sync()]));
    for (let i = 0; i < 2000; i++) await s.exec(calls[i % 1000]!); // warm-up
  }
  console.log(`load average at start: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  for (let r = 1; r <= ROUNDS; r++)
    for (const [name, s] of Object.entries(sessions)) {
      const c0 = cpuByRole();
      const t0 = performance.now();
      for (let i = 0; i < CALLS; i++) await s.exec(calls[i % 1000]!);
      const wall = performance.now() - t0;
      const c1 = cpuByRole();
      const per = (k: keyof typeof c1) => (((c1[k] - c0[k]) * 1000) / CALLS).toFixed(1);
      console.log(`round ${r} ${name}: wall ${((wall * 1000) / CALLS).toFixed(1)} µs/call; CPU main ${per("main")}, database thread ${per("database")}, other ${per("other")} µs/call`);
    }
  console.log(`load average at end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
  for (const s of Object.values(sessions)) await s.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}

await main();
