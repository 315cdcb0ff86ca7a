// Hand-made tar.gz and ZIP archives for the archive-normalizer tests: entry names and headers no
// archiver would write (NUL bytes, links, devices, lying sizes), and bombs that expand to a GiB
// while staying about a megabyte, built without ever holding the expansion in memory.
import { createDeflateRaw, deflateRawSync, gzipSync } from "node:zlib";

export interface TarSpec {
  name: string;
  data?: string | Buffer;
  /** typeflag: "0" file (default), "5" directory, "1" hard link, "2" symlink, "3"/"4" devices, "6" FIFO, ... */
  type?: string;
  mode?: number;
  linkname?: string;
  /** Declared size when it differs from the data's (a truncated or lying entry). */
  size?: number;
  /** How a name over 100 bytes is carried: a pax header (default) or a GNU long-name header. */
  longName?: "pax" | "gnu";
}

const octal = (n: number, width: number) => `${n.toString(8).padStart(width - 1, "0")}\0`;

export function tarHeader(name: string | Buffer, o: { type?: string; size?: number; mode?: number; linkname?: string } = {}): Buffer {
  const b = Buffer.alloc(512);
  (typeof name === "string" ? Buffer.from(name) : name).copy(b, 0, 0, 100);
  b.write(octal(o.mode ?? 0o644, 8), 100, "latin1");
  b.write(octal(0, 8), 108, "latin1");
  b.write(octal(0, 8), 116, "latin1");
  b.write(octal(o.size ?? 0, 12), 124, "latin1");
  b.write(octal(0, 12), 136, "latin1");
  b.write("        ", 148, "latin1");
  b.write(o.type ?? "0", 156, "latin1");
  if (o.linkname) b.write(o.linkname, 157, 100, "utf8");
  b.write("ustar\x0000", 257, "latin1");
  let sum = 0;
  for (const x of b) sum += x;
  b.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "latin1");
  return b;
}

const pad = (n: number) => Buffer.alloc((512 - (n % 512)) % 512);

function paxRecord(key: string, value: string): Buffer {
  const body = Buffer.from(` ${key}=${value}\n`);
  let len = body.length;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

/** The uncompressed tar of `entries` (with the two end-of-archive blocks). */
export function tarBytes(entries: TarSpec[], end = true): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const data = e.data === undefined ? Buffer.alloc(0) : Buffer.from(e.data);
    const nameBytes = Buffer.from(e.name);
    if (nameBytes.length > 100 || e.name.includes("\0")) {
      if (e.longName === "gnu") {
        parts.push(tarHeader("././@LongLink", { type: "L", size: nameBytes.length + 1 }), nameBytes, Buffer.alloc(1), pad(nameBytes.length + 1));
      } else {
        const rec = paxRecord("path", e.name);
        parts.push(tarHeader("././@PaxHeader", { type: "x", size: rec.length }), rec, pad(rec.length));
      }
    }
    parts.push(tarHeader(nameBytes.subarray(0, 100), { type: e.type, size: e.size ?? data.length, mode: e.mode, linkname: e.linkname }), data, pad(data.length));
  }
  if (end) parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

export const tarGz = (entries: TarSpec[]) => gzipSync(tarBytes(entries));

/** The index.js the bombs carry: a working function that answers "ok". */
export const HANDLER = "exports.handler = async () => 'ok';";

/**
 * A tar.gz of an index.js and `files` entries of `fileBytes` zeros each, as concatenated gzip members (one for each
 * header, one shared member of zeros): about 1 KB per MiB of expansion.
 */
export function tarGzBomb(files: number, fileBytes: number, name = (i: number) => `f${i}`): Buffer {
  const MiB = 1_048_576;
  const zeros = gzipSync(Buffer.alloc(MiB));
  const parts: Buffer[] = [gzipSync(tarBytes([{ name: "index.js", data: HANDLER }], false))];
  for (let i = 0; i < files; i++) {
    parts.push(gzipSync(tarHeader(name(i), { size: fileBytes })));
    for (let left = fileBytes; left > 0; left -= MiB) parts.push(left >= MiB ? zeros : gzipSync(Buffer.alloc(left)));
    if (fileBytes % 512) parts.push(gzipSync(pad(fileBytes)));
  }
  parts.push(gzipSync(Buffer.alloc(1024)));
  return Buffer.concat(parts);
}

// ZIP

const CRC_TABLE = (() => {
  const t = new Int32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c;
  }
  return t;
})();

export function crc32(b: Buffer, crc = 0): number {
  crc = ~crc;
  for (const x of b) crc = CRC_TABLE[(crc ^ x) & 0xff]! ^ (crc >>> 8);
  return ~crc >>> 0;
}

