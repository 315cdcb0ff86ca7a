import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { CliError } from "../errors";
import { output, printObject, printTable } from "../output";
import { act, csv, projectOption, qs, requireProject } from "./shared";

type ProjectOpts = { project?: string };
type ConfigOpts = ProjectOpts & {
  clientId?: string;
  clientSecret?: string;
  redirectUrl?: string;
  scopes?: string;
  issuer?: string;
  enabled?: string;
  disabled?: boolean;
  deviceClient?: string;
};

const base = (o: ProjectOpts) => `/projects/${encodeURIComponent(requireProject(o))}/oauth`;

/** `-` reads the secret from standard input, so it stays out of the shell's history and `ps`. */
function secretValue(v: string | undefined): string | undefined {
  if (v !== "-") return v;
  const s = readFileSync(0, "utf8").trim();
  if (!s) throw new CliError("--client-secret - read nothing from standard input", "pipe the secret in, e.g. `pass show google-secret | kiln auth oauth configs create google ... --client-secret -`");
  return s;
}

function enabledValue(v: string | undefined): boolean | undefined {
  if (v === undefined) return undefined;
  if (!/^(true|false)$/.test(v)) throw new CliError(`--enabled takes true or false, got '${v}'`);
  return v === "true";
}

/** One provider's configuration: `device` needs the client it means (--device-client). */
function configPath(o: ConfigOpts, provider: string): string {
  return `${base(o)}/configs/${encodeURIComponent(provider)}${qs({ client_id: o.deviceClient })}`;
}

/** `kiln auth oauth ...`: provider configurations for end-user sign-in (a platform or project token). */
export function oauthCommand(auth: Command): void {
  const oauth = auth.command("oauth").description("OAuth sign-in for end users: provider configurations");
  projectOption(oauth.command("providers").description("the providers Kiln signs end users in with, and their default scopes")).action(
    act(async (c, g, o: ProjectOpts) => {
      const r = await c.request("GET", `${base(o)}/providers`);
      output(g.json, r, () => printTable(r.providers.map((p: any) => ({ ...p, default_scopes: p.default_scopes.join(" ") })), ["id", "name", "default_scopes"], "providers"));
    }),
  );

  const configs = oauth.command("configs").description("a project's provider configurations");
  projectOption(configs.command("list").description("every configured provider (secrets are never listed)")).action(
    act(async (c, g, o: ProjectOpts) => {
      const r = await c.request("GET", `${base(o)}/configs`);
      output(g.json, r, () =>
        printTable(r.configs.map((x: any) => ({ ...x, scopes: x.scopes.join(" ") })), ["provider", "client_id", "enabled", "uses", "redirect_url", "scopes", "updated_at"], "configs"),
      );
    }),
  );

  projectOption(
    configs
      .command("create <provider>")
      .description("configure google, github, microsoft, apple, or a device client (device: --client-id only)")
      .requiredOption("--client-id <id>", "the OAuth client id the provider issued (device: the device client's id)")
      .option("--client-secret <secret>", "the client secret ('-' reads it from standard input); required but for device")
      .option("--redirect-url <url>", "the callback registered with the provider: <kiln>/auth/oauth/<provider>/callback; required but for device")
      .option("--scopes <list>", "comma-separated (default: the provider's default scopes)")
      .option("--issuer <url>", "the real provider (an OpenID issuer, or GitHub's address); default: the local emulator in the embedded profile")
      .option("--disabled", "create it disabled"),
  ).action(
    act(async (c, g, provider: string, o: ConfigOpts) => {
      const body: Record<string, unknown> = { provider, client_id: o.clientId };
      const s = secretValue(o.clientSecret);
      if (s !== undefined) body.client_secret = s;
      if (o.redirectUrl !== undefined) body.redirect_url = o.redirectUrl;
      if (o.scopes !== undefined) body.scopes = csv(o.scopes);
      if (o.issuer !== undefined) body.issuer = o.issuer;
      if (o.disabled) body.enabled = false;
      const r = await c.request("POST", `${base(o)}/configs`, body);
      output(g.json, r, () => printObject(r));
    }),
  );

  projectOption(
    configs
      .command("get <provider>")
      .description("one provider's configuration, the secret masked")
      .option("--device-client <client_id>", "which device client (provider device)"),
  ).action(
    act(async (c, g, provider: string, o: ConfigOpts) => {
      const r = await c.request("GET", configPath(o, provider));
      output(g.json, r, () => printObject(r));
    }),
  );

  projectOption(
    configs
      .command("update <provider>")
      .description("change only the given fields (a device client: --client-id and --enabled only)")
      .option("--device-client <client_id>", "which device client to change (provider device)")
      .option("--client-id <id>", "a new client id")
      .option("--client-secret <secret>", "a new client secret ('-' reads it from standard input)")
      .option("--redirect-url <url>", "a new callback URL")
      .option("--scopes <list>", "comma-separated")
      .option("--issuer <url>", "the real provider's address; 'default' goes back to the default")
      .option("--enabled <bool>", "true or false"),
  ).action(
    act(async (c, g, provider: string, o: ConfigOpts) => {
      const body: Record<string, unknown> = {};
      if (o.clientId !== undefined) body.client_id = o.clientId;
      const s = secretValue(o.clientSecret);
      if (s !== undefined) body.client_secret = s;
      if (o.redirectUrl !== undefined) body.redirect_url = o.redirectUrl;
      if (o.scopes !== undefined) body.scopes = csv(o.scopes);
      if (o.issuer !== undefined) body.issuer = o.issuer === "default" ? null : o.issuer;
      const enabled = enabledValue(o.enabled);
      if (enabled !== undefined) body.enabled = enabled;
      const r = await c.request("PUT", configPath(o, provider), body);
      output(g.json, r, () => printObject(r));
    }),
  );

  projectOption(
    configs
      .command("delete <provider>")
      .description("remove a provider's configuration")
      .option("--device-client <client_id>", "which device client (provider device)"),
  ).action(
    act(async (c, g, provider: string, o: ConfigOpts) => {
      await c.request("DELETE", configPath(o, provider));
      output(g.json, { deleted: provider, ...(o.deviceClient ? { client_id: o.deviceClient } : {}) }, () =>
        console.log(`Deleted the ${provider} configuration${o.deviceClient ? ` of client ${o.deviceClient}` : ""}`),
      );
    }),
  );
}
