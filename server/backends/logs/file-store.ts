import { closeSync, existsSync, fstatSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, statSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { crc32 } from "node:zlib";
import { keysSatisfy } from "./keys";
import { toPredicate } from "../../logs/query";
import { keyCondition, levelsOf, newerFirst, segmentsOf, type BuildLogSummary, type LineQuery, type LogImports, type LogStore, type LogStream, type ResourceType, type StoredLine } from "./log-store";

/**
 * The embedded profile's log store: append-only segment files and an index of them, no database.
 *
 * Lines are cut into the same segments as the SQL store's (`segmentsOf`: up to 64 lines of one
 * project, resource type and stream, in (at, id) order, with their keys, keys.ts). Each project has
 * a folder: one data file per UTC day (by a segment's newest line) holding its segments' text, and
 * one index file of records: a segment added (where its text is, its span, its lines' levels, a
 * bloom filter of its keys), trimmed (retention cut its oldest lines), dropped. The index is read
 * into memory at open; a search walks a stream's segments newest first, skips those whose bloom
 * filter or levels cannot match, and parses only the candidate lines of the rest.
 *
 * Crash safety without fsync (a process crash loses nothing the OS was given): a batch's data is
 * written before its index records, and the index records of one batch end with a commit record;
 * at open a batch without its commit (a torn tail) is cut off, and data no index record points at
 * is never read. Retention drops whole day files once none of their segments is left; a deleted
 * project's folder goes at once. See docs/observability.md.
 */

/** Bloom filter bits per key and probes: ~0.8% of segments without a key pass it (and are read). */
const BLOOM_BITS_PER_KEY = 10;
const BLOOM_PROBES = 7;
/** Open data files kept at once (appends and reads). */
const OPEN_FILES = 64;
const INDEX = "index";
const IMPORTS = "imports.json";
/** Record kinds of the index file. */
const ADD = 1;
const TRIM = 2;
const DROP = 3;
const COMMIT = 9;
/** An index file is rewritten (live segments only) once it holds this many dead records, and more dead than live. */
const COMPACT_DEAD = 2048;

interface Entry {
  seg: number;
  project: string;
  /** The data file (a UTC day, yyyymmdd.seg) and the segment's bytes in it. */
  file: string;
  off: number;
  len: number;
  type: ResourceType;
  stream: LogStream;
  deployment: string | null;
  /** Span of the lines still kept (epoch ms). */
  minAt: number;
  maxAt: number;
  lines: number;
  /** Leading lines cut by retention. */
  skip: number;
  /** The segment's distinct levels, and each line's as an index into them. */
  levels: string[];
  lineLevels: Uint8Array;
  bloom: Uint32Array;
  dead: boolean;
}

interface AddMeta {
  s: number;
  f: string;
  o: number;
  n: number;
  t: ResourceType;
  st: LogStream;
  d: string | null;
  a0: number;
  a1: number;
  c: number;
  k: number;
  lv: string[];
  ll: number[];
}

// --- bloom filters over a segment's keys (keys.ts: trigrams and hashed field values, 32-bit ints)

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

export function bloomOf(keys: readonly number[]): Uint32Array {
  const words = Math.max(2, Math.ceil((keys.length * BLOOM_BITS_PER_KEY) / 32));
  const b = new Uint32Array(words);
  const m = words * 32;
  for (const k of keys) {
    const h1 = fmix(k);
    const h2 = (fmix(k ^ 0x9e3779b9) | 1) >>> 0;
    for (let i = 0; i < BLOOM_PROBES; i++) {
      const p = (h1 + i * h2) % m;
      b[p >>> 5]! |= 1 << (p & 31);
    }
  }
  return b;
}

export function bloomHas(b: Uint32Array, k: number): boolean {
  const m = b.length * 32;
  const h1 = fmix(k);
  const h2 = (fmix(k ^ 0x9e3779b9) | 1) >>> 0;
  for (let i = 0; i < BLOOM_PROBES; i++) {
    const p = (h1 + i * h2) % m;
    if ((b[p >>> 5]! & (1 << (p & 31))) === 0) return false;
  }
  return true;
}

// --- a segment's text: a dictionary of the values its lines repeat, then one JSON array a line

/** [id, at, resource id, resource name, deployment, invocation, region, level, structured, body]; ids index the dictionary (-1: null). */
type LineRow = [string, number, number, number, number, number, number, number, 0 | 1, string];

function encodeSegment(lines: readonly StoredLine[]): string {
  const dict: string[] = [];
  const index = new Map<string, number>();
  const d = (v: string | null): number => {
    if (v === null) return -1;
    let i = index.get(v);
    if (i === undefined) {
      i = dict.length;
      index.set(v, i);
      dict.push(v);
    }
    return i;
  };
  let text = "";
  for (const l of lines) {
    const row: LineRow = [l.id, l.at, d(l.resource_id), d(l.resource_name), d(l.deployment_id), d(l.invocation_id), d(l.region), d(l.level), l.structured ? 1 : 0, l.body];
    text += JSON.stringify(row) + "\n";
  }
  return JSON.stringify(dict) + "\n" + text;
}

/** A segment's text, split into its dictionary and lines (each line parsed when asked for). */
class SegmentText {
  private readonly dict: string[];
  private readonly rows: string[];

  constructor(
    private readonly e: Entry,
    text: string,
  ) {
    const parts = text.split("\n");
    this.dict = JSON.parse(parts[0]!) as string[];
    this.rows = parts.slice(1, 1 + e.lines);
  }

  line(j: number): StoredLine {
    const r = JSON.parse(this.rows[j]!) as LineRow;
    const v = (i: number) => (i < 0 ? null : this.dict[i]!);
    return {
      id: r[0],
      project_id: this.e.project,
      resource_type: this.e.type,
      resource_id: v(r[2])!,
      resource_name: v(r[3])!,
      stream: this.e.stream,
      deployment_id: v(r[4]),
      invocation_id: v(r[5]),
      region: v(r[6])!,
      level: v(r[7])!,
      structured: r[8] === 1,
      body: r[9],
      at: r[1],
    };
  }

  /** A line's time without parsing its body. */
  at(j: number): number {
    const row = this.rows[j]!;
    const start = row.indexOf(",") + 1;
    return Number(row.slice(start, row.indexOf(",", start)));
  }
}

// --- the index file: records framed [u32 length][u32 crc32][kind][payload]

function frame(kind: number, json: unknown, tail?: Uint8Array): Buffer {
  const meta = Buffer.from(JSON.stringify(json ?? null));
  const payload = Buffer.alloc(1 + 4 + meta.length + (tail?.byteLength ?? 0));
  payload[0] = kind;
  payload.writeUInt32LE(meta.length, 1);
  meta.copy(payload, 5);
  if (tail) Buffer.from(tail.buffer, tail.byteOffset, tail.byteLength).copy(payload, 5 + meta.length);
  const head = Buffer.alloc(8);
  head.writeUInt32LE(payload.length, 0);
  head.writeUInt32LE(crc32(payload), 4);
  return Buffer.concat([head, payload]);
}

interface IndexRecord {
  kind: number;
  json: unknown;
  tail: Uint8Array;
}

/** The committed records of an index file, and where its last commit ends (what follows is cut). */
function readIndex(buf: Buffer): { batches: IndexRecord[][]; end: number } {
  const batches: IndexRecord[][] = [];
  let staged: IndexRecord[] = [];
  let at = 0;
  let end = 0;
  while (at + 8 <= buf.length) {
    const len = buf.readUInt32LE(at);
    if (len < 5 || at + 8 + len > buf.length) break;
    const payload = buf.subarray(at + 8, at + 8 + len);
    if (crc32(payload) !== buf.readUInt32LE(at + 4)) break;
    at += 8 + len;
    const kind = payload[0]!;
    if (kind === COMMIT) {
      batches.push(staged);
      staged = [];
      end = at;
      continue;
    }
    const metaLen = payload.readUInt32LE(1);
    let json: unknown;
    try {
      json = JSON.parse(payload.subarray(5, 5 + metaLen).toString("utf8"));
    } catch {
      break;
    }
    // A copy, aligned for a Uint32Array view.
    const tail = new Uint8Array(payload.subarray(5 + metaLen));
    staged.push({ kind, json, tail });
  }
  return { batches, end };
}

const SAFE_NAME = /^[A-Za-z0-9_-]{1,80}$/;
/** A project's folder name: its id when that is a safe name, else the id in hex. */
function folderOf(projectId: string): string {
  return SAFE_NAME.test(projectId) && !projectId.startsWith("x-") ? projectId : `x-${Buffer.from(projectId).toString("hex")}`;
}
function projectOfFolder(name: string): string {
  return name.startsWith("x-") ? Buffer.from(name.slice(2), "hex").toString("utf8") : name;
}

function dayFile(ms: number): string {
  const d = new Date(Number.isFinite(ms) ? ms : 0);
  const y = d.getUTCFullYear();
  const name = `${String(Math.max(0, y)).padStart(4, "0")}${String(d.getUTCMonth() + 1).padStart(2, "0")}${String(d.getUTCDate()).padStart(2, "0")}`;
  return `${name}.seg`;
}

/** A stream's segments, ordered by (maxAt, seg): a search walks them from the end. */
class Stream {
  readonly entries: Entry[] = [];

  add(e: Entry): void {
    const a = this.entries;
    const last = a[a.length - 1];
    if (!last || last.maxAt < e.maxAt || (last.maxAt === e.maxAt && last.seg < e.seg)) {
      a.push(e);
      return;
    }
    // Out of order (a clock set back, an import of older lines): its place by binary search.
    let lo = 0;
    let hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const m = a[mid]!;
      if (m.maxAt < e.maxAt || (m.maxAt === e.maxAt && m.seg < e.seg)) lo = mid + 1;
      else hi = mid;
    }
    a.splice(lo, 0, e);
  }

  /** Removes dead entries (after retention or a trim moved an entry's span, which keeps maxAt). */
  prune(): void {
    let w = 0;
    for (const e of this.entries) if (!e.dead) this.entries[w++] = e;
    this.entries.length = w;
  }
}

