// One test body for every BlobStore: the filesystem backend and the S3 backend (against Ceph's
// radosgw started on loopback by test/support/s3-server.ts, or the S3 endpoint in
// KILN_TEST_S3_ENDPOINT=http://ACCESS:SECRET@host:port), plus what only S3 has (multipart aborts,
// server-side or streamed assembly, key prefixes).
import { createHash, randomBytes, randomFillSync } from "node:crypto";
import { mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { Client } from "minio";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BlobTooLarge, type BlobStore, BufferPool } from "../../server/backends/blobs/blob-store";
import { FilesystemBlobStore } from "../../server/backends/blobs/filesystem";
import { S3BlobStore, type S3BlobStoreOptions } from "../../server/backends/blobs/s3";
import { startS3Server, type S3Server } from "../support/s3-server";

const MiB = 1024 * 1024;

type S3Target = Pick<S3Server, "endPoint" | "accessKey" | "secretKey" | "region">;
let server: S3Server | undefined;
let target: Promise<S3Target> | undefined;
/** One S3 server for the file, started by the first S3 suite that needs it. */
function s3Target(): Promise<S3Target> {
  const external = process.env.KILN_TEST_S3_ENDPOINT;
  if (external) {
    const u = new URL(external);
    return Promise.resolve({ endPoint: `${u.protocol}//${u.host}`, accessKey: decodeURIComponent(u.username), secretKey: decodeURIComponent(u.password), region: "us-east-1" });
  }
  target ??= startS3Server().then((s) => (server = s));
  return target;
}
afterAll(async () => {
  await server?.stop();
}, 30_000);

async function s3Store(opts: Partial<S3BlobStoreOptions> = {}): Promise<S3BlobStore> {
  const t = await s3Target();
  const bucket = opts.bucket ?? `kiln-test-${randomBytes(4).toString("hex")}`;
  const store = new S3BlobStore({ endPoint: t.endPoint, accessKey: t.accessKey, secretKey: t.secretKey, region: t.region, bucket, prefix: "kiln", ...opts });
  await store.init();
  return store;
}
/** A plain client to look at the bucket behind a store's back. */
async function rawClient(): Promise<Client> {
  const t = await s3Target();
  const u = new URL(t.endPoint);
  return new Client({ endPoint: u.hostname, port: Number(u.port), useSSL: u.protocol === "https:", accessKey: t.accessKey, secretKey: t.secretKey, region: t.region, pathStyle: true });
}

interface Backend {
  name: string;
  make(): Promise<{ store: BlobStore; cleanup(): Promise<void> }>;
  /** Runs the 160 MiB streaming test. */
  big: boolean;
}
const backends: Backend[] = [
  {
    name: "filesystem",
    big: true,
    make: async () => {
      const dir = mkdtempSync(join(tmpdir(), "kiln-blobs-"));
      const store = new FilesystemBlobStore(dir);
      return { store, cleanup: async () => rmSync(dir, { recursive: true, force: true }) };
    },
  },
  {
    name: "s3",
    big: true,
    make: async () => {
      const store = await s3Store();
      return { store, cleanup: () => store.close() };
    },
  },
  {
    // The path a server without UploadPartCopy takes: copy and assemble stream the bytes through.
    name: "s3 (streamed copies)",
    big: false,
    make: async () => {
      const store = await s3Store({ serverSideCopy: false });
      return { store, cleanup: () => store.close() };
    },
  },
];

const md5 = (b: Buffer) => createHash("md5").update(b).digest("hex");
async function readAll(s: Readable | null): Promise<Buffer> {
  if (!s) throw new Error("expected a stream, got null");
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}
/** `total` random bytes in chunks of `chunk`, streamed (never all in memory), hashed on the way out. */
function generated(total: number, chunk = 64 * 1024): { stream: Readable; md5: () => string } {
  const hash = createHash("md5");
  async function* gen() {
    for (let sent = 0; sent < total; ) {
      const b = randomFillSync(Buffer.allocUnsafe(Math.min(chunk, total - sent)));
      hash.update(b);
      sent += b.length;
      yield b;
    }
  }
  return { stream: Readable.from(gen(), { objectMode: false }), md5: () => hash.digest("hex") };
}

