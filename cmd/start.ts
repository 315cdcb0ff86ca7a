import type { Command } from "commander";
import { resolveConfig } from "../server/config";
import { stopOnSignals } from "./commands/shared";

export function startCommand(program: Command): void {
  program
    .command("start")
    .description("start the Kiln server")
    .option("--port <n>", "port to listen on (0 picks a free one; KILN_PORT; default 7070)")
    .option("--host <host>", "address to listen on (KILN_HOST; default 127.0.0.1)")
    .option("--data-dir <dir>", "where all state lives (KILN_DATA_DIR; default .kiln)")
    .option("--ephemeral", "keep state in a temporary folder removed at exit")
    .option("--plan <plan>", "plan of the default account: hobby or superagent (KILN_PLAN; default superagent)")
    .option("--regions <list>", "function regions this instance simulates, comma-separated (KILN_REGIONS; default local)")
    .option("--database-url <url>", "production profile: keep the control store in this PostgreSQL database (or KILN_DATABASE_URL)")
    .option("--postgres-url <url>", "production profile: keep managed databases on this PostgreSQL server (KILN_POSTGRES_URL)")
    .option("--pg-port <n>", "port of the PostgreSQL wire listener in connection strings (0 picks a free one; KILN_PG_PORT; default 7432)")
    .option("--pg-require-ssl", "the PostgreSQL wire listener refuses plaintext sessions; TLS is offered either way (KILN_PG_REQUIRE_SSL=1)")
    .option("--pg-tls-hosts <list>", "more host names and IP addresses for the wire listener's certificate, comma-separated (KILN_PG_TLS_HOSTS)")
    .option("--frontends-tls-port <n>", "HTTPS port serving frontends (default site URLs with the local CA's certificate, custom domains with theirs, chosen by SNI); 0 picks a free one; none by default (KILN_FRONTENDS_TLS_PORT)")
    .option("--s3-endpoint <url>", "production profile: keep storage objects on this S3 endpoint, http(s)://host:port (KILN_S3_ENDPOINT; credentials in KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY)")
    .option("--s3-bucket <name>", "the S3 bucket Kiln keeps objects in (KILN_S3_BUCKET; default kiln, created when missing)")
    .option("--function-runtime <kind>", "where functions run: process (sandboxed local processes) or docker (a Docker or Podman engine; KILN_FUNCTION_RUNTIME)")
    .option("--function-sandbox <kind>", "sandbox of local function processes and builds: auto (bubblewrap, else Linux namespaces through util-linux), bubblewrap or namespaces (KILN_FUNCTION_SANDBOX)")
    .option("--allow-unsandboxed-functions", "when no sandbox works here, run function code and builds as plain processes on this host instead of refusing them (KILN_ALLOW_UNSANDBOXED_FUNCTIONS=1); unsafe with code you do not trust")
    .option("--docker-host <address>", "container engine API for --function-runtime docker: unix:///path or tcp://host:port (KILN_DOCKER_HOST; default DOCKER_HOST, then the Docker and Podman sockets)")
    .option("--function-image <image>", "base image of function containers, imported when missing (KILN_FUNCTION_IMAGE; default kiln-runtime:base)")
    .option("--runtime-path <name=path>", "serve a function runtime with this interpreter of exactly that version, e.g. python3.12=/opt/python3.12/bin/python3.12 (repeatable; KILN_RUNTIME_PATHS, comma-separated)", (v: string, acc: string[] = []) => [...acc, v])
    .option("--runtime-image <name=image>", "--function-runtime docker: run a Python or Ruby runtime in this image's interpreter of exactly that version, e.g. python3.12=python:3.12-slim (repeatable; KILN_RUNTIME_IMAGES, comma-separated)", (v: string, acc: string[] = []) => [...acc, v])
    .option("--smtp-port <n>", "SMTP port of the built-in mail catcher (0 picks a free one; KILN_SMTP_PORT)")
    .option("--mail-catcher <mode>", "who reads the built-in mail catcher's pages: open (no credential; default without --database-url/--postgres-url), token (this Kiln's platform token; default with them) or off (needs KILN_SMTP_URL) (KILN_MAIL_CATCHER)")
    .option("--public-url <url>", "address used in links Kiln mails out (KILN_PUBLIC_URL; default: the listening address)")
    .option("--controllable-clock", "let tests move Kiln's clock forward via POST /_kiln/clock/advance and /_kiln/clock/set (KILN_CONTROLLABLE_CLOCK=1)")
    .option("--clock-start <instant>", "start the controllable clock at this RFC 3339 instant instead of now (implies --controllable-clock; KILN_CLOCK_START)")
    .option("--seed <file>", "apply this seed at start (kiln.seed.yaml: projects with their manifest, SQL per database, end users, objects, functions; docs/testing.md) and keep it as the snapshot 'seed' that POST /_kiln/reset restores (KILN_SEED)")
    .option("--resettable", "keep the state right after start as the snapshot 'start' that POST /_kiln/reset restores (KILN_RESETTABLE=1)")
    .option("--min-cli-version <v>", "answer 426 to CLIs older than this (or KILN_MIN_CLI_VERSION)")
    .action(async (opts, cmd: Command) => {
      const json = Boolean(cmd.optsWithGlobals().json);
      await applyRuntimeFlags(opts);
      const config = resolveConfig(opts);
      const { startKiln } = await import("../server/main");
      const running = await startKiln(config);
      // Handlers first: a client that stops Kiln as soon as it reads the line must find them.
      stopOnSignals(() => running.stop(), { ms: config.stopTimeoutMs, waitingFor: running.stopPhase });
      if (json) console.log(JSON.stringify({ listening: running.url }));
      else console.log(`Kiln listening on ${running.url}`);
      const code = running.services.consoleSignIn.current();
      if (!json && code) console.log(`Console: ${running.url}/_console#code=${code} (a one-time sign-in link, valid 15 minutes)`);
      // What the start left for after listening failed: Kiln stops, as when a start fails before it.
      running.ready.catch(async (err) => {
        const { printError } = await import("./errors");
        printError(err, json);
        await running.stop().catch(() => {});
        process.exit(1);
      });
    });
}

