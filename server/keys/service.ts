import { notFound } from "../http/errors";
import { hashSecret, newId, newSecret, secretPrefix } from "../ids";
import { isoTime as iso, type ControlStore, type Row, type Sql } from "../store/store";

function serviceKeyView(r: Row) {
  return {
    id: r.id as string,
    name: r.name as string,
    key_prefix: r.key_prefix as string,
    permissions: (r.permissions ?? null) as string[] | null,
    created_at: iso(r.created_at),
    updated_at: iso(r.updated_at),
  };
}

function anonKeyView(r: Row) {
  return { id: r.id as string, name: r.name as string, key: r.key as string, permissions: (r.permissions ?? []) as string[], created_at: iso(r.created_at) };
}

/** Service keys (secret, hashed) and anon keys (publishable, stored as given) of a project. */
export class KeysService {
  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    private readonly evict: (keyId: string) => void,
  ) {}

  async createServiceKey(projectId: string, input: { name: string; permissions?: string[] }) {
    const key = newSecret("sk");
    const at = this.now().toISOString();
    const [r] = await this.store.query(
      `insert into service_keys (id, project_id, name, key_hash, key_prefix, permissions, created_at, updated_at)
       values ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $7) returning *`,
      [newId(), projectId, input.name, hashSecret(key), secretPrefix(key), input.permissions ? JSON.stringify(input.permissions) : null, at],
    );
    return { ...serviceKeyView(r!), key };
  }

  async listServiceKeys(projectId: string) {
    const rows = await this.store.query(`select * from service_keys where project_id = $1 order by created_at, id`, [projectId]);
    return rows.map(serviceKeyView);
  }

  private async serviceKeyRow(projectId: string, keyId: string): Promise<Row> {
    const [r] = await this.store.query(`select * from service_keys where id = $1 and project_id = $2`, [keyId, projectId]);
    if (!r) throw notFound("service key not found");
    return r;
  }

  async getServiceKey(projectId: string, keyId: string) {
    return serviceKeyView(await this.serviceKeyRow(projectId, keyId));
  }

  async updateServiceKey(projectId: string, keyId: string, input: { name?: string; permissions?: string[] | null }) {
    const cur = await this.serviceKeyRow(projectId, keyId);
    const permissions = input.permissions === undefined ? cur.permissions : input.permissions;
    const [r] = await this.store.query(
      `update service_keys set name = $3, permissions = $4::text::jsonb, updated_at = $5 where id = $1 and project_id = $2 returning *`,
      [keyId, projectId, input.name ?? cur.name, permissions === null ? null : JSON.stringify(permissions), this.now().toISOString()],
    );
    this.evict(keyId);
    return serviceKeyView(r!);
  }

  async deleteServiceKey(projectId: string, keyId: string): Promise<void> {
    await this.serviceKeyRow(projectId, keyId);
    await this.store.query(`delete from service_keys where id = $1 and project_id = $2`, [keyId, projectId]);
    this.evict(keyId);
  }

  async createAnonKey(projectId: string, input: { name: string; permissions?: string[] }, tx: Sql = this.store) {
    const [r] = await tx.query(
      `insert into anon_keys (id, project_id, name, key, permissions, created_at) values ($1, $2, $3, $4, $5::text::jsonb, $6) returning *`,
      [newId(), projectId, input.name, newSecret("ak"), JSON.stringify(input.permissions ?? []), this.now().toISOString()],
    );
    return anonKeyView(r!);
  }

  async listAnonKeys(projectId: string) {
    const rows = await this.store.query(`select * from anon_keys where project_id = $1 order by created_at, id`, [projectId]);
    return rows.map(anonKeyView);
  }

  async deleteAnonKey(projectId: string, keyId: string): Promise<void> {
    const rows = await this.store.query(`delete from anon_keys where id = $1 and project_id = $2 returning id`, [keyId, projectId]);
    if (!rows.length) throw notFound("anon key not found");
    this.evict(keyId);
  }

  /** Project deletion: every key stops working and is removed. */
  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from service_keys where project_id = $1`, [projectId]);
    await this.store.query(`delete from anon_keys where project_id = $1`, [projectId]);
  }
}
