import { embeddedFile } from "../../embedded/embedded";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import type { PGlite } from "@electric-sql/pglite";

// pg_dump 18 compiled to WebAssembly, from @electric-sql/pglite-tools, run against a PGlite instance
// in this thread. The package's own pgDump() reads its output back as UTF-8 text, which breaks the
// custom format (binary); the Emscripten module factory it wraps is not exported, so it is taken from
// the package's bundle (the version is pinned in package.json; a bundle without it is a clear error).
// Loaded only by a database thread that is asked for a dump.

interface PgDumpModule {
  ENV: Record<string, string>;
  FS: { chmod(path: string, mode: number): void; readFile(path: string): Uint8Array; unlink(path: string): void };
  HEAPU8: Uint8Array;
  HEAP8: Int8Array;
  addFunction(fn: (ptr: number, len: number) => number, sig: string): number;
  _pgl_set_rw_cbs(read: number, write: number): void;
  callMain(args: string[]): number;
  onRuntimeInitialized?: () => void;
}
type Factory = (overrides: Record<string, unknown>) => Promise<PgDumpModule>;

const START = "var j=(()=>{";
const END = "})(),I=j;";
let factory: Promise<{ make: Factory; dist: string }> | null = null;

function load(): Promise<{ make: Factory; dist: string }> {
  factory ??= (async () => {
    // The compiled binary embeds the chunk and pg_dump.wasm side by side (cmd/build-binary.ts).
    const embeddedChunk = embeddedFile("pg-dump/pg_dump.js");
    const dist = embeddedChunk ? dirname(embeddedFile("pg-dump/pg_dump.wasm")!) : dirname(createRequire(import.meta.url).resolve("@electric-sql/pglite-tools/pg_dump"));
    const bundle = readFileSync(embeddedChunk ?? join(dist, (readFileSync(join(dist, "pg_dump.js"), "utf8").match(/\.\/(chunk-[A-Z0-9]+\.js)/) ?? [])[1] ?? "missing"), "utf8");
    const end = bundle.indexOf(END);
    if (!bundle.includes(START) || end < 0) throw new Error("this version of @electric-sql/pglite-tools is not the one Kiln reads pg_dump from (see package.json)");
    const source = bundle.slice(0, end + END.length) + "export default j;";
    const mod = (await import(`data:text/javascript;base64,${Buffer.from(source).toString("base64")}`)) as { default: Factory };
    return { make: mod.default, dist };
  })();
  factory.catch(() => (factory = null));
  return factory;
}

/** Runs pg_dump with `args` (without -f) against `pg`; its output file's bytes, or throws with its stderr. */
export async function pgDumpBytes(pg: PGlite, args: string[]): Promise<Uint8Array> {
  const { make, dist } = await load();
  const out = "/tmp/kiln-dump";
  let exitCode = 0;
  let stderr = "";
  let answer = new Uint8Array(0);
  const mod = await make({
    noExitRuntime: false,
    locateFile: (f: string) => join(dist, f),
    print: () => {},
    printErr: (t: string) => {
      stderr += `${t}\n`;
    },
    onExit: (status: number) => {
      exitCode = status;
    },
    preRun: [
      (m: PgDumpModule) => {
        m.ENV.HOME = "/home/postgres";
        m.ENV.USER = "postgres";
        m.ENV.LOGNAME = "postgres";
        m.onRuntimeInitialized = () => {
          // pg_dump's socket is these two calls: what it writes goes to PGlite, PGlite's answer is read back.
          const write = m.addFunction((ptr, len) => {
            void pg.execProtocolRawStream(m.HEAPU8.subarray(ptr, ptr + len), {
              onRawData: (d: Uint8Array) => {
                const joined = new Uint8Array(answer.length + d.length);
                joined.set(answer);
                joined.set(d, answer.length);
                answer = joined;
              },
            });
            return len;
          }, "iii");
          const read = m.addFunction((ptr, max) => {
            const n = Math.min(answer.length, max);
            m.HEAP8.set(answer.subarray(0, n) as unknown as Int8Array, ptr);
            answer = answer.subarray(n);
            return n;
          }, "iii");
          m._pgl_set_rw_cbs(read, write);
          m.FS.chmod("/home/postgres/.pgpass", 0o600);
        };
      },
    ],
  });
  mod.callMain(["-U", "postgres", "-j", "1", ...args, "-f", out]);
  // pg_dump leaves its session's prepared statements behind (the package's README says so).
  await pg.exec("deallocate all");
  if (exitCode !== 0) throw new Error(`pg_dump failed (${exitCode}): ${stderr.trim().slice(0, 2000)}`);
  return mod.FS.readFile(out);
}
