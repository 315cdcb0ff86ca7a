// The MD5 thread (see md5-thread.ts): hashes ranges of shared buffers in the order they come, one
// running hash per upload, and answers each message once its range is hashed.
import { createHash, type Hash } from "node:crypto";
import type { Md5Reply, Md5Request } from "./md5-thread";

declare const self: Worker;

const hashes = new Map<number, Hash>();

self.onmessage = (e: MessageEvent<Md5Request>) => {
  const m = e.data;
  let reply: Md5Reply;
  if (m.op === "update") {
    let h = hashes.get(m.hash);
    if (!h) hashes.set(m.hash, (h = createHash("md5")));
    h.update(new Uint8Array(m.buffer, m.offset, m.length));
    reply = { seq: m.seq };
  } else if (m.op === "digest") {
    const h = hashes.get(m.hash) ?? createHash("md5");
    hashes.delete(m.hash);
    reply = { seq: m.seq, hex: h.digest("hex") };
  } else {
    hashes.delete(m.hash);
    return;
  }
  postMessage(reply);
};
