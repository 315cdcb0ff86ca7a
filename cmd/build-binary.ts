// `npm run build:binary`: compiles Kiln into one executable, dist/kiln (docs/binary.md). The server,
// the CLI, the Bun workers and every file Kiln reads at run time (PGlite's WebAssembly and data
// files, extension bundles, pg_dump, the sandbox's bootstraps and scripts, the built web console, the
// prepared template data dirs) go inside; the files are listed in server/embedded/files.generated.ts,
// written here and read through server/embedded/embedded.ts. The server is compiled to bytecode
// (--bytecode): the binary starts without parsing its 12 MB of JavaScript.
import { readdirSync, readFileSync, rmSync, writeFileSync, statSync } from "node:fs";
import { basename, dirname, join, relative, resolve } from "node:path";
import { createRequire } from "node:module";
import { EMBEDDED_NAME, writeConsole } from "../server/console/bundle";

const ROOT = resolve(import.meta.dirname, "..");
const require = createRequire(join(ROOT, "package.json"));
const out = process.argv[2] ?? join(ROOT, "dist", "kiln");
const t0 = performance.now();

const pkgDir = (name: string) => resolve(dirname(require.resolve(name)), "..");
const version = (dir: string) => (JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { version: string }).version;
const pglite = pkgDir("@electric-sql/pglite");
const pgvector = pkgDir("@electric-sql/pglite-pgvector");
const tools = dirname(require.resolve("@electric-sql/pglite-tools/pg_dump"));

// name in the binary → file on disk
const files: Record<string, string> = {};
for (const f of ["pglite.wasm", "initdb.wasm", "pglite.data"]) files[`pglite/${f}`] = join(pglite, "dist", f);
for (const f of readdirSync(join(pglite, "dist")).filter((f) => f.endsWith(".tar.gz"))) files[`pglite-ext/${f}`] = join(pglite, "dist", f);
files["pglite-ext/vector.tar.gz"] = join(pgvector, "dist", "vector.tar.gz");
const dumpChunk = (readFileSync(join(tools, "pg_dump.js"), "utf8").match(/\.\/(chunk-[A-Z0-9]+\.js)/) ?? [])[1];
if (!dumpChunk) throw new Error("cannot find pg_dump's chunk in @electric-sql/pglite-tools");
files["pg-dump/pg_dump.js"] = join(tools, dumpChunk);
files["pg-dump/pg_dump.wasm"] = join(tools, "pg_dump.wasm");
for (const dir of ["bootstraps", "sandbox-etc"]) for (const f of readdirSync(join(ROOT, "runtime-sandbox", dir))) files[`${dir}/${f}`] = join(ROOT, "runtime-sandbox", dir, f);
files["sandbox-scripts/namespace-sandbox.sh"] = join(ROOT, "runtime-sandbox", "namespace-sandbox.sh");
// The web console, built now from the sources (the binary has no sources to build it from at run time).
files[EMBEDDED_NAME] = await writeConsole();
// The prepared data dirs (control store, databases) as archives: a fresh data dir on a new machine is
// unpacked from them instead of running initdb (seconds; server/store/template.ts).
// Beside the output, one folder per output: two builds at once (the binary test's and a developer's)
// never remove each other's archives.
const templates = join(dirname(resolve(out)), `.${basename(out)}-templates`);
rmSync(templates, { recursive: true, force: true });
const prep = Bun.spawnSync([process.execPath, join(ROOT, "cmd/kiln.ts"), "internal", "prepare-template", "--archives", templates], { cwd: ROOT, stdout: "inherit", stderr: "inherit" });
if (prep.exitCode !== 0) throw new Error("preparing the template archives failed");
for (const f of readdirSync(templates)) files[`templates/${f}`] = join(templates, f);

// Embedded files keep their own names (PGlite finds pglite.wasm, initdb.wasm and pglite.data next to
// its module, /$bunfs/root/), so two with the same name would collide.
const seen = new Map<string, string>();
for (const [name, path] of Object.entries(files)) {
  const b = basename(path);
  if (seen.has(b)) throw new Error(`two embedded files named ${b}: ${seen.get(b)} and ${name}`);
  seen.set(b, name);
}

const genPath = join(ROOT, "server", "embedded", "files.generated.ts");
const entries = Object.entries(files);
writeFileSync(
  genPath,
  [
    "// Written by cmd/build-binary.ts for the compiled binary; not in git. Bun's file imports have no types.",
    "// @ts-nocheck",
    ...entries.map(([, path], i) => `import f${i} from ${JSON.stringify(relative(dirname(genPath), path))} with { type: "file" };`),
    `export const FILES: Record<string, string> = {`,
    ...entries.map(([name], i) => `  ${JSON.stringify(name)}: f${i},`),
    `};`,
    `export const VERSIONS: Record<string, string> = ${JSON.stringify({ "@electric-sql/pglite": version(pglite), "@electric-sql/pglite-pgvector": version(pgvector) })};`,
    "",
  ].join("\n"),
);

// Bun Workers are extra entry points of the build (each is its own bundle inside the binary).
const workers = ["server/backends/logs/log-db-worker.ts", "server/backends/logs/file-store-worker.ts", "server/backends/blobs/md5-worker.ts", "server/backends/databases/pglite-thread-worker.ts"];
const proc = Bun.spawnSync([process.execPath, "build", "--compile", ...(process.env.KILN_BYTECODE === "0" ? [] : ["--bytecode", "--format=esm"]), "--minify-syntax", "--minify-whitespace", "--asset-naming=[name].[ext]", "cmd/kiln.ts", ...workers, "--outfile", out], { cwd: ROOT, stdout: "inherit", stderr: "inherit" });
if (proc.exitCode !== 0) process.exit(proc.exitCode ?? 1);
console.log(`kiln: built ${relative(process.cwd(), out)} (${(statSync(out).size / 1e6).toFixed(1)} MB, ${entries.length} embedded files) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
