// Object storage benchmark (issue #13): through an embedded Kiln (filesystem blobs under its data dir)
// against the same bytes written to and read from the same disk directly, in the same run.
// Run: npm run bench:storage
// Targets: large-object throughput >= 50% of raw disk; listing p50 < 20 ms at 100k objects in a
// bucket; RSS growth < 64 MB during a 1 GB upload (plain and resumable) and a 1 GB download.
//
// - throughput: 1 MB objects (SMALL_COUNT of them, default 64, one after another, through fetch in
//   this process) and 256 MB objects (LARGE_RUNS, default 3, best run), uploaded as multipart/form-data
//   and resumably (25 MB parts, 4 in flight), and downloaded, against writing the same bytes to a file
//   in the same folder durably (temporary file, fsync, rename, folder fsync: what Kiln does) and
//   reading it back. The large transfers use curl when it is installed: a native client, a separate
//   process reading its file from the page cache, so the load generator takes little of the two
//   cores from Kiln (as a client on another machine would); fetch in this process otherwise (the
//   client is printed). Reads are measured twice: from disk (the file, Kiln's blob and the raw one
//   alike, evicted from the page cache first with `dd iflag=nocache count=0`, POSIX_FADV_DONTNEED)
//   and from the page cache (just read), where the raw read is a memory copy and HTTP itself is the
//   ceiling: a bare Bun server sending the same file to the same client is printed beside it;
// - 4 KB uploads per second: 8 concurrent clients for SMALL_SECONDS (default 5), against durable raw
//   4 KB file writes, 8 at a time;
// - listing: a bucket of LIST_OBJECTS (default 100,000) objects. SEED_API (default 1,000) of them are
//   uploaded through the API; the rest are seeded straight into the control store (Kiln stopped, its
//   PGlite opened here, rows copied from an uploaded one with a blob file each, the project's usage
//   total kept, ANALYZE), since the API takes minutes per 10k small uploads on this machine; then Kiln
//   starts again on the same data dir and every listing goes through HTTP: p50/p99 of a first page
//   (limit 50), of prefix queries that match 100 names (limit 50) and of every page of a full walk by
//   cursor (limit 1000);
// - memory: VmRSS of the Kiln process from /proc, every 50 ms, during a HUGE_MB (default 1024) MB
//   multipart upload, resumable upload (4 parts in flight) and download; growth over the RSS just
//   before each.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { open, rename } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openPglite } from "../server/store/pglite-store";
import { BUN, pct, startKiln, TOKEN } from "./support";

const MB = 1024 * 1024;
const SMALL_COUNT = Number(process.env.SMALL_COUNT ?? 64);
const LARGE_MB = Number(process.env.LARGE_MB ?? 256);
const LARGE_RUNS = Number(process.env.LARGE_RUNS ?? 3);
const HUGE_MB = Number(process.env.HUGE_MB ?? 1024);
const SMALL_SECONDS = Number(process.env.SMALL_SECONDS ?? 5);
const LIST_OBJECTS = Number(process.env.LIST_OBJECTS ?? 100_000);
const SEED_API = Math.min(LIST_OBJECTS, Number(process.env.SEED_API ?? 1000));
const CHUNK = MB;
const CURL = process.env.BENCH_CLIENT !== "fetch" && Bun.which("curl") ? Bun.which("curl")! : null;

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

/** Writes bytes [start, end) of the object of `size` bytes to `path` (a client's source file). */
async function writeSource(path: string, size: number, start = 0, end = size): Promise<void> {
  const fh = await open(path, "w");
  for (let i = start / CHUNK; i * CHUNK < end; i++) await fh.write(chunk(i, size));
  await fh.close();
}

/** Drops a file's pages from the page cache (they are clean: everything here was fsynced). */
function evict(path: string): void {
  const r = spawnSync("dd", [`if=${path}`, "iflag=nocache", "count=0", "status=none"]);
  if (r.status !== 0) throw new Error(`dd iflag=nocache on ${path}: ${r.stderr}`);
}

