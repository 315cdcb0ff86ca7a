import { createHash, randomBytes } from "node:crypto";
import { createWriteStream, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { Option, type Command } from "commander";
import { ApiError, Client, configFile, type GlobalOptions } from "../client";
import { formatBytes, formatDuration, output, printObject, printTable } from "../output";
import { CliError, HintedApiError } from "../errors";
import { act, appClient, csv, currentProject, keyOption, qs, requireProject, PROJECT_HELP, type KeyOptions } from "./shared";

// `kiln storage`: buckets and policies (management), and objects: cp up and down (resumable above a
// threshold, resumed after an interruption), ls, rm, mv. Objects and policies take an application
// credential (a service key: --key or KILN_SERVICE_KEY); buckets the CLI's own credential.

const MiB = 1024 * 1024;
/** Uploads from this size on use the resumable protocol (unless --resumable forces it earlier). */
const RESUMABLE_THRESHOLD = 64 * MiB;
const BUCKET_COLUMNS = ["name", "id", "file_size_limit", "allowed_mime_types", "created_at"];
const OBJECT_COLUMNS = ["name", "size", "mime_type", "updated_at"];
const POLICY_COLUMNS = ["id", "name", "operation", "definition"];

const storageKey = (c: Command) => keyOption(c, "service key of the project (or KILN_SERVICE_KEY); an end-user token or the anon key work too, within the bucket's policies");

/** `[kiln://]bucket/path/in/it` */
function parseRemote(arg: string, needPath = true): { bucket: string; path: string } {
  const s = arg.replace(/^kiln:\/\//, "");
  const i = s.indexOf("/");
  const bucket = i < 0 ? s : s.slice(0, i);
  const path = i < 0 ? "" : s.slice(i + 1);
  if (!bucket) throw new Error(`'${arg}' is not <bucket>/<path>`);
  if (needPath && !path) throw new Error(`'${arg}' names a bucket but no object: use <bucket>/<path>`);
  return { bucket, path };
}

const objectUrl = (bucket: string, path: string) => `/storage/${encodeURIComponent(bucket)}/${path.split("/").map(encodeURIComponent).join("/")}`;

/** 5242880, 5MiB, 5MB, 64k ... (KB/MB/GB decimal, KiB/MiB/GiB and k/m/g binary). */
export function parseBytes(v: string, what: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([kmg]?i?b?)?\s*$/i.exec(v);
  if (!m) throw new Error(`${what} must be a size in bytes such as 5242880, 5MiB or 5MB (got '${v}')`);
  const unit = (m[2] ?? "").toLowerCase();
  const dec: Record<string, number> = { "": 1, b: 1, kb: 1e3, mb: 1e6, gb: 1e9 };
  const bin: Record<string, number> = { k: 1024, kib: 1024, m: MiB, mib: MiB, g: 1024 * MiB, gib: 1024 * MiB };
  const mult = dec[unit] ?? bin[unit];
  if (mult === undefined) throw new Error(`${what}: unknown unit in '${v}'`);
  const n = Math.round(Number(m[1]) * mult);
  if (!Number.isSafeInteger(n)) throw new Error(`${what} is too large: '${v}'`);
  return n;
}

function positiveInt(v: string, what: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${what} must be a whole number from 1 (got '${v}')`);
  return n;
}

const rate = (bytes: number, ms: number) => `${formatBytes(Math.round(bytes / Math.max(ms / 1000, 0.001)))}/s`;

/** A one-line progress bar on stderr, drawn only when stderr is a terminal. */
class Progress {
  private done = 0;
  /** Bytes that were already there (a resumed upload's parts): shown, but not in the rate. */
  private skipped = 0;
  private last = 0;
  private readonly started = performance.now();
  constructor(
    private readonly label: string,
    private readonly total: number,
    private readonly enabled = Boolean(process.stderr.isTTY),
  ) {}

  add(bytes: number): void {
    this.done += bytes;
    const now = performance.now();
    if (!this.enabled || (now - this.last < 100 && this.done < this.total)) return;
    this.last = now;
    const frac = this.total > 0 ? Math.min(1, this.done / this.total) : 1;
    const width = 28;
    const full = Math.round(frac * width);
    const bar = "#".repeat(full) + "-".repeat(width - full);
    process.stderr.write(`\r\x1b[K${this.label} [${bar}] ${(frac * 100).toFixed(0).padStart(3)}% ${formatBytes(this.done)} / ${formatBytes(this.total)} ${rate(this.done - this.skipped, now - this.started)}`);
  }

  skip(bytes: number): void {
    this.skipped += bytes;
    this.add(bytes);
  }

  finish(): void {
    if (this.enabled) process.stderr.write("\r\x1b[K");
  }
}

/** A file's bytes as a stream that fails if the file grows or shrinks under it. */
function fileStream(path: string, size: number, onBytes: (n: number) => void): ReadableStream<Uint8Array> {
  const reader = Bun.file(path).stream().getReader();
  let seen = 0;
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      const { done, value } = await reader.read();
      if (done) {
        if (seen !== size) ctl.error(new Error(`${path} changed during the upload (${seen} bytes read, ${size} expected)`));
        else ctl.close();
        return;
      }
      seen += value.length;
      if (seen > size) return ctl.error(new Error(`${path} grew during the upload`));
      onBytes(value.length);
      ctl.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

function contentTypeOf(path: string, explicit?: string): string {
  if (explicit) return explicit;
  return (Bun.file(path).type || "application/octet-stream").split(";")[0]!.trim() || "application/octet-stream";
}

interface UploadOptions {
  upsert?: boolean;
  resumable?: boolean;
  partSize?: string;
  contentType?: string;
  metadata?: string;
  concurrency?: string;
  stopAfterParts?: string;
}

interface UploadResult {
  object: Record<string, unknown>;
  /** Bytes sent by this run (less than the file's size when an upload resumed). */
  sentBytes?: number;
  session?: { id: string; part_size: number; total_parts: number; parts_sent: number; parts_already_uploaded: number; resumed: boolean };
}

function parseMetadata(v: string | undefined): Record<string, unknown> | undefined {
  if (v === undefined) return undefined;
  let p: unknown;
  try {
    p = JSON.parse(v);
  } catch {
    throw new Error("--metadata must be a JSON object");
  }
  if (typeof p !== "object" || p === null || Array.isArray(p)) throw new Error("--metadata must be a JSON object");
  return p as Record<string, unknown>;
}

/** One multipart/form-data request, the file streamed from disk (Content-Length known in advance). */
async function multipartUpload(c: Client, local: string, size: number, bucket: string, path: string, o: UploadOptions, progress: Progress): Promise<UploadResult> {
  const boundary = `----kiln${randomBytes(12).toString("hex")}`;
  const metadata = parseMetadata(o.metadata);
  const filename = basename(local).replace(/["\r\n\\]/g, "_");
  const enc = new TextEncoder();
  const head = enc.encode(
    (metadata ? `--${boundary}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n${JSON.stringify(metadata)}\r\n` : "") +
      `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${filename}"\r\nContent-Type: ${contentTypeOf(local, o.contentType)}\r\n\r\n`,
  );
  const tail = enc.encode(`\r\n--${boundary}--\r\n`);
  const file = fileStream(local, size, (n) => progress.add(n)).getReader();
  let stage = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(ctl) {
      if (stage === 0) {
        stage = 1;
        return ctl.enqueue(head);
      }
      if (stage === 1) {
        const { done, value } = await file.read();
        if (!done) return ctl.enqueue(value);
        stage = 2;
        ctl.enqueue(tail);
        return ctl.close();
      }
      ctl.close();
    },
    cancel(reason) {
      return file.cancel(reason);
    },
  });
  const headers: Record<string, string> = { "Content-Type": `multipart/form-data; boundary=${boundary}`, "Content-Length": String(head.length + size + tail.length) };
  if (o.upsert) headers["x-upsert"] = "true";
  const res = await c.send("POST", objectUrl(bucket, path), { headers, body });
  if (!res.ok) throw await Client.apiError(res);
  return { object: (await res.json()) as Record<string, unknown> };
}

