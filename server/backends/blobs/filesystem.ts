import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, mkdirSync, rmSync } from "node:fs";
import { copyFile, open, readdir, rename, rm, stat } from "node:fs/promises";
import { dirname, join, sep } from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { BlobTooLarge, noteBytesReceived, type BlobStore } from "./blob-store";

/** Kiln's keys are its own ([A-Za-z0-9/_.-], no `..`): anything else is a programming error. */
function checkKey(key: string): void {
  if (!/^[A-Za-z0-9_.-]+(\/[A-Za-z0-9_.-]+)*$/.test(key) || key.split("/").some((p) => p === "." || p === "..")) throw new Error(`bad blob key '${key}'`);
}

/**
 * Blobs as files under one folder (`<data-dir>/blobs/storage`). A write goes to a temporary file in
 * the same folder, is fsynced, renamed into place, and the folder fsynced: a crash leaves either the
 * old bytes or the new, never a partial file under the key (temporaries are swept at start).
 */
export class FilesystemBlobStore implements BlobStore {
  readonly kind = "filesystem" as const;

  constructor(private readonly root: string) {
    mkdirSync(root, { recursive: true });
  }

  private path(key: string): string {
    checkKey(key);
    return join(this.root, ...key.split("/"));
  }

  /** Temporaries a crash left behind (`.tmp-*` files) are removed. */
  async sweep(): Promise<void> {
    const walk = async (dir: string): Promise<void> => {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch {
        return;
      }
      for (const e of entries) {
        const p = join(dir, e.name);
        if (e.isDirectory()) await walk(p);
        else if (e.name.startsWith(".tmp-")) await rm(p, { force: true });
      }
    };
    await walk(this.root);
  }

  private tmpFor(path: string): string {
    return join(dirname(path), `.tmp-${randomBytes(8).toString("hex")}`);
  }

  /** fsync the file, rename it into place, fsync the folder: the rename is then durable too. */
  private async commit(tmp: string, path: string): Promise<void> {
    const fh = await open(tmp, "r");
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
    const dh = await open(dirname(path), "r");
    try {
      await dh.sync();
    } finally {
      await dh.close();
    }
  }

  async put(key: string, body: Readable, opts: { maxBytes?: number } = {}): Promise<{ size: number; md5: string }> {
    const path = this.path(key);
    mkdirSync(dirname(path), { recursive: true });
    const tmp = this.tmpFor(path);
    const md5 = createHash("md5");
    let size = 0;
    const max = opts.maxBytes ?? Number.POSITIVE_INFINITY;
    try {
      await pipeline(
        body,
        async function* (source: AsyncIterable<Buffer>) {
          for await (const chunk of source) {
            size += chunk.length;
            noteBytesReceived(chunk.length);
            if (size > max) throw new BlobTooLarge(max);
            md5.update(chunk);
            yield chunk;
          }
        },
        createWriteStream(tmp),
      );
      await this.commit(tmp, path);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    return { size, md5: md5.digest("hex") };
  }

  async get(key: string, range?: { start: number; end: number }): Promise<Readable | null> {
    const path = this.path(key);
    try {
      await stat(path);
    } catch {
      return null;
    }
    return createReadStream(path, range ? { start: range.start, end: range.end, highWaterMark: 256 * 1024 } : { highWaterMark: 256 * 1024 });
  }

  async blob(key: string, range?: { start: number; end: number }): Promise<Blob | null> {
    const path = this.path(key);
    if (!(await this.stat(key))) return null;
    const file = Bun.file(path);
    return range ? file.slice(range.start, range.end + 1) : file;
  }

  async stat(key: string): Promise<{ size: number } | null> {
    try {
      const s = await stat(this.path(key));
      return s.isFile() ? { size: s.size } : null;
    } catch {
      return null;
    }
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true });
  }

  async deletePrefix(prefix: string): Promise<void> {
    const trimmed = prefix.replace(/\/+$/, "");
    if (!trimmed) throw new Error("refusing to delete every blob");
    const path = this.path(trimmed);
    if (prefix.endsWith("/")) return rm(path, { recursive: true, force: true });
    // A bare prefix: every file and folder in its parent whose name starts with its last part.
    const parent = dirname(path);
    const base = path.slice(parent.length + sep.length);
    let entries: string[] = [];
    try {
      entries = await readdir(parent);
    } catch {
      return;
    }
    for (const e of entries) if (e.startsWith(base)) await rm(join(parent, e), { recursive: true, force: true });
  }

  async copy(from: string, to: string): Promise<void> {
    const src = this.path(from);
    const dst = this.path(to);
    mkdirSync(dirname(dst), { recursive: true });
    const tmp = this.tmpFor(dst);
    try {
      await copyFile(src, tmp);
      await this.commit(tmp, dst);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
  }

  async assemble(key: string, parts: string[]): Promise<{ size: number }> {
    const path = this.path(key);
    mkdirSync(dirname(path), { recursive: true });
    const tmp = this.tmpFor(path);
    let size = 0;
    try {
      // One reused buffer: reading ahead of the disk through streams piles up garbage chunks.
      const out = await open(tmp, "w");
      const buf = Buffer.allocUnsafe(1024 * 1024);
      try {
        for (const part of parts) {
          const src = await open(this.path(part), "r");
          try {
            for (;;) {
              const { bytesRead } = await src.read(buf, 0, buf.length, null);
              if (!bytesRead) break;
              await out.write(buf, 0, bytesRead);
              size += bytesRead;
            }
          } finally {
            await src.close();
          }
        }
      } finally {
        await out.close();
      }
      await this.commit(tmp, path);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    return { size };
  }

  async close(): Promise<void> {}
}
