import { Command } from "commander";
import { KILN_VERSION } from "../server/version";
import { keysCommand } from "./commands/keys";
import { loginCommand } from "./commands/login";
import { projectsCommand } from "./commands/projects";
import { tokensCommand } from "./commands/tokens";
import { varsCommand } from "./commands/vars";
import { authCommand, mailCommand, usersCommand } from "./commands/end-users";
import { databasesCommand } from "./commands/databases";
import { emulatorsCommand } from "./commands/emulators";
import { functionsCommand } from "./commands/functions";
import { durableCommand } from "./commands/durable";
import { clockCommand } from "./commands/clock";
import { schedulersCommand } from "./commands/schedulers";
import { deploymentsCommand, logsCommand, metricsCommand, usageCommand } from "./commands/observability";
import { locksCommand } from "./commands/locks";
import { storageCommand } from "./commands/storage";
import { internalCommand } from "./internal";
import { startCommand } from "./start";

export function buildProgram(): Command {
  const program = new Command("kiln")
    .version(KILN_VERSION)
    .description("Kiln: the whole backend platform on one machine")
    .option("--url <url>", "Kiln server address (or KILN_URL; default: kiln login's, else http://127.0.0.1:7070)")
    .option("--token <token>", "credential (or KILN_TOKEN; default: kiln login's, else ./.kiln/credentials.json)")
    .option("--json", "print JSON for scripts instead of tables");
  startCommand(program);
  loginCommand(program);
  projectsCommand(program);
  tokensCommand(program);
  keysCommand(program);
  varsCommand(program);
  usersCommand(program);
  databasesCommand(program);
  functionsCommand(program);
  durableCommand(program);
  schedulersCommand(program);
  logsCommand(program);
  metricsCommand(program);
  usageCommand(program);
  deploymentsCommand(program);
  locksCommand(program);
  storageCommand(program);
  clockCommand(program);
  authCommand(program);
  mailCommand(program);
  emulatorsCommand(program);
  internalCommand(program);
  return program;
}
