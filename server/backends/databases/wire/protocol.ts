/**
 * PostgreSQL wire protocol (v3) bytes: building the backend messages Kiln sends itself, and reading
 * the few fields the listener and the session mux need. Everything else passes through untouched.
 */

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export const utf8 = (s: string): Uint8Array => encoder.encode(s);
export const fromUtf8 = (b: Uint8Array): string => decoder.decode(b);

/** Frontend message type bytes. */
export const F = {
  bind: 0x42, // B
  close: 0x43, // C
  describe: 0x44, // D
  execute: 0x45, // E
  flush: 0x48, // H
  parse: 0x50, // P
  query: 0x51, // Q
  sync: 0x53, // S
  terminate: 0x58, // X
  password: 0x70, // p (also SASLInitialResponse / SASLResponse)
} as const;

/** Backend message type bytes. */
export const B = {
  commandComplete: 0x43, // C
  dataRow: 0x44, // D
  error: 0x45, // E
  parseComplete: 0x31, // 1
  readyForQuery: 0x5a, // Z
} as const;

export function readInt32(b: Uint8Array, at: number): number {
  return ((b[at]! << 24) | (b[at + 1]! << 16) | (b[at + 2]! << 8) | b[at + 3]!) | 0;
}

export function readInt16(b: Uint8Array, at: number): number {
  return (b[at]! << 8) | b[at + 1]!;
}

/** End (index of the NUL) of the C string starting at `at`; -1 if unterminated. */
export function cstringEnd(b: Uint8Array, at: number): number {
  return b.indexOf(0, at);
}

export function readCString(b: Uint8Array, at: number): { value: string; next: number } {
  const end = cstringEnd(b, at);
  if (end < 0) throw new ProtocolViolation("unterminated string in message");
  return { value: fromUtf8(b.subarray(at, end)), next: end + 1 };
}

export class ProtocolViolation extends Error {}

export function concatBytes(parts: Uint8Array[], total = parts.reduce((n, p) => n + p.length, 0)): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Builds one message: optional type byte, int32 length, payload. */
export class MessageBuilder {
  private parts: number[] = [];
  private chunks: Uint8Array[] = [];

