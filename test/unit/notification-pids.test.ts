import { describe, expect, test } from "vitest";
import { NotificationPids } from "../../server/backends/databases/pg-proxy";
import { MessageBuilder } from "../../server/backends/databases/wire/protocol";

// The production proxy's rewrite of NotificationResponse process ids in the server's byte stream,
// whatever the chunking: every split of a stream of mixed messages gives the same bytes out.

const notification = (pid: number, channel: string, payload: string) => Buffer.from(new MessageBuilder().int32(pid).cstring(channel).cstring(payload).build(0x41));
const dataRow = (text: string) => Buffer.from(new MessageBuilder().int16(1).int32(Buffer.byteLength(text)).bytes(Buffer.from(text)).build(0x44));
const ready = () => Buffer.from(new MessageBuilder().byte(0x49).build(0x5a));

const stream = Buffer.concat([dataRow("x".repeat(40)), notification(4242, "chan", "one"), ready(), notification(777, "chan", "two"), notification(4242, "c", "")]);
const expected = Buffer.concat([dataRow("x".repeat(40)), notification(7, "chan", "one"), ready(), notification(777, "chan", "two"), notification(7, "c", "")]);
const announced = (pid: number) => (pid === 4242 ? 7 : undefined);

function through(chunks: Buffer[]): Buffer {
  const p = new NotificationPids(announced);
  const out: Buffer[] = [];
  for (const c of chunks) {
    const o = p.pass(Buffer.from(c)); // a copy: pass may rewrite in place
    if (o) out.push(Buffer.from(o));
  }
  return Buffer.concat(out);
}

describe("NotificationPids", () => {
  test("one chunk: the known sender's pid is rewritten, an unknown one kept, other messages untouched", () => {
    expect(through([stream]).equals(expected)).toBe(true);
  });

  test("every split into two chunks, and byte by byte, gives the same bytes", () => {
    for (let at = 0; at <= stream.length; at++) expect(through([stream.subarray(0, at), stream.subarray(at)]).toString("hex")).toBe(expected.toString("hex"));
    expect(through([...stream].map((b) => Buffer.from([b]))).equals(expected)).toBe(true);
  });

  test("a tail inside a notification's header waits for the rest; nothing is lost or sent twice", () => {
    const p = new NotificationPids(announced);
    const n = notification(4242, "chan", "one");
    expect(p.pass(Buffer.from(n.subarray(0, 7)))).toBeNull();
    expect(p.pass(Buffer.from(n.subarray(7)))!.equals(notification(7, "chan", "one"))).toBe(true);
  });
});
