import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

let compiling: Promise<WebAssembly.Module> | null = null;

/**
 * Compiling PGlite's 9 MB WebAssembly takes ~170 ms. `kiln start` calls this first thing so the
 * compile runs on a background thread while the rest of Kiln loads and the data dir is copied;
 * every PGlite instance in the process then shares the compiled module.
 */
// Imports nothing but node: modules, so `kiln start` can call it before anything else loads.
export function compiledPglite(): Promise<WebAssembly.Module> {
  if (!compiling) {
    const dir = dirname(createRequire(import.meta.url).resolve("@electric-sql/pglite/package.json"));
    compiling = readFile(join(dir, "dist", "pglite.wasm")).then((bytes) => WebAssembly.compile(bytes));
  }
  return compiling;
}
