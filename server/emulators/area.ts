import type { MailCatcher } from "../../emulators/mail/catcher";
import { createSmtpMailer, type Mailer } from "../../emulators/mail/mailer";
import { defineArea } from "../area";
import type { Platform } from "../platform";
import { mailCatcherRoutes } from "./mail-routes";

/** smtp-server loads while the control store opens (imported on first use of this module). */
let catcherModule: Promise<typeof import("../../emulators/mail/catcher")> | null = null;
export function preloadMailCatcher(): void {
  catcherModule ??= import("../../emulators/mail/catcher");
  catcherModule.catch(() => {}); // awaited at start; this only keeps an early failure from going unhandled
}

/**
 * Email: over SMTP to the built-in catcher (messages at /_emulators/mail), or to a real server when
 * KILN_SMTP_URL is set, in which case the catcher is off.
 */
export const mailArea = defineArea({
  name: "mail",
  start: async ({ config, log }: Pick<Platform, "config" | "log">): Promise<{ mailer: Mailer; mailCatcher: MailCatcher | null; smtpAddress: string }> => {
    if (config.smtpUrl) return { mailer: createSmtpMailer({ url: config.smtpUrl, from: config.mailFrom }), mailCatcher: null, smtpAddress: "" };
    preloadMailCatcher();
    const { MailCatcher } = await catcherModule!;
    const mailCatcher = new MailCatcher();
    const smtp = await mailCatcher.start({ host: "127.0.0.1", port: config.smtpPort });
    const smtpAddress = `${smtp.host}:${smtp.port}`;
    log.info(`mail catcher: SMTP on ${smtpAddress}, messages at /_emulators/mail`);
    return { mailer: createSmtpMailer({ url: `smtp://${smtpAddress}`, from: config.mailFrom }), mailCatcher, smtpAddress };
  },
  routes: mailCatcherRoutes,
  stop: async ({ mailer, mailCatcher }) => {
    await mailer.close().catch(() => {});
    await mailCatcher?.stop().catch(() => {});
  },
});
