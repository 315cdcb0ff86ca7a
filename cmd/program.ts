import { Command } from "commander";
import { KILN_VERSION } from "../server/version";
import { startCommand } from "./start";

export function buildProgram(): Command {
  const program = new Command("kiln").version(KILN_VERSION).description("Kiln: the whole backend platform on one machine");
  startCommand(program);
  return program;
}
