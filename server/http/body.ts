import type { Config } from "../config";
import { badRequest, HttpError } from "./errors";

/**
 * Request bodies are read here and nowhere else, with a limit counted while the bytes arrive: a
 * declared Content-Length over the limit is refused before anything is read, a body without one
 * (chunked) is refused as soon as the count passes it, and the rest is never read. So a request's
 * memory is bounded by its route's limit, whatever the client sends.
 */
export interface BodyLimit {
  bytes: number;
  /** What is limited, for the message: "JSON request bodies". */
  what: string;
  /** Where the figure comes from, for the message: "KILN_MAX_JSON_BODY_BYTES". */
  setting?: string;
}

/**
 * Which limit a route reads its body under. A number overrides the JSON limit for one route (the
 * config apply route takes 4 MiB); `invoke` is a function invocation's, `deploy` a multipart
 * deploy upload's.
 */
export type RouteBodyLimit = number | "json" | "invoke" | "deploy";

const MiB = 1_048_576;
/** Room beside the archive in a deploy upload: the other fields (an OpenAPI document of up to 256 KiB), multipart framing. */
export const DEPLOY_FIELDS_ALLOWANCE = MiB;

export function jsonBodyLimit(config: Config): BodyLimit {
  return { bytes: config.maxJsonBodyBytes, what: "JSON request bodies", setting: "KILN_MAX_JSON_BODY_BYTES" };
}

export function invokeBodyLimit(config: Config): BodyLimit {
  return { bytes: config.maxInvokeBodyBytes, what: "function invocation requests", setting: "KILN_MAX_INVOKE_BODY_BYTES" };
}

export function deployBodyLimit(config: Config): BodyLimit {
  return {
    bytes: config.sourceArchiveLimitMb * MiB + DEPLOY_FIELDS_ALLOWANCE,
    what: "deploy uploads (the source archive limit plus 1 MiB for the other fields)",
    setting: "KILN_SOURCE_ARCHIVE_LIMIT_MB",
  };
}

export function resolveBodyLimit(limit: RouteBodyLimit | undefined, config: Config): BodyLimit {
  if (typeof limit === "number") return { bytes: limit, what: "request bodies of this route" };
  if (limit === "invoke") return invokeBodyLimit(config);
  if (limit === "deploy") return deployBodyLimit(config);
  return jsonBodyLimit(config);
}

