import { existsSync } from "node:fs";
import { packFolder, unpackFolder } from "../store/folder-archive";
import type { ControlStore, Sql } from "../store/store";

/**
 * Built code shared between instances (production profile): each instance builds into its own data
 * dir, so a deployment built by one is kept in the control store as a tar.gz (`function_code`, kind
 * `built`) and unpacked by any other instance the first time it runs that deployment (a scheduler
 * tick, a durable execution it took over, an invocation that reached it). The embedded profile has
 * one instance and keeps nothing here.
 */
export class SharedCode {
  /** Deployments whose folder is known to be here (checked once per deployment, then in memory). */
  private readonly present = new Set<string>();
  private readonly fetching = new Map<string, Promise<void>>();

  constructor(private readonly store: ControlStore) {}

  /** A built folder as a tar.gz (before the transaction that records it: packing takes a while). */
  pack(root: string): Promise<Buffer> {
    return packFolder(root);
  }

  /** In the transaction that marks the deployment succeeded: its packed folder. */
  async save(tx: Sql, deploymentId: string, packed: Buffer): Promise<void> {
    await tx.query(`insert into function_code (deployment_id, kind, bytes) values ($1, 'built', $2) on conflict (deployment_id, kind) do update set bytes = excluded.bytes`, [deploymentId, packed]);
    this.present.add(deploymentId);
  }

  /**
   * Null when the deployment's folder is here (the warm path: a set lookup); otherwise a promise that
   * unpacks it from the store (once, however many callers wait). A deployment nobody stored stays
   * missing, and the worker's start names the missing folder.
   */
  ensure(deploymentId: string, root: string): Promise<void> | null {
    if (this.present.has(deploymentId)) return null;
    if (existsSync(root)) {
      this.present.add(deploymentId);
      return null;
    }
    let p = this.fetching.get(deploymentId);
    if (!p) {
      p = this.unpack(deploymentId, root).finally(() => this.fetching.delete(deploymentId));
      this.fetching.set(deploymentId, p);
    }
    return p;
  }

  /** Another instance removed it here too (a new deployment serves, or the function is gone). */
  forget(deploymentId: string): void {
    this.present.delete(deploymentId);
  }

  private async unpack(deploymentId: string, root: string): Promise<void> {
    const [row] = await this.store.query<{ bytes: Uint8Array }>(`select bytes from function_code where deployment_id = $1 and kind = 'built'`, [deploymentId]);
    if (!row) return;
    // (A worker never sees a half-unpacked folder: unpackFolder renames it into place.)
    await unpackFolder(row.bytes, root);
    this.present.add(deploymentId);
  }
}
