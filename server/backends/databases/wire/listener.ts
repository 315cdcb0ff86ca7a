import { randomBytes, randomInt } from "node:crypto";
import { createServer, type Socket } from "node:net";
import {
  authentication,
  backendKeyData,
  concatBytes,
  errorResponse,
  F,
  negotiateProtocolVersion,
  parameterStatus,
  ProtocolViolation,
  readCString,
  readInt32,
  readyForQuery,
  fromUtf8,
  utf8,
} from "./protocol";
import { mockVerifier, SCRAM_MECHANISM, ScramError, ScramExchange, VerifierCache } from "./scram";

/**
 * A PostgreSQL wire-protocol TCP listener: TLS refused ('N'), SCRAM-SHA-256 authentication against
 * what the router says, then each complete frontend message handed to the router's backend in order.
 * What sits behind a backend (a PGlite session mux, a proxy) is not the listener's business.
 */

export interface WireClient {
  user: string;
  database: string;
  applicationName: string;
  /** The startup packet's parameters, `user` and `database` included. */
  params: Record<string, string>;
  remoteAddress: string;
}

/** Lets a backend end its client: FATAL ErrorResponse (57P01 unless told), then the connection closes. */
export interface WireControl {
  terminate(fatalMessage: string, code?: string): void;
}

export interface WireBackend {
  /** ParameterStatus values announced after authentication (application_name is echoed from the client regardless). */
  parameters(): Promise<Record<string, string>>;
  /**
   * One complete frontend message (type byte + int32 length + payload); called one at a time, in
   * order. The listener never reuses the memory of `message`, so a backend may keep it.
   */
  handle(message: Uint8Array, send: (data: Uint8Array) => void): Promise<void>;
  /**
   * Client gone or Terminate: roll back, release, forget its statements. Called exactly once, and
   * possibly while a `handle` is still pending (the client left while waiting): that work is dropped.
   */
  close(): Promise<void>;
  /** A CancelRequest with this client's key: cancel what it runs now, if anything (never throws). */
  cancel?(): void;
}

export interface WireRouter {
  /** Expected password for (user, database) and an opaque target; null for unknown role or database — fail exactly like a wrong password. */
  credentials(user: string, database: string): Promise<{ target: string; password: string } | null>;
  /** After successful auth. Throwing an Error refuses the connection with FATAL + that message. */
  open(target: string, client: WireClient, control: WireControl): Promise<WireBackend>;
}

export interface WireListener {
  port: number;
  /** Stops accepting, ends every connection (FATAL 57P01) and waits for their backends to close. */
  close(): Promise<void>;
}

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;
const PROTOCOL_3 = 3;
/** PostgreSQL's own cap on a frontend message (PQ_LARGE_MESSAGE_LIMIT is 1 GB minus a little). */
const MAX_MESSAGE = 0x3fffffff;
/** Before authentication nobody gets to make us buffer more (PostgreSQL's MAX_STARTUP_PACKET_LENGTH). */
const MAX_UNAUTHENTICATED_MESSAGE = 10_000;
/** Stop reading from a client that sends faster than its messages are handled. */
const READ_HIGH_WATER = 8 * 1024 * 1024;
const AUTH_TIMEOUT_MS = 60_000;

const AUTH_SASL = 10;
const AUTH_SASL_CONTINUE = 11;
const AUTH_SASL_FINAL = 12;
const AUTH_OK = 0;

