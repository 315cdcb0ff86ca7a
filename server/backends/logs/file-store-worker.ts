/// <reference lib="webworker" />
// The body of the embedded log store's thread: a FileLogStore driven by messages from
// `FileLogStoreThread`. Cutting lines into segments, their keys and bloom filters, file writes and
// searches run here, off Kiln's main thread.
import { FileLogStore } from "./file-store";
import type { FileStoreReply, FileStoreRequest } from "./file-store-thread";
import type { LineQuery, StoredLine } from "./log-store";

declare const self: Worker;

let store: FileLogStore | null = null;

async function run(m: FileStoreRequest): Promise<unknown> {
  if (m.op === "open") {
    store = new FileLogStore(m.args[0] as string);
    store.open();
    return null;
  }
  const s = store;
  if (!s) throw new Error("the log store is not open");
  switch (m.op) {
    case "append":
      return [...(await s.append(JSON.parse(m.args[0] as string) as StoredLine[]))];
    case "search":
      return s.search(m.args[0] as LineQuery);
    case "buildSummaries":
      return [...(await s.buildSummaries(m.args[0] as string[]))];
    case "removeProject":
      return s.removeProject(m.args[0] as string);
    case "removeOlderThan":
      return s.removeOlderThan(m.args[0] as number);
    case "importPosition":
      return s.importPosition(m.args[0] as string);
    case "importBatch":
      return s.importBatch(m.args[0] as string, JSON.parse(m.args[1] as string) as StoredLine[], m.args[2] as string);
    case "close":
      await s.close();
      store = null;
      return null;
  }
}

// One call at a time, in order.
let chain: Promise<void> = Promise.resolve();
self.onmessage = (e: MessageEvent<FileStoreRequest>) => {
  const m = e.data;
  chain = chain.then(async () => {
    let r: FileStoreReply;
    try {
      r = { id: m.id, ok: true, value: await run(m) };
    } catch (err) {
      const x = err as { message?: string; code?: string };
      r = { id: m.id, ok: false, message: x?.message ?? String(err), code: typeof x?.code === "string" ? x.code : undefined };
    }
    self.postMessage(r);
  });
};
