import { mkdirSync, rmSync, unlinkSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { EngineUnavailable, type DumpFormat } from "../backends/databases/engine";
import { conflict, HttpError } from "../http/errors";
import type { DatabaseRecord, DatabasesService } from "./service";

/** A dump being sent: the bytes, read from a file already unlinked (nothing is left behind). */
export interface DumpStream {
  stream: ReadableStream<Uint8Array>;
  sizeBytes: number;
  fileName: string;
  contentType: string;
}

const CHUNK = 256 * 1024;

/**
 * pg_dump of a database, for users' own tools (`kiln db dump`, GET .../dump). The engine writes the
 * dump to a file under `dir` (it is made before a byte is sent, so a failure is an error status, not
 * a cut-off download); the response reads it in chunks, so memory stays flat whatever its size.
 */
export class DumpsService {
  private seq = 0;

  constructor(
    private readonly databases: DatabasesService,
    private readonly dir: string,
    private readonly log: { error: (m: string, e?: unknown) => void },
  ) {
    // Dumps a stop cut off are of no use to anyone.
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
  }

  async dump(d: DatabaseRecord, format: DumpFormat): Promise<DumpStream> {
    if (d.status !== "active") throw conflict(`the database is ${d.status}; it can be dumped once it is active`);
    const path = join(this.dir, `${d.id}-${process.pid}-${++this.seq}.${format === "custom" ? "dump" : "sql"}`);
    let sizeBytes: number;
    try {
      sizeBytes = await this.databases.engine.dump(d.id, format, path);
    } catch (err) {
      rmSync(path, { force: true });
      if (err instanceof EngineUnavailable) throw new HttpError(503, { error: err.message });
      this.log.error(`database ${d.id}: dump failed`, err);
      throw new HttpError(500, { error: `the dump failed: ${(err as Error).message}` });
    }
    const file = await open(path, "r");
    unlinkSync(path);
    const buf = new Uint8Array(CHUNK);
    const stream = new ReadableStream<Uint8Array>({
      pull: async (c) => {
        try {
          const { bytesRead } = await file.read(buf, 0, CHUNK, null);
          if (bytesRead === 0) {
            await file.close();
            c.close();
          } else c.enqueue(buf.slice(0, bytesRead));
        } catch (err) {
          await file.close().catch(() => {});
          c.error(err);
        }
      },
      cancel: () => file.close().catch(() => {}),
    });
    return {
      stream,
      sizeBytes,
      fileName: `${d.name}.${format === "custom" ? "dump" : "sql"}`,
      contentType: format === "custom" ? "application/octet-stream" : "application/sql; charset=utf-8",
    };
  }
}
