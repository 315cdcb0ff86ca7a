import { hashSecret } from "../ids";
import { TtlCache } from "../store/ttl-cache";
import type { Principal } from "./principal";

/**
 * Verified credentials in memory, keyed by the secret's hash, so a busy client does not cost a
 * store read per request. Areas evict what they revoke or delete at once; the TTL
 * (`KILN_CREDENTIAL_CACHE_MS`) bounds how long another Kiln instance's revocation takes to be seen.
 */
export class PrincipalCache {
  private readonly cache: TtlCache<string, Principal>;

  constructor(ttlMs: () => number, now: () => number) {
    this.cache = new TtlCache(ttlMs, now);
  }

  get(secret: string): Principal | undefined {
    return this.cache.get(hashSecret(secret));
  }

  getByHash(hash: string): Principal | undefined {
    return this.cache.get(hash);
  }

  set(hash: string, p: Principal): void {
    this.cache.set(hash, p);
  }

  delete(hash: string): void {
    this.cache.delete(hash);
  }

  /** Forgets cached credentials matching the predicate (after revoke, delete, project deletion). */
  evict(match: (p: Principal) => boolean): void {
    this.cache.deleteWhere(match);
  }

  evictProject(projectId: string): void {
    this.evict((p) => "projectId" in p && p.projectId === projectId);
  }
}