/** What the CLI keeps between runs of one resumable cp (in the CLI's config folder). */
interface UploadState {
  url: string;
  local: string;
  bucket: string;
  path: string;
  size: number;
  mtime_ms: number;
  session_id: string;
  part_size: number;
  total_parts: number;
  expires_at: string;
}

export function uploadStateFile(url: string, local: string, bucket: string, path: string): string {
  const id = createHash("sha256").update(JSON.stringify([url, resolve(local), bucket, path])).digest("hex").slice(0, 32);
  return join(dirname(configFile()), "uploads", `${id}.json`);
}

function readState(file: string): UploadState | null {
  try {
    return JSON.parse(readFileSync(file, "utf8")) as UploadState;
  } catch {
    return null;
  }
}

function writeState(file: string, s: UploadState): void {
  mkdirSync(dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(s, null, 2) + "\n", { mode: 0o600 });
  renameSync(tmp, file);
}

/** Network failures and 5xx are retried a few times (a part is idempotent: a re-upload replaces it). */
async function withRetries<T>(what: string, fn: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      const retryable = !(err instanceof ApiError) || err.status >= 500;
      if (!retryable || attempt >= 3) throw err;
      process.stderr.write(`kiln: ${what} failed (${(err as Error).message}); retrying\n`);
      await new Promise((r) => setTimeout(r, 500 * attempt));
    }
  }
}

