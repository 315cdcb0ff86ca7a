import { openSync, closeSync, readdirSync, readFileSync, rmSync, fstatSync, writeSync } from "node:fs";
import { join } from "node:path";

/**
 * Just enough of PostgreSQL's write-ahead log format to find where to cut it for a point-in-time
 * restore: walk the records from a known record boundary, read each commit record's timestamp, and
 * zero the log from a chosen record on (crash recovery then replays exactly up to there).
 * Format (src/include/access/xlog_internal.h, xlogrecord.h): 8 KB pages, each with a header (24 bytes,
 * 40 on a segment's first page); records MAXALIGNed (8), starting with a 24-byte XLogRecord header,
 * possibly continued across pages. PostgreSQL's own checks are kept: each page's address must be
 * the expected one and each record must point back at its predecessor; anything else ends the log.
 */
const PAGE = 8192;
const SHORT_HEADER = 24;
const LONG_HEADER = 40;
const XLP_LONG_HEADER = 0x0002;
const RECORD_HEADER = 24;
const RM_XLOG_ID = 0;
const XLOG_SWITCH = 0x40;
const RM_XACT_ID = 1;
const XLOG_XACT_OPMASK = 0x70;
const XLOG_XACT_COMMIT = 0x00;
const XLOG_XACT_COMMIT_PREPARED = 0x30;
/** Microseconds from the Unix epoch to PostgreSQL's (2000-01-01). */
const PG_EPOCH_MS = 946_684_800_000;
const SEGMENT = /^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$/;

export function parseLsn(text: string): number {
  const m = /^([0-9A-F]+)\/([0-9A-F]+)$/i.exec(text.trim());
  if (!m) throw new Error(`not an LSN: ${text}`);
  return parseInt(m[1]!, 16) * 2 ** 32 + parseInt(m[2]!, 16);
}

export function formatLsn(lsn: number): string {
  return `${Math.floor(lsn / 2 ** 32).toString(16).toUpperCase()}/${(lsn % 2 ** 32).toString(16).toUpperCase()}`;
}

/** The segment number of a WAL file name (timeline excluded), for a given segment size. */
export function segmentNumber(name: string, segmentBytes: number): number {
  const m = SEGMENT.exec(name);
  if (!m) throw new Error(`not a WAL segment: ${name}`);
  return parseInt(m[2]!, 16) * (2 ** 32 / segmentBytes) + parseInt(m[3]!, 16);
}

interface Segments {
  timeline: string;
  segmentBytes: number;
  /** Segment number -> file path. */
  files: Map<number, string>;
}

/** The WAL segment files of a `pg_wal` folder, and their size (from the first one's long header). */
export function listSegments(walDir: string): Segments | null {
  const names = readdirSync(walDir).filter((f) => SEGMENT.test(f)).sort();
  if (names.length === 0) return null;
  const first = readFileSync(join(walDir, names[0]!)).subarray(0, LONG_HEADER);
  const dv = new DataView(first.buffer, first.byteOffset, first.byteLength);
  const segmentBytes = dv.getUint32(32, true);
  const timeline = names[names.length - 1]!.slice(0, 8);
  const files = new Map<number, string>();
  for (const n of names) if (n.startsWith(timeline)) files.set(segmentNumber(n, segmentBytes), join(walDir, n));
  return { timeline, segmentBytes, files };
}

export interface Commit {
  /** Where the commit record starts. */
  lsn: number;
  /** Its commit timestamp (epoch ms). */
  atMs: number;
}

/** Reads the log as one stream of bytes, page headers skipped, from a record boundary. */
class WalReader {
  private segNo = -1;
  private seg: Uint8Array | null = null;

  constructor(private readonly s: Segments) {}

  private page(lsn: number): { bytes: Uint8Array; start: number; header: number } | null {
    const segNo = Math.floor(lsn / this.s.segmentBytes);
    if (segNo !== this.segNo) {
      const path = this.s.files.get(segNo);
      this.segNo = segNo;
      this.seg = path ? readFileSync(path) : null;
    }
    if (!this.seg) return null;
    const offset = lsn % this.s.segmentBytes;
    const start = offset - (offset % PAGE);
    if (start + PAGE > this.seg.length) return null;
    const dv = new DataView(this.seg.buffer, this.seg.byteOffset + start, PAGE);
    const info = dv.getUint16(2, true);
    const pageAddr = dv.getUint32(12, true) * 2 ** 32 + dv.getUint32(8, true);
    // A recycled or never-written page: the log ends here.
    if (pageAddr !== lsn - (lsn % PAGE)) return null;
    return { bytes: this.seg, start, header: info & XLP_LONG_HEADER ? LONG_HEADER : SHORT_HEADER };
  }