class ProjectLog {
  readonly streams = new Map<string, Stream>();
  readonly bySeg = new Map<number, Entry>();
  /** Data files: bytes written, and live segments in them. */
  readonly files = new Map<string, { size: number; live: number }>();
  indexSize = 0;
  deadRecords = 0;

  constructor(
    readonly id: string,
    readonly dir: string,
  ) {}

  static key(type: ResourceType, stream: LogStream): string {
    return `${type}\u0000${stream}`;
  }

  stream(type: ResourceType, stream: LogStream): Stream | undefined {
    return this.streams.get(ProjectLog.key(type, stream));
  }

  addEntry(e: Entry): void {
    const k = ProjectLog.key(e.type, e.stream);
    let s = this.streams.get(k);
    if (!s) this.streams.set(k, (s = new Stream()));
    s.add(e);
    this.bySeg.set(e.seg, e);
    const f = this.files.get(e.file);
    if (f) f.live++;
    else this.files.set(e.file, { size: 0, live: 1 });
  }

  kill(e: Entry): void {
    if (e.dead) return;
    e.dead = true;
    this.bySeg.delete(e.seg);
    const f = this.files.get(e.file);
    if (f) f.live--;
  }
}

function entryOf(project: string, m: AddMeta, bloom: Uint8Array): Entry {
  return {
    seg: m.s,
    project,
    file: m.f,
    off: m.o,
    len: m.n,
    type: m.t,
    stream: m.st,
    deployment: m.d,
    minAt: m.a0,
    maxAt: m.a1,
    lines: m.c,
    skip: m.k,
    levels: m.lv,
    lineLevels: Uint8Array.from(m.ll),
    bloom: new Uint32Array(bloom.buffer, bloom.byteOffset, bloom.byteLength >>> 2),
    dead: false,
  };
}