/**
 * The resumable protocol: a session (kept in a state file), the parts not yet on the server (each
 * a slice of the file, several at a time), then completion. A re-run of the same cp asks the
 * session which parts it has and sends only the rest; a session that is gone starts over.
 */
async function resumableUpload(c: Client, local: string, size: number, mtimeMs: number, bucket: string, path: string, o: UploadOptions, progress: Progress): Promise<UploadResult> {
  const url = objectUrl(bucket, path);
  const stateFile = uploadStateFile(c.url, local, bucket, path);
  let state = readState(stateFile);
  let have = new Map<number, number>();
  let resumed = false;
  if (state && (state.size !== size || state.mtime_ms !== mtimeMs || state.bucket !== bucket || state.path !== path)) {
    process.stderr.write(`kiln: ${local} changed since the interrupted upload; starting over\n`);
    await c.send("DELETE", url, { headers: { "X-Upload-Session": state.session_id } }).then((r) => r.body?.cancel(), () => {});
    state = null;
  }
  if (state) {
    const res = await c.send("GET", url, { headers: { "X-Upload-Session": state.session_id } });
    if (res.status === 404) {
      await res.body?.cancel();
      process.stderr.write(`kiln: the interrupted upload's session ${state.session_id} is gone (expired, aborted or completed); starting over\n`);
      state = null;
    } else {
      if (!res.ok) throw await Client.apiError(res);
      const status = (await res.json()) as { parts: { part_number: number; size: number }[]; part_size: number; total_parts: number };
      have = new Map(status.parts.map((p) => [p.part_number, p.size]));
      state.part_size = status.part_size;
      state.total_parts = status.total_parts;
      resumed = true;
    }
  }
  if (!state) {
    rmSync(stateFile, { force: true });
    const metadata = parseMetadata(o.metadata);
    const body = {
      content_type: contentTypeOf(local, o.contentType),
      total_size: size,
      ...(o.partSize ? { part_size: parseBytes(o.partSize, "--part-size") } : {}),
      ...(metadata ? { metadata } : {}),
      ...(o.upsert ? { upsert: true } : {}),
    };
    const created = await c.request<{ session_id: string; part_size: number; total_parts: number; expires_at: string }>("POST", url, body);
    state = { url: c.url, local: resolve(local), bucket, path, size, mtime_ms: mtimeMs, session_id: created.session_id, part_size: created.part_size, total_parts: created.total_parts, expires_at: created.expires_at };
    writeState(stateFile, state);
  }
  const s = state;
  const expected = (n: number) => (n < s.total_parts ? s.part_size : size - s.part_size * (s.total_parts - 1));
  const todo: number[] = [];
  for (let n = 1; n <= s.total_parts; n++) {
    if (have.get(n) === expected(n)) progress.skip(expected(n));
    else todo.push(n);
  }
  const already = s.total_parts - todo.length;
  const stopAfter = o.stopAfterParts === undefined ? Infinity : positiveInt(o.stopAfterParts, "--stop-after-parts");
  const concurrency = o.concurrency === undefined ? 4 : positiveInt(o.concurrency, "--concurrency");
  let next = 0;
  let sent = 0;
  let claimed = 0;
  const file = Bun.file(local);
  const worker = async () => {
    while (next < todo.length && claimed < stopAfter) {
      const n = todo[next++]!;
      claimed++;
      const start = (n - 1) * s.part_size;
      await withRetries(`part ${n}`, async () => {
        const res = await c.send("PUT", url, {
          headers: { "X-Upload-Session": s.session_id, "X-Part-Number": String(n), "Content-Type": "application/octet-stream" },
          body: file.slice(start, start + expected(n)),
        });
        if (!res.ok) throw await Client.apiError(res);
        await res.body?.cancel();
      });
      sent++;
      progress.add(expected(n));
    }
  };
  const onSignal = () => {
    progress.finish();
    process.stderr.write(`\nkiln: interrupted; ${sent + already} of ${s.total_parts} parts are on the server. Run the same command again to resume.\n`);
    process.exit(130);
  };
  process.once("SIGINT", onSignal);
  try {
    await Promise.all(Array.from({ length: Math.min(concurrency, Math.max(1, todo.length)) }, worker));
  } finally {
    process.off("SIGINT", onSignal);
  }
  if (sent < todo.length) {
    progress.finish();
    throw new Error(
      `stopped after ${sent} part${sent === 1 ? "" : "s"} (--stop-after-parts): ${sent + already} of ${s.total_parts} parts of session ${s.session_id} are on the server; run the same command again to resume`,
    );
  }
  const res = await c.send("POST", url, { headers: { "X-Upload-Session": s.session_id, "X-Upload-Complete": "true" } });
  if (!res.ok) throw await Client.apiError(res);
  const object = (await res.json()) as Record<string, unknown>;
  rmSync(stateFile, { force: true });
  return {
    object,
    sentBytes: todo.reduce((a, n) => a + expected(n), 0),
    session: { id: s.session_id, part_size: s.part_size, total_parts: s.total_parts, parts_sent: sent, parts_already_uploaded: already, resumed },
  };
}

