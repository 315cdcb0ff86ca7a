import type { Command } from "commander";
import { emptyLine, output, printObject, printTable } from "../output";
import { oauthCommand } from "./oauth";
import { act, csv, qs, requireProject, PROJECT_HELP } from "./shared";

export function usersCommand(program: Command): void {
  const users = program.command("users").description("manage a project's end users");
  const base = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/users`;
  users
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .option("--search <text>", "part of an email address")
    .option("--page <n>")
    .option("--limit <n>")
    .action(
      act(async (c, g, o: { project: string; search?: string; page?: string; limit?: string }) => {
        const r = await c.request("GET", base(o) + qs({ search: o.search, page: o.page, limit: o.limit }));
        output(g.json, r, () => printTable(r.data, ["id", "email", "email_confirmed", "status", "last_sign_in_at", "created_at"], "users"));
      }),
    );
  users
    .command("create <email>")
    .option("--project <id>", PROJECT_HELP)
    .option("--password <pw>", "omit for a user without a password")
    .option("--unconfirmed", "leave the email unconfirmed")
    .action(
      act(async (c, g, email: string, o: { project: string; password?: string; unconfirmed?: boolean }) => {
        const r = await c.request("POST", base(o), { email, ...(o.password ? { password: o.password } : {}), email_confirmed: !o.unconfirmed });
        output(g.json, r, () => printObject(r));
      }),
    );
  users
    .command("delete <userId>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, id: string, o: { project: string }) => {
        await c.request("DELETE", `${base(o)}/${encodeURIComponent(id)}`);
        output(g.json, { deleted: id }, () => console.log(`Deleted ${id}`));
      }),
    );
}

export function authCommand(program: Command): void {
  const auth = program.command("auth").description("end-user authentication settings");
  oauthCommand(auth);
  const config = auth.command("config").description("a project's auth settings");
  const path = (o: { project?: string }) => `/auth/config?project_id=${encodeURIComponent(requireProject(o))}`;
  config
    .command("get")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project: string }) => {
        const r = await c.request("GET", path(o));
        output(g.json, r, () => printObject(r));
      }),
    );
  config
    .command("set")
    .option("--project <id>", PROJECT_HELP)
    .option("--redirect-urls <list>", "allowed redirect URLs, comma-separated ('' clears)")
    .option("--email-domains <list>", "allowed sign-up email domains ('' allows any)")
    .option("--device-verification-url <url>", "device flow verification page ('' clears)")
    .option("--require-email-confirmation <bool>", "true or false")
    .option("--access-token-ttl <seconds>", "end-user access token lifetime")
    .option("--rate-limit <name=n...>", "hourly limit per address, e.g. signup=20 signin=100")
    .action(
      act(
        async (
          c,
          g,
          o: {
            project: string;
            redirectUrls?: string;
            emailDomains?: string;
            deviceVerificationUrl?: string;
            requireEmailConfirmation?: string;
            accessTokenTtl?: string;
            rateLimit?: string[];
          },
        ) => {
          const body: Record<string, unknown> = {};
          if (o.redirectUrls !== undefined) body.allowed_redirect_urls = csv(o.redirectUrls);
          if (o.emailDomains !== undefined) body.allowed_email_domains = csv(o.emailDomains);
          if (o.deviceVerificationUrl !== undefined) body.device_verification_url = o.deviceVerificationUrl || null;
          if (o.requireEmailConfirmation !== undefined) {
            if (!/^(true|false)$/.test(o.requireEmailConfirmation)) throw new Error("--require-email-confirmation takes true or false");
            body.require_email_confirmation = o.requireEmailConfirmation === "true";
          }
          if (o.accessTokenTtl !== undefined) body.access_token_ttl_seconds = Number(o.accessTokenTtl);
          if (o.rateLimit) {
            body.rate_limits = Object.fromEntries(
              o.rateLimit.map((pair) => {
                const [k, v] = pair.split("=");
                if (!k || !v) throw new Error(`--rate-limit takes name=number, got '${pair}'`);
                return [k.replace(/-/g, "_"), Number(v)];
              }),
            );
          }
          const r = await c.request("PATCH", path(o), body);
          output(g.json, r, () => printObject(r));
        },
      ),
    );
}

export function mailCommand(program: Command): void {
  program
    .command("mail")
    .description("the latest emails caught by the local mail catcher")
    .option("--to <address>", "only messages to this address")
    .option("--limit <n>", "how many", "10")
    .action(
      act(async (c, g, o: { to?: string; limit: string }) => {
        const r = await c.request("GET", `/_emulators/mail/messages${qs({ to: o.to, limit: o.limit })}`);
        output(g.json, r, () => {
          if (r.data.length === 0) console.log(emptyLine("messages"));
          for (const m of r.data) {
            console.log(`${m.received_at}  to ${m.to.join(", ")}  ${m.subject}`);
            for (const l of m.links) console.log(`    ${l}`);
          }
        });
      }),
    );
}
