import { randomBytes, randomInt } from "node:crypto";
import type { Socket, TCPSocketListener } from "bun";
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
 * A PostgreSQL wire-protocol TCP listener: TLS on SSLRequest when given certificates (GSSAPI
 * encryption refused), plaintext refused if told so, SCRAM-SHA-256 authentication against
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
  /** The session runs over TLS. */
  ssl?: boolean;
  /** The process id its BackendKeyData announces (NotificationResponses it causes carry it). */
  processId?: number;
}

/** Lets a backend end its client: FATAL ErrorResponse (57P01 unless told), then the connection closes. */
export interface WireControl {
  terminate(fatalMessage: string, code?: string): void;
  /**
   * Writes whole messages to the client between the answers it is waiting for (a NotificationResponse
   * for a client idle between transactions, as PostgreSQL sends one). Nothing once it is ending.
   */
  send?(data: Uint8Array): void;
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
  /**
   * For a backend that passes bytes through (the production proxy): a run of complete frontend
   * messages, contiguous as the client sent them (Terminate never among them), instead of one
   * `handle` per message, so what arrived together leaves in one write. A promise holds the next
   * run back (backpressure); the same memory rules as `handle`.
   */
  handleRun?(run: Uint8Array, send: (data: Uint8Array) => void): void | Promise<void>;
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
    readonly hint?: string,
  ) {
    super(message);
  }
}

export async function startWireListener(opts: {
  host: string;
  port: number;
  router: WireRouter;
  onError?: (e: unknown) => void;
  /** Certificate and key for TLS (awaited at the first SSLRequest); none: SSLRequest is answered 'N'. */
  tls?: () => Promise<{ cert: string; key: string }>;
  /** Refuse sessions that did not upgrade to TLS (CancelRequests still come in plaintext, as libpq before 17 sends them). */
  requireSsl?: boolean;
}): Promise<WireListener> {
  const shared: Shared = {
    router: opts.router,
    onError: opts.onError ?? (() => {}),
    verifiers: new VerifierCache(),
    mockSecret: randomBytes(32),
    connections: new Set(),
    keys: new Map(),
    tls: opts.tls ?? null,
    requireSsl: Boolean(opts.requireSsl),
  };
  // Bun's own TCP sockets: about 40% less CPU per message than node:net's streams under Bun.
  let server: TCPSocketListener<WireSocket>;
  try {
    server = Bun.listen<WireSocket>({
      hostname: opts.host,
      port: opts.port,
      socket: {
        open(socket) {
          socket.data = new WireSocket(socket);
          const conn = new Connection(socket.data, shared);
          shared.connections.add(conn);
          conn.done.then(() => shared.connections.delete(conn));
        },
        // After a TLS upgrade Bun still hands the raw socket's ciphertext here: the TLS socket's handlers read it.
        data: (socket, chunk) => {
          if (!socket.data.encrypted) socket.data.onData?.(chunk);
        },
        drain: (socket) => {
          if (!socket.data.encrypted) socket.data.flush();
        },
        end: (socket) => socket.data.onEnd?.(),
        close: (socket) => socket.data.closed(),
        error: (socket) => socket.data.closed(), // close follows; this one only makes sure
      },
    });
  } catch (e) {
    throw Object.assign(new Error((e as Error).message), { code: (e as { code?: string }).code });
  }
  return {
    port: server.port,
    async close() {
      server.stop(false); // no new connections; the open ones end below
      await Promise.all([...shared.connections].map((c) => c.shutdown("terminating connection due to administrator command")));
      server.stop(true);
    },
  };
}

/**
 * A Bun TCP socket with what a connection needs: callbacks instead of events, and a write queue
 * (Bun writes what the kernel takes now and returns the count; the rest waits for `drain`).
 */
class WireSocket {
  onData: ((chunk: Uint8Array) => void) | null = null;
  onEnd: (() => void) | null = null;
  private closeWaiters: (() => void)[] = [];
  private drainWaiters: (() => void)[] = [];
  private queue: Uint8Array[] = [];
  private ending = false;
  private paused = false;
  isClosed = false;
  /** Upgraded to TLS: `socket` is the TLS socket from here on. */
  encrypted = false;
  private readonly remote: string;

  constructor(private socket: Socket<WireSocket>) {
    socket.setNoDelay(true);
    this.remote = socket.remoteAddress;
  }

