import type { Command } from "commander";
import { stopOnSignals } from "./shared";

export function emulatorsCommand(program: Command): void {
  const emulators = program.command("emulators").description("run an outside-world stand-in on its own");
  emulators
    .command("mail")
    .description("run the mail catcher alone: an SMTP server and its message pages")
    .option("--smtp-port <n>", "SMTP port", "1025")
    .option("--port <n>", "HTTP port of the message pages", "8025")
    .option("--host <host>", "address to listen on", "127.0.0.1")
    .action(async (o: { smtpPort: string; port: string; host: string }, cmd: Command) => {
      const { serveMailCatcher } = await import("../../server/emulators/standalone-mail");
      const running = await serveMailCatcher({ host: o.host, smtpPort: Number(o.smtpPort), httpPort: Number(o.port) });
      stopOnSignals(() => running.stop());
      if (cmd.optsWithGlobals().json) console.log(JSON.stringify({ smtp: running.smtp, messages: `${running.url}/_emulators/mail` }));
      else console.log(`Mail catcher: SMTP on ${running.smtp}, messages at ${running.url}/_emulators/mail`);
    });
  emulators
    .command("oauth")
    .description("run the local OAuth providers alone: google, microsoft and apple (OpenID Connect) and github")
    .option("--port <n>", "HTTP port", "8026")
    .option("--host <host>", "address to listen on", "127.0.0.1")
    .action(async (o: { port: string; host: string }, cmd: Command) => {
      const { serveOAuthEmulators } = await import("../../server/emulators/standalone-oauth");
      const running = await serveOAuthEmulators({ host: o.host, port: Number(o.port) });
      stopOnSignals(() => running.stop());
      if (cmd.optsWithGlobals().json) {
        console.log(JSON.stringify({ url: running.url, identities: `${running.url}/_emulators/oauth/identities`, providers: running.endpoints }));
        return;
      }
      console.log(`OAuth emulators on ${running.url}/_emulators/oauth (identities API: ${running.url}/_emulators/oauth/identities)`);
      for (const e of running.endpoints)
        console.log(e.kind === "github" ? `  github     authorize ${e.authorization}  token ${e.token}  api ${e.base}` : `  ${e.kind.padEnd(10)} issuer ${e.issuer}`);
    });
}