/** curl with `args`; its output to /dev/null; the HTTP status. */
async function curl(args: string[]): Promise<number> {
  const p = Bun.spawn([CURL!, "-sS", "-o", "/dev/null", "-w", "%{http_code}", ...args], { stdout: "pipe", stderr: "inherit" });
  const code = await new Response(p.stdout).text();
  await p.exited;
  return Number(code);
}

const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;
const mbps = (bytes: number, ms: number) => bytes / MB / (ms / 1000);
const f0 = (x: number) => x.toFixed(0);
const f1 = (x: number) => x.toFixed(1);
const f2 = (x: number) => x.toFixed(2);
const ratio = (a: number, b: number) => `${f0((a / b) * 100)}%`;

async function main() {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-storage-"));
  const rawDir = join(dir, "raw");
  const srcDir = join(dir, "client");
  const dataDir = join(dir, "kiln");
  let { url, proc } = await startKiln(dataDir);
  mkdirSync(rawDir, { recursive: true });
  mkdirSync(srcDir, { recursive: true });
  const api = async (method: string, path: string, body?: unknown, token = TOKEN) => {
    const r = await fetch(url + path, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : undefined;
  };
  const project = await api("POST", "/projects", { name: "bench-storage" });
  const sk = (await api("POST", `/projects/${project.id}/service-keys`, { name: "bench" })).key as string;
  const buckets: Record<string, string> = {};
  for (const name of ["data", "small", "list"]) buckets[name] = (await api("POST", `/projects/${project.id}/storage/buckets`, { name })).id;
  const auth = { authorization: `Bearer ${sk}` };
  /** The files behind the bucket's objects of `size` bytes (to evict from the page cache). */
  const blobPaths = (bucket: string, size: number) => {
    const folder = join(dataDir, "blobs", "storage", project.id, buckets[bucket]!);
    const files = readdirSync(folder, { withFileTypes: true })
      .filter((e) => e.isFile() && statSync(join(folder, e.name)).size === size)
      .map((e) => join(folder, e.name));
    if (!files.length) throw new Error(`no blob of ${size} bytes in ${folder}`);
    return files;
  };

  const uploadFetch = async (bucket: string, path: string, size: number) => {
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
  /** A multipart upload of `size` bytes; with curl, from `source` (a file of exactly those bytes). */
  const upload = async (bucket: string, path: string, size: number, source?: string) => {
    if (!CURL || !source) return uploadFetch(bucket, path, size);
    const status = await curl(["-H", `authorization: Bearer ${sk}`, "-F", `file=@${source};type=application/octet-stream`, `${url}/storage/${bucket}/${path}`]);
    if (status !== 201) throw new Error(`upload ${path}: ${status}`);
  };
  /** A resumable upload, 4 parts in flight; with curl, part n from `${sourceParts}.${n}`. */
  const resumable = async (bucket: string, path: string, size: number, sourceParts?: string, inFlight = 4) => {
    const s = await api("POST", `/storage/${bucket}/${path}`, { content_type: "application/octet-stream", total_size: size }, sk);
    let next = 1;
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        while (next <= s.total_parts) {
          const n = next++;
          const start = (n - 1) * s.part_size;
          const end = Math.min(size, start + s.part_size);
          const headers = { ...auth, "x-upload-session": s.session_id, "x-part-number": String(n), "content-type": "application/octet-stream" };
          if (CURL && sourceParts) {
            const status = await curl([...Object.entries(headers).flatMap(([k, v]) => ["-H", `${k}: ${v}`]), "-T", `${sourceParts}.${n}`, `${url}/storage/${bucket}/${path}`]);
            if (status !== 200) throw new Error(`part ${n}: ${status}`);
            continue;
          }
          const r = await fetch(`${url}/storage/${bucket}/${path}`, { method: "PUT", headers: { ...headers, "content-length": String(end - start) }, body: bodyStream(start, end), duplex: "half" } as RequestInit);
          const text = await r.text();
          if (r.status !== 200) throw new Error(`part ${n}: ${r.status} ${text}`);
        }
      }),
    );
    const r = await fetch(`${url}/storage/${bucket}/${path}`, { method: "POST", headers: { ...auth, "x-upload-session": s.session_id, "x-upload-complete": "true" } });
    const text = await r.text();
    if (r.status !== 200) throw new Error(`complete: ${r.status} ${text}`);
  };
  /** Writes the parts of a resumable upload's source as files `${base}.${n}` (25 MB parts). */
  const writeParts = async (base: string, size: number, partSize = 25 * MB) => {
    for (let n = 1; (n - 1) * partSize < size; n++) await writeSource(`${base}.${n}`, size, (n - 1) * partSize, Math.min(size, n * partSize));
  };
  const downloadFetch = async (target: string) => {
    const r = await fetch(target, { headers: auth });
    if (r.status !== 200) throw new Error(`download ${target}: ${r.status} ${await r.text()}`);
    let n = 0;
    for await (const c of r.body as unknown as AsyncIterable<Uint8Array>) n += c.length;
    return n;
  };
  const download = async (bucket: string, path: string, large = false) => {
    if (!CURL || !large) return downloadFetch(`${url}/storage/${bucket}/${path}`);
    const status = await curl(["-H", `authorization: Bearer ${sk}`, `${url}/storage/${bucket}/${path}`]);
    if (status !== 200) throw new Error(`download ${path}: ${status}`);
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

  const say = (s: string) => console.log(s);
  say(`client for large transfers: ${CURL ? `curl (${CURL})` : "fetch in this process"}; ${new Date().toISOString()}; load average ${readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ")}`);

  // 1. Throughput, 1 MB objects (fetch: one process, keep-alive; a curl per object would measure its start).
  await uploadFetch("data", "warm", MB);
  await download("data", "warm");
  let kUp = 0;
  let kDown = 0;
  let rUp = 0;
  let rDown = 0;
  for (let i = 0; i < SMALL_COUNT; i++) kUp += await timed(() => uploadFetch("data", `one/${i}`, MB));
  for (let i = 0; i < SMALL_COUNT; i++) kDown += await timed(() => download("data", `one/${i}`));
  for (let i = 0; i < SMALL_COUNT; i++) rUp += await timed(() => rawWrite(`one-${i}`, MB));
  for (let i = 0; i < SMALL_COUNT; i++) rDown += await timed(() => rawRead(`one-${i}`));
  const small = { kUp: mbps(SMALL_COUNT * MB, kUp), kDown: mbps(SMALL_COUNT * MB, kDown), rUp: mbps(SMALL_COUNT * MB, rUp), rDown: mbps(SMALL_COUNT * MB, rDown) };
  say(
    `1 MB objects (${SMALL_COUNT}, one at a time, fetch): upload ${f0(small.kUp)} MB/s vs raw ${f0(small.rUp)} MB/s (${ratio(small.kUp, small.rUp)}), ` +
      `download ${f0(small.kDown)} MB/s vs raw ${f0(small.rDown)} MB/s (${ratio(small.kDown, small.rDown)}; page cache)`,
  );

  // 2. Throughput, large objects (best of LARGE_RUNS each).
  const size = LARGE_MB * MB;
  const source = join(srcDir, "large.bin");
  await writeSource(source, size);
  await writeParts(join(srcDir, "large.part"), size);
  const best = { kUp: 0, kRes: 0, kDownCold: 0, kDownWarm: 0, rUp: 0, rDownCold: 0, rDownWarm: 0, bareDown: 0 };
  // The HTTP ceiling for downloads: a bare Bun server (its own process, as Kiln) sending the raw file.
  const bare = spawn(BUN, ["-e", `const s = Bun.serve({ port: 0, fetch: (req) => new Response(Bun.file(${JSON.stringify(rawDir)} + new URL(req.url).pathname)) }); console.log(s.port);`], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const barePort = await new Promise<string>((ok) => bare.stdout!.once("data", (d) => ok(String(d).trim())));
  const bareDownload = async (name: string) => {
    if (CURL) return void (await curl([`http://127.0.0.1:${barePort}/${name}`]));
    const n = await downloadFetch(`http://127.0.0.1:${barePort}/${name}`);
    if (n !== size) throw new Error(`bare download: ${n} bytes`);
  };
  for (let run = 0; run < LARGE_RUNS; run++) {
    best.kUp = Math.max(best.kUp, mbps(size, await timed(() => upload("data", `large/${run}`, size, source))));
    best.kRes = Math.max(best.kRes, mbps(size, await timed(() => resumable("data", `large-r/${run}`, size, join(srcDir, "large.part")))));
    best.rUp = Math.max(best.rUp, mbps(size, await timed(() => rawWrite(`large-${run}`, size))));
    // From disk: both files evicted first.
    for (const f of blobPaths("data", size)) evict(f);
    best.kDownCold = Math.max(best.kDownCold, mbps(size, await timed(() => download("data", `large/${run}`, true))));
    evict(join(rawDir, `large-${run}`));
    best.rDownCold = Math.max(best.rDownCold, mbps(size, await timed(() => rawRead(`large-${run}`))));
    // From the page cache: both were just read.
    best.kDownWarm = Math.max(best.kDownWarm, mbps(size, await timed(() => download("data", `large/${run}`, true))));
    best.rDownWarm = Math.max(best.rDownWarm, mbps(size, await timed(() => rawRead(`large-${run}`))));
    best.bareDown = Math.max(best.bareDown, mbps(size, await timed(() => bareDownload(`large-${run}`))));
    await remove("data", `large-r/${run}`);
    await remove("data", `large/${run}`);
    rmSync(join(rawDir, `large-${run}`), { force: true });
  }
  say(
    `${LARGE_MB} MB objects (best of ${LARGE_RUNS}): upload ${f0(best.kUp)} MB/s vs raw ${f0(best.rUp)} MB/s (${ratio(best.kUp, best.rUp)}), ` +
      `resumable upload ${f0(best.kRes)} MB/s (${ratio(best.kRes, best.rUp)}); download from disk ${f0(best.kDownCold)} MB/s vs raw ${f0(best.rDownCold)} MB/s (${ratio(best.kDownCold, best.rDownCold)})   (target >= 50%)`,
  );
  say(
    `  from the page cache: download ${f0(best.kDownWarm)} MB/s vs raw ${f0(best.rDownWarm)} MB/s (${ratio(best.kDownWarm, best.rDownWarm)}: a memory copy); ` +
      `the same file from a bare Bun HTTP server to this client: ${f0(best.bareDown)} MB/s, Kiln's download is ${ratio(best.kDownWarm, best.bareDown)} of that`,
  );
  bare.kill();
  rmSync(rawDir, { recursive: true, force: true });
  rmSync(srcDir, { recursive: true, force: true });
  mkdirSync(srcDir, { recursive: true });

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
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (performance.now() < until) await smallUpload("small", `k/${uploaded++}`, four);
    }),
  );
  const perSecond = uploaded / ((performance.now() - t4) / 1000);
  // The raw figure: the same durable write of 4 KB files, 8 at a time, for as long.
  mkdirSync(rawDir, { recursive: true });
  let written = 0;
  const rawUntil = performance.now() + SMALL_SECONDS * 1000;
  const tr = performance.now();
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (performance.now() < rawUntil) await rawWrite(`four-${written++}`, 4096);
    }),
  );
  const rawPerSecond = written / ((performance.now() - tr) / 1000);
  rmSync(rawDir, { recursive: true, force: true });
  say(`4 KB uploads: ${f0(perSecond)} per second (8 concurrent clients, ${uploaded} in ${SMALL_SECONDS} s) vs raw durable 4 KB file writes ${f0(rawPerSecond)} per second (${ratio(perSecond, rawPerSecond)})`);

  // 4. Listing in a bucket of LIST_OBJECTS objects: SEED_API through the API, the rest seeded.
  const name = (i: number) => `f/${String(i).padStart(6, "0")}`;
  const tiny = new Uint8Array(16);
  let started = 0;
  const tf = performance.now();
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (started < SEED_API) await smallUpload("list", name(started++), tiny);
    }),
  );
  const apiS = (performance.now() - tf) / 1000;
  const seeded = LIST_OBJECTS - SEED_API;
  let seedS = 0;
  if (seeded > 0) {
    proc.kill("SIGTERM");
    await new Promise((r) => proc.once("exit", r));
    const ts = performance.now();
    const db = await openPglite(join(dataDir, "control"));
    const [tpl] = (await db.query<Record<string, unknown>>(`select * from storage_objects where bucket_id = $1 and name = $2`, [buckets.list, name(0)])).rows;
    if (!tpl) throw new Error("no uploaded object to copy");
    // A blob file for every seeded object, as an upload would leave (not fsynced: a bench's data).
    const folder = join(dataDir, "blobs", "storage", project.id, buckets.list!);
    const seedId = (i: number) => `s${String(i).padStart(19, "0")}`;
    for (let i = SEED_API; i < LIST_OBJECTS; i++) writeFileSync(join(folder, `${seedId(i)}.v1`), tiny);
    await db.query(
      `insert into storage_objects (id, project_id, bucket_id, name, owner_id, size, mime_type, etag, is_public, metadata, blob_key, created_at, updated_at)
       select 's' || lpad(i::text, 19, '0'), project_id, bucket_id, 'f/' || lpad(i::text, 6, '0'), owner_id, size, mime_type, etag, is_public, metadata,
              project_id || '/' || bucket_id || '/s' || lpad(i::text, 19, '0') || '.v1', created_at, updated_at
         from storage_objects, generate_series($3::int, $4::int) as i where bucket_id = $1 and name = $2`,
      [buckets.list, name(0), SEED_API, LIST_OBJECTS - 1],
    );
    await db.query(`update storage_project_usage set bytes = bytes + $2 where project_id = $1`, [project.id, seeded * tiny.length]);
    await db.query("analyze storage_objects");
    await db.close();
    seedS = (performance.now() - ts) / 1000;
    ({ url, proc } = await startKiln(dataDir));
  }
  say(`listing bucket: ${SEED_API} objects uploaded through the API in ${f0(apiS)} s (${f0(SEED_API / apiS)}/s, 16 clients), ${seeded} seeded into the control store in ${f0(seedS)} s`);
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
    const p = name(Math.floor(Math.random() * LIST_OBJECTS)).slice(0, -2);
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
  if (seen !== LIST_OBJECTS) throw new Error(`the walk saw ${seen} objects, not ${LIST_OBJECTS}`);
  say(
    `listing ${LIST_OBJECTS} objects (service key, HTTP): first page of 50 p50 ${f2(pct(first, 50))} ms p99 ${f2(pct(first, 99))} ms; ` +
      `prefix query (limit 50) p50 ${f2(pct(prefixed, 50))} ms p99 ${f2(pct(prefixed, 99))} ms; ` +
      `cursor walk, ${walk.length} pages of 1000: p50 ${f2(pct(walk, 50))} ms p99 ${f2(pct(walk, 99))} ms   (target p50 < 20 ms)`,
  );

  // 5. Peak RSS during 1 GB transfers.
  const huge = HUGE_MB * MB;
  const hugeSource = join(srcDir, "huge.bin");
  if (CURL) {
    await writeSource(hugeSource, huge);
    await writeParts(join(srcDir, "huge.part"), huge);
  }
  const pid = proc.pid!;
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
  // Warm-up: every path once (the MD5 thread starts at the first large upload).
  await upload("data", "huge/warm", 8 * MB);
  await resumable("data", "huge/warm-r", 12 * MB);
  const mPlain = await memory(() => upload("data", "huge/plain", huge, hugeSource));
  const mRes = await memory(() => resumable("data", "huge/resumable", huge, join(srcDir, "huge.part")));
  const mDown = await memory(() => download("data", "huge/plain", true));
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