async function upload(c: Client, g: GlobalOptions, local: string, remote: string, o: UploadOptions): Promise<void> {
  const st = statSync(local);
  if (!st.isFile()) throw new Error(`${local} is not a file`);
  let { bucket, path } = parseRemote(remote, false);
  if (!path || path.endsWith("/")) path += basename(local);
  const progress = new Progress(`${basename(local)} -> ${bucket}/${path}`, st.size);
  const t0 = performance.now();
  const useResumable = st.size > 0 && (o.resumable || st.size >= RESUMABLE_THRESHOLD);
  const r = useResumable ? await resumableUpload(c, local, st.size, st.mtimeMs, bucket, path, o, progress) : await multipartUpload(c, local, st.size, bucket, path, o, progress);
  progress.finish();
  const ms = performance.now() - t0;
  const how = r.session
    ? `resumable, ${r.session.total_parts} part${r.session.total_parts === 1 ? "" : "s"} of ${formatBytes(r.session.part_size)}${r.session.parts_already_uploaded ? `, ${r.session.parts_already_uploaded} already uploaded` : ""}`
    : "multipart";
  const sent = r.sentBytes ?? st.size;
  const summary = `Uploaded ${local} -> ${bucket}/${path}: ${formatBytes(st.size)}${sent !== st.size ? ` (${formatBytes(sent)} sent now)` : ""} in ${formatDuration(ms)} (${rate(sent, ms)}, ${how})`;
  const result = { direction: "upload", local, bucket, path, bytes: st.size, bytes_sent: sent, seconds: Number((ms / 1000).toFixed(3)), object: r.object, ...(r.session ? { session: r.session } : {}) };
  if (g.json) process.stderr.write(summary + "\n");
  output(g.json, result, () => console.log(summary));
}

