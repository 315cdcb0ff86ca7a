// Object storage benchmark (issue #13): through an embedded Kiln (filesystem blobs under its data dir)
// against the same bytes written to and read from the same disk directly, in the same run.
// Run: npm run bench:storage
// Targets: large-object throughput >= 50% of raw disk; listing p50 < 20 ms at 100k objects in a
// bucket; RSS growth < 64 MB during a 1 GB upload (plain and resumable) and a 1 GB download.
//
// - throughput: 1 MB objects (SMALL_COUNT of them, default 64, one after another) and 256 MB objects
//   (LARGE_RUNS, default 2, best run), uploaded as multipart/form-data streamed from a generator (and,
//   for the large ones, resumably: 25 MB parts, 4 in flight) and downloaded streamed and discarded,
//   against writing the same chunks to a file in the same folder durably (temporary file, fsync,
//   rename, folder fsync: what Kiln does) and reading it back. Both reads come from the page cache
//   (the bytes were just written), so the raw read is a memory copy; a bare Bun server sending the
//   same file over HTTP to the same client is printed beside it as the transport's own ceiling;
// - 4 KB uploads per second: 8 concurrent clients for SMALL_SECONDS (default 5), against durable raw
//   4 KB file writes, 8 at a time;
// - listing: a bucket filled with LIST_OBJECTS (default 100,000) objects through the API (16 clients;
//   when the 4 KB rate says the fill would take more than FILL_BUDGET_S, default 240 s, 20,000 are
//   aimed at, and the fill stops when FILL_BUDGET_S is spent; the count reached is printed), then p50/p99 of a first page (limit 50), of prefix queries that
//   match 100 names (limit 50), and of every page of a full walk by cursor (limit 1000);
// - memory: VmRSS of the Kiln process from /proc, every 50 ms, during a HUGE_MB (default 1024) MB
//   multipart upload, resumable upload (4 parts in flight) and download; growth over the RSS just
//   before each.
// The load generator is fetch in this process, which shares the machine's cores with Kiln.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { open, rename } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BUN, pct, startKiln, TOKEN } from "./support";

const MB = 1024 * 1024;
const SMALL_COUNT = Number(process.env.SMALL_COUNT ?? 64);
const LARGE_MB = Number(process.env.LARGE_MB ?? 256);
const LARGE_RUNS = Number(process.env.LARGE_RUNS ?? 2);
const HUGE_MB = Number(process.env.HUGE_MB ?? 1024);
const SMALL_SECONDS = Number(process.env.SMALL_SECONDS ?? 5);
const LIST_OBJECTS = Number(process.env.LIST_OBJECTS ?? 100_000);
const FILL_BUDGET_S = Number(process.env.FILL_BUDGET_S ?? 240);
const CHUNK = MB;

const block = randomBytes(CHUNK);
/** Chunk `i` of an object of `size` bytes: a random block stamped with its index. */
function chunk(i: number, size: number): Buffer {
  const c = Buffer.allocUnsafe(Math.min(CHUNK, size - i * CHUNK));
  block.copy(c, 0, 0, c.length);
  c.writeUInt32BE(i, 0);
  return c;
}

function bodyStream(start: number, end: number, prefix?: Uint8Array, suffix?: Uint8Array): ReadableStream<Uint8Array> {
  let i = start / CHUNK;
  let stage = prefix ? 0 : 1;
  return new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (stage === 0) {
        stage = 1;
        return ctl.enqueue(prefix!);
      }
      if (stage === 1 && i * CHUNK < end) return ctl.enqueue(chunk(i++, end));
      if (stage === 1 && suffix) {
        stage = 2;
        return ctl.enqueue(suffix);
      }
      ctl.close();
    },
  });
}

