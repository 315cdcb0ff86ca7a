import { existsSync } from "node:fs";
import { packFolder, unpackFolder } from "../store/folder-archive";
import type { ControlStore, Sql } from "../store/store";

/**
 * A frontend deployment's archive (`source`) and built output (`built`) in the control store, for
 * the production profile: instances share the store but each has its own data dir, so the instance
 * that serves a site (or redeploys it) may not be the one that took the upload or ran the build. The
 * embedded profile (one instance) keeps nothing here.
 */
export class FrontendCode {
  constructor(private readonly store: ControlStore) {}

  async saveSource(deploymentId: string, bytes: Uint8Array): Promise<void> {
    await this.store.query(`insert into frontend_code (deployment_id, kind, bytes) values ($1, 'source', $2) on conflict (deployment_id, kind) do update set bytes = excluded.bytes`, [deploymentId, Buffer.from(bytes)]);
  }

  async readSource(deploymentId: string): Promise<Buffer | null> {
    const [row] = await this.store.query<{ bytes: Uint8Array }>(`select bytes from frontend_code where deployment_id = $1 and kind = 'source'`, [deploymentId]);
    return row ? Buffer.from(row.bytes) : null;
  }

  /** A built deployment folder as a tar.gz (before the switch's transaction: packing takes a while). */
  pack(root: string): Promise<Buffer> {
    return packFolder(root);
  }

  /** In the switch's transaction; the built outputs of the frontend's other deployments but `keep` go. */
  async saveBuilt(tx: Sql, frontendId: string, deploymentId: string, packed: Buffer, keep: string | null): Promise<void> {
    await tx.query(`insert into frontend_code (deployment_id, kind, bytes) values ($1, 'built', $2) on conflict (deployment_id, kind) do update set bytes = excluded.bytes`, [deploymentId, packed]);
    await tx.query(
      `delete from frontend_code where kind = 'built' and deployment_id in (select id from frontend_deployments where frontend_id = $1 and id <> $2 and id <> coalesce($3, ''))`,
      [frontendId, deploymentId, keep],
    );
  }

  /** Unpacks a deployment another instance built into `root` (a temporary folder renamed into place); false when nothing is stored. */
  async unpackBuilt(deploymentId: string, root: string): Promise<boolean> {
    if (existsSync(root)) return true;
    const [row] = await this.store.query<{ bytes: Uint8Array }>(`select bytes from frontend_code where deployment_id = $1 and kind = 'built'`, [deploymentId]);
    if (!row) return false;
    await unpackFolder(row.bytes, root);
    return true;
  }

  async removeFrontend(tx: Sql, frontendId: string): Promise<void> {
    await tx.query(`delete from frontend_code where deployment_id in (select id from frontend_deployments where frontend_id = $1)`, [frontendId]);
  }
}
