import { mkdirSync } from "node:fs";
import { open, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import type { ControlStore } from "../store/store";

/**
 * The normalized source archives, one file per deployment: `<dir>/<deployment>.tar.gz`. A deploy
 * writes its archive before the deployment row that names it is committed, so a queued deployment
 * always finds its source, even after a crash. With `shared` (the production profile: instances
 * sharing one control store, each with its own data dir) the archive is also a `function_code` row
 * (kind `source`), read from there by an instance that does not have the file: a deploy accepted by
 * one instance may be built by another.
 */
export class SourceBlobs {
  constructor(
    private readonly dir: string,
    private readonly shared: ControlStore | null = null,
  ) {
    mkdirSync(dir, { recursive: true });
  }

  private path(deploymentId: string): string {
    return join(this.dir, `${deploymentId}.tar.gz`);
  }

  /** Atomic and durable: a temporary file, fsynced, renamed into place, and the rename fsynced. */
  async write(deploymentId: string, bytes: Uint8Array): Promise<void> {
    const target = this.path(deploymentId);
    const temp = `${target}.${process.pid}.tmp`;
    try {
      const f = await open(temp, "w", 0o600);
      try {
        await f.writeFile(bytes);
        await f.sync();
      } finally {
        await f.close();
      }
      await rename(temp, target);
    } catch (err) {
      await rm(temp, { force: true });
      throw err;
    }
    const dir = await open(this.dir, "r");
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
    if (this.shared)
      await this.shared.query(`insert into function_code (deployment_id, kind, bytes) values ($1, 'source', $2) on conflict (deployment_id, kind) do update set bytes = excluded.bytes`, [
        deploymentId,
        Buffer.from(bytes),
      ]);
  }

  async read(deploymentId: string): Promise<Buffer> {
    try {
      return await readFile(this.path(deploymentId));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT" || !this.shared) throw err;
      const [row] = await this.shared.query<{ bytes: Uint8Array }>(`select bytes from function_code where deployment_id = $1 and kind = 'source'`, [deploymentId]);
      if (!row) throw err;
      return Buffer.from(row.bytes);
    }
  }

  /** Idempotent: an archive already gone is fine. Its built code (shared) goes with it. */
  async delete(deploymentId: string): Promise<void> {
    await rm(this.path(deploymentId), { force: true });
    if (this.shared) await this.shared.query(`delete from function_code where deployment_id = $1`, [deploymentId]);
  }
}