const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;
const mbps = (bytes: number, ms: number) => bytes / MB / (ms / 1000);
const f0 = (x: number) => x.toFixed(0);
const f1 = (x: number) => x.toFixed(1);
const f2 = (x: number) => x.toFixed(2);

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-storage-"));
  const rawDir = join(dir, "raw");
  const { url, proc } = await startKiln(join(dir, "kiln"));
  mkdirSync(rawDir, { recursive: true });
  const pid = proc.pid!;
  const api = async (method: string, path: string, body?: unknown, token = TOKEN) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : undefined;
  };
  const project = await api("POST", "/projects", { name: "bench-storage" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key as string;
  for (const name of ["data", "small", "list"]) await api("POST", `/projects/${project.id}/storage/buckets`, { name });
  const auth = { authorization: `Bearer ${sk}` };

  const upload = async (bucket: string, path: string, size: number) => {
    const boundary = `----kiln-bench-${randomBytes(6).toString("hex")}`;
    const head = new TextEncoder().encode(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="f.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`);
    const tail = new TextEncoder().encode(`\r\n--${boundary}--\r\n`);
    const r = await fetch(`${url}/storage/${bucket}/${path}`, {
      method: "POST",
      headers: { ...auth, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": String(head.length + size + tail.length) },
      body: bodyStream(0, size, head, tail),
      duplex: "half",
    } as RequestInit);
    const text = await r.text();
    if (r.status !== 201) throw new Error(`upload ${path}: ${r.status} ${text}`);
  };
  const resumable = async (bucket: string, path: string, size: number, inFlight = 4) => {
    const s = await api("POST", `/storage/${bucket}/${path}`, { content_type: "application/octet-stream", total_size: size }, sk);
    let next = 1;
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        while (next <= s.total_parts) {
          const n = next++;
          const start = (n - 1) * s.part_size;
          const end = Math.min(size, start + s.part_size);
          const r = await fetch(`${url}/storage/${bucket}/${path}`, {
            method: "PUT",
            headers: { ...auth, "x-upload-session": s.session_id, "x-part-number": String(n), "content-type": "application/octet-stream", "content-length": String(end - start) },
            body: bodyStream(start, end),
            duplex: "half",
          } as RequestInit);
          const text = await r.text();
          if (r.status !== 200) throw new Error(`part ${n}: ${r.status} ${text}`);
        }
      }),
    );
    const r = await fetch(`${url}/storage/${bucket}/${path}`, { method: "POST", headers: { ...auth, "x-upload-session": s.session_id, "x-upload-complete": "true" } });
    const text = await r.text();
    if (r.status !== 200) throw new Error(`complete: ${r.status} ${text}`);
  };
  const download = async (bucket: string, path: string) => {
    const r = await fetch(`${url}/storage/${bucket}/${path}`, { headers: auth });
    if (r.status !== 200) throw new Error(`download ${path}: ${r.status} ${await r.text()}`);
    let n = 0;
    for await (const c of r.body as unknown as AsyncIterable<Uint8Array>) n += c.length;
    return n;
  };
  const remove = (bucket: string, path: string) => api("DELETE", `/storage/${bucket}/${path}`, undefined, sk);

  // The same bytes straight to the same disk: temporary file, fsync, rename, folder fsync (what a
  // durable write needs), and read back.
  const rawWrite = async (name: string, size: number) => {
    const tmp = join(rawDir, `.tmp-${name}`);
    const fh = await open(tmp, "w");
    for (let i = 0; i * CHUNK < size; i++) await fh.write(chunk(i, size));
    await fh.sync();
    await fh.close();
    await rename(tmp, join(rawDir, name));
    const d = await open(rawDir, "r");
    await d.sync();
    await d.close();
  };
  const rawRead = async (name: string) => {
    let n = 0;
    for await (const c of Bun.file(join(rawDir, name)).stream()) n += c.length;
    return n;
  };
  const timed = async (fn: () => Promise<unknown>) => {
    const t = performance.now();
    await fn();
    return performance.now() - t;
  };

  const lines: string[] = [];
  const say = (s: string) => {
    console.log(s);
    lines.push(s);
  };

  // 1. Throughput, 1 MB objects.
  await upload("data", "warm", MB);
  await download("data", "warm");
  let kUp = 0;
  let kDown = 0;
  let rUp = 0;
  let rDown = 0;
  for (let i = 0; i < SMALL_COUNT; i++) kUp += await timed(() => upload("data", `one/${i}`, MB));
  for (let i = 0; i < SMALL_COUNT; i++) kDown += await timed(() => download("data", `one/${i}`));
  for (let i = 0; i < SMALL_COUNT; i++) rUp += await timed(() => rawWrite(`one-${i}`, MB));
  for (let i = 0; i < SMALL_COUNT; i++) rDown += await timed(() => rawRead(`one-${i}`));
  const small = { kUp: mbps(SMALL_COUNT * MB, kUp), kDown: mbps(SMALL_COUNT * MB, kDown), rUp: mbps(SMALL_COUNT * MB, rUp), rDown: mbps(SMALL_COUNT * MB, rDown) };
  say(
    `1 MB objects (${SMALL_COUNT}, one at a time): upload ${f0(small.kUp)} MB/s vs raw ${f0(small.rUp)} MB/s (${f0((small.kUp / small.rUp) * 100)}%), ` +
      `download ${f0(small.kDown)} MB/s vs raw ${f0(small.rDown)} MB/s (${f0((small.kDown / small.rDown) * 100)}%)`,
  );

  // 2. Throughput, large objects (best of LARGE_RUNS each).
  const size = LARGE_MB * MB;
  const best = { kUp: 0, kRes: 0, kDown: 0, rUp: 0, rDown: 0, bareDown: 0 };
  // The HTTP ceiling for downloads: a bare Bun server (its own process, as Kiln) sending the raw file.
  const bare = spawn(BUN, ["-e", `const s = Bun.serve({ port: 0, fetch: (req) => new Response(Bun.file(${JSON.stringify(rawDir)} + new URL(req.url).pathname)) }); console.log(s.port);`], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const barePort = await new Promise<string>((ok) => bare.stdout!.once("data", (d) => ok(String(d).trim())));
  const bareDownload = async (name: string) => {
    let n = 0;
    for await (const c of (await fetch(`http://127.0.0.1:${barePort}/${name}`)).body as unknown as AsyncIterable<Uint8Array>) n += c.length;
    if (n !== size) throw new Error(`bare download: ${n} bytes`);
  };
  for (let run = 0; run < LARGE_RUNS; run++) {
    best.kUp = Math.max(best.kUp, mbps(size, await timed(() => upload("data", `large/${run}`, size))));
    best.kRes = Math.max(best.kRes, mbps(size, await timed(() => resumable("data", `large-r/${run}`, size))));
    best.kDown = Math.max(best.kDown, mbps(size, await timed(() => download("data", `large/${run}`))));
    best.rUp = Math.max(best.rUp, mbps(size, await timed(() => rawWrite(`large-${run}`, size))));
    best.rDown = Math.max(best.rDown, mbps(size, await timed(() => rawRead(`large-${run}`))));
    best.bareDown = Math.max(best.bareDown, mbps(size, await timed(() => bareDownload(`large-${run}`))));
    await remove("data", `large-r/${run}`);
  }
  say(
    `${LARGE_MB} MB objects (best of ${LARGE_RUNS}): upload ${f0(best.kUp)} MB/s vs raw ${f0(best.rUp)} MB/s (${f0((best.kUp / best.rUp) * 100)}%), ` +
      `resumable upload ${f0(best.kRes)} MB/s (${f0((best.kRes / best.rUp) * 100)}%), download ${f0(best.kDown)} MB/s vs raw ${f0(best.rDown)} MB/s (${f0((best.kDown / best.rDown) * 100)}%)   (target >= 50%)`,
  );
  say(`  (the same file from a bare Bun HTTP server to this client: ${f0(best.bareDown)} MB/s; Kiln's download is ${f0((best.kDown / best.bareDown) * 100)}% of that)`);
  bare.kill();
  for (let run = 0; run < LARGE_RUNS; run++) await remove("data", `large/${run}`);
  rmSync(rawDir, { recursive: true, force: true });

  // 3. 4 KB uploads per second, 8 concurrent clients.
  const four = new Uint8Array(4096);
  const smallUpload = async (bucket: string, path: string, bytes: Uint8Array) => {
    const form = new FormData();
    form.set("file", new Blob([bytes as BlobPart], { type: "application/octet-stream" }), "f");
    const r = await fetch(`${url}/storage/${bucket}/${path}`, { method: "POST", headers: auth, body: form });
    const text = await r.text();
    if (r.status !== 201) throw new Error(`upload ${path}: ${r.status} ${text}`);
  };
  let uploaded = 0;
  const until = performance.now() + SMALL_SECONDS * 1000;
  const t4 = performance.now();
  await Promise.all(Array.from({ length: 8 }, async () => {
    while (performance.now() < until) await smallUpload("small", `k/${uploaded++}`, four);
  }));
  const perSecond = uploaded / ((performance.now() - t4) / 1000);
  // The raw figure: the same durable write of 4 KB files, 8 at a time, for as long.
  mkdirSync(rawDir, { recursive: true });
  let written = 0;
  const rawUntil = performance.now() + SMALL_SECONDS * 1000;
  const tr = performance.now();
  await Promise.all(Array.from({ length: 8 }, async () => {
    while (performance.now() < rawUntil) await rawWrite(`four-${written++}`, 4096);
  }));
  const rawPerSecond = written / ((performance.now() - tr) / 1000);
  rmSync(rawDir, { recursive: true, force: true });
  say(`4 KB uploads: ${f0(perSecond)} per second (8 concurrent clients, ${uploaded} in ${SMALL_SECONDS} s) vs raw durable 4 KB file writes ${f0(rawPerSecond)} per second (${f0((perSecond / rawPerSecond) * 100)}%)`);

  // 4. Listing in a bucket of LIST_OBJECTS objects (filled through the API).
  const estimate = LIST_OBJECTS / perSecond;
  const target = estimate > FILL_BUDGET_S ? Math.min(20_000, LIST_OBJECTS) : LIST_OBJECTS;
  if (target !== LIST_OBJECTS) say(`(filling ${LIST_OBJECTS} objects at ${f0(perSecond)}/s would take ~${f0(estimate)} s, over FILL_BUDGET_S=${FILL_BUDGET_S}: aiming at ${target})`);
  const name = (i: number) => `f/${String(i).padStart(6, "0")}`;
  const tiny = new Uint8Array(16);
  let started = 0;
  let count = 0;
  const tf = performance.now();
  // The fill stops at the target, or when FILL_BUDGET_S is spent (the count is printed either way).
  const fillUntil = tf + FILL_BUDGET_S * 1000;
  const rates: string[] = [];
  let lastMark = tf;
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (started < target && performance.now() < fillUntil) {
      await smallUpload("list", name(started++), tiny);
      if (++count % 5000 === 0) {
        const now = performance.now();
        rates.push(f0(5000 / ((now - lastMark) / 1000)));
        lastMark = now;
      }
    }
  }));
  const fillS = (performance.now() - tf) / 1000;
  say(`filled a bucket with ${count} objects through the API in ${f0(fillS)} s (${f0(count / fillS)}/s, 16 clients; per 5000: ${rates.join(", ")}/s)`);
  const listMs = async (q: string) => {
    const t = performance.now();
    const r = await fetch(`${url}/storage/list${q}`, { headers: auth });
    const body = (await r.json()) as { objects: unknown[]; next_cursor: string | null };
    if (r.status !== 200) throw new Error(`list: ${r.status}`);
    return { ms: performance.now() - t, body };
  };
  for (let i = 0; i < 20; i++) await listMs("?limit=50");
  const first: number[] = [];
  for (let i = 0; i < 200; i++) first.push((await listMs("?limit=50")).ms);
  const prefixed: number[] = [];
  for (let i = 0; i < 200; i++) {
    const p = name(Math.floor(Math.random() * count)).slice(0, -2);
    const r = await listMs(`?limit=50&prefix=${encodeURIComponent(p)}`);
    if (r.body.objects.length === 0) throw new Error(`prefix ${p} matched nothing`);
    prefixed.push(r.ms);
  }
  const walk: number[] = [];
  let cursor: string | null = null;
  let seen = 0;
  do {
    const r: { ms: number; body: { objects: unknown[]; next_cursor: string | null } } = await listMs(`?limit=1000${cursor ? `&cursor=${cursor}` : ""}`);
    walk.push(r.ms);
    seen += r.body.objects.length;
    cursor = r.body.next_cursor;
  } while (cursor);
  if (seen !== count) throw new Error(`the walk saw ${seen} objects, not ${count}`);
  say(
    `listing ${count} objects (service key): first page of 50 p50 ${f2(pct(first, 50))} ms p99 ${f2(pct(first, 99))} ms; ` +
      `prefix query (limit 50) p50 ${f2(pct(prefixed, 50))} ms p99 ${f2(pct(prefixed, 99))} ms; ` +
      `cursor walk, ${walk.length} pages of 1000: p50 ${f2(pct(walk, 50))} ms p99 ${f2(pct(walk, 99))} ms   (target p50 < 20 ms)`,
  );

  // 5. Peak RSS during 1 GB transfers.
  const huge = HUGE_MB * MB;
  const memory = async (fn: () => Promise<unknown>) => {
    await new Promise((r) => setTimeout(r, 500));
    const idle: number[] = [];
    for (let i = 0; i < 5; i++) {
      idle.push(rssMb(pid));
      await new Promise((r) => setTimeout(r, 50));
    }
    const before = idle.reduce((a, b) => a + b) / idle.length;
    let peak = before;
    const timer = setInterval(() => (peak = Math.max(peak, rssMb(pid))), 50);
    const ms = await timed(fn);
    clearInterval(timer);
    peak = Math.max(peak, rssMb(pid));
    return { before, peak, growth: peak - before, mbps: mbps(huge, ms) };
  };
  const mPlain = await memory(() => upload("data", "huge/plain", huge));
  const mRes = await memory(() => resumable("data", "huge/resumable", huge));
  const mDown = await memory(() => download("data", "huge/plain"));
  for (const [label, m] of [
    [`${HUGE_MB} MB multipart upload`, mPlain],
    [`${HUGE_MB} MB resumable upload (4 parts in flight)`, mRes],
    [`${HUGE_MB} MB download`, mDown],
  ] as const)
    say(`${label}: RSS idle ${f0(m.before)} MB, peak ${f0(m.peak)} MB, growth ${f1(m.growth)} MB, ${f0(m.mbps)} MB/s   (target growth < 64 MB)`);

  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
}

await main();
