import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { embeddedFile } from "../embedded/embedded";

let compiling: Promise<WebAssembly.Module> | null = null;

/**
 * Compiling PGlite's 9 MB WebAssembly takes ~170 ms. `kiln start` calls this first thing so the
 * compile runs on a background thread while the rest of Kiln loads and the data dir is copied;
 * every PGlite instance in the process then shares the compiled module.
 */
// Imports nothing but node: modules, so `kiln start` can call it before anything else loads.
export function compiledPglite(): Promise<WebAssembly.Module> {
  if (!compiling) {
    const path = embeddedFile("pglite/pglite.wasm") ?? join(dirname(createRequire(import.meta.url).resolve("@electric-sql/pglite/package.json")), "dist", "pglite.wasm");
    compiling = readFile(path).then((bytes) => WebAssembly.compile(bytes));
  }
  return compiling;
}

/**
 * PGlite's own options for its data file. From source it finds pglite.data beside its module; in the
 * compiled binary a Worker's bundle sits elsewhere under /$bunfs/, so the embedded file is named here.
 */
export function pgliteFileOptions(): { fsBundle?: Blob } {
  const data = embeddedFile("pglite/pglite.data");
  return data ? { fsBundle: Bun.file(data) } : {};
}
