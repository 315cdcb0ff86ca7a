#!/usr/bin/env bun
// The `kiln` command: `kiln start` runs the server; every other command is an API client.
import { compiledPglite } from "../server/store/pglite-wasm";

// `kiln start` with the embedded store: compile PGlite's WebAssembly on a background thread while the
// CLI and the server modules load (it is the longest single step of a start).
if (process.argv[2] === "start" && !process.argv.includes("--database-url") && !process.env.KILN_DATABASE_URL) void compiledPglite();

const { buildProgram } = await import("./program");
buildProgram()
  .parseAsync(process.argv)
  .catch((err) => {
    console.error(`kiln: ${err?.message ?? err}`);
    process.exit(1);
  });
