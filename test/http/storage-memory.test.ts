// Streaming end to end (issue #13, deliverable 6): a ~300 MB plain multipart upload, a ~300 MB
// resumable upload and a ~300 MB download each keep the Kiln process's RSS growth under 64 MB, on
// the filesystem and on S3.
// Black box: VmRSS of the server process from /proc, sampled every 50 ms during each transfer,
// against its RSS just before. The bytes come from a generator (never whole in this process either)
// and are hashed on the way out and on the way back.
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { BLOBS, createProject, PRODUCT_ALLOCATOR, useKiln } from "../support/kiln";

const MB = 1024 * 1024;
const CHUNK = MB;
const SIZE = 300 * MB + 12_345;
const LIMIT_MB = 64;

// Measures Kiln's memory: the allocator as users run it.
const k = useKiln({ env: PRODUCT_ALLOCATOR });

/** Chunk `i` of the object: a random block stamped with its index (so no two chunks are equal). */
const block = randomBytes(CHUNK);
function chunk(i: number, size: number): Uint8Array {
  const c = Buffer.allocUnsafe(Math.min(CHUNK, size - i * CHUNK));
  block.copy(c, 0, 0, c.length);
  c.writeUInt32BE(i, 0);
  return c;
}

/** Bytes [start, end) of the object as a pull stream of 1 MB chunks (start a multiple of CHUNK). */
function objectStream(size: number, start = 0, end = size, onChunk?: (c: Uint8Array) => void, prefix?: Uint8Array, suffix?: Uint8Array): ReadableStream<Uint8Array> {
  let i = start / CHUNK;
  let stage = prefix ? 0 : 1;
  return new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (stage === 0) {
        stage = 1;
        return ctl.enqueue(prefix!);
      }
      if (stage === 1 && i * CHUNK < end) {
        const c = chunk(i++, end);
        onChunk?.(c);
        return ctl.enqueue(c);
      }
      if (stage === 1 && suffix) {
        stage = 2;
        return ctl.enqueue(suffix);
      }
      ctl.close();
    },
  });
}

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** Runs `fn` while sampling the server's RSS every 50 ms: growth = peak - the RSS just before. */
async function measure(label: string, fn: () => Promise<void>): Promise<number> {
  const pid = k.proc.pid!;
  const idle: number[] = [];
  for (let i = 0; i < 5; i++) {
    idle.push(rssMb(pid));
    await new Promise((r) => setTimeout(r, 50));
  }
  const before = idle.reduce((a, b) => a + b) / idle.length;
  let peak = before;
  const timer = setInterval(() => (peak = Math.max(peak, rssMb(pid))), 50);
  const t0 = performance.now();
  try {
    await fn();
  } finally {
    clearInterval(timer);
  }
  peak = Math.max(peak, rssMb(pid));
  const growth = peak - before;
  console.log(`${label}: RSS ${before.toFixed(0)} MB before, peak ${peak.toFixed(0)} MB, growth ${growth.toFixed(1)} MB (limit ${LIMIT_MB} MB), ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  return growth;
}

async function setup() {
  const p = await createProject(k);
  const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "mem" } })).body.key as string;
  const bucket = "mem";
  expect((await k.api("POST", `/projects/${p.id}/storage/buckets`, { body: { name: bucket } })).status).toBe(201);
  return { sk, bucket };
}

async function multipartUpload(sk: string, bucket: string, path: string, size: number): Promise<{ status: number; body: any; md5: string }> {
  const boundary = `----kiln-mem-${randomBytes(8).toString("hex")}`;
  const head = new TextEncoder().encode(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`);
  const tail = new TextEncoder().encode(`\r\n--${boundary}--\r\n`);
  const hash = createHash("md5");
  const res = await fetch(`${k.url}/storage/${bucket}/${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${sk}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": String(head.length + size + tail.length) },
    body: objectStream(size, 0, size, (c) => hash.update(c), head, tail),
    duplex: "half",
  } as RequestInit);
  return { status: res.status, body: await res.json(), md5: hash.digest("hex") };
}

async function resumableUpload(sk: string, bucket: string, path: string, size: number): Promise<{ status: number; body: any }> {
  const auth = { authorization: `Bearer ${sk}` };
  const created = await k.api("POST", `/storage/${bucket}/${path}`, { token: sk, body: { content_type: "application/octet-stream", total_size: size } });
  expect(created.status).toBe(201);
  const { session_id: id, part_size: partSize, total_parts: parts } = created.body;
  expect(partSize % CHUNK).toBe(0);
  // Three parts in flight at a time, as a client uploading in parallel would.
  let next = 1;
  await Promise.all(
    Array.from({ length: 3 }, async () => {
      while (next <= parts) {
        const n = next++;
        const start = (n - 1) * partSize;
        const end = Math.min(size, start + partSize);
        const res = await fetch(`${k.url}/storage/${bucket}/${path}`, {
          method: "PUT",
          headers: { ...auth, "x-upload-session": id, "x-part-number": String(n), "content-type": "application/octet-stream", "content-length": String(end - start) },
          body: objectStream(size, start, end),
          duplex: "half",
        } as RequestInit);
        expect([n, res.status, await res.text()]).toEqual([n, 200, expect.any(String)]);
      }
    }),
  );
  const done = await fetch(`${k.url}/storage/${bucket}/${path}`, { method: "POST", headers: { ...auth, "x-upload-session": id, "x-upload-complete": "true" } });
  return { status: done.status, body: await done.json() };
}

async function downloadMd5(sk: string, bucket: string, path: string): Promise<{ status: number; bytes: number; md5: string }> {
  const res = await fetch(`${k.url}/storage/${bucket}/${path}`, { headers: { authorization: `Bearer ${sk}` } });
  const hash = createHash("md5");
  let bytes = 0;
  for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) {
    hash.update(c);
    bytes += c.length;
  }
  return { status: res.status, bytes, md5: hash.digest("hex") };
}

function expectedMd5(size: number): string {
  const hash = createHash("md5");
  for (let i = 0; i * CHUNK < size; i++) hash.update(chunk(i, size));
  return hash.digest("hex");
}

// Runs on both blob backends (the s3 project: objects on radosgw). On S3 the bytes pass through
// Kiln's part buffers (bounded, reused) on the way in and the S3 response's own stream on the way out.
describe("streaming: Kiln's RSS growth stays under 64 MB", () => {
  test("~300 MB multipart upload, ~300 MB resumable upload, ~300 MB download", { timeout: BLOBS === "s3" ? 300_000 : 120_000 }, async () => {
    const { sk, bucket } = await setup();
    const want = expectedMd5(SIZE);
    // Warm-up: every code path once with a small object, so the figures are growth, not first use.
    const warmSize = 12 * MB + 5;
    expect((await multipartUpload(sk, bucket, "warm/plain.bin", warmSize)).status).toBe(201);
    expect((await resumableUpload(sk, bucket, "warm/resumable.bin", warmSize)).status).toBe(200);
    expect((await downloadMd5(sk, bucket, "warm/plain.bin")).bytes).toBe(warmSize);

    let up!: Awaited<ReturnType<typeof multipartUpload>>;
    const plainGrowth = await measure("multipart upload of 300 MB", async () => {
      up = await multipartUpload(sk, bucket, "big/plain.bin", SIZE);
    });
    expect(up.status).toBe(201);
    expect(up.md5).toBe(want);
    expect(up.body).toMatchObject({ size: SIZE, etag: want });

    let done!: Awaited<ReturnType<typeof resumableUpload>>;
    const resumableGrowth = await measure("resumable upload of 300 MB", async () => {
      done = await resumableUpload(sk, bucket, "big/resumable.bin", SIZE);
    });
    expect(done.status).toBe(200);
    expect(done.body.size).toBe(SIZE);

    let down!: Awaited<ReturnType<typeof downloadMd5>>;
    const downloadGrowth = await measure("download of 300 MB", async () => {
      down = await downloadMd5(sk, bucket, "big/resumable.bin");
    });
    expect(down).toEqual({ status: 200, bytes: SIZE, md5: want });

    expect({ plainGrowth, resumableGrowth, downloadGrowth }).toEqual({
      plainGrowth: expect.any(Number),
      resumableGrowth: expect.any(Number),
      downloadGrowth: expect.any(Number),
    });
    expect(plainGrowth).toBeLessThan(LIMIT_MB);
    expect(resumableGrowth).toBeLessThan(LIMIT_MB);
    expect(downloadGrowth).toBeLessThan(LIMIT_MB);
  });
});