/** A connection that ends with a FATAL error to the client. */
class Fatal extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export async function startWireListener(opts: {
  host: string;
  port: number;
  router: WireRouter;
  onError?: (e: unknown) => void;
}): Promise<WireListener> {
  const shared: Shared = {
    router: opts.router,
    onError: opts.onError ?? (() => {}),
    verifiers: new VerifierCache(),
    mockSecret: randomBytes(32),
    connections: new Set(),
    keys: new Map(),
  };
  const server = createServer((socket) => {
    const conn = new Connection(socket, shared);
    shared.connections.add(conn);
    conn.done.then(() => shared.connections.delete(conn));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  server.on("error", (e) => shared.onError(e));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  return {
    port,
    async close() {
      const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
      await Promise.all([...shared.connections].map((c) => c.shutdown("terminating connection due to administrator command")));
      await stopped;
    },
  };
}

interface Shared {
  router: WireRouter;
  onError: (e: unknown) => void;
  verifiers: VerifierCache;
  mockSecret: Buffer;
  connections: Set<Connection>;
  /** BackendKeyData process id -> the connection and its secret, for CancelRequests. */
  keys: Map<number, { secret: number; conn: Connection }>;
}

let nextPid = 1;

/** A router or backend refusing the connection: its message, and its SQLSTATE if it carries one. */
function refusal(e: unknown): Fatal {
  const code = (e as { code?: unknown } | null)?.code;
  return new Fatal(typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : "08004", e instanceof Error ? e.message : String(e));
}

class Connection {
  /** Resolves once the socket is closed and the backend (if any) has closed. */
  readonly done: Promise<void>;

  // Incoming bytes: `buf[pos..]` then `pending` chunks, joined only when a message needs them.
  private buf: Uint8Array = new Uint8Array(0);
  private pos = 0;
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  private need = 0;
  private wake: (() => void) | null = null;

  private ended = false;
  private backend: WireBackend | null = null;
  private backendClosed: Promise<void> | null = null;

  constructor(
    private readonly socket: Socket,
    private readonly shared: Shared,
  ) {
    socket.setNoDelay(true);
    socket.on("data", (chunk: Uint8Array) => this.received(chunk));
    socket.on("error", () => {}); // 'close' follows every error
    socket.on("end", () => this.end());
    const closed = new Promise<void>((resolve) =>
      socket.on("close", () => {
        this.end();
        // At once, not after the pending handle: a client waiting for the session must leave the queue.
        void this.closeBackend();
        resolve();
      }),
    );
    const timer = setTimeout(() => this.backend || socket.destroy(), AUTH_TIMEOUT_MS);
    timer.unref?.();
    const ran = this.run().finally(() => clearTimeout(timer));
    this.done = Promise.all([closed, ran]).then(() => this.closeBackend());
  }

  private async run(): Promise<void> {
    try {
      if (await this.authenticate()) await this.serve();
    } catch (e) {
      if (e instanceof Fatal) this.fatal(e.code, e.message);
      else if (e instanceof ProtocolViolation) this.fatal("08P01", e.message);
      else {
        this.shared.onError(e);
        this.fatal("XX000", "internal error in Kiln's database listener");
      }
    } finally {
      this.socket.end();
    }
  }

  private async authenticate(): Promise<WireClient | null> {
    let startup: Uint8Array | null;
    for (;;) {
      startup = await this.next(false);
      if (!startup) return null;
      const code = readInt32(startup, 4);
      if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
        this.send(utf8("N"));
        continue;
      }
      if (code === CANCEL_REQUEST) {
        // As PostgreSQL: act on a matching key, answer nothing either way, close.
        if (startup.length >= 16) {
          const key = this.shared.keys.get(readInt32(startup, 8));
          if (key && key.secret === readInt32(startup, 12)) key.conn.cancel();
        }
        return null;
      }
      if (code >> 16 !== PROTOCOL_3) throw new Fatal("0A000", `unsupported frontend protocol ${code >> 16}.${code & 0xffff}`);
      break;
    }

    const params: Record<string, string> = {};
    const unsupported: string[] = [];
    let at = 8;
    while (at < startup.length && startup[at] !== 0) {
      const name = readCString(startup, at);
      const value = readCString(startup, name.next);
      at = value.next;
      if (name.value.startsWith("_pq_.")) unsupported.push(name.value);
      else params[name.value] = value.value;
    }
    const minor = readInt32(startup, 4) & 0xffff;
    if (minor > 0 || unsupported.length) this.send(negotiateProtocolVersion(0, unsupported));

    const user = params.user;
    if (!user) throw new Fatal("28000", "no PostgreSQL user name specified in startup packet");
    const database = params.database || user;
    const found = await this.shared.router.credentials(user, database);
    const verifier = found ? await this.shared.verifiers.get(found.password) : mockVerifier(user, this.shared.mockSecret);
    const failed = new Fatal("28P01", `password authentication failed for user "${user}"`);

    this.send(authentication(AUTH_SASL, utf8(`${SCRAM_MECHANISM}\0\0`)));
    const initial = await this.next(true);
    if (!initial) return null;
    if (initial[0] !== F.password) throw new ProtocolViolation("expected SASL response");
    const mechanism = readCString(initial, 5);
    if (mechanism.value !== SCRAM_MECHANISM) throw new Fatal("28000", "client selected an invalid SASL authentication mechanism");
    const exchange = new ScramExchange(verifier);
    let serverFinal: string | null;
    try {
      const len = readInt32(initial, mechanism.next);
      const clientFirst = fromUtf8(initial.subarray(mechanism.next + 4, mechanism.next + 4 + Math.max(len, 0)));
      this.send(authentication(AUTH_SASL_CONTINUE, utf8(exchange.first(clientFirst))));
      const response = await this.next(true);
      if (!response) return null;
      if (response[0] !== F.password) throw new ProtocolViolation("expected SASL response");
      serverFinal = exchange.final(fromUtf8(response.subarray(5)));
    } catch (e) {
      if (e instanceof ScramError) throw found ? new Fatal("08P01", e.message) : failed;
      throw e;
    }
    if (!found || serverFinal === null) throw failed;
    this.send(concatBytes([authentication(AUTH_SASL_FINAL, utf8(serverFinal)), authentication(AUTH_OK)]));

    const client: WireClient = {
      user,
      database,
      applicationName: params.application_name ?? "",
      params,
      remoteAddress: this.socket.remoteAddress ?? "",
    };
    const control: WireControl = { terminate: (message, code) => this.terminate(message, code) };
    let announced: Record<string, string>;
    try {
      this.backend = await this.shared.router.open(found.target, client, control);
      if (this.ended) return null; // gone meanwhile; `done` closes the backend
      announced = { ...(await this.backend.parameters()), application_name: client.applicationName };
    } catch (e) {
      throw refusal(e);
    }
    const hello = Object.entries(announced).map(([k, v]) => parameterStatus(k, v));
    const pid = nextPid++;
    const secret = randomInt(0x7fffffff);
    this.shared.keys.set(pid, { secret, conn: this });
    this.done.then(() => this.shared.keys.delete(pid));
    hello.push(backendKeyData(pid, secret), readyForQuery("I"));
    this.send(concatBytes(hello));
    return client;
  }

  private async serve(): Promise<void> {
    const backend = this.backend!;
    const send = (data: Uint8Array) => this.send(data);
    for (;;) {
      const message = await this.next(true);
      if (!message || message[0] === F.terminate) return;
      await backend.handle(message, send);
      if (this.socket.writableNeedDrain && !this.ended) await this.drained();
    }
  }

  private drained(): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.socket.off("drain", done).off("close", done);
        resolve();
      };
      this.socket.on("drain", done).on("close", done);
    });
  }

  /** The next complete message (typed after startup), or null once the client is gone. */
  private async next(typed: boolean): Promise<Uint8Array | null> {
    for (;;) {
      if (this.ended) return null;
      const m = this.take(typed);
      if (m) return m;
      if (this.socket.isPaused()) this.socket.resume();
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  private take(typed: boolean): Uint8Array | null {
    const head = typed ? 5 : 4;
    const available = this.buf.length - this.pos + this.pendingBytes;
    if (available < head) return (this.need = head), null;
    if (this.buf.length - this.pos < head) this.join();
    const len = readInt32(this.buf, this.pos + head - 4);
    if (len < 4 || len > (this.backend ? MAX_MESSAGE : MAX_UNAUTHENTICATED_MESSAGE)) throw new ProtocolViolation(`invalid message length ${len}`);
    const total = head - 4 + len;
    if (available < total) return (this.need = total), null;
    if (this.buf.length - this.pos < total) this.join();
    const m = this.buf.subarray(this.pos, this.pos + total);
    this.pos += total;
    this.need = 0;
    return m;
  }

  /** Joins the unread bytes into a fresh buffer; messages already handed out keep their memory. */
  private join(): void {
    this.buf = concatBytes([this.buf.subarray(this.pos), ...this.pending], this.buf.length - this.pos + this.pendingBytes);
    this.pos = 0;
    this.pending = [];
    this.pendingBytes = 0;
  }

  private received(chunk: Uint8Array): void {
    if (this.buf.length === this.pos && this.pending.length === 0) {
      this.buf = chunk;
      this.pos = 0;
    } else {
      this.pending.push(chunk);
      this.pendingBytes += chunk.length;
    }
    if (this.buf.length - this.pos + this.pendingBytes > READ_HIGH_WATER) this.socket.pause();
    if (this.buf.length - this.pos + this.pendingBytes >= this.need) this.poke();
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private end(): void {
    this.ended = true;
    this.poke();
  }

  private send(data: Uint8Array): void {
    if (!this.socket.destroyed && this.socket.writable) this.socket.write(data);
  }

  private fatal(code: string, message: string): void {
    this.send(errorResponse("FATAL", code, message));
  }

  cancel(): void {
    try {
      this.backend?.cancel?.();
    } catch (e) {
      this.shared.onError(e);
    }
  }

  private terminate(message: string, code = "57P01"): void {
    if (this.ended) return;
    this.fatal(code, message);
    this.end();
    this.socket.end();
  }

  private closeBackend(): Promise<void> {
    if (!this.backend) return Promise.resolve();
    this.backendClosed ??= this.backend.close().catch((e) => this.shared.onError(e));
    return this.backendClosed;
  }

  async shutdown(message: string): Promise<void> {
    this.terminate(message);
    const timer = setTimeout(() => this.socket.destroy(), 2000);
    await this.done;
    clearTimeout(timer);
  }
}