/** The object streamed to a temporary file next to the destination, renamed into place when whole. */
async function download(c: Client, g: GlobalOptions, remote: string, local: string): Promise<void> {
  const { bucket, path } = parseRemote(remote);
  const toStdout = local === "-";
  let dest = local;
  if (!toStdout && (local.endsWith("/") || (existsSync(local) && statSync(local).isDirectory()))) dest = join(local, basename(path));
  const t0 = performance.now();
  const res = await c.send("GET", objectUrl(bucket, path));
  if (!res.ok) throw await Client.apiError(res);
  const declared = res.headers.get("content-length");
  const total = declared === null ? 0 : Number(declared);
  const progress = new Progress(`${bucket}/${path} -> ${toStdout ? "stdout" : basename(dest)}`, total, !toStdout && Boolean(process.stderr.isTTY));
  const tmp = toStdout ? "" : join(dirname(resolve(dest)), `.${basename(dest)}.kiln-download-${randomBytes(4).toString("hex")}`);
  const out = toStdout ? process.stdout : createWriteStream(tmp);
  let bytes = 0;
  try {
    if (res.body)
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        bytes += chunk.length;
        progress.add(chunk.length);
        if (!out.write(chunk)) await new Promise((r) => out.once("drain", r));
      }
    if (declared !== null && bytes !== total) throw new Error(`the download ended after ${bytes} of ${total} bytes`);
    if (!toStdout) {
      await new Promise<void>((ok, fail) => (out as ReturnType<typeof createWriteStream>).end((err?: Error | null) => (err ? fail(err) : ok())));
      renameSync(tmp, dest);
    }
  } catch (err) {
    if (!toStdout) {
      (out as ReturnType<typeof createWriteStream>).destroy();
      rmSync(tmp, { force: true });
    }
    throw err;
  } finally {
    progress.finish();
  }
  const ms = performance.now() - t0;
  const summary = `Downloaded ${bucket}/${path} -> ${toStdout ? "stdout" : dest}: ${formatBytes(bytes)} in ${formatDuration(ms)} (${rate(bytes, ms)})`;
  if (toStdout || g.json) {
    process.stderr.write(summary + "\n");
    if (g.json && !toStdout) console.log(JSON.stringify({ direction: "download", bucket, path, local: dest, bytes, seconds: Number((ms / 1000).toFixed(3)), etag: res.headers.get("etag") }, null, 2));
  } else console.log(summary);
}

/** A bucket's id: looked up by name through the management API with --project, else taken as given. */
async function bucketId(c: Client, o: { project?: string }, bucket: string): Promise<string> {
  const project = currentProject(o)?.id;
  if (!project) return bucket;
  try {
    return (await c.request<{ id: string }>("GET", `/projects/${encodeURIComponent(project)}/storage/buckets/${encodeURIComponent(bucket)}`)).id;
  } catch (err) {
    // Not a name in that project: perhaps an id (policy calls answer 404 if it is not one either).
    if (err instanceof ApiError && err.status === 404) return bucket;
    throw err;
  }
}

function sizeLimit(v: string): number | null {
  return /^(none|null|unlimited)$/i.test(v.trim()) ? null : parseBytes(v, "--file-size-limit");
}