  int32(n: number): this {
    this.parts.push((n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
    return this;
  }
  int16(n: number): this {
    this.parts.push((n >>> 8) & 0xff, n & 0xff);
    return this;
  }
  byte(n: number): this {
    this.parts.push(n);
    return this;
  }
  cstring(s: string): this {
    return this.bytes(utf8(s)).byte(0);
  }
  bytes(b: Uint8Array): this {
    this.flushParts();
    this.chunks.push(b);
    return this;
  }
  private flushParts(): void {
    if (this.parts.length) this.chunks.push(Uint8Array.from(this.parts));
    this.parts = [];
  }
  /** The finished message; `type` null for the untyped startup-phase messages. */
  build(type: number | null): Uint8Array {
    this.flushParts();
    const payload = concatBytes(this.chunks);
    const head = type === null ? 0 : 1;
    const out = new Uint8Array(head + 4 + payload.length);
    if (type !== null) out[0] = type;
    const len = 4 + payload.length;
    out[head] = len >>> 24;
    out[head + 1] = (len >>> 16) & 0xff;
    out[head + 2] = (len >>> 8) & 0xff;
    out[head + 3] = len & 0xff;
    out.set(payload, head + 4);
    return out;
  }
}

const msg = () => new MessageBuilder();

export function errorResponse(severity: "FATAL" | "ERROR", code: string, message: string, hint?: string): Uint8Array {
  const m = msg()
    .byte(0x53).cstring(severity) // S
    .byte(0x56).cstring(severity) // V (not localized)
    .byte(0x43).cstring(code) // C
    .byte(0x4d).cstring(message); // M
  if (hint) m.byte(0x48).cstring(hint); // H
  return m.byte(0).build(B.error);
}

export const authentication = (code: number, data?: Uint8Array): Uint8Array => {
  const m = msg().int32(code);
  if (data) m.bytes(data);
  return m.build(0x52); // R
};

export const parameterStatus = (name: string, value: string): Uint8Array => msg().cstring(name).cstring(value).build(0x53);
export const backendKeyData = (pid: number, secret: number): Uint8Array => msg().int32(pid).int32(secret).build(0x4b);
export const readyForQuery = (status: "I" | "T" | "E"): Uint8Array => msg().byte(status.charCodeAt(0)).build(B.readyForQuery);

export function negotiateProtocolVersion(minor: number, unsupported: string[]): Uint8Array {
  const m = msg().int32(minor).int32(unsupported.length);
  for (const o of unsupported) m.cstring(o);
  return m.build(0x76); // v
}

export const sync = (): Uint8Array => msg().build(F.sync);
export const simpleQuery = (sql: string): Uint8Array => msg().cstring(sql).build(F.query);
export const copyFail = (reason: string): Uint8Array => msg().cstring(reason).build(0x66); // f
/** CopyInResponse: every column in the overall format (text or binary). */
export function copyInResponse(binary: boolean, columns: number): Uint8Array {
  const m = msg().byte(binary ? 1 : 0).int16(columns);
  for (let i = 0; i < columns; i++) m.int16(binary ? 1 : 0);
  return m.build(0x47); // G
}
export const closeStatement = (name: string): Uint8Array => msg().byte(0x53).cstring(name).build(F.close);

/** Walks complete backend messages in `out`, calling `visit(type, payloadStart, payloadEnd)`. */
export function eachMessage(out: Uint8Array, visit: (type: number, start: number, end: number) => void): void {
  let at = 0;
  while (at + 5 <= out.length) {
    const len = readInt32(out, at + 1);
    if (len < 4) return; // not a message boundary (e.g. a proxied chunk split mid-message): stop
    const end = at + 1 + len;
    visit(out[at]!, at + 5, end);
    at = end;
  }
}

/**
 * The rows of the first result and the first error of a simple-query response (Kiln's own queries);
 * `firstComplete`: the first statement completed before any error.
 */
export function firstResult(out: Uint8Array): { rows: (string | null)[][]; error: string | null; firstComplete: boolean } {
  const rows: (string | null)[][] = [];
  let error: string | null = null;
  let done = false;
  let firstComplete = false;
  eachMessage(out, (type, start, end) => {
    if (type === B.dataRow && !done) {
      const row: (string | null)[] = [];
      let at = start + 2;
      for (let i = readInt16(out, start); i > 0; i--) {
        const len = readInt32(out, at);
        at += 4;
        row.push(len < 0 ? null : fromUtf8(out.subarray(at, at + len)));
        if (len > 0) at += len;
      }
      rows.push(row);
    } else if (type === B.commandComplete) {
      if (!done && error === null) firstComplete = true;
      done = true;
    } else if (type === B.error && error === null) {
      error = errorFields(out.subarray(start, end)).M ?? "unknown error";
    }
  });
  return { rows, error, firstComplete };
}

/** Fields of an ErrorResponse / NoticeResponse payload, keyed by their field letter. */
export function errorFields(payload: Uint8Array): Record<string, string> {
  const fields: Record<string, string> = {};
  let at = 0;
  while (at < payload.length && payload[at] !== 0) {
    const key = String.fromCharCode(payload[at]!);
    const { value, next } = readCString(payload, at + 1);
    fields[key] = value;
    at = next;
  }
  return fields;
}

/** A SQL string literal that reads the same whatever standard_conforming_strings is. */
export function sqlLiteral(s: string): string {
  return `E'${s.replace(/\\/g, "\\\\").replace(/'/g, "''")}'`;
}

export function sqlIdent(s: string): string {
  return `"${s.replace(/"/g, '""')}"`;
}