  /** `n` bytes of the stream at `lsn` (which must not sit inside a page header), and the position after them. */
  read(lsn: number, n: number): { data: Uint8Array; next: number } | null {
    const out = new Uint8Array(n);
    let got = 0;
    let at = lsn;
    while (got < n) {
      const p = this.page(at);
      if (!p) return null;
      const inPage = at % PAGE;
      if (inPage < p.header) at += p.header - inPage; // skip the header of a page entered
      const off = at % this.s.segmentBytes;
      const take = Math.min(n - got, PAGE - (at % PAGE));
      out.set(p.bytes.subarray(off, off + take), got);
      got += take;
      at += take;
    }
    return { data: out, next: at };
  }

  /** The first byte position at or after `lsn` that is not inside a page header. */
  skipHeader(lsn: number): number | null {
    const p = this.page(lsn);
    if (!p) return null;
    const inPage = lsn % PAGE;
    return inPage < p.header ? lsn + (p.header - inPage) : lsn;
  }
}

const maxAlign = (x: number) => Math.ceil(x / 8) * 8;

/**
 * The commit records from `startLsn` (a record boundary, e.g. a backup's START WAL LOCATION) to the
 * end of the valid log, and where that end is (the first byte after the last valid record).
 */
export function readCommits(walDir: string, startLsn: number): { commits: Commit[]; end: number } {
  const s = listSegments(walDir);
  if (!s) return { commits: [], end: startLsn };
  const r = new WalReader(s);
  const commits: Commit[] = [];
  let at = startLsn;
  let prev = -1;
  for (;;) {
    const start = r.skipHeader(at);
    if (start === null) break;
    const head = r.read(start, RECORD_HEADER);
    if (!head) break;
    const dv = new DataView(head.data.buffer);
    const total = dv.getUint32(0, true);
    if (total < RECORD_HEADER) break;
    const xlPrev = dv.getUint32(12, true) * 2 ** 32 + dv.getUint32(8, true);
    if (prev >= 0 && xlPrev !== prev) break;
    const rec = r.read(start, total);
    if (!rec) break;
    const info = head.data[16]!;
    const rmid = head.data[17]!;
    if (rmid === RM_XACT_ID && ((info & XLOG_XACT_OPMASK) === XLOG_XACT_COMMIT || (info & XLOG_XACT_OPMASK) === XLOG_XACT_COMMIT_PREPARED)) {
      const main = mainData(rec.data);
      if (main && main.length >= 8) {
        const micros = new DataView(main.buffer, main.byteOffset, 8).getBigInt64(0, true);
        commits.push({ lsn: start, atMs: Number(micros / 1000n) + PG_EPOCH_MS });
      }
    }
    prev = start;
    at = maxAlign(rec.next);
    // A segment switch: the rest of the segment is unused; the log goes on at the next one.
    if (rmid === RM_XLOG_ID && (info & 0xf0) === XLOG_SWITCH && at % s.segmentBytes !== 0) at += s.segmentBytes - (at % s.segmentBytes);
  }
  return { commits, end: prev < 0 ? startLsn : at };
}

/** A record's main data (its last payload), found by walking its block headers. */
function mainData(rec: Uint8Array): Uint8Array | null {
  const dv = new DataView(rec.buffer, rec.byteOffset, rec.byteLength);
  let at = RECORD_HEADER;
  let payload = 0;
  while (at < rec.length) {
    const id = rec[at]!;
    if (id === 255) {
      const len = rec[at + 1]!;
      return rec.subarray(rec.length - len);
    }
    if (id === 254) {
      const len = dv.getUint32(at + 1, true);
      return rec.subarray(rec.length - len);
    }
    if (id === 253) {
      at += 3; // replication origin
      continue;
    }
    if (id === 252) {
      at += 5; // top-level xid
      continue;
    }
    if (id > 32) return null;
    // XLogRecordBlockHeader: id, fork_flags, data_length (uint16)
    const flags = rec[at + 1]!;
    payload += dv.getUint16(at + 2, true);
    at += 4;
    if (flags & 0x10) {
      // XLogRecordBlockImageHeader: length, hole_offset (uint16 each), bimg_info
      payload += dv.getUint16(at, true);
      const bimg = rec[at + 4]!;
      at += 5;
      // A compressed image with a hole carries its hole length (XLogRecordBlockCompressHeader).
      if (bimg & 0x01 && bimg & 0x1c) at += 2;
    }
    if (!(flags & 0x80)) at += 12; // RelFileLocator, unless the same relation as the previous block
    at += 4; // BlockNumber
  }
  void payload;
  return null;
}

/**
 * Ends the log at `lsn`: the rest of its segment is zeroed and later segments removed, so crash
 * recovery stops there (the first record it cannot read is the end of the log).
 */
export function truncateWal(walDir: string, lsn: number): void {
  const s = listSegments(walDir);
  if (!s) return;
  const segNo = Math.floor(lsn / s.segmentBytes);
  for (const [n, path] of s.files) if (n > segNo) rmSync(path);
  const path = s.files.get(segNo);
  if (!path) return;
  const fd = openSync(path, "r+");
  try {
    const size = fstatSync(fd).size;
    const off = lsn % s.segmentBytes;
    if (off < size) writeSync(fd, new Uint8Array(size - off), 0, size - off, off);
  } finally {
    closeSync(fd);
  }
}
