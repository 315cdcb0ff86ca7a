import { Command } from "commander";
import { KILN_VERSION } from "../server/version";
import { keysCommand } from "./commands/keys";
import { loginCommand } from "./commands/login";
import { projectsCommand } from "./commands/projects";
import { useCommand } from "./commands/use";
import { wantsJson } from "./errors";
import { tokensCommand } from "./commands/tokens";
import { varsCommand } from "./commands/vars";
import { authCommand, mailCommand, usersCommand } from "./commands/end-users";
import { databasesCommand } from "./commands/databases";
import { emulatorsCommand } from "./commands/emulators";
import { frontendsCommand } from "./commands/frontends";
import { functionsCommand } from "./commands/functions";
import { runtimesCommand } from "./commands/runtimes";
import { durableCommand } from "./commands/durable";
import { clockCommand } from "./commands/clock";
import { configCommand } from "./commands/config";
import { schedulersCommand } from "./commands/schedulers";
import { deploymentsCommand, logsCommand, metricsCommand, usageCommand } from "./commands/observability";
import { locksCommand } from "./commands/locks";
import { snapshotCommand } from "./commands/snapshots";
import { storageCommand } from "./commands/storage";
import { internalCommand } from "./internal";
import { startCommand } from "./start";

export function buildProgram(): Command {
  const program = new Command("kiln")
    .version(KILN_VERSION)
    .description("Kiln: the whole backend platform on one machine")
    .option("--url <url>", "Kiln server address (or KILN_URL; default: kiln login's, else http://127.0.0.1:7070)")
    .option("--token <token>", "credential (or KILN_TOKEN; default: kiln login's, else ./.kiln/credentials.json)")
    .option("--json", "print JSON for scripts instead of tables (errors too: {\"error\": ...} on stderr)");
  // Set before the commands are added, so that each inherits them: commander's own errors (a missing
  // argument, an unknown option) are thrown to cmd/kiln.ts, which prints them as every other error.
  const json = wantsJson(process.argv);
  program.exitOverride().configureOutput({
    writeErr: (s) => (json ? undefined : process.stderr.write(s)),
    outputError: (s, write) => (json ? undefined : write(s)),
  });
  startCommand(program);
  loginCommand(program);
  projectsCommand(program);
  useCommand(program);
  tokensCommand(program);
  keysCommand(program);
  varsCommand(program);
  usersCommand(program);
  databasesCommand(program);
  functionsCommand(program);
  runtimesCommand(program);
  durableCommand(program);
  frontendsCommand(program);
  schedulersCommand(program);
  logsCommand(program);
  metricsCommand(program);
  usageCommand(program);
  deploymentsCommand(program);
  locksCommand(program);
  storageCommand(program);
  configCommand(program);
  clockCommand(program);
  snapshotCommand(program);
  authCommand(program);
  mailCommand(program);
  emulatorsCommand(program);
  internalCommand(program);
  return program;
}
