// One error printer for every command: `kiln: <what went wrong>` and a `hint:` line saying what to do
// next, or with --json `{"error", "status"?, "hint"?}` on stderr; the exit status is non-zero either way.
import { ApiError, Client } from "./client";

/** A failure the CLI itself found, with what to do about it. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly hint?: string,
  ) {
    super(message);
  }
}

/** An API failure re-worded for the CLI (its status kept), with a hint. */
export class HintedApiError extends ApiError {
  constructor(
    err: ApiError,
    readonly hint: string,
    message?: string,
  ) {
    super(err.status, err.body);
    if (message) this.message = `${err.status} ${message}`;
  }
}

/** Whether the command line asked for JSON (before any `--`, after which arguments belong to another program). */
export function wantsJson(argv: string[]): boolean {
  const end = argv.indexOf("--");
  return (end < 0 ? argv : argv.slice(0, end)).includes("--json");
}

/** What to do next after a failed API call, from its status and the credential it was made with. */
function apiHint(err: ApiError): string | undefined {
  if ("hint" in err && typeof err.hint === "string") return err.hint;
  const c = Client.last;
  if (err.status === 401 && c) {
    if (c.credential.kind === "key")
      return `the application key from ${c.credential.from} was refused: pass a service key (sk-...), an end-user access token or the anon key of the project with --key (or KILN_SERVICE_KEY)`;
    const { from, tried } = c.credential.source;
    const login = `run \`kiln login --token pk-... --url ${c.url}\``;
    if (!from) return `no credential found (looked at ${tried.join(", ")}); ${login}, or run kiln in the folder where \`kiln start\` keeps .kiln/credentials.json`;
    return `the credential read from ${from} was refused by ${c.url}; ${login} to save a working one`;
  }
  if (err.status === 403 && c?.credential.kind === "key") return "the key lacks the permission this needs: use a full service key, or one scoped with the permission (kiln keys service update <id> --permissions ...)";
  return undefined;
}

export function describeError(err: unknown): { error: string; status?: number; hint?: string } {
  if (err instanceof ApiError) {
    const hint = apiHint(err);
    // The server's advice is HTTP's ("send Authorization: Bearer <token>"); the hint says the CLI's.
    const error = err.status === 401 ? err.message.replace(/: send Authorization: Bearer <token>$/, "") : err.message;
    return { error, status: err.status, ...(hint ? { hint } : {}) };
  }
  if (err instanceof CliError) return { error: err.message, ...(err.hint ? { hint: err.hint } : {}) };
  const e = err as { message?: string; code?: string };
  // Commander's own messages start with "error: ".
  return { error: String(e?.message ?? err).replace(/^error: /, "") };
}

/** Prints a failure on stderr, as JSON with --json; the caller exits non-zero. */
export function printError(err: unknown, json: boolean): void {
  const d = describeError(err);
  if (json) process.stderr.write(`${JSON.stringify(d)}\n`);
  else process.stderr.write(`kiln: ${d.error}\n${d.hint ? `hint: ${d.hint}\n` : ""}`);
}