const bytesOf = (b: Uint32Array) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength);

function metaOf(e: Entry): AddMeta {
  return { s: e.seg, f: e.file, o: e.off, n: e.len, t: e.type, st: e.stream, d: e.deployment, a0: e.minAt, a1: e.maxAt, c: e.lines, k: e.skip, lv: e.levels, ll: [...e.lineLevels] };
}

export class FileLogStore implements LogStore, LogImports {
  private readonly projects = new Map<string, ProjectLog>();
  /** Build segments by deployment (the deployment history's summaries). */
  private readonly builds = new Map<string, Set<Entry>>();
  private readonly fds = new Map<string, number>();
  private nextSeg = 1;
  private imports: Record<string, string> = {};
  private opened = false;

  constructor(readonly root: string) {}

  /** Reads every project's index; cuts torn tails; forgets what a crash left half done. */
  open(): void {
    if (this.opened) return;
    mkdirSync(this.root, { recursive: true, mode: 0o700 });
    for (const name of readdirSync(this.root)) {
      const path = join(this.root, name);
      // A project deletion cut short: its folder was renamed first.
      if (name.startsWith(".deleted-")) {
        rmSync(path, { recursive: true, force: true });
        continue;
      }
      if (name === IMPORTS) {
        try {
          this.imports = JSON.parse(readFileSync(path, "utf8")) as Record<string, string>;
        } catch {
          this.imports = {};
        }
        continue;
      }
      if (!statSync(path).isDirectory()) continue;
      this.load(projectOfFolder(name), path);
    }
    this.opened = true;
  }

