import { badRequest, conflict, notFound } from "../http/errors";
import { newId } from "../ids";
import type { SecretKey } from "../secrets/secret-key";
import { isoTime, isUniqueViolation, type ControlStore, type Row } from "../store/store";
import { PROVIDERS, type ProviderId } from "./providers";

export interface OAuthConfigView {
  id: string;
  provider: ProviderId;
  client_id: string;
  client_secret?: string;
  enabled: boolean;
  redirect_url: string | null;
  scopes: string[];
  issuer: string | null;
  uses: "emulator" | "provider";
  created_at: string;
  updated_at: string;
}

/** A config as the sign-in flow needs it: the secret decrypted. Never leaves the server. */
export interface OAuthConfig {
  id: string;
  projectId: string;
  provider: ProviderId;
  clientId: string;
  clientSecret: string | null;
  enabled: boolean;
  redirectUrl: string | null;
  scopes: string[];
  issuer: string | null;
}

export interface CreateConfig {
  provider: ProviderId;
  client_id: string;
  client_secret?: string;
  redirect_url?: string;
  scopes?: string[];
  enabled?: boolean;
  issuer?: string;
}
export type UpdateConfig = Partial<Omit<CreateConfig, "provider" | "issuer">> & { issuer?: string | null };

/**
 * The first 4 and last 4 characters, as the spec shows a secret; a secret too short for that to
 * hide anything shows only its length's worth of nothing.
 */
export function maskSecret(s: string): string {
  return s.length >= 12 ? `${s.slice(0, 4)}…${s.slice(-4)}` : "…";
}

/**
 * A project's OAuth provider configurations. Client secrets are written encrypted with the instance
 * secret key (server/secrets) and are only ever decrypted for the sign-in flow: responses carry them
 * masked (single get, create, update) or not at all (list).
 */
