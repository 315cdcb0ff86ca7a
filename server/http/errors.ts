/**
 * Every error leaves Kiln in the spec's shape: `{error: <message>}` or, for coded conflicts,
 * `{code: <string>}`. Services throw these; the HTTP layer turns them into responses.
 */
export type ErrorBody = { error: string } | { code: string; error?: string };

export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly body: ErrorBody,
    readonly headers: Record<string, string> = {},
  ) {
    super("error" in body && body.error ? body.error : (body as { code: string }).code);
  }
}

export const badRequest = (error: string) => new HttpError(400, { error });
export const unauthorized = (error = "invalid token") => new HttpError(401, { error });
export const forbidden = (error: string) => new HttpError(403, { error });
export const notFound = (error = "not found") => new HttpError(404, { error });
export const conflict = (error: string) => new HttpError(409, { error });
export const conflictCode = (code: string) => new HttpError(409, { code });
export const tooManyRequests = (error: string, retryAfterSeconds: number) =>
  new HttpError(429, { error }, { "Retry-After": String(Math.max(1, Math.ceil(retryAfterSeconds))) });

export function jsonResponse(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  if (status === 204 || body === undefined) return new Response(null, { status, headers });
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json; charset=utf-8", ...headers },
  });
}

export function errorResponse(err: HttpError): Response {
  return jsonResponse(err.status, err.body, err.headers);
}