describe.each(backends)("BlobStore: $name", (backend) => {
  let store: BlobStore;
  let cleanup: () => Promise<void>;
  beforeAll(async () => {
    ({ store, cleanup } = await backend.make());
  }, 60_000);
  afterAll(async () => {
    await cleanup?.();
  });

  it("put, get, stat and delete round-trip with the size and MD5", async () => {
    for (const size of [0, 1, 1000, 12 * MiB + 7]) {
      const bytes = randomBytes(size);
      const key = `proj/rt/${size}`;
      expect(await store.put(key, Readable.from([bytes]))).toEqual({ size, md5: md5(bytes) });
      expect(await store.stat(key)).toEqual({ size });
      expect((await readAll(await store.get(key))).equals(bytes)).toBe(true);
      await store.delete(key);
      expect(await store.stat(key)).toBeNull();
      expect(await store.get(key)).toBeNull();
    }
  }, 60_000);

  it("list: every key under a prefix (a folder or a name's start) with when its bytes were written", async () => {
    const before = Date.now() - 60_000; // S3 servers keep LastModified to the second; clocks may differ a little
    for (const key of ["ls/a/1.x", "ls/a/2.x", "ls/b/uploads/s/data", "lsx/other"]) await store.put(key, Readable.from([Buffer.from(key)]));
    const all = async (prefix?: string) => {
      const out: { key: string; modifiedMs: number }[] = [];
      for await (const b of store.list(prefix)) out.push(b);
      return out.sort((x, y) => x.key.localeCompare(y.key));
    };
    const under = await all("ls/");
    expect(under.map((b) => b.key)).toEqual(["ls/a/1.x", "ls/a/2.x", "ls/b/uploads/s/data"]);
    for (const b of under) expect(b.modifiedMs).toBeGreaterThan(before);
    expect((await all("ls/a/")).map((b) => b.key)).toEqual(["ls/a/1.x", "ls/a/2.x"]);
    expect((await all("ls")).map((b) => b.key)).toEqual(["ls/a/1.x", "ls/a/2.x", "ls/b/uploads/s/data", "lsx/other"]);
    expect((await all()).map((b) => b.key)).toEqual(expect.arrayContaining(["ls/a/1.x", "lsx/other"]));
    await store.deletePrefix("ls/");
    await store.delete("lsx/other");
    expect(await all("ls")).toEqual([]);
  });

  it("serves inclusive byte ranges: first byte, middle (across a part boundary), last byte, whole", async () => {
    const bytes = randomBytes(12 * MiB + 3);
    await store.put("proj/ranges", Readable.from([bytes]));
    const n = bytes.length;
    for (const [start, end] of [[0, 0], [8 * MiB - 10, 8 * MiB + 10], [4321, 4321 + 99], [n - 1, n - 1], [0, n - 1]]) {
      const got = await readAll(await store.get("proj/ranges", { start, end }));
      expect(got.length).toBe(end - start + 1);
      expect(got.equals(bytes.subarray(start, end + 1))).toBe(true);
    }
  }, 60_000);

  it("answers null for an absent key", async () => {
    expect(await store.get("proj/absent")).toBeNull();
    expect(await store.get("proj/absent", { start: 0, end: 0 })).toBeNull();
    expect(await store.stat("proj/absent")).toBeNull();
  });

  it("replaces what was under a key", async () => {
    await store.put("proj/replace", Readable.from([Buffer.from("first version, longer")]));
    expect(await store.put("proj/replace", Readable.from([Buffer.from("second")]))).toEqual({ size: 6, md5: md5(Buffer.from("second")) });
    expect((await readAll(await store.get("proj/replace"))).toString()).toBe("second");
    expect(await store.stat("proj/replace")).toEqual({ size: 6 });
  });

  it("deletes absent keys without complaint", async () => {
    await store.delete("proj/never-there");
    await store.delete("elsewhere/never/there");
  });

  it("deletePrefix removes only that prefix", async () => {
    const keys = ["p/a/1", "p/a/2", "p/a/deep/3", "p/ab", "p/b/1", "q/a/1", "pa"];
    for (const k of keys) await store.put(k, Readable.from([Buffer.from(k)]));
    await store.deletePrefix("p/a/");
    const left = async () => (await Promise.all(keys.map(async (k) => ((await store.stat(k)) ? k : null)))).filter(Boolean);
    expect(await left()).toEqual(["p/ab", "p/b/1", "q/a/1", "pa"]);
    // Without a trailing slash it is a plain string prefix: "p/a" takes "p/ab" too.
    await store.put("p/a/1", Readable.from([Buffer.from("again")]));
    await store.deletePrefix("p/a");
    expect(await left()).toEqual(["p/b/1", "q/a/1", "pa"]);
    await store.deletePrefix("p/nothing-here/");
    await expect(store.deletePrefix("")).rejects.toThrow();
    await expect(store.deletePrefix("/")).rejects.toThrow();
  });

  it("copies", async () => {
    const bytes = randomBytes(300_000);
    await store.put("proj/copy-src", Readable.from([bytes]));
    await store.copy("proj/copy-src", "proj/sub/copy-dst");
    expect((await readAll(await store.get("proj/sub/copy-dst"))).equals(bytes)).toBe(true);
    expect(await store.stat("proj/copy-src")).toEqual({ size: bytes.length });
    // onto an existing key
    await store.put("proj/copy-over", Readable.from([Buffer.from("old")]));
    await store.copy("proj/copy-src", "proj/copy-over");
    expect(await store.stat("proj/copy-over")).toEqual({ size: bytes.length });
  });

  it("assembles 3 parts (5 MiB, 5 MiB, small) into their exact concatenation, leaving the parts", async () => {
    const parts = [randomBytes(5 * MiB), randomBytes(5 * MiB), randomBytes(12_345)];
    const keys = parts.map((_, i) => `sessions/s1/part-${i + 1}`);
    for (const [i, p] of parts.entries()) await store.put(keys[i], Readable.from([p]));
    const whole = Buffer.concat(parts);
    expect(await store.assemble("proj/assembled", keys, { contentType: "application/pdf" })).toEqual({ size: whole.length });
    const got = await readAll(await store.get("proj/assembled"));
    expect(got.length).toBe(whole.length);
    expect(md5(got)).toBe(md5(whole));
    for (const [i, k] of keys.entries()) expect(await store.stat(k)).toEqual({ size: parts[i].length });
    // Ranges of the assembled object, across the parts' seams.
    const seam = await readAll(await store.get("proj/assembled", { start: 5 * MiB - 3, end: 10 * MiB + 2 }));
    expect(seam.equals(whole.subarray(5 * MiB - 3, 10 * MiB + 3))).toBe(true);
    await store.deletePrefix("sessions/s1/");
    expect(await store.stat(keys[0])).toBeNull();
  }, 60_000);

  it("assembles a single part, and small parts too", async () => {
    await store.put("sessions/s2/1", Readable.from([Buffer.from("only")]));
    expect(await store.assemble("proj/one", ["sessions/s2/1"])).toEqual({ size: 4 });
    expect((await readAll(await store.get("proj/one"))).toString()).toBe("only");
    await store.put("sessions/s2/2", Readable.from([Buffer.from("-and-more")]));
    expect(await store.assemble("proj/two", ["sessions/s2/1", "sessions/s2/2"])).toEqual({ size: 13 });
    expect((await readAll(await store.get("proj/two"))).toString()).toBe("only-and-more");
  }, 60_000);

  it("put past maxBytes fails with BlobTooLarge and stores nothing", async () => {
    // Within the first part, and past a whole part (on S3 a multipart upload was under way).
    for (const [total, max] of [[3 * MiB, MiB], [20 * MiB, 10 * MiB]]) {
      const key = `proj/too-large-${total}`;
      const src = generated(total);
      const err = await store.put(key, src.stream, { maxBytes: max }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BlobTooLarge);
      expect((err as BlobTooLarge).limit).toBe(max);
      expect(src.stream.destroyed).toBe(true);
      expect(await store.stat(key)).toBeNull();
    }
    // An existing object stays as it was.
    await store.put("proj/keep", Readable.from([Buffer.from("kept")]));
    await expect(store.put("proj/keep", generated(2 * MiB).stream, { maxBytes: MiB })).rejects.toBeInstanceOf(BlobTooLarge);
    expect((await readAll(await store.get("proj/keep"))).toString()).toBe("kept");
    // Exactly maxBytes is fine.
    const exact = randomBytes(1000);
    expect(await store.put("proj/exact", Readable.from([exact]), { maxBytes: 1000 })).toEqual({ size: 1000, md5: md5(exact) });
  }, 60_000);

  it.runIf(backend.big)(
    "streams a 160 MiB put and get with RSS growth well under 64 MB (300 MB through the HTTP API: storage-memory.test)",
    async () => {
      const total = 160 * MiB;
      const gc = () => (globalThis as { Bun?: { gc(sync: boolean): void } }).Bun?.gc(true);
      /** Growth of the process's RSS over its value at the start (heap settled first), sampled every 20 ms. */
      async function rssGrowth<T>(fn: () => Promise<T>): Promise<{ result: T; growth: number; ms: number }> {
        gc();
        const base = process.memoryUsage().rss;
        let peak = base;
        const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
        const t0 = performance.now();
        try {
          const result = await fn();
          peak = Math.max(peak, process.memoryUsage().rss);
          return { result, growth: peak - base, ms: performance.now() - t0 };
        } finally {
          clearInterval(sampler);
        }
      }
      try {
        // Warm up (connections, code paths) first.
        await store.put("big/warm", generated(9 * MiB).stream);
        await readAll(await store.get("big/warm"));
        const src = generated(total);
        const put = await rssGrowth(() => store.put("big/160", src.stream));
        expect(put.result).toEqual({ size: total, md5: src.md5() });
        const get = await rssGrowth(async () => {
          const down = createHash("md5");
          let size = 0;
          for await (const c of (await store.get("big/160"))!) {
            down.update(c as Buffer);
            size += (c as Buffer).length;
          }
          return { size, md5: down.digest("hex") };
        });
        expect(get.result).toEqual(put.result);
        console.log(
          `[${backend.name}] 160 MiB: put ${Math.round(put.ms)} ms, RSS +${(put.growth / MiB).toFixed(1)} MiB; get ${Math.round(get.ms)} ms, RSS +${(get.growth / MiB).toFixed(1)} MiB`,
        );
        expect(put.growth).toBeLessThan(64 * 1000 * 1000);
        expect(get.growth).toBeLessThan(64 * 1000 * 1000);
      } finally {
        await store.delete("big/160");
        await store.delete("big/warm");
      }
    },
    180_000,
  );
});

