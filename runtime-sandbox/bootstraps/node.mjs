// Kiln's Node.js bootstrap: loads the function once, then serves invocations one at a time.
// Protocol (see runtime-sandbox/worker.ts): one JSON object per line on fd 3, a socketpair shared
// with the pool (or on the unix socket KILN_CHANNEL names, in a container). Everything the function prints is turned into log frames on that same channel,
// so a stray line on stdout can never be mistaken for a response.
//
// argv: <task root> <entry, relative> <handler export name>
// The handler is called as handler(event, context) with
//   context = { functionName, invocationId, region, deadlineMs, getRemainingTimeInMillis() }.
import net from "node:net";
import { Console } from "node:console";
import { Writable } from "node:stream";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [taskRoot, entry, handlerName] = process.argv.slice(2);
// In a container the channel is a unix socket Kiln listens on (KILN_CHANNEL), not an inherited fd.
const channelPath = process.env.KILN_CHANNEL;
const channelToken = process.env.KILN_CHANNEL_TOKEN;
delete process.env.KILN_CHANNEL;
delete process.env.KILN_CHANNEL_TOKEN;
const channel = channelPath ? net.createConnection(channelPath) : new net.Socket({ fd: 3, readable: true, writable: true });
// The first line on a container's channel proves it is this worker's bootstrap.
if (channelPath) channel.write(JSON.stringify({ t: "hello", token: channelToken }) + "\n");

function send(frame) {
  channel.write(JSON.stringify(frame) + "\n");
}

function log(level, message) {
  send({ t: "log", l: level, m: message, ts: Date.now() });
}

// --- output capture ---------------------------------------------------------------------------

/** A stream for Console: one log line per console call (Writable calls write() synchronously). */
const sink = (level) =>
  new Writable({
    decodeStrings: false,
    write(chunk, _enc, cb) {
      log(level, String(chunk).replace(/\n$/, ""));
      cb();
    },
  });
const infoConsole = new Console({ stdout: sink("info"), stderr: sink("error") });
const warnConsole = new Console({ stdout: sink("warn"), stderr: sink("warn") });
for (const k of Object.keys(Console.prototype)) {
  if (typeof infoConsole[k] === "function") console[k] = infoConsole[k].bind(infoConsole);
}
console.warn = warnConsole.warn.bind(warnConsole);

/** process.stdout/stderr.write: line-buffered, so partial writes join into one line. */
const partial = { info: "", error: "" };
function captureWrites(stream, level) {
  stream.write = (chunk, encoding, cb) => {
    partial[level] += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString(typeof encoding === "string" ? encoding : "utf8");
    let nl;
    while ((nl = partial[level].indexOf("\n")) >= 0) {
      log(level, partial[level].slice(0, nl));
      partial[level] = partial[level].slice(nl + 1);
    }
    const done = typeof encoding === "function" ? encoding : cb;
    if (done) process.nextTick(done);
    return true;
  };
}
captureWrites(process.stdout, "info");
captureWrites(process.stderr, "error");

function flushPartial() {
  for (const level of ["info", "error"]) {
    if (partial[level]) log(level, partial[level]);
    partial[level] = "";
  }
}

// --- loading ------------------------------------------------------------------------------------

function describe(e) {
  if (e instanceof Error) return { error: e.message, type: e.name || e.constructor?.name || "Error", stack: e.stack };
  return { error: String(e), type: typeof e, stack: undefined };
}

let handler;
try {
  // import() handles both module kinds: CommonJS (exports.handler) and ESM (.mjs, or .js under "type":"module").
  const mod = await import(pathToFileURL(resolve(taskRoot, entry)).href);
  handler = mod[handlerName];
  // module.exports = { handler } is not always seen as a named export; it is always the default.
  if (handler === undefined && mod.default && typeof mod.default === "object") handler = mod.default[handlerName];
  if (typeof handler !== "function") {
    const found = Object.keys(mod).filter((k) => k !== "default" && k !== "module.exports");
    throw Object.assign(new Error(`${entry} does not export a function named "${handlerName}"${found.length ? ` (it exports: ${found.join(", ")})` : ""}`), { name: "HandlerNotFound" });
  }
} catch (e) {
  const d = describe(e);
  flushPartial();
  if (d.stack) log("error", d.stack);
  send({ t: "init_error", error: d.error, type: d.type });
  channel.end(() => process.exit(1));
}

// --- durable executions ---------------------------------------------------------------------------
// A durable handler is called as handler(event, step, context). Each step call takes the next
// position; a position the journal settles is answered from it (a completed step's output, a failed
// step's error) without running anything; a new one runs, is reported, and resolves only once Kiln
// has written it down (or tells the invocation to end: a sleep, a retry later, a stop).

/** Ack waiters of the invocation in progress, by step position. */
const acks = new Map();
const SUSPENDED = Symbol("suspended");

function stepError(e) {
  return Object.assign(new Error(e.message), { name: e.type || "Error" });
}

