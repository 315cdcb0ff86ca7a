// The client process of bench/wire-fd-handover.ts (see there): bun bench/wire-fd-handover-client.ts <port> flood|many|rtt <n>
import * as net from "node:net";

const [portArg, what, nArg] = process.argv.slice(2);
const port = Number(portArg);
const n = Number(nArg);

function frame(payload: string): Buffer {
  const p = Buffer.from(payload);
  const f = Buffer.alloc(4 + p.length);
  f.writeInt32BE(f.length, 0);
  p.copy(f, 4);
  return f;
}

/** One connection: sends `first` at once, then calls `next` with each echoed message. */
function session(first: Buffer[], next: (msg: Buffer, send: (b: Buffer) => void) => void): Promise<{ ended: "clean" | string }> {
  return new Promise((resolve) => {
    const c = net.connect(port, "127.0.0.1");
    c.setNoDelay(true);
    let buf: Buffer = Buffer.alloc(0);
    let result: string | null = null;
    c.on("connect", () => c.write(Buffer.concat(first)));
    c.on("data", (chunk: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      while (buf.length >= 4 && buf.length >= buf.readInt32BE(0)) {
        const len = buf.readInt32BE(0);
        const msg = buf.subarray(0, len);
        buf = buf.subarray(len);
        if (msg.length === 7 && msg.toString("utf8", 5) === "ye") continue; // bye's echo: the server ends now
        next(msg, (b) => c.write(b));
      }
    });
    c.on("end", () => (result ??= "clean"));
    c.on("error", (e) => (result = `error ${(e as NodeJS.ErrnoException).code}`));
    c.on("close", () => resolve({ ended: result ?? "closed without end" }));
  });
}

const startup = frame("startup");
if (what === "flood") {
  // Startup and n messages in one write: every echo must come back, in order, from the worker.
  const msgs = Array.from({ length: n }, (_, i) => frame(`x${i}`));
  let got = 0;
  const by: Record<string, number> = {};
  let order = true;
  const r = await session([startup, ...msgs, frame("bye")], (m) => {
    const who = String.fromCharCode(m[4]!);
    by[who] = (by[who] ?? 0) + 1;
    if (m.toString("utf8", 5) !== String(got)) order = false;
    got++;
  });
  console.log(`${got}/${n} answers, by ${JSON.stringify(by)}, in order: ${order}, end: ${r.ended}`);
} else if (what === "many") {
  // n connections, 8 at a time, each 5 round trips then bye.
  let clean = 0;
  const other: Record<string, number> = {};
  let next = 0;
  const one = async () => {
    while (next < n) {
      next++;
      let left = 5;
      const r = await session([startup, frame("x")], (_m, send) => send(left-- > 0 ? frame("x") : frame("bye")));
      if (r.ended === "clean") clean++;
      else other[r.ended] = (other[r.ended] ?? 0) + 1;
    }
  };
  await Promise.all(Array.from({ length: 8 }, one));
  console.log(`${n} connections: ${clean} ended clean, others ${JSON.stringify(other)}`);
} else {
  // n round trips one after another.
  const msg = frame("x-------------------------------");
  let left = n;
  let t0 = 0;
  let who = "";
  const cpu0 = process.cpuUsage();
  await session([startup, msg], (m, send) => {
    if (left === n) t0 = performance.now();
    who = String.fromCharCode(m[4]!);
    if (--left > 0) send(msg);
    else send(frame("bye"));
  });
  const us = ((performance.now() - t0) * 1000) / (n - 1);
  const cpu = process.cpuUsage(cpu0);
  console.log(`${us.toFixed(1)} µs per round trip (answered by ${who}; client CPU ${((cpu.user + cpu.system) / n).toFixed(1)} µs each)`);
}