  private load(projectId: string, dir: string): void {
    const p = new ProjectLog(projectId, dir);
    const indexPath = join(dir, INDEX);
    const buf = existsSync(indexPath) ? readFileSync(indexPath) : Buffer.alloc(0);
    const { batches, end } = readIndex(buf);
    for (const batch of batches) {
      for (const r of batch) {
        if (r.kind === ADD) {
          const e = entryOf(projectId, r.json as AddMeta, r.tail);
          p.addEntry(e);
          if (e.seg >= this.nextSeg) this.nextSeg = e.seg + 1;
        } else if (r.kind === TRIM) {
          const t = r.json as { s: number; k: number; a0: number };
          const e = p.bySeg.get(t.s);
          if (e) {
            e.skip = t.k;
            e.minAt = t.a0;
          }
          p.deadRecords++;
        } else if (r.kind === DROP) {
          for (const s of r.json as number[]) {
            const e = p.bySeg.get(s);
            if (e) p.kill(e);
            p.deadRecords += 2;
          }
        }
      }
    }
    // A batch cut short by a crash: its records go (its data, never pointed at, is never read).
    if (end < buf.length) truncateSync(indexPath, end);
    p.indexSize = end;
    for (const [name, f] of p.files) {
      const path = join(dir, name);
      f.size = existsSync(path) ? statSync(path).size : 0;
    }
    // Segments whose text is not there (a data file lost) are not searched.
    for (const e of [...p.bySeg.values()]) if (e.off + e.len > p.files.get(e.file)!.size) p.kill(e);
    for (const s of p.streams.values()) s.prune();
    for (const e of p.bySeg.values()) this.noteBuild(e);
    this.projects.set(projectId, p);
  }

  private noteBuild(e: Entry): void {
    if (e.stream !== "build" || e.deployment === null) return;
    let s = this.builds.get(e.deployment);
    if (!s) this.builds.set(e.deployment, (s = new Set()));
    s.add(e);
  }

  private project(projectId: string): ProjectLog {
    let p = this.projects.get(projectId);
    if (!p) {
      const dir = join(this.root, folderOf(projectId));
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      p = new ProjectLog(projectId, dir);
      this.projects.set(projectId, p);
    }
    return p;
  }

  private fd(p: ProjectLog, file: string): number {
    const path = join(p.dir, file);
    let fd = this.fds.get(path);
    if (fd !== undefined) {
      // Most recently used last.
      this.fds.delete(path);
      this.fds.set(path, fd);
      return fd;
    }
    if (this.fds.size >= OPEN_FILES) {
      const [oldest, ofd] = this.fds.entries().next().value as [string, number];
      this.fds.delete(oldest);
      closeSync(ofd);
    }
    fd = openSync(path, "a+", 0o600);
    this.fds.set(path, fd);
    return fd;
  }

  private closeFd(path: string): void {
    const fd = this.fds.get(path);
    if (fd === undefined) return;
    this.fds.delete(path);
    closeSync(fd);
  }