  /**
   * Server-side TLS over this connection (after the 'S' answer is written): Bun's upgradeTLS on an
   * accepted socket. Later reads and writes go through the TLS socket; its handshake runs as the client goes.
   */
  startTls(tls: { cert: string; key: string }): void {
    this.encrypted = true;
    const [, secure] = this.socket.upgradeTLS<WireSocket>({
      data: this,
      tls,
      socket: {
        data: (s, chunk) => s.data.onData?.(chunk),
        drain: (s) => s.data.flush(),
        end: (s) => s.data.onEnd?.(),
        close: (s) => s.data.closed(),
        error: (s) => s.data.closed(),
      },
    });
    this.socket = secure;
  }

  get remoteAddress(): string {
    return this.remote;
  }

  get needsDrain(): boolean {
    return this.queue.length > 0;
  }

  write(data: Uint8Array): void {
    if (this.isClosed || this.ending) return;
    if (this.queue.length) {
      this.queue.push(data);
      return;
    }
    const n = this.socket.write(data);
    if (n < data.length) this.queue.push(n > 0 ? data.subarray(n) : data);
  }

  /** Writes what waits (on `drain`); ends the socket once empty if asked to. */
  flush(): void {
    while (this.queue.length) {
      const head = this.queue[0]!;
      const n = this.socket.write(head);
      if (n < head.length) {
        this.queue[0] = n > 0 ? head.subarray(n) : head;
        return;
      }
      this.queue.shift();
    }
    if (this.ending) this.socket.end();
    for (const w of this.drainWaiters.splice(0)) w();
  }

  /** Resolves when the queue has drained or the socket closed. */
  drained(): Promise<void> {
    if (!this.queue.length || this.isClosed) return Promise.resolve();
    return new Promise((r) => this.drainWaiters.push(r));
  }

  whenClosed(fn: () => void): void {
    if (this.isClosed) fn();
    else this.closeWaiters.push(fn);
  }

  /** Ends after what is queued has been written. */
  end(): void {
    if (this.ending || this.isClosed) return;
    this.ending = true;
    if (!this.queue.length) this.socket.end();
  }

  destroy(): void {
    if (!this.isClosed) this.socket.terminate();
  }

  pause(): void {
    if (!this.paused && !this.isClosed) (this.paused = true), this.socket.pause();
  }

  resume(): void {
    if (this.paused && !this.isClosed) (this.paused = false), this.socket.resume();
  }

  isPaused(): boolean {
    return this.paused;
  }

  closed(): void {
    if (this.isClosed) return;
    this.isClosed = true;
    this.queue = [];
    for (const w of [...this.drainWaiters.splice(0), ...this.closeWaiters.splice(0)]) w();
  }
}

