import { createHash, createHmac, pbkdf2Sync, randomBytes } from "node:crypto";
import { connect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { tlsConnectOptions, wantsTls, type ServerTls } from "./server-tls";
import { MessageBuilder, simpleQuery, utf8 } from "./wire/protocol";

/**
 * A raw PostgreSQL connection used as a pipe: Kiln's wire listener authenticates the client itself,
 * then hands its messages to a backend connection opened here with the database's internal
 * credentials, after putting the session into the client's access mode.
 */
export interface ProxyTarget {
  host: string;
  port: number;
  user: string;
  password: string;
  database: string;
  applicationName: string;
  /**
   * The client's startup parameters (`options`, `DateStyle`, `TimeZone`, `search_path`, ...), passed
   * on to the server so the session starts as the client asked; `user`, `database`, `replication`
   * and `_pq_.*` are never passed on (the server's user and database are the target's own).
   */
  params?: Record<string, string>;
  /** TLS to the server (`sslmode` of --postgres-url); plaintext when null. */
  tls?: ServerTls | null;
}

/** Startup parameters that are the proxy's to choose, or that the proxy cannot honour. */
const NOT_FORWARDED = new Set(["user", "database", "replication", "application_name"]);

/** The startup parameters sent to the server: the client's, then the target's user and database. */
export function startupParams(t: ProxyTarget): Record<string, string> {
  const out: Record<string, string> = { client_encoding: "UTF8" };
  for (const [k, v] of Object.entries(t.params ?? {})) if (!NOT_FORWARDED.has(k) && !k.startsWith("_pq_.")) out[k] = v;
  return { ...out, user: t.user, database: t.database, application_name: t.applicationName };
}

const CANCEL_REQUEST = 80877102;
const SSL_REQUEST = (() => {
  const b = Buffer.alloc(8);
  b.writeInt32BE(8, 0);
  b.writeInt32BE(80877103, 4);
  return b;
})();

const P = 0x70; // PasswordMessage / SASLInitialResponse / SASLResponse ('p')

/** Protocol 3.0 startup: the one untyped message a client sends. */
function startupMessage(params: Record<string, string>): Uint8Array {
  const m = new MessageBuilder().int32(196608);
  for (const [k, v] of Object.entries(params)) m.cstring(k).cstring(v);
  return m.byte(0).build(null);
}

/** Splits a byte stream into complete backend messages. */
class Framer {
  private buf: Buffer = Buffer.alloc(0);
  push(chunk: Buffer): { type: string; body: Buffer; raw: Buffer }[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: { type: string; body: Buffer; raw: Buffer }[] = [];
    while (this.buf.length >= 5) {
      const len = this.buf.readInt32BE(1);
      if (this.buf.length < len + 1) break;
      const raw = this.buf.subarray(0, len + 1);
      out.push({ type: String.fromCharCode(raw[0]!), body: raw.subarray(5), raw });
      this.buf = this.buf.subarray(len + 1);
    }
    return out;
  }
  rest(): Buffer {
    const r = this.buf;
    this.buf = Buffer.alloc(0);
    return r;
  }
}

/** An ErrorResponse as an Error: the server's message, and its SQLSTATE as `code` (the wire listener relays both). */
function serverError(body: Buffer): Error & { code?: string } {
  const fields: Record<string, string> = {};
  let i = 0;
  while (i < body.length && body[i] !== 0) {
    const code = String.fromCharCode(body[i]!);
    const end = body.indexOf(0, i + 1);
    fields[code] = body.toString("utf8", i + 1, end);
    i = end + 1;
  }
  const err: Error & { code?: string } = new Error(fields.M ?? "backend error");
  if (fields.C) err.code = fields.C;
  return err;
}

/** Not reaching the server at all: a connection failure (08001), not Node's errno (EPIPE would pass for a SQLSTATE). */
function connectError(message: string): Error & { code: string } {
  return Object.assign(new Error(message), { code: "08001" });
}

const hmac = (key: Buffer, data: string) => createHmac("sha256", key).update(data).digest();

export interface ProxyConnection {
  parameters: Record<string, string>;
  /** The server's own process id for this session (its BackendKeyData), null if it sent none. */
  serverPid: number | null;
  /** False once bytes wait to be written: write more after `drained`. */
  write(data: Uint8Array): boolean;
  drained(): Promise<void>;
  /** The server's bytes as they come: chunks split messages anywhere. */
  onData(fn: (data: Buffer) => void): void;
  onClose(fn: () => void): void;
  end(): void;
  /**
   * Sends the server a CancelRequest for this session (a new connection to the same host and port,
   * as libpq's PQcancel does): whatever the session runs now is cancelled. Never throws.
   */
  cancel(): void;
}

/** Fire-and-forget CancelRequest for the backend `pid`/`secret` on host:port; errors are swallowed. */
function sendCancel(host: string, port: number, pid: number, secret: number, timeoutMs = 5_000): void {
  try {
    const packet = Buffer.alloc(16);
    packet.writeInt32BE(16, 0);
    packet.writeInt32BE(CANCEL_REQUEST, 4);
    packet.writeInt32BE(pid, 8);
    packet.writeInt32BE(secret, 12);
    const sock = connect({ host, port });
    const timer = setTimeout(() => sock.destroy(), timeoutMs);
    timer.unref?.();
    sock.on("error", () => {});
    sock.on("close", () => clearTimeout(timer));
    // The server answers nothing and closes once it has read the request.
    sock.once("connect", () => sock.end(packet));
    sock.on("data", () => {});
  } catch {}
}

/**
 * One connection to the server as the proxy uses it: bytes in order both ways, whatever carries them.
 * Plaintext runs on Bun's own TCP socket (no stream layers: the proxy's CPU per select-only
 * transaction went from 74 to 57 µs in bench/database-proxy.ts); TLS on node:tls, which verifies
 * as libpq's sslmode says.
 */
interface Leg {
  /** False when bytes wait in user space: write more only after `drained`. */
  write(data: Uint8Array): boolean;
  drained(): Promise<void>;
  /** Where received bytes go (chunks may split messages anywhere). */
  reader: (chunk: Buffer) => void;
  onClose(fn: () => void): void;
  end(): void;
  destroy(): void;
}

/** A Bun TCP socket as a Leg: Bun writes what the kernel takes now; the rest is queued for `drain`. */
function bunLeg(host: string, port: number): Promise<Leg> {
  return new Promise((resolve, reject) => {
    let queue: Uint8Array[] = [];
    let closed = false;
    let ending = false;
    const closers: (() => void)[] = [];
    let drainers: (() => void)[] = [];
    const close = () => {
      if (closed) return;
      closed = true;
      queue = [];
      for (const f of drainers.splice(0)) f();
      for (const f of closers.splice(0)) f();
    };
    let socket: import("bun").Socket<undefined>;
    const leg: Leg = {
      reader: () => {},
      write(data) {
        if (closed || ending) return true;
        if (queue.length) queue.push(data);
        else {
          const n = socket.write(data);
          if (n < data.length) queue.push(n > 0 ? data.subarray(n) : data);
        }
        return queue.length === 0;
      },
      drained: () => (queue.length && !closed ? new Promise((r) => drainers.push(r)) : Promise.resolve()),
      onClose: (fn) => (closed ? fn() : closers.push(fn)),
      end() {
        if (closed || ending) return;
        ending = true;
        if (!queue.length) socket.end();
      },
      destroy: () => {
        if (!closed) socket.terminate();
      },
    };
    Bun.connect({
      hostname: host,
      port,
      socket: {
        open: (s) => {
          socket = s;
          s.setNoDelay(true); // a statement's messages go out when written, not after the previous answer's ACK
          resolve(leg);
        },
        // A fresh Buffer each time (Bun reuses nothing it hands out).
        data: (_s, chunk) => leg.reader(chunk),
        drain: (s) => {
          while (queue.length) {
            const head = queue[0]!;
            const n = s.write(head);
            if (n < head.length) {
              queue[0] = n > 0 ? head.subarray(n) : head;
              return;
            }
            queue.shift();
          }
          if (ending) s.end();
          for (const f of drainers.splice(0)) f();
        },
        close,
        end: (s) => void s.end(),
        error: close,
        connectError: (_s, e) => reject(e),
      },
    }).catch(reject);
  });
}

/** A node:net or node:tls socket as a Leg. */
function nodeLeg(sock: Socket): Leg {
  const leg: Leg = {
    reader: () => {},
    write: (d) => sock.write(d),
    drained: () => (sock.writableNeedDrain && !sock.destroyed ? new Promise<void>((r) => sock.once("drain", r).once("close", r)) : Promise.resolve()),
    onClose: (fn) => (sock.destroyed ? fn() : sock.once("close", fn)),
    end: () => sock.end(),
    destroy: () => sock.destroy(),
  };
  sock.on("data", (d: Buffer) => leg.reader(d));
  sock.on("error", () => {}); // "close" follows
  return leg;
}

/** The server's socket, TLS negotiated as `tls` asks (an SSLRequest, the one-byte answer, then the handshake). */
function connectLeg(t: ProxyTarget, timeoutMs: number): Promise<Leg> {
  if (!wantsTls(t.tls ?? null)) {
    const connecting = bunLeg(t.host, t.port);
    return new Promise((resolve, reject) => {
      let late = false;
      const timer = setTimeout(() => {
        late = true;
        reject(connectError("timed out connecting to the database server"));
      }, timeoutMs);
      connecting.then(
        (leg) => (clearTimeout(timer), late ? leg.destroy() : resolve(leg)),
        (e: Error) => (clearTimeout(timer), reject(connectError(`could not connect to the database server: ${e.message}`))),
      );
    });
  }
  const tls = t.tls!;
  return new Promise((resolve, reject) => {
    const raw: Socket = connect({ host: t.host, port: t.port, noDelay: true });
    let done = false;
    const fail = (err: Error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      raw.destroy();
      reject(err);
    };
    const ok = (s: Socket) => {
      if (done) return s.destroy();
      done = true;
      clearTimeout(timer);
      resolve(nodeLeg(s));
    };
    const timer = setTimeout(() => fail(connectError("timed out connecting to the database server")), timeoutMs);
    raw.once("error", (e) => fail(connectError(`could not connect to the database server: ${e.message}`)));
    raw.once("close", () => fail(connectError("the database server closed the connection during startup")));
    raw.once("connect", () => {
      raw.write(SSL_REQUEST);
      raw.once("data", (answer: Buffer) => {
        if (answer[0] === 0x53) {
          const s = tlsConnect({ socket: raw, ...tlsConnectOptions(tls) });
          s.once("error", (e) => fail(connectError(`TLS with the database server failed (sslmode=${tls.mode}): ${e.message}`)));
          s.once("secureConnect", () => ok(s));
        } else if (tls.mode === "prefer") ok(raw);
        else fail(connectError(`the database server does not support SSL, but --postgres-url asks for sslmode=${tls.mode}`));
      });
    });
  });
}

/** Connects, authenticates (SCRAM-SHA-256, MD5 or cleartext), runs `init`, and returns the pipe. */
export async function openProxy(t: ProxyTarget, init: string[], timeoutMs = 10_000): Promise<ProxyConnection> {
  const started = performance.now();
  const sock = await connectLeg(t, timeoutMs);
  return new Promise((resolve, reject) => {
    const framer = new Framer();
    const parameters: Record<string, string> = {};
    let phase: "auth" | "init" | "ready" = "auth";
    let scram: { nonce: string; clientFirstBare: string; serverSignature?: Buffer } | null = null;
    let key: { pid: number; secret: number } | null = null;
    const timer = setTimeout(() => fail(connectError("timed out connecting to the database server")), Math.max(0, timeoutMs - (performance.now() - started)));
    const fail = (err: Error) => {
      if (phase === "ready") return;
      phase = "ready"; // settled
      clearTimeout(timer);
      sock.destroy();
      reject(err);
    };
    sock.onClose(() => fail(connectError("the database server closed the connection during startup")));
    const onData = (chunk: Buffer) => {
      for (const m of framer.push(chunk)) {
        if (m.type === "E") return fail(serverError(m.body));
        if (m.type === "R") {
          const code = m.body.readInt32BE(0);
          if (code === 0) continue; // AuthenticationOk
          if (code === 3) sock.write(new MessageBuilder().cstring(t.password).build(P));
          else if (code === 5) {
            const salt = m.body.subarray(4, 8);
            const inner = createHash("md5").update(t.password + t.user).digest("hex");
            const outer = createHash("md5").update(Buffer.concat([Buffer.from(inner), salt])).digest("hex");
            sock.write(new MessageBuilder().cstring(`md5${outer}`).build(P));
          } else if (code === 10) {
            const nonce = randomBytes(18).toString("base64");
            const clientFirstBare = `n=*,r=${nonce}`;
            scram = { nonce, clientFirstBare };
            const data = utf8(`n,,${clientFirstBare}`);
            sock.write(new MessageBuilder().cstring("SCRAM-SHA-256").int32(data.length).bytes(data).build(P));
          } else if (code === 11 && scram) {
            const serverFirst = m.body.subarray(4).toString();
            const attrs = Object.fromEntries(serverFirst.split(",").map((kv) => [kv[0], kv.slice(2)]));
            if (!attrs.r?.startsWith(scram.nonce)) return fail(new Error("SCRAM nonce mismatch"));
            const salted = pbkdf2Sync(t.password, Buffer.from(attrs.s!, "base64"), Number(attrs.i), 32, "sha256");
            const clientKey = hmac(salted, "Client Key");
            const storedKey = createHash("sha256").update(clientKey).digest();
            const finalNoProof = `c=biws,r=${attrs.r}`;
            const authMessage = `${scram.clientFirstBare},${serverFirst},${finalNoProof}`;
            const signature = hmac(storedKey, authMessage);
            const proof = Buffer.from(clientKey.map((b, i) => b ^ signature[i]!));
            scram.serverSignature = hmac(hmac(salted, "Server Key"), authMessage);
            sock.write(new MessageBuilder().bytes(utf8(`${finalNoProof},p=${proof.toString("base64")}`)).build(P));
          } else if (code === 12 && scram) {
            const v = m.body.subarray(4).toString().replace(/^v=/, "");
            if (!scram.serverSignature || Buffer.from(v, "base64").compare(scram.serverSignature) !== 0)
              return fail(new Error("the database server failed SCRAM verification"));
          } else return fail(new Error(`unsupported authentication request ${code} from the database server`));
        } else if (m.type === "K") {
          key = { pid: m.body.readInt32BE(0), secret: m.body.readInt32BE(4) };
        } else if (m.type === "S") {
          const [k, v] = m.body.toString("utf8").split("\0");
          parameters[k!] = v!;
        } else if (m.type === "Z") {
          if (phase === "auth" && init.length > 0) {
            phase = "init";
            sock.write(simpleQuery(init.join("; ")));
          } else {
            phase = "ready";
            clearTimeout(timer);
            const leftover = framer.rest();
            let forward: ((d: Buffer) => void) | null = null;
            const pending: Buffer[] = leftover.length ? [leftover] : [];
            sock.reader = (d) => (forward ? forward(d) : pending.push(d));
            resolve({
              parameters,
              serverPid: key?.pid ?? null,
              write: (d) => sock.write(d),
              drained: () => sock.drained(),
              onData: (fn) => {
                forward = fn;
                for (const p of pending.splice(0)) fn(p);
              },
              onClose: (fn) => sock.onClose(fn),
              end: () => sock.end(),
              cancel: () => {
                if (key) sendCancel(t.host, t.port, key.pid, key.secret);
              },
            });
            return;
          }
        }
        // Notices and init's own results are not the client's business.
      }
    };
    sock.reader = onData;
    sock.write(startupMessage(startupParams(t)));
  });
}

/**
 * Gives each NotificationResponse in the server's byte stream the sender's process id as Kiln
 * announced it to its client (BackendKeyData), instead of the server's own: clients compare it with
 * their own key (psycopg, node-postgres). Only message headers are read; chunks pass on as they are,
 * but for a tail that ends inside a header or inside a notification's process id, which waits (at
 * most 8 bytes) for the next chunk. A sender Kiln does not know keeps the server's pid.
 */
export class NotificationPids {
  /** Body bytes of the message in progress still to come in later chunks. */
  private rest = 0;
  private carry: Buffer | null = null;

  constructor(private readonly announced: (serverPid: number) => number | undefined) {}

  /** What of `chunk` (with any held tail in front) to send now; null for nothing yet. */
  pass(chunk: Buffer): Buffer | null {
    if (this.carry) {
      chunk = Buffer.concat([this.carry, chunk]);
      this.carry = null;
    }
    if (this.rest >= chunk.length) {
      this.rest -= chunk.length;
      return chunk;
    }
    let i = this.rest;
    this.rest = 0;
    while (i < chunk.length) {
      const left = chunk.length - i;
      if (left < 5 || (chunk[i] === 0x41 && left < 9)) {
        this.carry = Buffer.from(chunk.subarray(i)); // a copy: the chunk's memory goes to the client
        return i > 0 ? chunk.subarray(0, i) : null;
      }
      if (chunk[i] === 0x41) {
        const pid = this.announced(chunk.readInt32BE(i + 5));
        if (pid !== undefined) chunk.writeInt32BE(pid, i + 5);
      }
      const end = i + 1 + chunk.readInt32BE(i + 1);
      if (end > chunk.length) {
        this.rest = end - chunk.length;
        return chunk;
      }
      i = end;
    }
    return chunk;
  }
}
