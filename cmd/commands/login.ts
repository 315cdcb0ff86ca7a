import type { Command } from "commander";
import { Client, resolveTarget, writeConfig } from "../client";
import { CliError } from "../errors";
import { output } from "../output";

export function loginCommand(program: Command): void {
  program
    .command("login")
    .description("save the server address and a platform or project access token for later commands")
    .usage("--token <pk-...|pt-...> [--url <url>]")
    .action(async (_o: unknown, cmd: Command) => {
      // --token and --url are the global options, so `kiln login --token X` reads naturally.
      const g = cmd.optsWithGlobals() as { url?: string; token?: string; json?: boolean };
      if (!g.token) throw new CliError("missing --token <pk-...|pt-...>", "the platform token is in .kiln/credentials.json (platform_token) of the folder where `kiln start` runs, or KILN_PLATFORM_TOKEN");
      const o = { token: g.token };
      const { url } = resolveTarget({ url: g.url });
      if (!/^(pk|pt)-/.test(o.token)) throw new CliError("--token must be a platform token (pk-...) or project access token (pt-...)");
      const client = new Client(url, o.token, { kind: "cli", source: { from: "--token", tried: ["--token"] } });
      // Check the token now rather than at the next command.
      if (o.token.startsWith("pk-")) await client.request("GET", "/projects?page=1&limit=1");
      else await client.request("GET", "/healthz");
      const file = writeConfig({ url, token: o.token });
      output(g.json, { url, file }, () => console.log(`Logged in to ${url}; saved to ${file}`));
    });
}
