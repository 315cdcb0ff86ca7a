import type { MailCatcher } from "../../emulators/mail/catcher";
import { createSmtpMailer, type Mailer } from "../../emulators/mail/mailer";
import type { AccountsService } from "../accounts/service";
import { defineArea } from "../area";
import type { Platform } from "../platform";
import { mailCatcherRoutes, type MailCatcherRouteDeps } from "./mail-routes";

/** smtp-server loads while the control store opens (imported on first use of this module). */
let catcherModule: Promise<typeof import("../../emulators/mail/catcher")> | null = null;
export function preloadMailCatcher(): void {
  catcherModule ??= import("../../emulators/mail/catcher");
  catcherModule.catch(() => {}); // awaited at start; this only keeps an early failure from going unhandled
}

type Provides = { mailer: Mailer } & MailCatcherRouteDeps;

/**
 * Email: over SMTP to the built-in catcher (messages at /_emulators/mail), or to a real server when
 * KILN_SMTP_URL is set, in which case the catcher is off. `--mail-catcher` says who may read it.
 */
export const mailArea = defineArea({
  name: "mail",
  start: async ({ config, log, accounts }: Pick<Platform, "config" | "log"> & { accounts: AccountsService }): Promise<Provides> => {
    const access = { mailCatcherAccess: config.mailCatcher === "token" ? ("token" as const) : ("open" as const), isOperator: (id: string) => accounts.isDefault(id) };
    if (config.smtpUrl || config.mailCatcher === "off")
      return { mailer: createSmtpMailer({ url: config.smtpUrl!, from: config.mailFrom }), mailCatcher: null, smtpAddress: "", ...access };
    preloadMailCatcher();
    const { MailCatcher } = await catcherModule!;
    const mailCatcher = new MailCatcher();
    const smtp = await mailCatcher.start({ host: "127.0.0.1", port: config.smtpPort });
    const smtpAddress = `${smtp.host}:${smtp.port}`;
    log.info(`mail catcher: SMTP on ${smtpAddress}, messages at /_emulators/mail${access.mailCatcherAccess === "token" ? " (platform token required)" : ""}`);
    return { mailer: createSmtpMailer({ url: `smtp://${smtpAddress}`, from: config.mailFrom }), mailCatcher, smtpAddress, ...access };
  },
  routes: mailCatcherRoutes,
  // The inbox is in memory only: a restore empties it, as the stop and start it replaces did.
  reset: { resume: ({ mailCatcher }) => void mailCatcher?.clear() },
  stop: async ({ mailer, mailCatcher }) => {
    await mailer.close().catch(() => {});
    await mailCatcher?.stop().catch(() => {});
  },
});
