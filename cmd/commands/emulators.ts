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
}
