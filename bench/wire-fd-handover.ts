// Spike (issue 26 item 7, session 18): can Kiln's main thread accept a plaintext connection, read its
// startup packet, then hand the connection itself to a worker (the database thread), so that a round
// trip is client -> worker -> client (PostgreSQL's two wake-ups) instead of client -> main -> worker ->
// main -> client? And what is such a round trip worth? Not product code.
//
// Run: bun bench/wire-fd-handover.ts            (ROUNDS=20000 CONNECTIONS=1000 FLOOD=2000 HANDOVER=terminate|pause)
//
// A toy protocol: a startup packet, then length-prefixed messages that the server echoes with the
// first payload byte replaced by who answered ('M' main thread, 'W' worker), so the client can tell
// that after the hand-over only the worker answers. Three servers, each in this process:
//   main     the main thread echoes (no thread at all: the floor);
//   relay    the main thread reads, passes each message to a worker through shared memory exactly as
//            Kiln's PgliteThread does (Atomics.notify, worker's Atomics.waitAsync, back the same way),
//            and writes the answer (Kiln's path today: three wake-ups per round trip);
//   handover the main thread reads the startup packet, dup()s the descriptor (bun:ffi, libc), lets
//            go of its own socket, and posts the dup and any bytes read past the startup packet to the
//            worker, which adopts it with `Bun.connect({ fd })` and serves it to the end.
// The client is a separate process (like pgbench). Checks: (a) a client that sends its startup
// packet and FLOOD messages in one write gets every echo, in order, all from the worker; (b) the
// worker's end() reaches the client as a clean end of stream (no reset); (c) CONNECTIONS connections
// handed over and ended leave the server's descriptor count where it was; (d) a connection outlives
// its worker (Kiln restarts the database thread to cancel a statement) when the main thread keeps a
// dup of it: 200 workers adopt it in turn and are terminated.
//
// What it showed (Bun 1.4.5, this 2-core VM, load average 2.2-6.5, four runs):
// - Works, with HANDOVER=terminate: `fd = dup(socket.fd)` (Bun's TCP socket has an `fd` getter),
//   `socket.terminate()` (SO_LINGER {1, 0} + close(2): Bun takes the socket out of the main thread's
//   epoll and closes its descriptor; the dup keeps the connection, so no reset is sent), then
//   `setsockopt(fd, SOL_SOCKET, SO_LINGER, {0, 0})` to undo the linger (else the worker's close
//   resets), `worker.postMessage({ fd, rest })`, and `Bun.connect({ fd, socket })` in the worker.
//   (a) 2000/2000 answers, all from the worker, in order; (b) the client sees a clean end;
//   (c) 1,000 connections: 1,000 clean ends, descriptors 13 before and after; (d) 200 workers
//   adopted `dup(kept)` in turn and were terminated: the client stayed connected, descriptors
//   unchanged (terminate() closes the worker's descriptor), a clean end once the kept dup closed.
// - Does not work well: HANDOVER=pause (main keeps its socket paused with `socket.pause()` until the
//   worker reports its close): fine for 30 connections, hung at one of 300 (not looked into).
//   The worker's end() sends no FIN while another descriptor refers to the connection: whoever holds
//   the last one must close it (or the worker calls `shutdown()` first).
//   node:net in the worker: `net.connect({ fd })` works; `new net.Socket({ fd })` gets no data.
// - Round trip, 1 client, 20,000 sequential round trips, server = this process's CPU (all threads):
//     main thread echoes:          61-79 µs wall, 27-41 µs server CPU
//     relayed through a worker:   106-178 µs wall, 70-95 µs server CPU   (Kiln's hand-over today)
//     handed over to the worker:   61-85 µs wall (one 130), 26-42 µs server CPU   (as cheap as no thread)
//   So the hand-over costs ~45-60 µs of CPU and ~40-100 µs of wall time per round trip, and a
//   worker-owned connection removes all of it. bench/wire-thread-ceiling.ts measures what that is
//   worth on Kiln's real wire path (listener + mux + PGlite).
import type { FdSocketOptions, Socket } from "bun";
import { dlopen, FFIType } from "bun:ffi";
import { readdirSync } from "node:fs";
import { loadavg } from "node:os";

