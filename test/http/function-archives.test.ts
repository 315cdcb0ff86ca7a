// Hostile and malformed source archives through a real Kiln: every one is a 400 naming the problem
// and the entry, on the single deploy route and in a batch (where it is that function's `failed`
// error and the others still deploy), and archive bombs are refused without the Kiln process's
// memory growing with the expansion.
import { readFileSync, writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { beforeAll, describe, expect, test } from "vitest";
import { deflatedZeros, tarBytes, tarGz, tarGzBomb, tarHeader, zip, zipBomb } from "../support/archives";
import { deploy, settled } from "../support/functions";
import { createProject, PRODUCT_ALLOCATOR, useKiln } from "../support/kiln";

// Measures Kiln's memory: the allocator as users run it.
const k = useKiln({ env: PRODUCT_ALLOCATOR });
const GiB = 1 << 30;
const MiB = 1 << 20;
const index = { name: "index.js", data: "exports.handler = async () => 'ok';" };

interface Case {
  label: string;
  archive: () => Buffer | Promise<Buffer>;
  error: string | RegExp;
}

/** One buffer of `count` tar entries (index.js, then empty files), gzipped. */
function manyEntries(count: number): Buffer {
  const out = Buffer.alloc((count + 3) * 512);
  tarBytes([index], false).copy(out);
  for (let i = 1; i < count; i++) tarHeader(`lib/${i}.js`).copy(out, (i + 1) * 512);
  return gzipSync(out, { level: 1 });
}

// Kiln's default limit is 50 MB for the upload and the normalized archive, 500 MB unpacked.
const CASES: Case[] = [
  { label: "a file 'a' and a file 'a/b'", archive: () => tarGz([index, { name: "a", data: "1" }, { name: "a/b", data: "2" }]), error: "archive entry 'a/b' needs 'a' to be a directory, but it is a file" },
  { label: "'a/b' before a file 'a' (zip)", archive: () => zip([index, { name: "a/b", data: "2" }, { name: "a", data: "1" }]), error: "archive entry 'a' is a file, but 'a/b' needs it to be a directory" },
  { label: "a file and a directory with one path (zip)", archive: () => zip([index, { name: "lib", data: "1" }, { name: "lib/" }]), error: "archive entry 'lib/' is a directory, but the archive also has 'lib' as a file" },
  { label: "a duplicate entry", archive: () => zip([index, { name: "./index.js", data: "again" }]), error: "archive entry 'index.js' appears more than once" },
  { label: "a 300-character name", archive: () => tarGz([index, { name: "x".repeat(300), data: "1" }]), error: `archive entry name has a component longer than 255 bytes: '${"x".repeat(100)}…' (300 bytes)` },
  { label: "a 1,219-byte path", archive: () => tarGz([index, { name: Array.from({ length: 20 }, () => "d".repeat(60)).join("/"), data: "1" }]), error: /^archive entry name is longer than 1024 bytes: / },
  { label: "a NUL byte in a name (tar)", archive: () => tarGz([index, { name: "a\0b.js", data: "1" }]), error: "archive entry name contains a NUL byte: 'a\\0b.js'" },
  { label: "a NUL byte in a name (zip)", archive: () => zip([index, { name: "a\0b.js", data: "1" }]), error: "archive entry name contains a NUL byte: 'a\\0b.js'" },
  { label: "a 3,000-level deep path", archive: () => tarGz([index, { name: `${"a/".repeat(3000)}f`, data: "1" }]), error: /^archive entry 'a\/a\/a.*' \(6001 bytes\) is nested 3001 levels deep; the limit is 64$/ },
  { label: "'.service/function-build.json/x'", archive: () => tarGz([index, { name: ".service/function-build.json/x", data: "1" }]), error: /^archive entry '\.service\/function-build\.json\/x' is reserved: '\.service' is the platform's directory/ },
  { label: "another file under '.service/'", archive: () => zip([index, { name: ".service/hooks.json", data: "{}" }]), error: /^archive entry '\.service\/hooks\.json' is reserved/ },
  { label: "a symlink", archive: () => tarGz([index, { name: "passwd", type: "2", linkname: "/etc/passwd" }]), error: "archive entry 'passwd' is a symlink; links are not allowed" },
  { label: "a hard link", archive: () => tarGz([index, { name: "copy.js", type: "1", linkname: "index.js" }]), error: "archive entry 'copy.js' is a hard link; links are not allowed" },
  { label: "a zip symlink", archive: () => zip([index, { name: "passwd", data: "/etc/passwd", mode: 0o120777 }]), error: "archive entry 'passwd' is a symlink; links are not allowed" },
  { label: "a device", archive: () => tarGz([index, { name: "null", type: "3" }]), error: "archive entry 'null' is a character device; only files and directories are allowed" },
  { label: "a FIFO", archive: () => tarGz([index, { name: "pipe", type: "6" }]), error: "archive entry 'pipe' is a FIFO; only files and directories are allowed" },
  { label: "a '..' component", archive: () => tarGz([index, { name: "lib/../../outside.js", data: "1" }]), error: "archive entry 'lib/../../outside.js' escapes the archive root ('..' is not allowed in entry names)" },
  { label: "an absolute path", archive: () => zip([index, { name: "/etc/cron.d/x", data: "1" }]), error: "archive entry '/etc/cron.d/x' has an absolute path" },
  { label: "an empty name", archive: () => zip([index, { name: "", data: "1" }]), error: "archive has a file entry with an empty name ('')" },
  { label: "100,001 entries", archive: () => manyEntries(100_001), error: "archive has more than 100000 entries" },
  { label: "a zip entry unpacking past its declared size", archive: () => zip([{ ...index, uncompressedSize: 5 }]), error: "archive entry 'index.js' unpacks to more than the 5 bytes its header declares" },
  { label: "a zip entry whose data overflows the file", archive: () => zip([{ ...index, compressedSize: 1_000_000 }]), error: /^archive entry 'index\.js' cannot be read: file data overflows file bounds/ },
  { label: "a zip64 entry declaring 1 TiB", archive: () => zip([{ ...index, zip64: { uncompressed: 1n << 40n, compressed: 30n } }]), error: "archive unpacks to more than 500 MB (the limit is reached at entry 'index.js')" },
  { label: "an invalid gzip stream", archive: () => Buffer.concat([Buffer.from([0x1f, 0x8b, 8, 0]), Buffer.from("not deflate data")]), error: /^not a readable tar\.gz archive: / },
  { label: "a truncated tar", archive: () => gzipSync(tarBytes([index, { name: "lib.js", data: "y".repeat(3000) }]).subarray(0, 2048)), error: "not a readable tar.gz archive: it is truncated inside entry 'lib.js'" },
  { label: "a tar.gz bomb: one 1 GiB entry", archive: () => tarGzBomb(1, GiB), error: "archive unpacks to more than 500 MB (the limit is reached at entry 'f0')" },
  { label: "a tar.gz bomb: 1,024 entries of 1 MiB", archive: () => tarGzBomb(1024, MiB), error: "archive unpacks to more than 500 MB (the limit is reached at entry 'f499')" },
  { label: "a zip bomb: 1,024 entries of 1 MiB", archive: async () => zipBomb(1024, MiB, await deflatedZeros(MiB)), error: "archive unpacks to more than 500 MB (the limit is reached at entry 'f499')" },
  { label: "a zip entry declaring 1,000 bytes and unpacking to 1 GiB", archive: () => lyingZip, error: "archive entry 'index.js' unpacks to more than the 1000 bytes its header declares" },
];

let lyingZip: Buffer;
const archives = new Map<string, Buffer>();
beforeAll(async () => {
  lyingZip = zip([{ name: "index.js", raw: await deflatedZeros(GiB), uncompressedSize: 1000 }]);
  for (const c of CASES) archives.set(c.label, await c.archive());
}, 120_000);

const matches = (actual: string, expected: string | RegExp) => (typeof expected === "string" ? actual === expected : expected.test(actual));

describe("hostile archives are a 400 naming the problem and the entry", () => {
  test("POST /projects/{id}/functions", async () => {
    const p = await createProject(k);
    const wrong: string[] = [];
    for (const c of CASES) {
      const r = await deploy(k, p.id, { name: "hostile", runtime: "nodejs22.x" }, archives.get(c.label)!);
      if (r.status !== 400 || !matches(r.body.error, c.error)) wrong.push(`${c.label}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    expect(wrong).toEqual([]);
    // Nothing was created, and Kiln is still fine.
    expect((await k.api("GET", `/projects/${p.id}/functions`)).body.total).toBe(0);
  }, 120_000);

  test("POST /projects/{id}/functions/batch: each is its function's failure; a good one beside them deploys", async () => {
    const p = await createProject(k);
    const form = new FormData();
    const list = CASES.map((c, i) => ({ name: `hostile-${i}`, runtime: "nodejs22.x", file_field: `f${i}` }));
    form.set("functions", JSON.stringify([...list, { name: "good", runtime: "nodejs22.x", file_field: "good" }]));
    CASES.forEach((c, i) => form.set(`f${i}`, new Blob([new Uint8Array(archives.get(c.label)!)]), `f${i}`));
    form.set("good", new Blob([new Uint8Array(tarGz([index]))]), "good.tgz");
    const res = await fetch(`${k.url}/projects/${p.id}/functions/batch`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    const body = (await res.json()) as any;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body.functions.map((f: any) => f.name)).toEqual(["good"]);
    const wrong = CASES.flatMap((c, i) => {
      const f = body.failed.find((x: any) => x.name === `hostile-${i}`);
      return f && matches(f.error, c.error) ? [] : [`${c.label}: ${JSON.stringify(f)}`];
    });
    expect(wrong).toEqual([]);
    expect((await settled(k, p.id, body.functions[0].id)).status).toBe("active");
  }, 120_000);
});

/** The Kiln process's memory from /proc: current and peak resident set, in bytes. */
function memory(pid: number) {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)![1]) * 1024;
  return { rss: kb("VmRSS"), peak: kb("VmHWM") };
}

/** Runs `fn` and returns how much the Kiln process's resident set grew at its peak meanwhile. */
async function growth<T>(fn: () => Promise<T>): Promise<{ result: T; growth: number; note: string }> {
  const pid = k.proc.pid!;
  // Reset the peak (VmHWM) to the current resident set, where the kernel allows it.
  let reset = true;
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, "5");
  } catch {
    reset = false;
  }
  const before = memory(pid);
  const result = await fn();
  const after = memory(pid);
  // Without a reset, an unchanged peak is an older one (start-up): then only the resident set tells.
  const peak = reset || after.peak > before.peak ? after.peak : after.rss;
  return { result, growth: peak - before.rss, note: `peak ${peak >> 20} MB, before ${before.rss >> 20} MB (peak reset: ${reset})` };
}

describe("memory stays bounded", () => {
  test.each([
    "a tar.gz bomb: one 1 GiB entry",
    "a tar.gz bomb: 1,024 entries of 1 MiB",
    "a zip bomb: 1,024 entries of 1 MiB",
    "a zip entry declaring 1,000 bytes and unpacking to 1 GiB",
  ])("%s: 400, and Kiln's resident set grows by less than 64 MB", async (label) => {
    const c = CASES.find((x) => x.label === label)!;
    const p = await createProject(k);
    // Warm up the deploy path (modules, JIT) with a small archive, so the measurement is the bomb's.
    expect((await deploy(k, p.id, { name: "warm", runtime: "nodejs22.x" }, tarGz([index]))).status).toBe(201);
    const { result: r, growth: g, note } = await growth(() => deploy(k, p.id, { name: "bomb", runtime: "nodejs22.x" }, archives.get(label)!));
    expect(r.status).toBe(400);
    expect(matches(r.body.error, c.error), r.body.error).toBe(true);
    expect(g, note).toBeLessThan(64 * MiB);
  }, 60_000);

  test.each(["tgz", "zip"] as const)("%s: 400 MiB unpacked, under the limit, is accepted, normalized and built in memory far below that", async (kind) => {
    const p = await createProject(k);
    expect((await deploy(k, p.id, { name: "warm", runtime: "nodejs22.x" }, tarGz([index]))).status).toBe(201);
    const code = kind === "tgz" ? tarGzBomb(400, MiB) : zipBomb(400, MiB, await deflatedZeros(MiB));
    const { result, growth: g, note } = await growth(async () => {
      const d = await deploy(k, p.id, { name: "big", runtime: "nodejs22.x" }, code);
      expect(d.status, JSON.stringify(d.body)).toBe(201);
      return settled(k, p.id, d.body.id);
    });
    expect(result.status).toBe("active");
    // 8 MiB of contents held in memory, the rest spooled; spent zlib chunks are collected every
    // 8 MiB streamed, but asynchronously: measured +35-60 MB under load, never near the 400 MiB.
    expect(g, note).toBeLessThan(96 * MiB);
    const sk = (await k.api("POST", `/projects/${p.id}/service-keys`, { body: { name: "s" } })).body.key as string;
    expect((await k.api("POST", `/functions/${result.id}/invoke`, { token: sk, body: { payload: null } })).body).toBe("ok");
    expect((await k.api("DELETE", `/projects/${p.id}/functions/${result.id}`)).status).toBe(202);
  }, 120_000);
});