export class OAuthConfigsService {
  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
    private readonly secretKey: SecretKey,
    /** Whether a config without an issuer signs in against the local emulators (embedded profile). */
    private readonly emulatorByDefault: boolean,
  ) {}

  private view(r: Row, secret: "masked" | "omitted"): OAuthConfigView {
    const v: OAuthConfigView = {
      id: r.id,
      provider: r.provider,
      client_id: r.client_id,
      enabled: r.enabled,
      redirect_url: r.redirect_url ?? null,
      scopes: r.scopes,
      issuer: r.issuer ?? null,
      uses: this.usesEmulator(r.provider, r.issuer) ? "emulator" : "provider",
      created_at: isoTime(r.created_at),
      updated_at: isoTime(r.updated_at),
    };
    if (secret === "masked" && r.client_secret) v.client_secret = maskSecret(this.secretKey.decrypt(r.client_secret));
    return v;
  }

  usesEmulator(provider: ProviderId, issuer: string | null): boolean {
    return provider !== "device" && !issuer && this.emulatorByDefault;
  }

  async create(projectId: string, b: CreateConfig): Promise<OAuthConfigView> {
    const device = b.provider === "device";
    if (!device) {
      if (!b.client_secret) throw badRequest(`client_secret is required for provider ${b.provider}`);
      if (!b.redirect_url) throw badRequest(`redirect_url is required for provider ${b.provider}`);
    }
    const at = this.now().toISOString();
    try {
      // The device flow uses only client_id (RFC 8628 public clients): the rest is not stored.
      const [row] = await this.store.query(
        `insert into oauth_configs (id, project_id, provider, client_id, client_secret, enabled, redirect_url, scopes, issuer, created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9, $10, $10) returning *`,
        [
          newId(),
          projectId,
          b.provider,
          b.client_id,
          device ? null : this.secretKey.encrypt(b.client_secret!),
          b.enabled ?? true,
          device ? null : b.redirect_url,
          JSON.stringify(device ? [] : (b.scopes ?? PROVIDERS[b.provider].default_scopes)),
          device ? null : (b.issuer ?? null),
          at,
        ],
      );
      return this.view(row!, "masked");
    } catch (err) {
      if (isUniqueViolation(err))
        throw conflict(device ? `a device client with client_id '${b.client_id}' is already configured` : `provider ${b.provider} is already configured for this project`);
      throw err;
    }
  }

  async list(projectId: string): Promise<OAuthConfigView[]> {
    const rows = await this.store.query(`select * from oauth_configs where project_id = $1 order by created_at, id`, [projectId]);
    return rows.map((r) => this.view(r, "omitted"));
  }

  /** The row a route addresses: the provider's config, or for `device` the client named by client_id. */
  private async row(projectId: string, provider: ProviderId, clientId: string | undefined, need: "read" | "change"): Promise<Row> {
    if (provider !== "device") {
      const [r] = await this.store.query(`select * from oauth_configs where project_id = $1 and provider = $2`, [projectId, provider]);
      if (!r) throw notFound(`provider ${provider} is not configured for this project`);
      return r;
    }
    if (clientId === undefined) {
      if (need === "change") throw badRequest("the device provider is addressed by client_id: add ?client_id=<the device client's id>");
      const rows = await this.store.query(`select * from oauth_configs where project_id = $1 and provider = 'device' order by created_at limit 2`, [projectId]);
      if (rows.length === 0) throw notFound("provider device is not configured for this project");
      if (rows.length > 1) throw badRequest("this project has several device clients: add ?client_id=<the device client's id>");
      return rows[0]!;
    }
    const [r] = await this.store.query(`select * from oauth_configs where project_id = $1 and provider = 'device' and client_id = $2`, [projectId, clientId]);
    if (!r) throw notFound(`no device client with client_id '${clientId}' is configured for this project`);
    return r;
  }

  async get(projectId: string, provider: ProviderId, clientId?: string): Promise<OAuthConfigView> {
    return this.view(await this.row(projectId, provider, clientId, "read"), "masked");
  }

  /** Changes only the fields given. A device client takes only client_id and enabled. */
  async update(projectId: string, provider: ProviderId, clientId: string | undefined, b: UpdateConfig): Promise<OAuthConfigView> {
    if (provider === "device") {
      const other = (["client_secret", "redirect_url", "scopes", "issuer"] as const).filter((f) => b[f] !== undefined);
      if (other.length) throw badRequest(`a device client takes only client_id and enabled; not ${other.join(", ")}`);
    }
    const cur = await this.row(projectId, provider, clientId, "change");
    const sets: string[] = [];
    const params: unknown[] = [cur.id];
    const set = (column: string, value: unknown, cast = "") => sets.push(`${column} = $${params.push(value)}${cast}`);
    if (b.client_id !== undefined) set("client_id", b.client_id);
    if (b.client_secret !== undefined) set("client_secret", this.secretKey.encrypt(b.client_secret));
    if (b.redirect_url !== undefined) set("redirect_url", b.redirect_url);
    if (b.scopes !== undefined) set("scopes", JSON.stringify(b.scopes), "::text::jsonb");
    if (b.enabled !== undefined) set("enabled", b.enabled);
    if (b.issuer !== undefined) set("issuer", b.issuer);
    set("updated_at", this.now().toISOString());
    try {
      const [row] = await this.store.query(`update oauth_configs set ${sets.join(", ")} where id = $1 returning *`, params);
      return this.view(row!, "masked");
    } catch (err) {
      if (isUniqueViolation(err)) throw conflict(`a device client with client_id '${b.client_id}' is already configured`);
      throw err;
    }
  }

  async remove(projectId: string, provider: ProviderId, clientId?: string): Promise<void> {
    const cur = await this.row(projectId, provider, clientId, "change");
    await this.store.query(`delete from oauth_configs where id = $1`, [cur.id]);
  }

  async removeAll(projectId: string): Promise<void> {
    await this.store.query(`delete from oauth_configs where project_id = $1`, [projectId]);
  }

  /** The provider's config with its secret, for the sign-in flow; null when not configured. */
  async forFlow(projectId: string, provider: ProviderId): Promise<OAuthConfig | null> {
    const [r] = await this.store.query(`select * from oauth_configs where project_id = $1 and provider = $2 order by created_at limit 1`, [projectId, provider]);
    return r ? this.internal(r) : null;
  }

  /** A device client by its client_id. */
  async deviceClient(projectId: string, clientId: string): Promise<OAuthConfig | null> {
    const [r] = await this.store.query(`select * from oauth_configs where project_id = $1 and provider = 'device' and client_id = $2`, [projectId, clientId]);
    return r ? this.internal(r) : null;
  }

  private internal(r: Row): OAuthConfig {
    return {
      id: r.id,
      projectId: r.project_id,
      provider: r.provider,
      clientId: r.client_id,
      clientSecret: r.client_secret ? this.secretKey.decrypt(r.client_secret) : null,
      enabled: r.enabled,
      redirectUrl: r.redirect_url ?? null,
      scopes: r.scopes,
      issuer: r.issuer ?? null,
    };
  }
}