  /**
   * Appends a batch's index records and its commit; a write that fails is cut back off. The file is
   * opened for each batch: a store with thousands of projects holds no descriptor per project.
   */
  private writeIndex(p: ProjectLog, records: Buffer[]): void {
    const buf = Buffer.concat([...records, frame(COMMIT, null)]);
    const path = join(p.dir, INDEX);
    const fd = openSync(path, "a", 0o600);
    try {
      let done = 0;
      while (done < buf.length) done += writeSync(fd, buf, done, buf.length - done);
    } catch (err) {
      try {
        ftruncateSync(fd, p.indexSize);
      } catch {
        // the torn records are cut at the next open
      }
      throw err;
    } finally {
      closeSync(fd);
    }
    p.indexSize += buf.length;
  }

  async append(lines: readonly StoredLine[]): Promise<Map<string, string[]>> {
    return this.appendNow(lines);
  }

  private appendNow(lines: readonly StoredLine[]): Map<string, string[]> {
    const written = new Map<string, string[]>();
    if (!lines.length) return written;
    const base = this.nextSeg;
    const segments = segmentsOf(lines, (i) => String(base + i));
    this.nextSeg += segments.length;
    const byProject = new Map<string, typeof segments>();
    for (const s of segments) {
      const pid = s.lines[0]!.project_id;
      const g = byProject.get(pid);
      if (g) g.push(s);
      else byProject.set(pid, [s]);
    }
    for (const [pid, segs] of byProject) {
      const p = this.project(pid);
      const byFile = new Map<string, { e: Entry; text: Buffer }[]>();
      for (const s of segs) {
        const first = s.lines[0]!;
        const last = s.lines[s.lines.length - 1]!;
        const levels: string[] = [];
        const lineLevels = new Uint8Array(s.lines.length);
        for (let j = 0; j < s.lines.length; j++) {
          let i = levels.indexOf(s.lines[j]!.level);
          if (i < 0) i = levels.push(s.lines[j]!.level) - 1;
          lineLevels[j] = i;
        }
        const text = Buffer.from(encodeSegment(s.lines));
        const e: Entry = {
          seg: Number(s.seg),
          project: pid,
          file: dayFile(last.at),
          off: 0,
          len: text.length,
          type: first.resource_type,
          stream: first.stream,
          deployment: first.stream === "build" ? first.deployment_id : null,
          minAt: first.at,
          maxAt: last.at,
          lines: s.lines.length,
          skip: 0,
          levels,
          lineLevels,
          bloom: bloomOf(s.keys),
          dead: false,
        };
        const g = byFile.get(e.file);
        if (g) g.push({ e, text });
        else byFile.set(e.file, [{ e, text }]);
      }
      // Data first (at each file's end as it is on disk: bytes a failed write left are skipped), then the index that points at it.
      const records: Buffer[] = [];
      for (const [file, items] of byFile) {
        const fd = this.fd(p, file);
        let off = fstatSync(fd).size;
        for (const it of items) {
          it.e.off = off;
          off += it.text.length;
          records.push(frame(ADD, metaOf(it.e), bytesOf(it.e.bloom)));
        }
        const buf = Buffer.concat(items.map((it) => it.text));
        let done = 0;
        while (done < buf.length) done += writeSync(fd, buf, done, buf.length - done);
      }
      this.writeIndex(p, records);
      const ids: string[] = [];
      for (const items of byFile.values())
        for (const { e } of items) {
          p.addEntry(e);
          this.noteBuild(e);
          ids.push(String(e.seg));
        }
      written.set(pid, ids);
    }
    return written;
  }

  private read(e: Entry): SegmentText {
    const p = this.projects.get(e.project)!;
    const fd = this.fd(p, e.file);
    const buf = Buffer.allocUnsafe(e.len);
    let done = 0;
    while (done < e.len) {
      const n = readSync(fd, buf, done, e.len - done, e.off + done);
      if (n === 0) throw new Error(`log segment ${e.seg} is cut short in ${e.file}`);
      done += n;
    }
    return new SegmentText(e, buf.toString("utf8"));
  }

  async search(q: LineQuery): Promise<StoredLine[]> {
    return this.searchNow(q);
  }

