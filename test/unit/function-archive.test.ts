import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, test } from "vitest";
import { ArchiveError, extractSource, inferRoots, normalizeSource } from "../../server/functions/archive";
import { deflatedZeros, tarBytes, tarGz, tarGzBomb, tarHeader, zip, zipBomb } from "../support/archives";

const work = mkdtempSync(join(tmpdir(), "kiln-archive-test-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
let n = 0;

/** Writes files into a fresh folder and packs it with the system zip or tar, as users would. */
function pack(kind: "zip" | "tgz", files: Record<string, string>, extra?: (dir: string) => void): Uint8Array {
  const dir = join(work, `src-${++n}`);
  for (const [p, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, p)), { recursive: true });
    writeFileSync(join(dir, p), content);
  }
  mkdirSync(dir, { recursive: true });
  extra?.(dir);
  const out = join(work, `a-${n}.${kind}`);
  if (kind === "zip") execFileSync("zip", ["-qry", out, "."], { cwd: dir });
  else execFileSync("tar", ["-czf", out, "-C", dir, "."]);
  return readFileSync(out);
}

const limits = { uploadBytes: 5 * 1_048_576, normalizedBytes: 5 * 1_048_576, extractedBytes: 20 * 1_048_576 };
const norm = (buf: Uint8Array, runtime = "nodejs22.x") => normalizeSource(buf, { runtime, handler: "handler", limits });

async function unpack(tarGz: Uint8Array): Promise<Record<string, string>> {
  const dir = join(work, `out-${++n}`);
  mkdirSync(dir);
  await extractSource(tarGz, dir);
  const out: Record<string, string> = {};
  const walk = (d: string, prefix = "") => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const rel = prefix ? `${prefix}/${e.name}` : e.name;
      if (e.isDirectory()) walk(join(d, e.name), rel);
      else out[rel] = readFileSync(join(d, e.name), "utf8");
    }
  };
  walk(dir);
  return out;
}

describe("normalizeSource", () => {
  test.each(["zip", "tgz"] as const)("%s: keeps sources, drops installed dependencies, writes function-build.json", async (kind) => {
    const r = await norm(
      pack(kind, {
        "index.js": "exports.handler = async () => 1",
        "package.json": "{}",
        "lib/util.js": "x",
        "node_modules/left-pad/index.js": "y",
        "lib/vendor/thing.rb": "z",
        ".venv/bin/python": "p",
      }),
    );
    expect(r.files).toEqual([".service/function-build.json", "index.js", "lib/util.js", "package.json"]);
    expect(r.dropped).toEqual([".venv", "lib/vendor", "node_modules"]);
    expect(r.build).toEqual({ function_root: ".", install_root: ".", entry: "index.js", runtime: "nodejs22.x", handler: "handler" });
    const files = await unpack(r.tarGz);
    expect(JSON.parse(files[".service/function-build.json"]!)).toEqual(r.build);
    expect(files["index.js"]).toBe("exports.handler = async () => 1");
    expect(r.sha256).toMatch(/^[0-9a-f]{64}$/);
  });

  test("the same source gives the same bytes, whatever the archive format", async () => {
    const files = { "main.py": "def handler(e, c): return 1", "requirements.txt": "" };
    const a = await norm(pack("zip", files), "python3.11");
    const b = await norm(pack("tgz", files), "python3.11");
    expect(a.sha256).toBe(b.sha256);
  });

  test.each(["zip", "tgz"] as const)("%s: symlinks are refused", async (kind) => {
    const buf = pack(kind, { "index.js": "x" }, (dir) => symlinkSync("/etc/passwd", join(dir, "passwd")));
    await expect(norm(buf)).rejects.toThrow(/symlink/);
  });

  test("paths escaping the root, garbage and empty archives are refused", async () => {
    const dir = join(work, "evil");
    mkdirSync(join(dir, "a"), { recursive: true });
    writeFileSync(join(work, "outside.js"), "x");
    execFileSync("tar", ["-czf", join(work, "evil.tgz"), "-C", dir, "-P", "../outside.js"]);
    await expect(norm(readFileSync(join(work, "evil.tgz")))).rejects.toThrow(/escapes the archive root/);
    await expect(norm(new TextEncoder().encode("not an archive"))).rejects.toThrow(/ZIP or tar\.gz/);
    await expect(norm(pack("tgz", {}))).rejects.toThrow(/no files/);
  });

  test("size limits apply to the upload, the unpacked content and the normalized archive", async () => {
    const big = pack("tgz", { "index.js": "x".repeat(300_000) });
    await expect(normalizeSource(big, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, uploadBytes: 100 } })).rejects.toThrow(ArchiveError);
    await expect(normalizeSource(big, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, extractedBytes: 100_000 } })).rejects.toThrow(/unpacks to more than/);
    const random = pack("tgz", { "index.js": Buffer.from(crypto.getRandomValues(new Uint8Array(60_000))).toString("base64") });
    await expect(normalizeSource(random, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, normalizedBytes: 10_000 } })).rejects.toThrow(/normalized source archive is larger/);
  });

  test("the reserved .service-dependencies path is accepted and flagged; an uploaded build file is replaced", async () => {
    const r = await norm(pack("zip", { "index.js": "x", ".service-dependencies/x": "y", ".service/function-build.json": '{"function_root":"/etc"}' }));
    expect(r.reservedPath).toBe(true);
    expect(r.build.function_root).toBe(".");
    expect(JSON.parse((await unpack(r.tarGz))[".service/function-build.json"]!).function_root).toBe(".");
  });
});

