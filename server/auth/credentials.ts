import { takeFault, type Config, type PlanName } from "../config";
import { hashSecret } from "../ids";
import type { ControlStore } from "../store/store";
import type { PrincipalCache } from "./principal-cache";
import type { Principal } from "./principal";

/**
 * Turns a bearer secret into a Principal, through the shared cache (PrincipalCache). Platform
 * tokens, project tokens and keys are looked up in the store; end-user JWTs are verified by the
 * end-users area, which owns the signing keys and sessions (`userTokens`).
 */
export class Credentials {
  constructor(
    private readonly store: ControlStore,
    private readonly config: Config,
    private readonly cache: PrincipalCache,
    private readonly now: () => number,
    private readonly userTokens: (jwt: string) => Promise<Principal | null>,
  ) {}

  /**
   * The answer resolve would give from memory: undefined when the secret is not cached (then call
   * resolve). Lets the hot paths skip a promise per request.
   */
  cached(secret: string): Principal | null | undefined {
    const hit = this.cache.get(secret);
    return hit && this.stillValid(hit);
  }

  /** null: the secret is not a live credential. Throws when the store cannot answer. */
  async resolve(secret: string): Promise<Principal | null> {
    const hash = hashSecret(secret);
    const hit = this.cache.getByHash(hash);
    if (hit) return this.stillValid(hit);
    const principal = await this.lookup(secret, hash);
    if (principal) this.cache.set(hash, principal);
    else this.cache.delete(hash);
    return principal && this.stillValid(principal);
  }

  private stillValid(p: Principal): Principal | null {
    if ((p.kind === "project_token" || p.kind === "user") && p.expiresAt !== null && p.expiresAt <= this.now()) return null;
    return p;
  }

  private async lookup(secret: string, hash: string): Promise<Principal | null> {
    if (takeFault(this.config, "credential-store")) throw new Error("injected fault: credential-store");
    if (secret.startsWith("eyJ")) return this.userTokens(secret);
    const kind = secret.slice(0, 3);
    if (kind === "pk-") {
      const [r] = await this.store.query<{ id: string; account_id: string; plan: PlanName }>(
        `select t.id, t.account_id, a.plan from platform_tokens t join accounts a on a.id = t.account_id where t.token_hash = $1`,
        [hash],
      );
      return r ? { kind: "platform", tokenId: r.id, accountId: r.account_id, plan: r.plan } : null;
    }
    if (kind === "pt-") {
      const [r] = await this.store.query(
        `select t.id, t.project_id, t.scope, t.expires_at, p.account_id
           from access_tokens t join projects p on p.id = t.project_id
          where t.token_hash = $1 and t.revoked_at is null and p.status not in ('deleted')`,
        [hash],
      );
      if (!r) return null;
      return {
        kind: "project_token",
        tokenId: r.id,
        projectId: r.project_id,
        accountId: r.account_id,
        scope: r.scope,
        expiresAt: r.expires_at ? new Date(r.expires_at).getTime() : null,
      };
    }
    if (kind === "sk-") {
      const [r] = await this.store.query(
        `select k.id, k.project_id, k.permissions from service_keys k join projects p on p.id = k.project_id
          where k.key_hash = $1 and p.status = 'active'`,
        [hash],
      );
      return r ? { kind: "service_key", keyId: r.id, projectId: r.project_id, permissions: r.permissions ?? null } : null;
    }
    if (kind === "ak-") {
      const [r] = await this.store.query(
        `select k.id, k.project_id, k.permissions from anon_keys k join projects p on p.id = k.project_id
          where k.key = $1 and p.status = 'active'`,
        [secret],
      );
      return r ? { kind: "anon_key", keyId: r.id, projectId: r.project_id, permissions: r.permissions ?? [] } : null;
    }
    return null;
  }
}
