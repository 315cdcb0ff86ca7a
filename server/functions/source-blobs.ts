import { mkdirSync } from "node:fs";
import { open, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";

/**
 * The normalized source archives, one file per deployment: `<dir>/<deployment>.tar.gz`. A deploy
 * writes its archive before the deployment row that names it is committed, so a queued deployment
 * always finds its source, even after a crash.
 */
export class SourceBlobs {
  constructor(private readonly dir: string) {
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
  }

  read(deploymentId: string): Promise<Buffer> {
    return readFile(this.path(deploymentId));
  }

  /** Idempotent: an archive already gone is fine. */
  async delete(deploymentId: string): Promise<void> {
    await rm(this.path(deploymentId), { force: true });
  }
}