describe("rule 6: function and install roots", () => {
  test("the single entry file decides the function root; the closest manifest above it the install root", () => {
    expect(inferRoots(["packages/api/index.js", "package.json", "packages/web/app.js"], "nodejs22.x")).toEqual({
      function_root: "packages/api",
      install_root: ".",
      entry: "index.js",
    });
    expect(inferRoots(["svc/main.py", "svc/requirements.txt", "README.md"], "python3.12")).toEqual({ function_root: "svc", install_root: "svc", entry: "main.py" });
    expect(inferRoots(["app/main.rb"], "ruby3.3")).toEqual({ function_root: "app", install_root: "app", entry: "main.rb" });
  });
  test("without a single entry, the only top-level directory; otherwise the root", () => {
    expect(inferRoots(["fn/a.js", "fn/b/index.js", "fn/c/index.js"], "nodejs22.x").function_root).toBe("fn");
    expect(inferRoots(["a/index.js", "b/index.js"], "nodejs22.x")).toMatchObject({ function_root: ".", entry: null });
    expect(inferRoots(["index.mjs", "package.json"], "nodejs24.x")).toMatchObject({ function_root: ".", entry: "index.mjs" });
  });
});

// Hostile and malformed archives: each is a 400-style ArchiveError naming the problem and the entry.
describe("archive rules", () => {
  const file = (name: string, data = "x") => ({ name, data });
  const rejects = async (buf: Uint8Array, message: RegExp | string, o: { limits?: Partial<typeof limits> } = {}) => {
    const err = await normalizeSource(buf, { runtime: "nodejs22.x", handler: "handler", limits: { ...limits, ...o.limits } }).then(
      () => null,
      (e) => e,
    );
    expect(err, `expected a refusal matching ${message}`).toBeInstanceOf(ArchiveError);
    if (typeof message === "string") expect(err.message).toBe(message);
    else expect(err.message).toMatch(message);
  };
  const both = (entries: { name: string; data?: string; type?: string; mode?: number }[]) => ({
    tgz: tarGz(entries.map((e) => ({ ...e, type: e.type ?? (e.name.endsWith("/") ? "5" : "0") }))),
    zip: zip(entries.map((e) => ({ name: e.name, data: e.data, mode: e.mode }))),
  });

  test.each(["tgz", "zip"] as const)("%s: a file where a directory must be, and the reverse, name both entries", async (kind) => {
    await rejects(both([file("index.js"), file("a"), file("a/b")])[kind], "archive entry 'a/b' needs 'a' to be a directory, but it is a file");
    await rejects(both([file("a/b/c"), file("a/b")])[kind], "archive entry 'a/b' is a file, but 'a/b/c' needs it to be a directory");
    await rejects(both([file("a"), { name: "a/" }])[kind], "archive entry 'a/' is a directory, but the archive also has 'a' as a file");
    await rejects(both([{ name: "a/" }, file("a")])[kind], "archive entry 'a' is a file, but 'a/' needs it to be a directory");
    await rejects(both([file("x/a/b"), file("x/a/b/c/d")])[kind], "archive entry 'x/a/b/c/d' needs 'x/a/b' to be a directory, but it is a file");
  });

  test.each(["tgz", "zip"] as const)("%s: an entry twice (also after normalization) is refused; a directory twice is fine", async (kind) => {
    await rejects(both([file("index.js"), file("index.js")])[kind], "archive entry 'index.js' appears more than once");
    await rejects(both([file("lib/a.js"), file("./lib//a.js")])[kind], "archive entry 'lib/a.js' appears more than once");
    const r = await norm(both([{ name: "lib/" }, { name: "./lib/" }, file("lib/a.js"), file("index.js")])[kind]);
    expect(r.files).toEqual([".service/function-build.json", "index.js", "lib/a.js"]);
  });

  test("names: NUL bytes, long components, long paths, deep paths (pax, GNU long names and ZIP)", async () => {
    for (const longName of ["pax", "gnu"] as const) {
      const t = (name: string) => tarGz([{ name: "index.js", data: "x" }, { name, data: "y", longName }]);
      await rejects(t("a\0b.js"), "archive entry name contains a NUL byte: 'a\\0b.js'");
      await rejects(t("x".repeat(300)), `archive entry name has a component longer than 255 bytes: '${"x".repeat(100)}…' (300 bytes)`);
      await rejects(t(Array.from({ length: 20 }, () => "d".repeat(60)).join("/")), /^archive entry name is longer than 1024 bytes: 'd{60}\/d{39}…' \(1219 bytes\)$/);
      await rejects(t(`${"a/".repeat(3000)}f`), /^archive entry 'a\/a\/.*…' \(6001 bytes\) is nested 3001 levels deep; the limit is 64$/);
    }
    await rejects(zip([{ name: "index.js", data: "x" }, { name: "a\0b.js", data: "y" }]), "archive entry name contains a NUL byte: 'a\\0b.js'");
    await rejects(zip([{ name: "x".repeat(300), data: "y" }]), /component longer than 255 bytes/);
    await rejects(zip([{ name: `${"a/".repeat(3000)}f`, data: "y" }]), /is nested 3001 levels deep; the limit is 64/);
    // Right at the limits: accepted, and the names survive normalization (a pax header for > 100 bytes).
    const deep = `${"d/".repeat(63)}f.js`;
    const wide = `${"w".repeat(255)}/${"v".repeat(252)}.js`;
    const r = await norm(tarGz([{ name: "index.js", data: "x" }, { name: deep, data: "deep" }, { name: wide, data: "wide" }]));
    const out = await unpack(r.tarGz);
    expect(out[deep]).toBe("deep");
    expect(out[wide]).toBe("wide");
  });

  test.each(["tgz", "zip"] as const)("%s: '..' anywhere, absolute paths and empty file names are refused", async (kind) => {
    await rejects(both([file("index.js"), file("../x.js")])[kind], "archive entry '../x.js' escapes the archive root ('..' is not allowed in entry names)");
    await rejects(both([file("index.js"), file("a/../../x.js")])[kind], /'a\/\.\.\/\.\.\/x\.js' escapes the archive root/);
    await rejects(both([file("index.js"), file("a/../b.js")])[kind], /'a\/\.\.\/b\.js' escapes the archive root/);
    await rejects(both([file("/etc/x")])[kind], "archive entry '/etc/x' has an absolute path");
    await rejects(both([file("index.js"), file("")])[kind], "archive has a file entry with an empty name ('')");
    await rejects(tarGz([{ name: "index.js", data: "x" }, { name: ".", data: "y" }]), "archive has a file entry with an empty name ('.')");
  });

  test("the reserved .service directory: only an uploaded function-build.json is tolerated (and replaced)", async () => {
    for (const kind of ["tgz", "zip"] as const) {
      await rejects(both([file("index.js"), file(".service/function-build.json/x")])[kind], /^archive entry '\.service\/function-build\.json\/x' is reserved: '\.service' is the platform's directory/);
      await rejects(both([file("index.js"), file(".service/other.json")])[kind], /^archive entry '\.service\/other\.json' is reserved/);
      await rejects(both([file("index.js"), file(".service")])[kind], /^archive entry '\.service' is reserved/);
      await rejects(both([file("index.js"), { name: ".service/function-build.json/" }])[kind], /^archive entry '\.service\/function-build\.json' is reserved/);
      const r = await norm(both([{ name: ".service/" }, file(".service/function-build.json", "{}"), file("index.js")])[kind]);
      expect(r.files).toEqual([".service/function-build.json", "index.js"]);
    }
  });

  test("links, devices and unknown tar types are refused; ZIP file types come from the unix mode", async () => {
    const t = (e: { name: string; type: string; linkname?: string }) => tarGz([{ name: "index.js", data: "x" }, e]);
    await rejects(t({ name: "p", type: "2", linkname: "/etc/passwd" }), "archive entry 'p' is a symlink; links are not allowed");
    await rejects(t({ name: "h", type: "1", linkname: "index.js" }), "archive entry 'h' is a hard link; links are not allowed");
    await rejects(t({ name: "tty", type: "3" }), "archive entry 'tty' is a character device; only files and directories are allowed");
    await rejects(t({ name: "sda", type: "4" }), "archive entry 'sda' is a block device; only files and directories are allowed");
    await rejects(t({ name: "pipe", type: "6" }), "archive entry 'pipe' is a FIFO; only files and directories are allowed");
    await rejects(t({ name: "sparse", type: "S" }), "archive entry 'sparse' has an unsupported tar entry type 'S'; only files and directories are allowed");
    // Links are refused even inside dropped dependency folders (node_modules/.bin is full of them).
    await rejects(t({ name: "node_modules/.bin/x", type: "2", linkname: "../x/cli.js" }), /is a symlink/);
    await rejects(zip([{ name: "index.js", data: "x" }, { name: "p", data: "/etc/passwd", mode: 0o120777 }]), "archive entry 'p' is a symlink; links are not allowed");
    await rejects(zip([{ name: "index.js", data: "x" }, { name: "tty", mode: 0o020644 }]), "archive entry 'tty' is a character device; only files and directories are allowed");
    await rejects(zip([{ name: "index.js", data: "x" }, { name: "s", mode: 0o140644 }]), "archive entry 's' is a socket; only files and directories are allowed");
    // A directory by mode without the trailing slash is a directory.
    expect((await norm(zip([{ name: "index.js", data: "x" }, { name: "lib", mode: 0o040755 }, { name: "lib/a.js", data: "y" }]))).files).toContain("lib/a.js");
  });

  test("executable bits survive normalization; everything else is fixed", async () => {
    const r = await norm(tarGz([{ name: "index.js", data: "x" }, { name: "run.sh", data: "#!/bin/sh", mode: 0o4775 }]));
    const dir = join(work, `exec-${++n}`);
    mkdirSync(dir);
    await extractSource(r.tarGz, dir);
    expect(statSync(join(dir, "run.sh")).mode & 0o7777).toBe(0o755);
    expect(statSync(join(dir, "index.js")).mode & 0o7777).toBe(0o644);
  });

  test("entry count: at most 100,000 entries of any kind", async () => {
    // index.js and count - 1 empty files in node_modules, written straight into one buffer.
    const many = (count: number) => {
      const out = Buffer.alloc((count + 3) * 512);
      tarBytes([{ name: "index.js", data: "x" }], false).copy(out);
      for (let i = 1; i < count; i++) tarHeader(`node_modules/m/${i}`).copy(out, (i + 1) * 512);
      return gzipSync(out, { level: 1 });
    };
    await rejects(many(100_001), "archive has more than 100000 entries");
    expect((await norm(many(100_000))).dropped).toEqual(["node_modules"]);
    await rejects(zip([{ name: "index.js", data: "x" }], { entryCount: 65535 }), /^not a readable ZIP archive/);
    await rejects(zip([{ name: "index.js", data: "x" }], { entryCount: 0xffff }), /^not a readable ZIP archive/);
  }, 60_000);

  test("ZIP sizes: lying, overflowing and zip64 sizes never get past their declared budget", async () => {
    const body = Buffer.from("exports.handler = async () => 1;\n".repeat(100));
    // Declared smaller than what the deflate stream holds: stopped at the declared size.
    await rejects(zip([{ name: "index.js", data: body, uncompressedSize: 10 }]), "archive entry 'index.js' unpacks to more than the 10 bytes its header declares");
    await rejects(zip([{ name: "index.js", data: body, uncompressedSize: body.length + 10 }]), `archive entry 'index.js' unpacks to ${body.length} bytes, but its header declares ${body.length + 10}`);
    // Compressed data running past the end of the file.
    await rejects(zip([{ name: "index.js", data: body, compressedSize: 1_000_000 }]), /^archive entry 'index.js' cannot be read: file data overflows file bounds/);
    await rejects(zip([{ name: "index.js", data: "abc", method: 0, compressedSize: 2 }]), /^not a readable ZIP archive: compressed\/uncompressed size mismatch/);
    // Broken deflate data.
    await rejects(zip([{ name: "index.js", raw: Buffer.from("this is not deflate data at all"), uncompressedSize: 100 }]), /^archive entry 'index\.js' cannot be read: /);
    // zip64: real sizes in the extra field are fine; a huge declared size is over the budget before any data is read.
    expect((await norm(zip([{ name: "index.js", data: body, zip64: true }]))).files).toContain("index.js");
    await rejects(zip([{ name: "index.js", data: body, zip64: { uncompressed: 1n << 40n, compressed: BigInt(body.length) } }]), /^archive unpacks to more than 20 MB \(the limit is reached at entry 'index\.js'\)$/);
    await rejects(zip([{ name: "index.js", data: body, zip64: { uncompressed: 0xffffffffffffffffn, compressed: BigInt(body.length) } }]), /^archive unpacks to more than 20 MB/);
    // Encrypted entries and other compression methods.
    await rejects(zip([{ name: "index.js", data: "x", flags: 1 }]), "archive entry 'index.js' is encrypted, which is not supported");
    await rejects(zip([{ name: "index.js", raw: Buffer.from("xz"), method: 14, uncompressedSize: 1 }]), "archive entry 'index.js' uses ZIP compression method 14; only stored (0) and deflate (8) are supported");
    // Garbage after the signature.
    await rejects(Buffer.from("PK\u0003\u0004 and nothing else"), /^not a readable ZIP archive: /);
  });

  test("tar.gz streams: invalid gzip, truncated gzip, truncated tar, bad checksums", async () => {
    const good = tarBytes([{ name: "index.js", data: "x".repeat(2000) }]);
    await rejects(Buffer.concat([Buffer.from([0x1f, 0x8b]), Buffer.from("definitely not deflate")]), /^not a readable tar\.gz archive: /);
    // A compressed stream cut short or corrupted after the end of the tar is still refused.
    const gz = gzipSync(good);
    for (const cut of [4, 8, 12, 20]) await rejects(gz.subarray(0, gz.length - cut), /^not a readable tar\.gz archive: /);
    const flipped = Buffer.from(gz);
    flipped[flipped.length - 6] ^= 0xff; // the CRC
    await rejects(flipped, /^not a readable tar\.gz archive: /);
    await rejects(gzipSync(good.subarray(0, 1000)), "not a readable tar.gz archive: it is truncated inside entry 'index.js'");
    await rejects(gzipSync(good.subarray(0, 300)), "not a readable tar.gz archive: it is truncated inside the header of entry #1");
    await rejects(gzipSync(good.subarray(0, 512 + 2000)), "not a readable tar.gz archive: it is truncated inside entry 'index.js'");
    // Ending right after an entry (no end-of-archive blocks) loses nothing: accepted.
    expect((await norm(gzipSync(good.subarray(0, 512 + 2048)))).files).toContain("index.js");
    const bad = Buffer.from(good);
    bad[10] ^= 1;
    await rejects(gzipSync(bad), "not a readable tar.gz archive: the header of entry #1 has a bad checksum");
    await rejects(gzipSync(Buffer.from("hello, this is not a tar file".repeat(40))), /^not a readable tar\.gz archive: /);
    // An extended header with nothing after it, and a malformed pax record.
    await rejects(gzipSync(tarBytes([{ name: "x".repeat(150), data: "y" }]).subarray(0, 1024)), /^not a readable tar\.gz archive: it ends after an extended header/);
    await rejects(gzipSync(Buffer.concat([tarHeader("p", { type: "x", size: 10 }), Buffer.from("99 path=x\n"), Buffer.alloc(502), tarHeader("index.js"), Buffer.alloc(1024)])), /malformed pax/);
    // A tar.gz of a tar.gz is not unpacked twice.
    await rejects(gzipSync(gzipSync(good)), /^not a readable tar\.gz archive: /);
  });

  test("bombs are refused from the headers' sizes, before their data is unpacked", async () => {
    const t0 = Date.now();
    // One 1 GiB entry (about 1 MB compressed): refused at its header.
    await rejects(tarGzBomb(1, 1 << 30), /^archive unpacks to more than 20 MB \(the limit is reached at entry 'f0'\)$/);
    // 1,024 entries of 1 MiB: refused at the 20th.
    await rejects(tarGzBomb(1024, 1 << 20), /^archive unpacks to more than 20 MB \(the limit is reached at entry 'f19'\)$/);
    const zeros = await deflatedZeros(1 << 20);
    await rejects(zipBomb(1024, 1 << 20, zeros), /^archive unpacks to more than 20 MB \(the limit is reached at entry 'f19'\)$/);
    // A ZIP entry declaring 1,000 bytes whose data unpacks to 1 GiB: stopped after its first chunk.
    const lying = await deflatedZeros(1 << 30);
    await rejects(zip([{ name: "index.js", raw: lying, uncompressedSize: 1000 }]), "archive entry 'index.js' unpacks to more than the 1000 bytes its header declares");
    expect(Date.now() - t0).toBeLessThan(20_000);
  }, 60_000);

  test("contents beyond the in-memory share go through a temporary folder and come out the same", async () => {
    const big = (seed: number) => Buffer.alloc(3 * 1_048_576, `${"abcdefghijklmnopqrstuvwxyz".slice(seed % 26)}${seed}`);
    const files = { "index.js": "x", "a.txt": big(7), "b/c.txt": big(11), "d.txt": big(13), "e.txt": "small" };
    const fromTar = await norm(tarGz(Object.entries(files).map(([name, data]) => ({ name, data }))));
    const fromZip = await norm(zip(Object.entries(files).map(([name, data]) => ({ name, data }))));
    expect(fromTar.sha256).toBe(fromZip.sha256);
    const out = await unpack(fromTar.tarGz);
    for (const [name, data] of Object.entries(files)) expect(out[name] === data.toString(), name).toBe(true);
  }, 60_000);

  test("what archivers write: GNU long names, pax headers, macOS metadata, ./ prefixes", async () => {
    const long = `${"very-long-directory-name-".repeat(5)}/index.js`;
    const gnu = join(work, `gnu-${++n}`);
    mkdirSync(join(gnu, dirname(long)), { recursive: true });
    writeFileSync(join(gnu, long), "exports.handler = 1");
    writeFileSync(join(gnu, "package.json"), "{}");
    mkdirSync(join(gnu, "__MACOSX"));
    writeFileSync(join(gnu, "__MACOSX", "x"), "meta");
    writeFileSync(join(gnu, ".DS_Store"), "meta");
    for (const format of ["gnu", "pax", "ustar"]) {
      if (format === "ustar") continue; // the ustar format cannot hold this name
      execFileSync("tar", [`--format=${format}`, "-czf", join(work, `gnu-${n}-${format}.tgz`), "-C", gnu, "."]);
      const r = await norm(readFileSync(join(work, `gnu-${n}-${format}.tgz`)));
      expect(r.files, format).toEqual([".service/function-build.json", "package.json", long]);
      expect(r.build.function_root).toBe(dirname(long));
    }
  });
});