  private searchNow(q: LineQuery): StoredLine[] {
    const p = this.projects.get(q.projectId);
    const stream = p?.stream(q.resourceType, q.deploymentIds?.length ? "build" : "runtime");
    if (!stream || q.limit <= 0) return [];
    const cond = keyCondition(q);
    const levels = q.where ? levelsOf(q.where) : null;
    const match = q.where ? toPredicate(q.where) : null;
    const ids = q.resourceIds?.length ? new Set(q.resourceIds) : null;
    const deployments = q.deploymentIds?.length ? new Set(q.deploymentIds) : null;
    const beforeAt = q.before ? Date.parse(q.before.at) : undefined;
    const beforeId = q.before?.id ?? "";
    const has = (b: Uint32Array) => (k: number) => bloomHas(b, k);
    let found: StoredLine[] = [];
    const entries = stream.entries;
    for (let i = entries.length - 1; i >= 0; i--) {
      const e = entries[i]!;
      // Every segment left ends no later than this one: lines found newer than that are final.
      if (found.length >= q.limit && found[q.limit - 1]!.at > e.maxAt) break;
      if (q.startMs !== undefined && e.maxAt < q.startMs) break;
      if (e.dead) continue;
      if (q.endMs !== undefined && e.minAt > q.endMs) continue;
      if (beforeAt !== undefined && e.minAt > beforeAt) continue;
      if (deployments && (e.deployment === null || !deployments.has(e.deployment))) continue;
      let wanted: boolean[] | null = null;
      if (levels) {
        wanted = e.levels.map((l) => levels.has(l));
        if (!wanted.includes(true)) continue;
      }
      if (cond && !keysSatisfy(cond, has(e.bloom))) continue;
      const text = this.read(e);
      const got: StoredLine[] = [];
      for (let j = e.lines - 1; j >= e.skip; j--) {
        if (wanted && !wanted[e.lineLevels[j]!]) continue;
        const l = text.line(j);
        if (ids && !ids.has(l.resource_id)) continue;
        if (q.startMs !== undefined && l.at < q.startMs) break;
        if (q.endMs !== undefined && l.at > q.endMs) continue;
        if (beforeAt !== undefined && (l.at > beforeAt || (l.at === beforeAt && l.id >= beforeId))) continue;
        if (match && !match(l)) continue;
        got.push(l);
        if (got.length >= q.limit) break;
      }
      if (got.length) found = found.concat(got).sort(newerFirst).slice(0, q.limit);
    }
    return found;
  }

  /** Whether a line (by project, stream, time and id) is in the store (imports skip what they wrote). */
  private hasLine(l: StoredLine): boolean {
    const s = this.projects.get(l.project_id)?.stream(l.resource_type, l.stream);
    if (!s) return false;
    for (let i = s.entries.length - 1; i >= 0; i--) {
      const e = s.entries[i]!;
      if (e.maxAt < l.at) break;
      if (e.dead || e.minAt > l.at) continue;
      const t = this.read(e);
      for (let j = e.skip; j < e.lines; j++) if (t.at(j) === l.at && t.line(j).id === l.id) return true;
    }
    return false;
  }

  async buildSummaries(deploymentIds: readonly string[]): Promise<Map<string, BuildLogSummary>> {
    const out = new Map<string, BuildLogSummary>();
    for (const d of deploymentIds) {
      let lines = 0;
      let first = Infinity;
      let last = -Infinity;
      for (const e of this.builds.get(d) ?? []) {
        if (e.dead || e.lines - e.skip <= 0) continue;
        lines += e.lines - e.skip;
        first = Math.min(first, e.minAt);
        last = Math.max(last, e.maxAt);
      }
      if (lines) out.set(d, { lines, first_at: new Date(first).toISOString(), last_at: new Date(last).toISOString() });
    }
    return out;
  }

  async removeProject(projectId: string): Promise<void> {
    const p = this.projects.get(projectId);
    const dir = p?.dir ?? join(this.root, folderOf(projectId));
    if (p) {
      for (const e of p.bySeg.values()) if (e.deployment !== null) this.builds.get(e.deployment)?.delete(e);
      for (const file of p.files.keys()) this.closeFd(join(p.dir, file));
      this.projects.delete(projectId);
    }
    if (!existsSync(dir)) return;
    // Renamed first: a removal cut short finishes at the next open, and never leaves half a project.
    const trash = join(this.root, `.deleted-${folderOf(projectId)}-${Date.now().toString(36)}`);
    renameSync(dir, trash);
    rmSync(trash, { recursive: true, force: true });
  }

