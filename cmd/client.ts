import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve as resolvePath } from "node:path";
import { KILN_VERSION } from "../server/version";

/** Where `kiln login` keeps the server address and credential. */
export function configFile(): string {
  const dir = process.env.KILN_CONFIG_DIR ?? join(process.env.XDG_CONFIG_HOME ?? join(homedir(), ".config"), "kiln");
  return join(dir, "config.json");
}

export interface SavedConfig {
  url?: string;
  token?: string;
}

export function readConfig(): SavedConfig {
  try {
    return JSON.parse(readFileSync(configFile(), "utf8"));
  } catch {
    return {};
  }
}

export function writeConfig(c: SavedConfig): string {
  const file = configFile();
  mkdirSync(join(file, ".."), { recursive: true });
  writeFileSync(file, JSON.stringify(c, null, 2) + "\n", { mode: 0o600 });
  return file;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(`${status} ${ApiError.reason(body)}`);
  }

  /** The server's own words (its JSON body's `error`), without the status. */
  static reason(body: unknown): string {
    const b = body as { error?: string; code?: string } | undefined;
    return b?.error ?? b?.code ?? (typeof body === "string" && body ? body : "request failed");
  }
}

export interface GlobalOptions {
  url?: string;
  token?: string;
  json?: boolean;
}

/** Where the CLI's own credential came from (named in a 401's hint), and every place it looked. */
export interface CredentialSource {
  /** "--token", "KILN_TOKEN", or the file it was read from; undefined when none was found. */
  from?: string;
  tried: string[];
}

/** `kiln start`'s credentials file in the current folder (or KILN_DATA_DIR). */
export function localCredentialsFile(): string {
  return join(process.env.KILN_DATA_DIR ?? ".kiln", "credentials.json");
}

/**
 * Resolves where to talk and as whom: flags, then KILN_URL/KILN_TOKEN, then `kiln login`'s file,
 * then a local Kiln started in this folder (`.kiln/credentials.json`).
 */
export function resolveTarget(g: GlobalOptions): { url: string; token?: string; source: CredentialSource } {
  const saved = readConfig();
  const url = (g.url ?? process.env.KILN_URL ?? saved.url ?? "http://127.0.0.1:7070").replace(/\/+$/, "");
  const local = localCredentialsFile();
  const tried = ["--token", "KILN_TOKEN", configFile(), resolvePath(local)];
  if (g.token) return { url, token: g.token, source: { from: "--token", tried } };
  if (process.env.KILN_TOKEN) return { url, token: process.env.KILN_TOKEN, source: { from: "KILN_TOKEN", tried } };
  if (saved.token) return { url, token: saved.token, source: { from: configFile(), tried } };
  if (existsSync(local)) {
    try {
      const token = JSON.parse(readFileSync(local, "utf8")).platform_token;
      if (token) return { url, token, source: { from: resolvePath(local), tried } };
    } catch {}
  }
  return { url, source: { tried } };
}

export class Client {
  /** The client of the latest request: a failure's hint names its credential (cmd/errors.ts). */
  static last: Client | null = null;

  /** `credential` says what the token is and where it came from, for error hints. */
  constructor(
    readonly url: string,
    readonly token?: string,
    readonly credential: { kind: "cli"; source: CredentialSource } | { kind: "key"; from: string } = { kind: "cli", source: { tried: [] } },
  ) {}

  /** The response itself (function invocations answer with whatever the function returned). */
  async raw(method: string, path: string, body?: unknown): Promise<Response> {
    Client.last = this;
    const headers: Record<string, string> = { "X-Service-CLI-Version": KILN_VERSION };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    try {
      return await fetch(this.url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (err) {
      throw new Error(`cannot reach Kiln at ${this.url} (${(err as Error).message}); is \`kiln start\` running?`);
    }
  }

  /**
   * Any request with the caller's headers and body (a stream, a file slice): the response as it came,
   * whatever its status (storage transfers stream both ways). `apiError` turns a failed one into an ApiError.
   */
  async send(method: string, path: string, init: { headers?: Record<string, string>; body?: BodyInit | null; signal?: AbortSignal } = {}): Promise<Response> {
    Client.last = this;
    const headers: Record<string, string> = { ...init.headers, "X-Service-CLI-Version": KILN_VERSION };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    try {
      return await fetch(this.url + path, { method, headers, body: init.body ?? undefined, signal: init.signal, ...(init.body instanceof ReadableStream ? { duplex: "half" } : {}) } as RequestInit);
    } catch (err) {
      throw new Error(`cannot reach Kiln at ${this.url} (${(err as Error).message}); is \`kiln start\` running?`);
    }
  }

  /** The ApiError for a response that is not ok (its JSON body's `error` as the message). */
  static async apiError(res: Response): Promise<ApiError> {
    const text = await res.text().catch(() => "");
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {}
    return new ApiError(res.status, parsed);
  }

  /** A multipart request (function deploys). */
  async requestForm<T = any>(method: string, path: string, form: FormData): Promise<T> {
    Client.last = this;
    const headers: Record<string, string> = { "X-Service-CLI-Version": KILN_VERSION };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    const res = await fetch(this.url + path, { method, headers, body: form });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {}
    if (!res.ok) throw new ApiError(res.status, parsed);
    return parsed as T;
  }

  /** A JSON request; `extra` headers are added to the CLI's own (the lock routes' X-Service-* ids). */
  async request<T = any>(method: string, path: string, body?: unknown, extra?: Record<string, string>): Promise<T> {
    Client.last = this;
    const headers: Record<string, string> = { ...extra, "X-Service-CLI-Version": KILN_VERSION };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    try {
      res = await fetch(this.url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (err) {
      throw new Error(`cannot reach Kiln at ${this.url} (${(err as Error).message}); is \`kiln start\` running?`);
    }
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {}
    if (res.headers.get("x-service-cli-instruction") === "suggestion_version_upgrade")
      console.error("kiln: a newer CLI is available for this server; consider upgrading");
    if (!res.ok) throw new ApiError(res.status, parsed);
    return parsed as T;
  }
}
