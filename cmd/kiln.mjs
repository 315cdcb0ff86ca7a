#!/usr/bin/env node
// The `kiln` bin (package.json): runs cmd/kiln.ts under the Bun that Kiln depends on, so `npx kiln`
// works from any folder of a project that depends on Kiln without `bun` on PATH. Plain Node (any
// version npm runs on), no dependencies. Arguments, working directory, environment and stdio go
// through unchanged; signals are relayed; the exit code (or the signal that ended Kiln) is ours.
import { spawn } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { constants } from "node:os";
import { dirname, join } from "node:path";
import { isatty } from "node:tty";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

/** The Bun binary of the `bun` package Kiln resolves from its own folder (not PATH). */
function bunBinary() {
  let pkgDir;
  try {
    pkgDir = dirname(require.resolve("bun/package.json"));
  } catch {
    fail("the `bun` package is not installed next to Kiln; run `npm install` in the project");
  }
  const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
  const bin = join(pkgDir, typeof pkg.bin === "string" ? pkg.bin : (pkg.bin?.bun ?? "bin/bun.exe"));
  // The package ships a placeholder there that its postinstall replaces with the real binary. With
  // install scripts off, the binary is still in the platform package (@oven/bun-<os>-<arch>[-musl]).
  if (existsSync(bin) && statSync(bin).size > 1 << 20) return bin;
  const arch = process.arch === "arm64" ? "aarch64" : process.arch;
  const os = process.platform === "win32" ? "windows" : process.platform;
  for (const variant of ["", "-musl", "-baseline", "-musl-baseline"]) {
    try {
      const platformPkg = dirname(createRequire(join(pkgDir, "package.json")).resolve(`@oven/bun-${os}-${arch}${variant}/package.json`));
      for (const exe of ["bin/bun", "bin/bun.exe"]) if (existsSync(join(platformPkg, exe))) return join(platformPkg, exe);
    } catch {}
  }
  fail(`Bun's binary is missing from ${pkgDir} (installed with --ignore-scripts?); reinstall with scripts enabled: npm rebuild bun`);
}

function fail(message) {
  process.stderr.write(`kiln: ${message}\n`);
  process.exit(1);
}

// Bun's own JavaScriptCore options: a `kiln start` from here is a server that lives for hours, whose
// databases run fastest once JSC optimizes PGlite's hot WebAssembly at its usual thresholds. The raised
// thresholds of cmd/jsc-options.json, which save CPU in a Kiln living seconds, are set by kiln/testing
// and the test suite (docs/databases.md, "PGlite's WebAssembly tiers").
const child = spawn(bunBinary(), [join(here, "kiln.ts"), ...process.argv.slice(2)], { stdio: "inherit", env: process.env });

// Relay signals sent to this process. A terminal's Ctrl-C (SIGINT) already reaches Kiln too (same
// process group), and Kiln takes a second SIGINT as "exit at once", so SIGINT is relayed only when
// stdin is not a terminal (a process manager or a test signalling this pid). isatty, not
// process.stdin: creating that stream could change the terminal's mode under Kiln. (SIGUSR1 is
// Node's debugger signal and is left alone.)
const terminal = isatty(0);
const relayed = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR2"];
const relay = (signal) => {
  if (signal === "SIGINT" && terminal) return;
  if (child.exitCode === null && child.signalCode === null) child.kill(signal);
};
for (const s of relayed) process.on(s, relay);

child.on("error", (e) => fail(`cannot run Bun: ${e.message}`));
child.on("exit", (code, signal) => {
  if (!signal) process.exit(code ?? 1);
  // End the way Kiln ended, so a shell sees 128 + n; a signal that does not end us: that status.
  for (const s of relayed) process.off(s, relay);
  process.kill(process.pid, signal);
  setTimeout(() => process.exit(128 + (constants.signals[signal] ?? 0)), 100);
});
