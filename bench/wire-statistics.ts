// The JavaScript cost per TPC-B round trip of the production proxy's per-message work without sockets: the
// wire router's statistics (tracked handleRun, the answer tracker) and NotificationPids, on a fake
// pass-through backend, with fresh buffers per chunk as Bun hands them; "copies only" is that floor.
// Run: bun bench/wire-statistics.ts [round trips]   (docs/databases.md, the production wire proxy)
import { DatabaseWireRouter } from "../server/databases/wire-router";
import { DatabaseActivity } from "../server/databases/activity";
import { NotificationPids } from "../server/backends/databases/pg-proxy";
import { MessageBuilder } from "../server/backends/databases/wire/protocol";

const activity = new DatabaseActivity({} as any, () => new Date(), { error() {} });
const rec = { id: "aaaaaaaaaaaaaaaaaaaa", project_id: "p", status: "active", name: "app", client_password: "x" };
let respond: ((d: Uint8Array) => void) | null = null;
let reply: Uint8Array = new Uint8Array(0);
const inner: any = {
  parameters: async () => ({}),
  handle: async () => {},
  handleRun: (run: Uint8Array, s: (d: Uint8Array) => void) => {
    respond = s;
  },
  close: async () => {},
};
const databases: any = { byId: async () => rec, engine: { openWire: async () => inner }, activity };
const router = new DatabaseWireRouter(databases, {} as any, {} as any);
const backend = await router.open("aaaaaaaaaaaaaaaaaaaa", { user: "service_client_aaaaaaaaaaaaaaaaaaaa", database: "app", applicationName: "", params: {}, remoteAddress: "" }, { terminate() {} });
const notes = new NotificationPids(() => undefined);

const texts = ["BEGIN;", "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2;", "SELECT abalance FROM pgbench_accounts WHERE aid = $1;", "UPDATE pgbench_tellers SET tbalance = tbalance + $1 WHERE tid = $2;", "UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2;", "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP);", "END;"];
const parse = (i: number) => new MessageBuilder().cstring(`P0_${i}`).cstring(texts[i]!).int16(0).build(0x50);
const bind = (i: number) => new MessageBuilder().cstring("").cstring(`P0_${i}`).int16(0).int16(2).int32(4).bytes(new TextEncoder().encode("1234")).int32(3).bytes(new TextEncoder().encode("567")).int16(0).build(0x42);
const exec = () => new MessageBuilder().cstring("").int32(0).build(0x45);
const sync = () => new MessageBuilder().build(0x53);
const cat = (xs: Uint8Array[]) => Buffer.concat(xs);
const bindComplete = new MessageBuilder().build(0x32);
const cc = (tag: string) => new MessageBuilder().cstring(tag).build(0x43);
const z = (s: string) => new MessageBuilder().byte(s.charCodeAt(0)).build(0x5a);
const dataRow = new MessageBuilder().int16(1).int32(4).bytes(new TextEncoder().encode("1234")).build(0x44);
const send = (d: Uint8Array) => {};
// prepare once
for (let i = 0; i < 7; i++) {
  backend.handleRun!(cat([parse(i), sync()]), send);
  respond!(cat([new MessageBuilder().build(0x31), z("I")]));
}
const reqs = texts.map((_, i) => cat([bind(i), exec(), sync()]));
const reps = texts.map((t, i) => cat([bindComplete, ...(i === 2 ? [dataRow] : []), cc(i === 2 ? "SELECT 1" : i === 0 ? "BEGIN" : i === 6 ? "COMMIT" : "UPDATE 1"), z(i === 6 ? "I" : "T")]));
const N = Number(process.argv[2] ?? 300000);
for (let round = 0; round < 3; round++) {
  const t0 = performance.now();
  for (let n = 0; n < N; n++) {
    const i = n % 7;
    // fresh buffers as Bun hands them
    const q = Buffer.from(reqs[i]!);
    backend.handleRun!(q, send);
    const r = Buffer.from(reps[i]!);
    const out = notes.pass(r);
    if (out) respond!(out);
  }
  const t1 = performance.now();
  // baseline: just the copies
  for (let n = 0; n < N; n++) {
    const i = n % 7;
    const q = Buffer.from(reqs[i]!);
    const r = Buffer.from(reps[i]!);
    send(q); send(r);
  }
  const t2 = performance.now();
  console.log(`per round trip: pipeline ${((1000 * (t1 - t0)) / N).toFixed(2)} µs, copies only ${((1000 * (t2 - t1)) / N).toFixed(2)} µs`);
}