interface Shared {
  router: WireRouter;
  onError: (e: unknown) => void;
  verifiers: VerifierCache;
  mockSecret: Buffer;
  connections: Set<Connection>;
  tls: (() => Promise<{ cert: string; key: string }>) | null;
  requireSsl: boolean;
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
    private readonly socket: WireSocket,
    private readonly shared: Shared,
  ) {
    socket.onData = (chunk) => this.received(chunk);
    socket.onEnd = () => this.end();
    const closed = new Promise<void>((resolve) =>
      socket.whenClosed(() => {
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
      if (e instanceof Fatal) this.fatal(e.code, e.message, e.hint);
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
      if (code === SSL_REQUEST && this.shared.tls && !this.socket.encrypted) {
        // As PostgreSQL (CVE-2021-23214): bytes sent after SSLRequest before the handshake are an attack, not a startup.
        if (this.buf.length - this.pos + this.pendingBytes > 0) throw new Fatal("08P01", "received unencrypted data after SSL request");
        let material: { cert: string; key: string } | null = null;
        try {
          material = await this.shared.tls();
        } catch (e) {
          this.shared.onError(e); // no certificate: the client hears 'N', as from a server without SSL
        }
        if (this.ended) return null;
        this.send(utf8(material ? "S" : "N"));
        if (material) this.socket.startTls(material);
        continue;
      }
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
    if (this.shared.requireSsl && !this.socket.encrypted) {
      // PostgreSQL's words for a hostssl-only pg_hba.conf, with a hint naming what to change.
      throw new Fatal(
        "28000",
        `no pg_hba.conf entry for host "${this.socket.remoteAddress}", user "${user}", database "${database}", no encryption`,
        "SSL required: this Kiln runs with --pg-require-ssl; connect with sslmode=require, or sslmode=verify-full and sslrootcert set to Kiln's CA (<data-dir>/tls/ca.pem).",
      );
    }
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

    const pid = nextPid++;
    const client: WireClient = {
      user,
      database,
      applicationName: params.application_name ?? "",
      params,
      remoteAddress: this.socket.remoteAddress ?? "",
      ssl: this.socket.encrypted,
      processId: pid,
    };
    const control: WireControl = {
      terminate: (message, code) => this.terminate(message, code),
      send: (data) => {
        if (!this.ended) this.send(data);
      },
    };
    let announced: Record<string, string>;
    try {
      this.backend = await this.shared.router.open(found.target, client, control);
      if (this.ended) return null; // gone meanwhile; `done` closes the backend
      announced = { ...(await this.backend.parameters()), application_name: client.applicationName };
    } catch (e) {
      throw refusal(e);
    }
    const hello = Object.entries(announced).map(([k, v]) => parameterStatus(k, v));
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
    if (backend.handleRun) return this.serveRuns(backend, send);
    for (;;) {
      const message = await this.next(true);
      if (!message || message[0] === F.terminate) return;
      await backend.handle(message, send);
      if (this.socket.needsDrain && !this.ended) await this.socket.drained();
    }
  }

  /**
   * Runs of messages for a pass-through backend, handed over from the socket's own data callback (no
   * promise or microtask per message): every complete message at hand that lies right after the
   * previous one in memory (a chunk's messages do; one joined across chunks starts a new run). Only
   * the headers are read here, so a client's Bind/Execute/Sync reach the server in one write.
   * Resolves at Terminate or when the client is gone.
   */
  private serveRuns(backend: WireBackend, send: (data: Uint8Array) => void): Promise<void> {
    return new Promise((resolve, reject) => {
      this.runs = { backend, send, resolve, reject };
      this.pump();
    });
  }

  private runs: { backend: WireBackend; send: (data: Uint8Array) => void; resolve: () => void; reject: (e: unknown) => void } | null = null;
  /** A run is with the backend (or waits for the client to drain): the next one waits. */
  private pumping = false;

  private pump(): void {
    const r = this.runs;
    if (!r || this.pumping) return;
    this.pumping = true;
    try {
      for (;;) {
        if (this.ended) return this.stopRuns();
        // The complete messages at hand in the current buffer, headers read in place (a bad length,
        // a Terminate or a message split across chunks ends the run; `take` then reports, handles or
        // joins it). A chunk of whole messages goes on as it came, without a view made of it.
        let buf = this.buf;
        let start = this.pos;
        let at = this.completeFrom(start);
        if (at === start) {
          const first = this.take(true); // joins chunks if it must
          if (!first) break;
          if (first[0] === F.terminate) return this.stopRuns();
          buf = this.buf;
          start = this.pos - first.length;
          at = this.completeFrom(this.pos);
        }
        this.pos = at;
        const run = start === 0 && at === buf.length ? buf : buf.subarray(start, at);
        const held = r.backend.handleRun!(run, r.send);
        const drain = this.socket.needsDrain;
        if (held || drain)
          // Backpressure: the next run once the server's leg and the client's have room.
          return void Promise.resolve(held)
            .then(() => (drain ? this.socket.drained() : undefined))
            .then(
              () => {
                this.pumping = false;
                this.pump();
              },
              (e) => this.stopRuns(e),
            );
      }
    } catch (e) {
      return this.stopRuns(e);
    }
    this.pumping = false;
    if (this.socket.isPaused()) this.socket.resume();
  }

  /** The end of the complete messages (Terminate excluded) in `buf` from `at` on. */
  private completeFrom(at: number): number {
    const buf = this.buf;
    while (at + 5 <= buf.length && buf[at] !== F.terminate) {
      const len = readInt32(buf, at + 1);
      if (len < 4 || len > MAX_MESSAGE || at + 1 + len > buf.length) break;
      at += 1 + len;
    }
    return at;
  }

  private stopRuns(error?: unknown): void {
    const r = this.runs;
    this.runs = null;
    this.pumping = false;
    if (error === undefined) r?.resolve();
    else r?.reject(error);
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
    if (this.runs) this.pump();
    else if (this.buf.length - this.pos + this.pendingBytes >= this.need) this.poke();
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private end(): void {
    this.ended = true;
    this.poke();
    if (this.runs && !this.pumping) this.stopRuns();
  }

  private send(data: Uint8Array): void {
    this.socket.write(data);
  }

  private fatal(code: string, message: string, hint?: string): void {
    this.send(errorResponse("FATAL", code, message, hint));
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