const ROUNDS = Number(process.env.ROUNDS ?? 20000);
const CONNECTIONS = Number(process.env.CONNECTIONS ?? 1000);
const FLOOD = Number(process.env.FLOOD ?? 2000);
const HANDOVER = process.env.HANDOVER ?? "terminate"; // how the main thread lets go: terminate | pause

const libc = dlopen("libc.so.6", {
  dup: { args: [FFIType.i32], returns: FFIType.i32 },
  close: { args: [FFIType.i32], returns: FFIType.i32 },
  setsockopt: { args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
});
/** `Bun.connect({ fd })`: works at runtime; bun-types declares `FdSocketOptions` but no overload takes it. */
const connectFd = Bun.connect as unknown as <D = undefined>(options: FdSocketOptions<D>) => Promise<Socket<D>>;
declare const self: Worker;
const SOL_SOCKET = 1;
const SO_LINGER = 13;

/** Splits length-prefixed frames (int32 length, itself included) out of a byte stream. */
class Frames {
  private buf = new Uint8Array(0);
  push(chunk: Uint8Array): Uint8Array[] {
    const b = this.buf.length ? concat(this.buf, chunk) : chunk;
    const out: Uint8Array[] = [];
    let at = 0;
    while (b.length - at >= 4) {
      const len = new DataView(b.buffer, b.byteOffset + at).getInt32(0);
      if (b.length - at < len) break;
      out.push(b.subarray(at, at + len));
      at += len;
    }
    this.buf = Uint8Array.prototype.slice.call(b, at); // a copy (a Buffer's slice() is a view of memory Bun reuses)
    return out;
  }
  rest(): Uint8Array {
    return this.buf;
  }
}
function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const c = new Uint8Array(a.length + b.length);
  c.set(a);
  c.set(b, a.length);
  return c;
}
function frame(payload: string): Uint8Array {
  const p = new TextEncoder().encode(payload);
  const f = new Uint8Array(4 + p.length);
  new DataView(f.buffer).setInt32(0, f.length);
  f.set(p, 4);
  return f;
}
function answer(msg: Uint8Array, who: "M" | "W"): Uint8Array {
  const a = Uint8Array.from(msg); // a copy (a Buffer's slice() is a view)
  a[4] = who.charCodeAt(0);
  return a;
}
const isBye = (m: Uint8Array) => m.length === 7 && m[4] === 98 /* b */ && m[5] === 121 && m[6] === 101;

// ---------------------------------------------------------------- the worker (the "database thread")
if (!Bun.isMainThread) {
  self.onmessage = async (e: MessageEvent) => {
    const m = e.data;
    if (m.op === "channel") return void serveChannel(m.channel);
    if (m.op === "adopt") return void adopt(m.fd, m.rest);
    if (m.op === "adopt-tagged") {
      // (d): answer "<tag>:<message>", so the client can tell which worker answered.
      await connectFd({ fd: m.fd, socket: { data: (s, d) => void s.write(`${m.tag}:${d}`) } });
      self.postMessage({ op: "adopted" });
    }
  };
  // relay: the same channel shape as Kiln's pglite-thread (request counter, answered counter).
  async function serveChannel(channel: SharedArrayBuffer) {
    const slots = new Int32Array(channel, 0, 4);
    const area = new Uint8Array(channel, 16);
    let seen = 0;
    for (;;) {
      const w = Atomics.waitAsync(slots, 0, seen);
      if (w.async) await w.value;
      if (Atomics.load(slots, 0) === seen) continue;
      seen = Atomics.load(slots, 0);
      const msg = area.slice(0, slots[2]);
      area.set(answer(msg, "W"));
      slots[3] = msg.length;
      Atomics.store(slots, 1, seen);
      Atomics.notify(slots, 1);
    }
  }
  // handover: the worker owns the connection from here on.
  async function adopt(fd: number, rest: Uint8Array) {
    const frames = new Frames();
    const serve = (s: { write(b: Uint8Array): number; end(): void }, chunk: Uint8Array) => {
      for (const msg of frames.push(chunk)) {
        s.write(answer(msg, "W"));
        if (isBye(msg)) {
          s.end();
          return;
        }
      }
    };
    const sock = await connectFd({
      fd,
      socket: {
        data: (s, chunk) => serve(s, chunk),
        close: () => self.postMessage({ op: "closed", fd }),
        error: () => {},
      },
    });
    if (rest.length) serve(sock, rest);
  }
} else {
  await main();
}

