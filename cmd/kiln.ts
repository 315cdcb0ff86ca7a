#!/usr/bin/env bun
// The `kiln` command: `kiln start` runs the server; every other command is an API client.
import { buildProgram } from "./program";

buildProgram()
  .parseAsync(process.argv)
  .catch((err) => {
    console.error(`kiln: ${err?.message ?? err}`);
    process.exit(1);
  });