function size(bytes: number): string {
  if (bytes >= MiB && bytes % (MiB / 4) === 0) return `${bytes / MiB} MiB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}

/**
 * 413 naming the limit: "JSON request bodies may be at most 1 MiB (1048576 bytes, KILN_MAX_JSON_BODY_BYTES)".
 * No `Connection: close`: the server discards the unread rest (it never reaches Kiln), and a client
 * still writing its body reads this answer instead of a reset connection.
 */
export function payloadTooLarge(limit: BodyLimit): HttpError {
  const shown = size(limit.bytes);
  const detail = [shown.endsWith("bytes") ? "" : `${limit.bytes} bytes`, limit.setting ?? ""].filter(Boolean).join(", ");
  return new HttpError(413, { error: `request body too large: ${limit.what} may be at most ${shown}${detail ? ` (${detail})` : ""}` });
}

/**
 * Requests answered before their body was all read. The server discards the rest after the answer;
 * server.ts shortens such a connection's idle timeout, so a client that stopped sending (and keeps
 * the connection open) does not hold it for the full idle timeout, and a graceful stop closes it once
 * no request is in flight (`stopHttp`).
 */
export const unreadBodies = new WeakSet<Request>();

function refused(request: Request, limit: BodyLimit): HttpError {
  unreadBodies.add(request);
  return payloadTooLarge(limit);
}

/** The declared length, when the framing is by Content-Length (a chunked body has none that counts). */
function declaredLength(request: Request): number | null {
  if (request.headers.has("transfer-encoding")) return null;
  const v = request.headers.get("content-length");
  if (v === null || !/^\s*\d+\s*$/.test(v)) return null;
  return Number(v);
}

/** A body read that failed because the client went away is the client's problem (400), not a 500. */
async function settle<T>(read: Promise<T>): Promise<T> {
  try {
    return await read;
  } catch {
    throw badRequest("request body could not be read: the connection ended before it was complete");
  }
}

/** The whole body, at most `limit.bytes` of it; a 413 as soon as it is known to be more. */
export async function readBodyBytes(request: Request, limit: BodyLimit): Promise<Uint8Array> {
  const declared = declaredLength(request);
  if (declared !== null) {
    if (declared > limit.bytes) throw refused(request, limit);
    // Framed by Content-Length: the server reads exactly that many bytes, so it can be read whole.
    const whole = new Uint8Array(await settle(request.arrayBuffer()));
    if (whole.byteLength > limit.bytes) throw payloadTooLarge(limit);
    return whole;
  }
  const stream = request.body;
  if (!stream) return new Uint8Array(0);
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    let next: Awaited<ReturnType<typeof reader.read>>;
    try {
      next = await reader.read();
    } catch (err) {
      // Bun ends the stream (and answers 413 itself) past maxRequestBodySize; otherwise the client went away.
      if (/maxRequestBodySize/i.test(String((err as Error)?.message ?? err))) throw payloadTooLarge(limit);
      throw badRequest("request body could not be read: the connection ended before it was complete");
    }
    const { done, value } = next;
    if (done) break;
    total += value.byteLength;
    if (total > limit.bytes) {
      chunks.length = 0;
      reader.cancel().catch(() => {});
      throw refused(request, limit);
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

export async function readBodyText(request: Request, limit: BodyLimit): Promise<string> {
  const declared = declaredLength(request);
  // The common case (a small body with its length declared) skips the copy through bytes.
  if (declared !== null && declared <= limit.bytes) {
    const text = await settle(request.text());
    // UTF-8 never decodes to more UTF-16 units than it had bytes.
    if (text.length > limit.bytes) throw payloadTooLarge(limit);
    return text;
  }
  return new TextDecoder().decode(await readBodyBytes(request, limit));
}

/**
 * Whether JSON text nests arrays and objects deeper than `max`: one pass, no recursion, string
 * contents (escaped quotes included) skipped. Run before JSON.parse, so no deep value is ever built
 * (JSON.stringify, structuredClone and recursive walks overflow the stack on one).
 */
export function jsonTooDeep(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: the next character is escaped, a quote included
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

export function tooDeep(max: number, where = "request body"): HttpError {
  return badRequest(`${where} is nested too deeply: JSON arrays and objects may nest at most ${max} levels (KILN_MAX_JSON_DEPTH)`);
}

/** JSON text to a value: nesting checked first, then parsed; a 400 for either problem. */
export function parseJsonText(text: string, maxDepth: number, where = "request body"): unknown {
  if (jsonTooDeep(text, maxDepth)) throw tooDeep(maxDepth, where);
  try {
    return JSON.parse(text);
  } catch {
    throw badRequest(`${where} is not valid JSON`);
  }
}

/**
 * A JSON body within its limit and nesting depth. An empty body is `{}` (`emptyIsObject`, the API
 * routes) or invalid JSON (a function's RPC address, which needs `{payload}`).
 */
export async function readJsonBody(request: Request, limit: BodyLimit, maxDepth: number, o: { emptyIsObject?: boolean } = { emptyIsObject: true }): Promise<unknown> {
  const text = await readBodyText(request, limit);
  // Lenient about Content-Type (curl -d sends form encoding) but strict about the JSON itself.
  if (o.emptyIsObject && text.trim() === "") return {};
  return parseJsonText(text, maxDepth);
}

/** Whether the request says its body is `application/x-www-form-urlencoded`. */
export function isFormEncoded(request: Request): boolean {
  return /^application\/x-www-form-urlencoded\b/i.test(request.headers.get("content-type") ?? "");
}

/** A form-encoded body within its limit as an object of its fields (a repeated field: its first value). */
export async function readFormBody(request: Request, limit: BodyLimit): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(await readBodyText(request, limit))) if (!(k in out)) out[k] = v;
  return out;
}

/** A multipart/form-data body within its limit, parsed once it is all read. */
export async function readMultipartBody(request: Request, limit: BodyLimit): Promise<FormData> {
  const bytes = await readBodyBytes(request, limit);
  try {
    return await new Response(bytes as BodyInit, { headers: { "content-type": request.headers.get("content-type") ?? "" } }).formData();
  } catch {
    throw badRequest("request body is not valid multipart/form-data");
  }
}