export interface ZipSpec {
  name: string | Buffer;
  data?: string | Buffer;
  /** 0 stored, 8 deflate (default for data), or any other number to test refusals. */
  method?: number;
  /** The unix mode in the external attributes (file type bits included), e.g. 0o120777 for a symlink. */
  mode?: number;
  /** Compressed bytes to store instead of compressing `data` (with `uncompressedSize` to match). */
  raw?: Buffer;
  /** Declared sizes when they should differ from the real ones. */
  uncompressedSize?: number;
  compressedSize?: number;
  crc?: number;
  /** General-purpose flags (1 = encrypted; 0x800 = UTF-8 names is always set). */
  flags?: number;
  /** Write the sizes as 0xFFFFFFFF with a zip64 extra field holding `zip64` (or the real sizes). */
  zip64?: { uncompressed?: bigint; compressed?: bigint } | true;
}

export function zip(entries: ZipSpec[], o: { entryCount?: number } = {}): Buffer {
  const locals: Buffer[] = [];
  const central: Buffer[] = [];
  let offset = 0;
  for (const e of entries) {
    const name = typeof e.name === "string" ? Buffer.from(e.name) : e.name;
    const data = e.data === undefined ? Buffer.alloc(0) : Buffer.from(e.data);
    const method = e.method ?? (e.raw || data.length ? 8 : 0);
    const body = e.raw ?? (method === 8 ? deflateRawSync(data) : data);
    const usize = e.uncompressedSize ?? data.length;
    const csize = e.compressedSize ?? body.length;
    const crc = e.crc ?? crc32(data);
    const flags = 0x800 | (e.flags ?? 0);
    let extra = Buffer.alloc(0);
    let u32 = usize;
    let c32 = csize;
    if (e.zip64) {
      const z = e.zip64 === true ? {} : e.zip64;
      const fields: bigint[] = [];
      if (z.uncompressed !== undefined || e.zip64 === true) fields.push(z.uncompressed ?? BigInt(usize));
      if (z.compressed !== undefined || e.zip64 === true) fields.push(z.compressed ?? BigInt(csize));
      extra = Buffer.alloc(4 + 8 * fields.length);
      extra.writeUInt16LE(0x0001, 0);
      extra.writeUInt16LE(8 * fields.length, 2);
      fields.forEach((f, i) => extra.writeBigUInt64LE(f, 4 + 8 * i));
      u32 = 0xffffffff;
      if (fields.length > 1) c32 = 0xffffffff;
    }
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(e.zip64 ? 45 : 20, 4);
    local.writeUInt16LE(flags, 6);
    local.writeUInt16LE(method, 8);
    local.writeUInt32LE(crc, 14);
    local.writeUInt32LE(c32 >>> 0, 18);
    local.writeUInt32LE(u32 >>> 0, 22);
    local.writeUInt16LE(name.length, 26);
    local.writeUInt16LE(extra.length, 28);
    locals.push(local, name, extra, body);
    const c = Buffer.alloc(46);
    c.writeUInt32LE(0x02014b50, 0);
    c.writeUInt16LE((3 << 8) | 45, 4); // made by unix
    c.writeUInt16LE(e.zip64 ? 45 : 20, 6);
    c.writeUInt16LE(flags, 8);
    c.writeUInt16LE(method, 10);
    c.writeUInt32LE(crc, 16);
    c.writeUInt32LE(c32 >>> 0, 20);
    c.writeUInt32LE(u32 >>> 0, 24);
    c.writeUInt16LE(name.length, 28);
    c.writeUInt16LE(extra.length, 30);
    const isDir = name[name.length - 1] === 0x2f;
    c.writeUInt32LE(((e.mode ?? (isDir ? 0o40755 : 0o100644)) << 16) >>> 0, 38);
    c.writeUInt32LE(offset, 42);
    central.push(c, name, extra);
    offset += 30 + name.length + extra.length + body.length;
  }
  const cd = Buffer.concat(central);
  const eocd = Buffer.alloc(22);
  eocd.writeUInt32LE(0x06054b50, 0);
  eocd.writeUInt16LE(o.entryCount ?? entries.length, 8);
  eocd.writeUInt16LE(o.entryCount ?? entries.length, 10);
  eocd.writeUInt32LE(cd.length, 12);
  eocd.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, cd, eocd]);
}

/** The raw deflate stream of `bytes` zeros, made chunk by chunk (about 1 KB per MiB). */
export async function deflatedZeros(bytes: number): Promise<Buffer> {
  const d = createDeflateRaw({ level: 9 });
  const out: Buffer[] = [];
  d.on("data", (c: Buffer) => out.push(c));
  const MiB = Buffer.alloc(1_048_576);
  for (let left = bytes; left > 0; left -= MiB.length) if (!d.write(left >= MiB.length ? MiB : MiB.subarray(0, left))) await new Promise((r) => d.once("drain", r));
  await new Promise<void>((r) => {
    d.once("end", r);
    d.end();
  });
  return Buffer.concat(out);
}

/** A ZIP of an index.js and `files` entries of `fileBytes` zeros, honestly declared, sharing one compressed body. */
export function zipBomb(files: number, fileBytes: number, zeros: Buffer): Buffer {
  const crc = crc32(Buffer.alloc(fileBytes));
  return zip([{ name: "index.js", data: HANDLER }, ...Array.from({ length: files }, (_, i) => ({ name: `f${i}`, raw: zeros, uncompressedSize: fileBytes, crc }))]);
}