function durableStep(msg) {
  const journal = new Map(msg.durable.journal.map((e) => [e.seq, e]));
  let next = 0;
  let dead = false;
  let suspend;
  const suspended = new Promise((r) => (suspend = r));
  const ask = (frame) =>
    new Promise((resolve) => {
      if (dead) return; // the invocation has ended: this step never settles
      acks.set(frame.seq, resolve);
      send({ t: "step", id: msg.id, ...frame });
    }).then((ack) => {
      if (ack.action === "suspend") {
        dead = true;
        suspend();
        return new Promise(() => {});
      }
      return ack;
    });
  const position = async (name, op) => {
    if (typeof name !== "string" || !name) throw new TypeError(`step.${op === "run" ? "run" : "sleep"}: the first argument must be the step's name (a non-empty string)`);
    const seq = next++;
    const e = journal.get(seq);
    if (e && (e.name !== name || e.op !== op)) {
      await ask({ seq, name, op: "mismatch", error: `non-deterministic replay: step ${seq + 1} was ${e.op} "${e.name}" when the execution first ran, and is now ${op} "${name}"` });
    }
    return { seq, entry: e };
  };
  const step = {
    async run(name, fn, opts = {}) {
      const { seq, entry } = await position(name, "run");
      if (entry?.status === "completed") return entry.output;
      if (entry?.status === "failed") throw stepError(entry.error);
      if (typeof fn !== "function") throw new TypeError(`step.run("${name}"): the second argument must be a function`);
      const t = performance.now();
      let frame;
      try {
        const out = await fn();
        // What replays will return: the JSON of the value, so the first run sees the same.
        const json = JSON.stringify(out === undefined ? null : out);
        if (json === undefined) throw new TypeError(`step "${name}" returned a value that is not JSON`);
        frame = { status: "completed", output: JSON.parse(json) };
      } catch (err) {
        const d = describe(err);
        frame = { status: "failed", error: { message: d.error, type: d.type } };
        if (d.stack) log("error", d.stack);
      }
      const ack = await ask({ seq, name, op: "run", ...frame, ms: performance.now() - t, ...(opts?.retries !== undefined ? { retries: opts.retries } : {}) });
      if (ack.action === "throw") throw stepError(ack.error);
      if (frame.status === "failed") throw stepError(frame.error);
      return frame.output;
    },
    async sleep(name, duration) {
      const { seq, entry } = await position(name, "sleep");
      if (entry) return;
      const ack = await ask({ seq, name, op: "sleep", duration });
      if (ack.action === "throw") throw stepError(ack.error);
    },
    async sleepUntil(name, instant) {
      const { seq, entry } = await position(name, "sleep");
      if (entry) return;
      const until = instant instanceof Date ? instant.toISOString() : instant;
      const ack = await ask({ seq, name, op: "sleep", until });
      if (ack.action === "throw") throw stepError(ack.error);
    },
  };
  return { step, suspended: suspended.then(() => SUSPENDED), end: () => (dead = true) };
}

// --- serving --------------------------------------------------------------------------------------

async function invoke(msg) {
  const c = msg.context;
  const context = { ...c, getRemainingTimeInMillis: () => Math.max(0, c.deadlineMs - Date.now()) };
  let frame;
  const durable = msg.durable ? durableStep(msg) : null;
  try {
    const value = durable ? await Promise.race([handler(msg.event, durable.step, context), durable.suspended]) : await handler(msg.event, context);
    durable?.end();
    acks.clear();
    frame = JSON.stringify({ t: "result", id: msg.id, value: value === undefined || value === SUSPENDED ? null : value });
  } catch (e) {
    durable?.end();
    acks.clear();
    const d = describe(e);
    if (d.stack) log("error", d.stack);
    // Under RLIMIT_DATA (no memory cgroup) a Buffer that does not fit is a RangeError; left
    // uncaught by the handler it is the memory limit, as Python's MemoryError is.
    if (e instanceof RangeError && /Array buffer allocation failed/.test(e.message)) {
      flushPartial();
      send({ t: "fatal", kind: "out_of_memory", error: d.error });
      channel.end(() => process.exit(1));
      return;
    }
    frame = JSON.stringify({ t: "error", id: msg.id, error: d.error, type: d.type });
  }
  flushPartial();
  channel.write(frame + "\n");
}

if (handler) {
  let inbox = "";
  let queue = Promise.resolve();
  channel.setEncoding("utf8");
  channel.on("data", (d) => {
    inbox += d;
    let nl;
    while ((nl = inbox.indexOf("\n")) >= 0) {
      const line = inbox.slice(0, nl);
      inbox = inbox.slice(nl + 1);
      const msg = JSON.parse(line);
      if (msg.t === "invoke") queue = queue.then(() => invoke(msg));
      else if (msg.t === "step_ack") {
        const resolve = acks.get(msg.seq);
        acks.delete(msg.seq);
        resolve?.(msg);
      }
    }
  });
  // The pool went away (Kiln stopped or crashed): nothing left to serve.
  channel.on("end", () => process.exit(0));
  channel.on("error", () => process.exit(0));
  send({ t: "ready" });
}
