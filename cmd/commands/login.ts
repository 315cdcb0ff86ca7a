import type { Command } from "commander";
import { Client, resolveTarget, writeConfig } from "../client";

export function loginCommand(program: Command): void {
  program
    .command("login")
    .description("save the server address and a platform or project access token for later commands")
    .usage("--token <pk-...|pt-...> [--url <url>]")
    .action(async (_o: unknown, cmd: Command) => {
      // --token and --url are the global options, so `kiln login --token X` reads naturally.
      const g = cmd.optsWithGlobals() as { url?: string; token?: string };
      if (!g.token) throw new Error("missing --token <pk-...|pt-...>");
      const o = { token: g.token };
      const { url } = resolveTarget({ url: g.url });
      if (!/^(pk|pt)-/.test(o.token)) throw new Error("--token must be a platform token (pk-...) or project access token (pt-...)");
      const client = new Client(url, o.token);
      // Check the token now rather than at the next command.
      if (o.token.startsWith("pk-")) await client.request("GET", "/projects?page=1&limit=1");
      else await client.request("GET", "/healthz");
      const file = writeConfig({ url, token: o.token });
      console.log(`Logged in to ${url}; saved to ${file}`);
    });
}
