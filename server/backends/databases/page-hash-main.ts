// The page-hash process (snapshot.ts `inPageHashProcess`): `fingerprint <dir>` prints a data dir's
// fingerprint; `divergence <dir>` reads a fingerprint on stdin and prints the bytes that differ from it;
// `refresh <dir>` reads a fingerprint on stdin and prints it brought up to date for changed files.
import { divergenceOfDirSync, fingerprintDirSync, refreshFingerprintSync } from "./page-hash";

const [op, dir] = process.argv.slice(2);
if (op === "fingerprint" && dir) process.stdout.write(fingerprintDirSync(dir));
else if (op === "divergence" && dir) process.stdout.write(String(divergenceOfDirSync(dir, await new Response(Bun.stdin.stream()).text())));
else if (op === "refresh" && dir) process.stdout.write(refreshFingerprintSync(dir, await new Response(Bun.stdin.stream()).text()));
else {
  process.stderr.write("usage: page-hash-main.ts fingerprint|divergence|refresh <data dir>\n");
  process.exit(2);
}
