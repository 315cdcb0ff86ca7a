import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Option, type Command } from "commander";
import { Client, configFile, resolveTarget, type GlobalOptions } from "../client";
import { CliError } from "../errors";

// The CLI's one grammar: every command gets its server and credential the same way (--url/--token,
// KILN_URL/KILN_TOKEN, `kiln login`), its project the same way (--project, KILN_PROJECT, `kiln use`),
// an application key the same way (--key, KILN_SERVICE_KEY), and --json from the program.

/** The server the running command talks to (set by `act`; the remembered project is per server). */
let currentUrl: string | undefined;

/** Wraps an action: builds the API client from global options (errors are printed by cmd/kiln.ts). */
export function act<A extends unknown[]>(fn: (client: Client, g: GlobalOptions, ...args: A) => Promise<void>) {
  return async (...args: unknown[]) => {
    const cmd = args[args.length - 1] as Command;
    const g = cmd.optsWithGlobals() as GlobalOptions & Record<string, unknown>;
    const { url, token, source } = resolveTarget(g);
    currentUrl = url;
    await fn(new Client(url, token, { kind: "cli", source }), g, ...(args.slice(0, -1) as A));
  };
}

// --- the project ---------------------------------------------------------------------------------

/** What `kiln use <project>` remembers: the project, and the server it belongs to. */
export interface UsedProject {
  url: string;
  id: string;
  name?: string;
}

export const useFile = () => join(dirname(configFile()), "project.json");

export function readUsed(): UsedProject | null {
  try {
    const u = JSON.parse(readFileSync(useFile(), "utf8")) as UsedProject;
    return typeof u.id === "string" && typeof u.url === "string" ? u : null;
  } catch {
    return null;
  }
}

export function writeUsed(u: UsedProject): string {
  const file = useFile();
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, JSON.stringify(u, null, 2) + "\n", { mode: 0o600 });
  return file;
}

export function clearUsed(): void {
  rmSync(useFile(), { force: true });
}

/** The project and where it came from: --project, then KILN_PROJECT, then `kiln use` (for this server). */
export function currentProject(o: { project?: string }, url = currentUrl): { id: string; from: string } | null {
  if (o.project) return { id: o.project, from: "--project" };
  if (process.env.KILN_PROJECT) return { id: process.env.KILN_PROJECT, from: "KILN_PROJECT" };
  const used = readUsed();
  if (used && (url === undefined || used.url === url)) return { id: used.id, from: `kiln use (${useFile()})` };
  return null;
}

export function requireProject(o: { project?: string }): string {
  const p = currentProject(o);
  if (p) return p.id;
  const used = readUsed();
  throw new CliError(
    "missing --project <id>",
    used
      ? `the project remembered by \`kiln use\` (${used.name ?? used.id}) is for ${used.url}, not ${currentUrl}: pass --project <id>, set KILN_PROJECT, or run \`kiln use <project>\` again`
      : "pass --project <id>, set KILN_PROJECT, or run `kiln use <project>` once to make it the default",
  );
}

export const PROJECT_HELP = "the project (default: KILN_PROJECT, else the one `kiln use` remembers)";

/** `--project` on a command that works on one project. */
export function projectOption(cmd: Command, help = PROJECT_HELP): Command {
  return cmd.option("--project <id>", help);
}

// --- application keys ----------------------------------------------------------------------------

/** `--key` on a command that calls the application API (sk-, an end-user token or ak-); --service-key is its old name. */
export function keyOption(cmd: Command, help = "service key (sk-...), end-user access token or anon key of the project (or KILN_SERVICE_KEY)"): Command {
  return cmd.option("--key <key>", help).addOption(new Option("--service-key <key>", "old name of --key").hideHelp());
}

export type KeyOptions = { key?: string; serviceKey?: string };

/** A client with the application key of --key (or KILN_SERVICE_KEY); `what` says who needs it. */
export function appClient(c: Client, o: KeyOptions, what: string): Client {
  const flag = o.key !== undefined ? "--key" : o.serviceKey !== undefined ? "--service-key" : "KILN_SERVICE_KEY";
  const key = o.key ?? o.serviceKey ?? process.env.KILN_SERVICE_KEY;
  if (!key)
    throw new CliError(
      `${what} needs --key <key>`,
      "pass a service key (sk-...) of the project with --key, or set KILN_SERVICE_KEY (kiln keys service create <name> --project <id> makes one); the platform token is not accepted here",
    );
  return new Client(c.url, key, { kind: "key", from: flag });
}

export function qs(q: Record<string, string | number | boolean | undefined>): string {
  const sp = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== false) sp.set(k, String(v));
  const s = sp.toString();
  return s ? `?${s}` : "";
}

export const csv = (v: string) => v.split(",").map((s) => s.trim()).filter(Boolean);

/**
 * Long-running commands: SIGINT/SIGTERM stop cleanly and exit 0; a second signal exits at once. With a
 * `deadline`, a stop that takes longer says what it still waits for and exits 1 (as a service manager's
 * stop timeout would, but with the reason on stderr).
 */
export function stopOnSignals(stop: () => Promise<void>, deadline?: { ms: number; waitingFor: () => string }): void {
  let signals = 0;
  const handler = async () => {
    if (++signals > 1) process.exit(1);
    if (deadline) {
      setTimeout(() => {
        console.error(`kiln: stopping took longer than ${deadline.ms} ms, still waiting for: ${deadline.waitingFor()}; exiting`);
        process.exit(1);
      }, deadline.ms).unref();
    }
    await stop();
    process.exit(0);
  };
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
}