export function storageCommand(program: Command): void {
  const storage = program
    .command("storage")
    .description("object storage: buckets (--project), objects and policies (an application key: --key or KILN_SERVICE_KEY)");

  // Buckets: the management API, with the CLI's own credential (platform or project token).
  const buckets = storage.command("buckets").description("manage a project's buckets");
  const bucketsBase = (o: { project?: string }) => `/projects/${encodeURIComponent(requireProject(o))}/storage/buckets`;
  buckets
    .command("create <name>")
    .option("--project <id>", PROJECT_HELP)
    .option("--file-size-limit <bytes>", "largest object: bytes, or with a unit (10MB, 5MiB); default unlimited")
    .option("--allowed-mime-types <types>", "comma-separated MIME types, wildcards allowed (image/*,application/pdf); default any")
    .action(
      act(async (c, g, name: string, o: { project?: string; fileSizeLimit?: string; allowedMimeTypes?: string }) => {
        const body: Record<string, unknown> = { name };
        if (o.fileSizeLimit !== undefined) body.file_size_limit = sizeLimit(o.fileSizeLimit);
        if (o.allowedMimeTypes !== undefined) body.allowed_mime_types = csv(o.allowedMimeTypes);
        const r = await c.request("POST", bucketsBase(o), body);
        output(g.json, r, () => printObject(r));
      }),
    );
  buckets
    .command("list")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, o: { project?: string }) => {
        const r = await c.request("GET", bucketsBase(o));
        output(g.json, r, () => printTable(r.buckets, BUCKET_COLUMNS, "buckets"));
      }),
    );
  buckets
    .command("get <name>")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project?: string }) => {
        const r = await c.request("GET", `${bucketsBase(o)}/${encodeURIComponent(name)}`);
        output(g.json, r, () => printObject(r));
      }),
    );
  buckets
    .command("update <name>")
    .option("--project <id>", PROJECT_HELP)
    .option("--file-size-limit <bytes>", "largest object (bytes or 10MB, 5MiB), or 'none' for unlimited")
    .option("--allowed-mime-types <types>", "comma-separated MIME types (wildcards allowed); '' for any")
    .action(
      act(async (c, g, name: string, o: { project?: string; fileSizeLimit?: string; allowedMimeTypes?: string }) => {
        const body: Record<string, unknown> = {};
        if (o.fileSizeLimit !== undefined) body.file_size_limit = sizeLimit(o.fileSizeLimit);
        if (o.allowedMimeTypes !== undefined) body.allowed_mime_types = csv(o.allowedMimeTypes);
        if (!Object.keys(body).length) throw new Error("nothing to change: pass --file-size-limit and/or --allowed-mime-types");
        const r = await c.request("PATCH", `${bucketsBase(o)}/${encodeURIComponent(name)}`, body);
        output(g.json, r, () => printObject(r));
      }),
    );
  buckets
    .command("delete <name>")
    .description("delete a bucket with every object, policy and upload session in it")
    .option("--project <id>", PROJECT_HELP)
    .action(
      act(async (c, g, name: string, o: { project?: string }) => {
        const r = await c.request("DELETE", `${bucketsBase(o)}/${encodeURIComponent(name)}`);
        output(g.json, r, () => console.log(r.message));
      }),
    );

  // Objects: an application credential.
  storageKey(
    storage
      .command("cp <source> <destination>")
      .description(
        "upload (cp <local-file> <bucket>/<path>) or download (cp <bucket>/<path> <local-file>, - for stdout). The source decides: an existing local file uploads, " +
          "anything else is <bucket>/<path> (kiln://<bucket>/<path> to be explicit). Files from 64 MiB on (or with --resumable) go up in parts and an interrupted upload resumes when the same cp runs again",
      )
      .option("--upsert", "replace the object if it exists")
      .option("--resumable", "use the resumable protocol whatever the size")
      .option("--part-size <bytes>", "resumable part size (5 MiB to 25 MiB; bytes or 5MiB); default 25 MiB")
      .option("--concurrency <n>", "resumable parts sent at once", "4")
      .option("--content-type <type>", "the object's MIME type (default: from the file name)")
      .option("--metadata <json>", "custom metadata, a JSON object (at most 50 keys, 10 KB)")
      .addOption(new Option("--stop-after-parts <n>", "testing: stop (as if interrupted) after sending n parts").hideHelp()),
  ).action(
    act(async (c, g, source: string, destination: string, o: UploadOptions & KeyOptions) => {
      const isLocal = !source.startsWith("kiln://") && existsSync(source);
      // A source written as a path (./x, ../x, /x, ~/x), or copied to kiln://, is meant as a local file;
      // so is one without a slash, which cannot be <bucket>/<path>.
      const remote = source.startsWith("kiln://");
      const meantLocal = !remote && (/^(\.{1,2}|~)?[\\/]/.test(source) || /^[a-z]:[\\/]/i.test(source) || !source.includes("/") || destination.startsWith("kiln://"));
      if (!isLocal && meantLocal) throw new CliError(`no such local file ${source}`, `check the path (relative to ${process.cwd()}); to download, give the source as <bucket>/<path> or kiln://<bucket>/<path>`);
      if (isLocal && statSync(source).isDirectory()) throw new CliError(`${source} is a directory: cp copies one file`, `copy each file, e.g. kiln storage cp ${source}/<file> ${destination}`);
      const app = appClient(c, o, "storage objects");
      if (isLocal) {
        try {
          return await upload(app, g, source, destination, o);
        } catch (err) {
          // The server speaks HTTP (x-upsert); the CLI's way to replace is --upsert.
          if (err instanceof ApiError && err.status === 409 && !o.upsert)
            throw new HintedApiError(err, "pass --upsert to replace it", ApiError.reason(err.body).replace(/\s*\(send (x-)?upsert: true to replace it\)/, ""));
          throw err;
        }
      }
      try {
        await download(app, g, source, destination);
      } catch (err) {
        if (err instanceof ApiError && err.status === 404)
          throw new HintedApiError(err, `downloading ${source} found nothing there, and there is no local file ${source} to upload either`);
        throw err;
      }
    }),
  );
  storageKey(
    storage
      .command("ls <location>")
      .description("list objects: <bucket> or <bucket>/<prefix> (a name prefix: photos/2024 matches photos/2024-01.png and photos/2024/a.png)")
      .option("--limit <n>", "at most this many objects (default: all; pages of up to 1000 are followed)")
      .addOption(new Option("--page-size <n>", "testing: objects per request (1-1000)").hideHelp()),
  ).action(
    act(async (c, g, location: string, o: KeyOptions & { limit?: string; pageSize?: string }) => {
      const app = appClient(c, o, "storage objects");
      const { bucket, path: prefix } = parseRemote(location, false);
      const limit = o.limit === undefined ? Infinity : positiveInt(o.limit, "--limit");
      const pageSize = o.pageSize === undefined ? 1000 : Math.min(1000, positiveInt(o.pageSize, "--page-size"));
      const objects: Record<string, unknown>[] = [];
      let cursor: string | undefined;
      let next: string | null = null;
      do {
        const page = await app.request<{ objects: Record<string, unknown>[]; next_cursor: string | null }>(
          "GET",
          `/storage/${encodeURIComponent(bucket)}${qs({ prefix: prefix || undefined, limit: Math.min(pageSize, limit - objects.length), cursor })}`,
        );
        objects.push(...page.objects);
        next = page.next_cursor;
        cursor = next ?? undefined;
      } while (next && objects.length < limit);
      output(g.json, { objects, next_cursor: next }, () => {
        printTable(objects, OBJECT_COLUMNS, "objects");
        if (next) console.log(`(more objects follow; raise --limit to see them)`);
      });
    }),
  );
  storageKey(storage.command("rm <objects...>").description("delete objects: <bucket>/<path> ...")).action(
    act(async (c, g, targets: string[], o: KeyOptions) => {
      const app = appClient(c, o, "storage objects");
      const deleted: string[] = [];
      for (const t of targets) {
        const { bucket, path } = parseRemote(t);
        try {
          await app.request("DELETE", objectUrl(bucket, path));
        } catch (err) {
          throw new Error(`${bucket}/${path}: ${(err as Error).message}`);
        }
        deleted.push(`${bucket}/${path}`);
        if (!g.json) console.log(`Deleted ${bucket}/${path}`);
      }
      if (g.json) console.log(JSON.stringify({ deleted }, null, 2));
    }),
  );
  storageKey(storage.command("mv <from> <to>").description("rename an object within its bucket: mv <bucket>/<from-path> <to-path> (to-path is in the same bucket)")).action(
    act(async (c, g, from: string, to: string, o: KeyOptions) => {
      const app = appClient(c, o, "storage objects");
      const src = parseRemote(from);
      const dest = to.replace(/^kiln:\/\//, "");
      const r = await app.request("POST", `/storage/${encodeURIComponent(src.bucket)}/move`, { from: src.path, to: dest });
      output(g.json, r, () => console.log(`Moved ${src.bucket}/${src.path} -> ${src.bucket}/${r.name}`));
    }),
  );

  // Policies: a service key; the bucket by name (resolved with --project and the CLI's credential) or id.
  const policies = storage.command("policies").description("a bucket's access policies (SQL boolean expressions; service key)");
  const policyBase = async (c: Client, o: { project?: string }, bucket: string) => `/storage/buckets/${encodeURIComponent(await bucketId(c, o, bucket))}/policies`;
  /** A policy call; without a project, a 404 may mean a bucket name was given where an id was taken. */
  const policyCall = async (app: Client, c: Client, o: { project?: string }, bucket: string, method: string, rest = "", body?: unknown) => {
    try {
      return await app.request(method, `${await policyBase(c, o, bucket)}${rest}`, body);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404 && !currentProject(o))
        throw new HintedApiError(err, "to name the bucket by name rather than id, pass --project <id> (or set KILN_PROJECT, or run `kiln use <project>`)");
      throw err;
    }
  };
  const bucketArg = "the bucket: its name (the project from --project, KILN_PROJECT or `kiln use`), or its id";
  storageKey(
    policies
      .command("create <bucket>")
      .description(`create a policy; <bucket>: ${bucketArg}`)
      .option("--project <id>", "the project, to find the bucket by name (default: KILN_PROJECT, else `kiln use`'s)")
      .requiredOption("--name <name>", "unique in the bucket")
      .requiredOption("--operation <op>", "SELECT, INSERT, UPDATE or DELETE")
      .requiredOption("--definition <sql>", "a SQL boolean expression over bucket_id, name, owner_id, size, mime_type, is_public, metadata, e.g. \"owner_id = auth.uid()\""),
  ).action(
    act(async (c, g, bucket: string, o: KeyOptions & { project?: string; name: string; operation: string; definition: string }) => {
      const app = appClient(c, o, "storage policies");
      const r = await policyCall(app, c, o, bucket, "POST", "", { name: o.name, operation: o.operation.toUpperCase(), definition: o.definition });
      output(g.json, r, () => printObject(r));
    }),
  );
  storageKey(
    policies
      .command("list <bucket>")
      .description(`list a bucket's policies; <bucket>: ${bucketArg}`)
      .option("--project <id>", "the project, to find the bucket by name (default: KILN_PROJECT, else `kiln use`'s)"),
  ).action(
    act(async (c, g, bucket: string, o: KeyOptions & { project?: string }) => {
      const app = appClient(c, o, "storage policies");
      const r = await policyCall(app, c, o, bucket, "GET");
      output(g.json, r, () => printTable(r.policies, POLICY_COLUMNS, "policies"));
    }),
  );
  storageKey(
    policies
      .command("delete <bucket> <policy-id>")
      .description(`delete a policy; <bucket>: ${bucketArg}`)
      .option("--project <id>", "the project, to find the bucket by name (default: KILN_PROJECT, else `kiln use`'s)"),
  ).action(
    act(async (c, g, bucket: string, policyId: string, o: KeyOptions & { project?: string }) => {
      const app = appClient(c, o, "storage policies");
      const r = await policyCall(app, c, o, bucket, "DELETE", `/${encodeURIComponent(policyId)}`);
      output(g.json, r, () => console.log(r.message));
    }),
  );
}