  async removeOlderThan(cutoffMs: number): Promise<number> {
    let removed = 0;
    for (const p of this.projects.values()) {
      const dropped: Entry[] = [];
      const trims: { e: Entry; k: number; a0: number }[] = [];
      for (const e of p.bySeg.values()) {
        if (e.minAt >= cutoffMs) continue;
        if (e.maxAt < cutoffMs) {
          dropped.push(e);
          continue;
        }
        // Across the cutoff: its older lines are cut (lines are in time order: a prefix).
        const t = this.read(e);
        let k = e.skip;
        while (k < e.lines && t.at(k) < cutoffMs) k++;
        trims.push({ e, k, a0: t.at(k) });
      }
      if (!dropped.length && !trims.length) continue;
      const records = trims.map((t) => frame(TRIM, { s: t.e.seg, k: t.k, a0: t.a0 }));
      if (dropped.length) records.push(frame(DROP, dropped.map((e) => e.seg)));
      this.writeIndex(p, records);
      // Applied in memory once on disk.
      for (const e of dropped) {
        removed += e.lines - e.skip;
        p.kill(e);
        p.deadRecords += 2;
      }
      for (const t of trims) {
        removed += t.k - t.e.skip;
        t.e.skip = t.k;
        t.e.minAt = t.a0;
        p.deadRecords++;
      }
      for (const s of p.streams.values()) s.prune();
      // Day files none of whose segments is left go whole.
      for (const [file, f] of [...p.files]) {
        if (f.live > 0) continue;
        const path = join(p.dir, file);
        this.closeFd(path);
        rmSync(path, { force: true });
        p.files.delete(file);
      }
      if (p.deadRecords >= COMPACT_DEAD && p.deadRecords > p.bySeg.size) this.compact(p);
    }
    for (const [d, s] of this.builds) {
      for (const e of s) if (e.dead) s.delete(e);
      if (!s.size) this.builds.delete(d);
    }
    return removed;
  }

  /** Rewrites a project's index with its live segments only (written beside, then renamed over). */
  private compact(p: ProjectLog): void {
    const records = [...p.bySeg.values()].map((e) => frame(ADD, metaOf(e), bytesOf(e.bloom)));
    const tmp = join(p.dir, `${INDEX}.new`);
    const buf = Buffer.concat([...records, frame(COMMIT, null)]);
    writeFileSync(tmp, buf, { mode: 0o600 });
    renameSync(tmp, join(p.dir, INDEX));
    p.indexSize = buf.length;
    p.deadRecords = 0;
  }

  /** Log lines kept of a project (tests, and a deleted project's check). */
  lineCount(projectId: string): number {
    let n = 0;
    for (const e of this.projects.get(projectId)?.bySeg.values() ?? []) n += e.lines - e.skip;
    return n;
  }

  async importPosition(source: string): Promise<string | null> {
    return this.imports[source] ?? null;
  }

  /**
   * Lines moved in from elsewhere, then the position reached. Each project's part of a batch is
   * written whole or not at all (one commit), so a move cut short and resumed skips the parts it
   * finds (their first and last lines are here) instead of writing them twice.
   */
  async importBatch(source: string, lines: readonly StoredLine[], position: string): Promise<void> {
    const groups = new Map<string, StoredLine[]>();
    for (const l of lines) {
      const g = groups.get(l.project_id);
      if (g) g.push(l);
      else groups.set(l.project_id, [l]);
    }
    for (const g of groups.values()) {
      const sorted = [...g].sort((a, b) => -newerFirst(a, b));
      if (this.hasLine(sorted[0]!) && this.hasLine(sorted[sorted.length - 1]!)) continue;
      this.appendNow(sorted);
    }
    this.imports[source] = position;
    const tmp = join(this.root, `${IMPORTS}.new`);
    writeFileSync(tmp, JSON.stringify(this.imports), { mode: 0o600 });
    renameSync(tmp, join(this.root, IMPORTS));
  }

  async close(): Promise<void> {
    for (const fd of this.fds.values()) closeSync(fd);
    this.fds.clear();
    this.projects.clear();
  }
}