// ---------------------------------------------------------------- the main thread
async function main() {
  const worker = new Worker(import.meta.path);
  const channel = new SharedArrayBuffer(16 + 64 * 1024);
  worker.postMessage({ op: "channel", channel });
  const slots = new Int32Array(channel, 0, 4);
  const area = new Uint8Array(channel, 16);
  let seq = 0;
  const relayCall = (msg: Uint8Array): Promise<Uint8Array> => {
    area.set(msg);
    slots[2] = msg.length;
    const mine = ++seq;
    Atomics.store(slots, 0, mine);
    Atomics.notify(slots, 0);
    return new Promise((resolve) => {
      const check = () => {
        if (Atomics.load(slots, 1) !== mine) {
          const w = Atomics.waitAsync(slots, 1, mine - 1);
          if (w.async) void w.value.then(check);
          else check();
          return;
        }
        resolve(area.slice(0, slots[3]));
      };
      check();
    });
  };
  const pausedUntilWorkerDone = new Map<number, { end(): void }>(); // HANDOVER=pause: dup -> main socket
  worker.onmessage = (e: MessageEvent) => {
    if (e.data.op === "closed") pausedUntilWorkerDone.get(e.data.fd)?.end(), pausedUntilWorkerDone.delete(e.data.fd);
  };

  type Data = { frames: Frames; started: boolean; chain: Promise<void> };
  const listen = (mode: "main" | "relay" | "handover") =>
    Bun.listen<Data>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open(s) {
          s.data = { frames: new Frames(), started: false, chain: Promise.resolve() };
          s.setNoDelay(true);
        },
        data(s, chunk) {
          const msgs = s.data.frames.push(chunk);
          for (let i = 0; i < msgs.length; i++) {
            const msg = msgs[i]!;
            if (!s.data.started) {
              s.data.started = true; // the startup packet
              if (mode === "handover") return handOver(s, msgs.slice(i + 1), s.data.frames.rest());
              continue;
            }
            if (mode === "main") {
              s.write(answer(msg, "M"));
              if (isBye(msg)) s.end();
            } else {
              s.data.chain = s.data.chain.then(async () => {
                s.write(await relayCall(msg));
                if (isBye(msg)) s.end();
              });
            }
          }
        },
        error() {},
      },
    });
  function handOver(s: import("bun").Socket<Data>, whole: Uint8Array[], partial: Uint8Array) {
    const fd = libc.symbols.dup((s as unknown as { fd: number }).fd);
    if (fd < 0) throw new Error("dup failed");
    let rest = partial;
    for (let i = whole.length - 1; i >= 0; i--) rest = concat(whole[i]!, rest);
    if (HANDOVER === "pause") {
      // Keep the main socket, paused (it must not read), and close it after the worker's end.
      s.pause();
      pausedUntilWorkerDone.set(fd, s);
    } else {
      // terminate() = SO_LINGER {1, 0} + close(2): the dup keeps the connection open, so no reset
      // now, but the option stays on the socket: put it back before the worker's close would reset.
      s.terminate();
      const off = new Int32Array(2);
      libc.symbols.setsockopt(fd, SOL_SOCKET, SO_LINGER, off, 8);
    }
    worker.postMessage({ op: "adopt", fd, rest });
  }

  const fds = () => readdirSync("/proc/self/fd").length;
  const report: string[] = [`load ${loadavg().map((l) => l.toFixed(2)).join(" ")}, handover=${HANDOVER}`];
  const client = async (port: number, what: string, n: number) => {
    const p = Bun.spawn([process.execPath, import.meta.path.replace(/wire-fd-handover\.ts$/, "wire-fd-handover-client.ts"), String(port), what, String(n)], { stdout: "pipe", stderr: "inherit" });
    const cpu0 = process.cpuUsage(); // this process, all its threads: the server's CPU
    const out = await new Response(p.stdout).text();
    await p.exited;
    const cpu = process.cpuUsage(cpu0);
    const server = what === "rtt" ? `; server CPU ${((cpu.user + cpu.system) / n).toFixed(1)} µs each` : "";
    console.error(out.trim() + server);
    return out.trim() + server;
  };

  const servers = { main: listen("main"), relay: listen("relay"), handover: listen("handover") };
  // (a) flooding client, (b) clean close.
  report.push(`flood handover: ${await client(servers.handover.port, "flood", FLOOD)}`);
  // (c) descriptors after many connections.
  const before = fds();
  report.push(`connections handover: ${await client(servers.handover.port, "many", CONNECTIONS)}`);
  await Bun.sleep(200);
  report.push(`descriptors before/after ${CONNECTIONS} connections: ${before}/${fds()}`);
  report.push(`restarts: ${await restartCheck()}`);
  // Round trips, alternating, 3 rounds.
  for (let r = 0; r < 3; r++)
    for (const mode of ["main", "relay", "handover"] as const) report.push(`rtt ${mode}: ${await client(servers[mode].port, "rtt", ROUNDS)}`);
  report.push(`load ${loadavg().map((l) => l.toFixed(2)).join(" ")}`);
  console.log(report.join("\n"));

  /**
   * (d) A connection that outlives its worker (Kiln restarts a database thread to cancel a
   * statement): the main thread keeps a dup of the descriptor, polled by no one; each worker adopts a
   * dup of that; worker.terminate() closes the worker's descriptor and the connection stays up.
   */
  async function restartCheck(): Promise<string> {
    let kept = -1;
    const srv = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        data(s) {
          kept = libc.symbols.dup((s as unknown as { fd: number }).fd);
          s.terminate();
          libc.symbols.setsockopt(kept, SOL_SOCKET, SO_LINGER, new Int32Array(2), 8);
        },
      },
    });
    const { connect } = await import("node:net");
    const c = connect(srv.port, "127.0.0.1");
    let got = "";
    let ended = "";
    c.on("data", (d) => (got = String(d)));
    c.on("end", () => (ended ||= "end"));
    c.on("error", (e: NodeJS.ErrnoException) => (ended ||= e.code ?? "error"));
    await new Promise((r) => c.on("connect", r));
    c.write("startup");
    while (kept < 0) await Bun.sleep(1);
    const before = fds();
    let cycles = 0;
    for (; cycles < 200 && !ended; cycles++) {
      const w = new Worker(import.meta.path);
      const adopted = new Promise((r) => (w.onmessage = (e) => e.data.op === "adopted" && r(null)));
      w.postMessage({ op: "adopt-tagged", fd: libc.symbols.dup(kept), tag: `w${cycles}` });
      await adopted;
      c.write(`ping${cycles}`);
      const t0 = Date.now();
      while (got !== `w${cycles}:ping${cycles}` && Date.now() - t0 < 3000) await Bun.sleep(1);
      if (got !== `w${cycles}:ping${cycles}`) return `no answer from worker ${cycles} (got ${JSON.stringify(got)})`;
      w.terminate();
    }
    await Bun.sleep(200);
    const after = fds();
    const alive = ended || "still connected";
    libc.symbols.close(kept);
    await Bun.sleep(100);
    srv.stop(true);
    c.destroy();
    return `${cycles} workers adopted it in turn and were terminated; client ${alive}; descriptors ${before}/${after}; after closing the kept dup the client saw: ${ended || "nothing yet"}`;
  }
  for (const s of Object.values(servers)) s.stop(true);
  worker.terminate();
  process.exit(0);
}
