#!/usr/bin/env bun
// The `kiln` command: `kiln start` runs the server; every other command is an API client.
import { compiledPglite } from "../server/store/pglite-wasm";

// `kiln start` with the embedded store: compile PGlite's WebAssembly on a background thread while the
// CLI and the server modules load (it is the longest single step of a start).
if (process.argv[2] === "start" && !process.argv.includes("--database-url") && !process.env.KILN_DATABASE_URL) void compiledPglite();

// The compiled binary is also its own page-hash process (server/backends/databases/page-hash.ts).
if (process.argv[2] === "__kiln-page-hash") {
  process.argv.splice(2, 1);
  await import("../server/backends/databases/page-hash-main");
} else await runCli();

async function runCli(): Promise<void> {
  const { buildProgram } = await import("./program");
  const { printError, wantsJson } = await import("./errors");
  const { CommanderError } = await import("commander");
  buildProgram()
    .parseAsync(process.argv)
    .catch((err) => {
      if (err instanceof CommanderError) {
        // --help and --version end here with 0; commander has printed its own error unless --json.
        if (err.exitCode === 0) process.exit(0);
        if (wantsJson(process.argv)) printError(err.code === "commander.help" ? new Error("this command needs a subcommand (see kiln <command> --help)") : err, true);
        process.exit(err.exitCode || 1);
      }
      printError(err, wantsJson(process.argv));
      process.exit(1);
    });
}