/** --runtime-path and --runtime-image (of start and doctor) into KILN_RUNTIME_PATHS / KILN_RUNTIME_IMAGES, checked. */
export async function applyRuntimeFlags(opts: { runtimePath?: string[]; runtimeImage?: string[] }): Promise<void> {
  const { RUNTIME_NAMES } = await import("../runtime-sandbox/runtimes");
  const valid = (name: string) => RUNTIME_NAMES.includes(name) && !name.startsWith("nodejs");
  for (const pair of opts.runtimePath ?? []) {
    const [name, path] = [pair.slice(0, pair.indexOf("=")), pair.slice(pair.indexOf("=") + 1)];
    if (!valid(name) || !path.startsWith("/")) throw new Error(`--runtime-path must be <python or ruby runtime name>=<absolute path>, e.g. python3.12=/usr/local/bin/python3.12; got "${pair}"`);
  }
  for (const pair of opts.runtimeImage ?? []) {
    const [name, image] = [pair.slice(0, pair.indexOf("=")), pair.slice(pair.indexOf("=") + 1)];
    if (!valid(name) || !/^[\w][\w.\-/:@]*$/.test(image)) throw new Error(`--runtime-image must be <python or ruby runtime name>=<image>, e.g. python3.12=python:3.12-slim; got "${pair}"`);
  }
  if (opts.runtimePath?.length) process.env.KILN_RUNTIME_PATHS = [process.env.KILN_RUNTIME_PATHS, ...opts.runtimePath].filter(Boolean).join(",");
  if (opts.runtimeImage?.length) process.env.KILN_RUNTIME_IMAGES = [process.env.KILN_RUNTIME_IMAGES, ...opts.runtimeImage].filter(Boolean).join(",");
}