describe("S3BlobStore specifics", () => {
  let raw: Client;
  beforeAll(async () => {
    raw = await rawClient();
  }, 60_000);

  async function incompleteUploads(bucket: string): Promise<string[]> {
    const keys: string[] = [];
    for await (const u of raw.listIncompleteUploads(bucket, "", true)) keys.push(u.key);
    return keys;
  }

  it("aborts the multipart upload of a put past maxBytes, and of a put whose source fails", async () => {
    const store = await s3Store({ partSize: 5 * MiB });
    try {
      await expect(store.put("big/aborted", generated(30 * MiB).stream, { maxBytes: 17 * MiB })).rejects.toBeInstanceOf(BlobTooLarge);
      async function* failing() {
        yield randomBytes(6 * MiB);
        yield randomBytes(6 * MiB);
        throw new Error("client went away");
      }
      await expect(store.put("big/failed", Readable.from(failing()))).rejects.toThrow("client went away");
      expect(await incompleteUploads(store.bucket)).toEqual([]);
      expect(await store.stat("big/aborted")).toBeNull();
      expect(await store.stat("big/failed")).toBeNull();
    } finally {
      await store.close();
    }
  }, 60_000);

  it("returns the MD5 of the bytes, not the multipart ETag", async () => {
    const store = await s3Store({ partSize: 5 * MiB });
    try {
      const bytes = randomBytes(11 * MiB);
      const put = await store.put("proj/multi", Readable.from([bytes.subarray(0, 3 * MiB), bytes.subarray(3 * MiB)]));
      expect(put.md5).toBe(md5(bytes));
      const stat = await raw.statObject(store.bucket, "kiln/proj/multi");
      expect(stat.etag).toMatch(/-3$/); // three parts: 5, 5, 1 MiB
    } finally {
      await store.close();
    }
  }, 60_000);

  it("assembles server-side with UploadPartCopy on radosgw, and copies large objects in ranges", async () => {
    const store = await s3Store({ copyPartSize: 5 * MiB });
    try {
      const parts = [randomBytes(5 * MiB), randomBytes(2)];
      await store.put("s/1", Readable.from([parts[0]]));
      await store.put("s/2", Readable.from([parts[1]]));
      await store.assemble("proj/a", ["s/1", "s/2"], { contentType: "text/plain" });
      if (!process.env.KILN_TEST_S3_ENDPOINT) expect(store.serverSideCopy).toBe(true);
      expect((await raw.statObject(store.bucket, "kiln/proj/a")).metaData["content-type"]).toBe("text/plain");
      const big = randomBytes(12 * MiB + 1);
      await store.put("proj/big", Readable.from([big]), { contentType: "image/png" });
      await store.copy("proj/big", "proj/big-copy");
      expect(md5(await readAll(await store.get("proj/big-copy")))).toBe(md5(big));
      const stat = await raw.statObject(store.bucket, "kiln/proj/big-copy");
      expect(stat.etag).toMatch(/-3$/); // 5 + 5 + 2 MiB ranges
      expect(stat.metaData["content-type"]).toBe("image/png");
    } finally {
      await store.close();
    }
  }, 60_000);

  it("keeps stores with different prefixes in one bucket apart", async () => {
    const bucket = `kiln-test-${randomBytes(4).toString("hex")}`;
    const a = await s3Store({ bucket, prefix: "a" });
    const b = await s3Store({ bucket, prefix: "b/" });
    try {
      await a.init(); // again: the bucket exists
      await a.put("proj/x", Readable.from([Buffer.from("from a")]));
      await b.put("proj/x", Readable.from([Buffer.from("from b")]));
      await a.deletePrefix("proj/");
      expect(await a.stat("proj/x")).toBeNull();
      expect((await readAll(await b.get("proj/x"))).toString()).toBe("from b");
      const names: string[] = [];
      for await (const o of raw.listObjectsV2(bucket, "", true)) names.push(o.name!);
      expect(names).toEqual(["b/proj/x"]);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("deletePrefix also aborts uploads left unfinished under the prefix", async () => {
    const store = await s3Store();
    try {
      const id = await raw.initiateNewMultipartUpload(store.bucket, "kiln/gone/half", {});
      await raw.uploadPart({ bucketName: store.bucket, objectName: "kiln/gone/half", uploadID: id, partNumber: 1, headers: {} }, randomBytes(5 * MiB));
      const other = await raw.initiateNewMultipartUpload(store.bucket, "kiln/stays/half", {});
      await store.deletePrefix("gone/");
      expect(await incompleteUploads(store.bucket)).toEqual(["kiln/stays/half"]);
      await raw.abortMultipartUpload(store.bucket, "kiln/stays/half", other);
    } finally {
      await store.close();
    }
  });

  it("abortStaleUploads aborts the unfinished uploads under its prefix begun before the time given, and only those", async () => {
    const store = await s3Store();
    try {
      const id = await raw.initiateNewMultipartUpload(store.bucket, "kiln/p/b/half.v", {});
      const outside = await raw.initiateNewMultipartUpload(store.bucket, "other/half", {});
      expect(await store.abortStaleUploads(Date.now() - 3_600_000)).toBe(0);
      expect((await incompleteUploads(store.bucket)).sort()).toEqual(["kiln/p/b/half.v", "other/half"]);
      expect(await store.abortStaleUploads(Date.now() + 60_000)).toBe(1);
      expect(await incompleteUploads(store.bucket)).toEqual(["other/half"]);
      await raw.abortMultipartUpload(store.bucket, "other/half", outside);
      void id;
    } finally {
      await store.close();
    }
  });

  it("refuses keys that are not Kiln's", async () => {
    const store = await s3Store();
    try {
      for (const bad of ["../x", "a//b", "/a", "a/./b", "a b", ""]) await expect(store.stat(bad)).rejects.toThrow(/bad blob key/);
    } finally {
      await store.close();
    }
  });
});

describe("FilesystemBlobStore: resumable parts in place (putAt, finishAt)", () => {
  let dir: string;
  let store: FilesystemBlobStore;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "kiln-blobs-at-"));
    store = new FilesystemBlobStore(dir);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("writes ranges in place in any order, patches re-uploaded ones and links the file at the end", async () => {
    const parts = [randomBytes(3 * MiB), randomBytes(3 * MiB), randomBytes(1234)];
    const offsets = [0, 3 * MiB, 6 * MiB];
    // Out of order, the last first; two at once (the file is made once, by whichever comes first).
    expect(await store.putAt!("s/up/data", offsets[2], Readable.from([parts[2]]), { maxBytes: parts[2].length })).toEqual({ size: parts[2].length, md5: md5(parts[2]) });
    const both = await Promise.all([0, 1].map((i) => store.putAt!("s/up/data", offsets[i], Readable.from([parts[i]]))));
    expect(both).toEqual([0, 1].map((i) => ({ size: parts[i].length, md5: md5(parts[i]) })));
    // Part 2 uploaded again: a blob of its own, copied in at the end.
    const again = randomBytes(3 * MiB);
    await store.put("s/up/2.v2", Readable.from([again]));
    const whole = Buffer.concat([parts[0], again, parts[2]]);
    expect(await store.finishAt!("s/up/data", "p/object", whole.length, [{ key: "s/up/2.v2", offset: offsets[1] }])).toEqual({ size: whole.length });
    expect(md5(await readAll(await store.get("p/object")))).toBe(md5(whole));
    // The object's blob is new as of its completion: a link would keep the session file's mtime (its
    // last part's, maybe days old), and the sweep of unreferenced blobs spares only young files.
    await store.putAt!("s/up3/data", 0, Readable.from([Buffer.from("abc")]));
    utimesSync(join(dir, "s", "up3", "data"), new Date(0), new Date(0));
    await store.finishAt!("s/up3/data", "p/object3", 3, []);
    for await (const b of store.list("p/object3")) expect(b.modifiedMs).toBeGreaterThan(Date.now() - 60_000);
    // The object stays when the session's files go.
    await store.deletePrefix("s/up/");
    expect(md5(await readAll(await store.get("p/object")))).toBe(md5(whole));
  }, 60_000);

  it("writes nothing of a range past maxBytes; finishAt checks the size and makes nothing on a mismatch", async () => {
    const err = await store.putAt!("s/bad/data", 0, Readable.from([Buffer.from("too long")]), { maxBytes: 5 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BlobTooLarge);
    expect(await store.stat("s/bad/data")).toEqual({ size: 0 });
    expect(await store.putAt!("s/bad/data", 0, Readable.from([Buffer.from("whole")]), { maxBytes: 5 })).toEqual({ size: 5, md5: md5(Buffer.from("whole")) });
    expect(await store.finishAt!("s/bad/data", "p/bad", 5, [])).toEqual({ size: 5 });
    expect((await readAll(await store.get("p/bad"))).toString()).toBe("whole");
    await expect(store.finishAt!("s/bad/data", "p/bad2", 6, [])).rejects.toThrow(/holds 5 bytes, not 6/);
    expect(await store.stat("p/bad2")).toBeNull();
  });
});

describe("BufferPool", () => {
  it("reuses buffers, bounds what is out, serves waiters in turn, and lets one oversized request through alone", async () => {
    const pool = new BufferPool(3 * MiB);
    const a = pool.tryTake(MiB)!;
    const b = await pool.take(MiB);
    const c = await pool.take(MiB);
    expect(pool.tryTake(MiB)).toBeNull();
    let got: Buffer | null = null;
    const waiting = pool.take(MiB).then((x) => (got = x));
    await Promise.resolve();
    expect(got).toBeNull();
    pool.give(b);
    await waiting;
    expect(got).toBe(b); // the same memory again
    for (const x of [a, c, got!]) pool.give(x);
    expect(pool.usage).toMatchObject({ out: 0, waiting: 0 });
    const big = pool.tryTake(5 * MiB)!; // more than the limit, but nothing else is out
    expect(big.length).toBe(5 * MiB);
    expect(pool.tryTake(MiB)).toBeNull();
    pool.give(big);
    expect(pool.usage.kept).toBeLessThanOrEqual(3 * MiB);
  });
});

describe("S3BlobStore download spool (HTTP bodies with their length)", () => {
  it("is emptied at start; spools bodies over 1 MiB into files up to its total, streams beyond it, and frees them keepMs after", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-spool-"));
    writeFileSync(join(dir, "left-by-a-crash"), "x");
    // Dated an hour ahead, so only the emptying at start can remove it, never a sweep for age.
    utimesSync(join(dir, "left-by-a-crash"), new Date(Date.now() + 3_600_000), new Date(Date.now() + 3_600_000));
    // Kept a minute: nothing is swept for age during the test until it sweeps with a later time itself.
    const store = await s3Store({ spool: { dir, maxBytes: 4 * MiB, totalBytes: 5 * MiB, keepMs: 60_000 } });
    try {
      expect(readdirSync(dir)).toEqual([]);
      const bytes = randomBytes(3 * MiB);
      await store.put("spool/a", Readable.from([bytes]));
      const first = await store.body!("spool/a");
      expect(first).toBeInstanceOf(Blob);
      expect((first as Blob).size).toBe(bytes.length);
      expect(md5(Buffer.from(await (first as Blob).arrayBuffer()))).toBe(md5(bytes));
      expect(readdirSync(dir)).toHaveLength(1);
      // 3 MiB more would pass the 5 MiB total: streamed, the same bytes.
      const second = await store.body!("spool/a", { start: 0, end: 3 * MiB - 1 });
      expect(second).toBeInstanceOf(ReadableStream);
      expect(md5(Buffer.from(await new Response(second as ReadableStream).arrayBuffer()))).toBe(md5(bytes));
      // A small one is bytes, whatever the spool holds.
      await store.put("spool/small", Readable.from([Buffer.from("tiny")]));
      expect(await (await store.body!("spool/small") as Blob).text()).toBe("tiny");
      // Not yet kept a minute: it stays. Once it is removed, its bytes count no longer.
      store.sweepSpool(Date.now() + 30_000);
      expect(readdirSync(dir)).toHaveLength(1);
      store.sweepSpool(Date.now() + 61_000);
      expect(readdirSync(dir)).toEqual([]);
      expect(await store.body!("spool/a")).toBeInstanceOf(Blob);
    } finally {
      await store.deletePrefix("spool/");
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
