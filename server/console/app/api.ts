// The console's only way to Kiln: its public HTTP API, with the signed-in platform token (kept in
// sessionStorage) or a project's service key the console created for itself (data routes).

const TOKEN = "kiln.console.token";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** The refusal's headers (a failed invocation's X-Service-Invocation-Id). */
    readonly headers?: Headers,
  ) {
    super(message);
  }
}

export const session = {
  token: (): string | null => sessionStorage.getItem(TOKEN),
  signIn(token: string) {
    sessionStorage.setItem(TOKEN, token);
  },
  signOut() {
    sessionStorage.clear();
  },
};

/** The API's own message: `error`, else `code`, else the status line. */
async function failure(res: Response): Promise<ApiError> {
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    return new ApiError(res.status, `${res.status}: ${body.error ?? body.code ?? text}`, res.headers);
  } catch {
    return new ApiError(res.status, `${res.status}: ${text || res.statusText}`, res.headers);
  }
}

export interface CallOptions {
  /** A different bearer (a service key); the platform token otherwise. */
  bearer?: string;
  body?: unknown;
  /** A raw body (FormData, Blob) sent as is. */
  raw?: BodyInit;
  headers?: Record<string, string>;
  /** Aborts the request (a live tail being closed). */
  signal?: AbortSignal;
}

export async function request(method: string, path: string, opts: CallOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { ...opts.headers };
  const bearer = opts.bearer ?? session.token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  let body: BodyInit | undefined = opts.raw;
  if (opts.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.body);
  }
  const res = await fetch(path, { method, headers, body, signal: opts.signal });
  if (!res.ok) throw await failure(res);
  return res;
}

export async function api<T = any>(method: string, path: string, opts: CallOptions = {}): Promise<T> {
  const res = await request(method, path, opts);
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/**
 * The service key this console uses for a project's data routes (invoke, storage objects, the query
 * API): created once per sign-in session, named so people see where it came from.
 */
export async function serviceKey(projectId: string): Promise<string> {
  const slot = `kiln.console.key.${projectId}`;
  const saved = sessionStorage.getItem(slot);
  if (saved) return saved;
  const created = await api<{ key: string }>("POST", `/projects/${projectId}/service-keys`, { body: { name: `console ${new Date().toISOString().slice(0, 19)}` } });
  sessionStorage.setItem(slot, created.key);
  return created.key;
}

export const enc = encodeURIComponent;

/**
 * A call whose refusal the page shows in its own way (the SQL editor: SQLSTATE and position):
 * the status and the parsed body, whatever the status. Network failures still throw.
 */
export async function apiAnswer<T = any>(method: string, path: string, opts: CallOptions = {}): Promise<{ ok: boolean; status: number; body: T }> {
  const headers: Record<string, string> = { ...opts.headers };
  const bearer = opts.bearer ?? session.token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: opts.body !== undefined ? JSON.stringify(opts.body) : opts.raw });
  const text = await res.text();
  let body: any = text;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    // not JSON: the text as it came
  }
  return { ok: res.ok, status: res.status, body };
}
