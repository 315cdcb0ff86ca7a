import { describe, expect, test } from "vitest";
import { DatabaseActivity } from "../../server/databases/activity";
import { DatabaseWireRouter } from "../../server/databases/wire-router";
import { MessageBuilder } from "../../server/backends/databases/wire/protocol";

// What the wire router counts for top queries and usage from a pass-through session (the production
// proxy's handleRun path): each statement of a pipelined batch gets its own call and rows, an error
// in an extended-protocol batch ends the statements skipped up to the Sync, a simple Query with two
// statements counts once, and however the server's bytes are split into chunks the counts are the same.

const DB = "aaaaaaaaaaaaaaaaaaaa";
const text = (s: string) => new TextEncoder().encode(s);
const parse = (name: string, sql: string) => new MessageBuilder().cstring(name).cstring(sql).int16(0).build(0x50);
const bind = (portal: string, statement: string) => new MessageBuilder().cstring(portal).cstring(statement).int16(0).int16(0).int16(0).build(0x42);
const execute = (portal = "") => new MessageBuilder().cstring(portal).int32(0).build(0x45);
const sync = () => new MessageBuilder().build(0x53);
const query = (sql: string) => new MessageBuilder().cstring(sql).build(0x51);
const parseComplete = () => new MessageBuilder().build(0x31);
const bindComplete = () => new MessageBuilder().build(0x32);
const dataRow = (v: string) => new MessageBuilder().int16(1).int32(text(v).length).bytes(text(v)).build(0x44);
const complete = (tag: string) => new MessageBuilder().cstring(tag).build(0x43);
const error = () => new MessageBuilder().byte(0x53).cstring("ERROR").byte(0x43).cstring("22012").byte(0x4d).cstring("division by zero").byte(0).build(0x45);
const ready = (status = "I") => new MessageBuilder().byte(status.charCodeAt(0)).build(0x5a);
const cat = (...parts: Uint8Array[]) => new Uint8Array(Buffer.concat(parts));

/** A session through the router over a fake pass-through backend; `serve` delivers the server's bytes in the given chunk sizes. */
async function session() {
  const rows: any[] = [];
  const usage: any[] = [];
  const store = {
    transaction: async (fn: (tx: any) => Promise<void>) =>
      fn({ query: async (sql: string, p: unknown[]) => void (sql.includes("database_query_stats") ? rows.push({ query: p[2], calls: p[4], rows: p[8], min: p[6], max: p[7] }) : usage.push({ written: p[2], transfer: p[3] })) }),
  };
  const activity = new DatabaseActivity(store as any, () => new Date(), { error() {} });
  let respond: ((d: Uint8Array) => void) | null = null;
  const inner: any = {
    parameters: async () => ({}),
    handle: async () => {},
    handleRun: (_run: Uint8Array, send: (d: Uint8Array) => void) => void (respond = send),
    close: async () => {},
  };
  const record = { id: DB, project_id: "p", status: "active", name: "app", client_password: "x" };
  const databases: any = { byId: async () => record, engine: { openWire: async () => inner }, activity };
  const router = new DatabaseWireRouter(databases, {} as any, {} as any);
  const backend = await router.open(DB, { user: `service_client_${DB}`, database: "app", applicationName: "", params: {}, remoteAddress: "" }, { terminate() {} });
  const sent: Uint8Array[] = [];
  return {
    send: (run: Uint8Array) => backend.handleRun!(run, (d) => void sent.push(d)),
    serve(bytes: Uint8Array, chunk = bytes.length) {
      for (let at = 0; at < bytes.length; at += chunk) respond!(bytes.subarray(at, at + chunk));
    },
    sent,
    async stats() {
      await backend.close();
      await activity.flush();
      return { rows, usage };
    },
  };
}

describe("wire statistics of a pass-through session", () => {
  for (const chunk of [1, 3, 7, 1000]) {
    test(`pipelined executes each count, an error skips to the Sync, simple queries count once (server chunks of ${chunk} bytes)`, async () => {
      const s = await session();
      // Two prepared statements, then a pipeline: a (2 rows), b (1 row), a (0 rows, an error), b skipped by the error.
      s.send(cat(parse("a", "select x from t  where   y = $1"), parse("b", "select 1"), sync()));
      s.serve(cat(parseComplete(), parseComplete(), ready()), chunk);
      s.send(cat(bind("", "a"), execute(), bind("", "b"), execute(), bind("p", "a"), execute("p"), bind("", "b"), execute(), sync()));
      s.serve(cat(bindComplete(), dataRow("1"), dataRow("2"), complete("SELECT 2"), bindComplete(), dataRow("1"), complete("SELECT 1"), bindComplete(), error(), ready()), chunk);
      // After the Sync the skipped execute is forgotten: the next statement is counted as itself.
      s.send(cat(bind("", "b"), execute(), sync()));
      s.serve(cat(bindComplete(), dataRow("9"), complete("SELECT 1"), ready()), chunk);
      // A simple Query of two statements: one call of its text, the first result's rows.
      s.send(query("select 1; select 2"));
      s.serve(cat(dataRow("1"), complete("SELECT 1"), dataRow("2"), complete("SELECT 1"), ready()), chunk);
      const { rows, usage } = await s.stats();
      const by = Object.fromEntries(rows.map((r) => [r.query, r]));
      expect(by["select x from t where y = $1"]).toMatchObject({ calls: 2, rows: 2 });
      expect(by["select 1"]).toMatchObject({ calls: 2, rows: 2 });
      expect(by["select 1; select 2"]).toMatchObject({ calls: 1, rows: 1 });
      expect(rows).toHaveLength(3);
      // Bytes: every Bind and Query written, every server byte transferred.
      expect(usage.reduce((n, u) => n + u.written, 0)).toBe(5 * bind("", "b").length + 1 + query("select 1; select 2").length);
      expect(usage.reduce((n, u) => n + u.transfer, 0)).toBeGreaterThan(100);
      expect(s.sent.length).toBeGreaterThan(0);
    });
  }
});
