import { describe, expect, test } from "vitest";
import { Credentials } from "../../server/auth/credentials";
import { PrincipalCache } from "../../server/auth/principal-cache";
import { resolveConfig } from "../../server/config";
import { hashSecret } from "../../server/ids";
import type { ControlStore } from "../../server/store/store";

/** A store that answers the platform-token lookup and counts how often it is asked. */
function countingStore(token: string) {
  const calls = { n: 0 };
  const store = {
    kind: "pglite",
    async query(_sql: string, params?: unknown[]) {
      calls.n++;
      return params?.[0] === hashSecret(token) ? [{ id: "t1", account_id: "a1", plan: "hobby" }] : [];
    },
    transaction: async (fn: any) => fn(store),
    close: async () => {},
  } as unknown as ControlStore;
  return { store, calls };
}

/** Credentials over a cache with the configured TTL, as Kiln makes them (no end-user tokens here). */
function credentials(store: ControlStore, env: Record<string, string>, now: () => number) {
  const config = resolveConfig({}, env);
  const cache = new PrincipalCache(() => config.credentialCacheMs, now);
  return { creds: new Credentials(store, config, cache, now, async () => null), cache };
}

describe("credential cache", () => {
  test("a verified credential is not looked up again within the TTL; eviction forces a lookup", async () => {
    const token = "pk-abcdefghijklmnopqrstuvwxyz";
    const { store, calls } = countingStore(token);
    let now = 1_000;
    const { creds, cache } = credentials(store, { KILN_CREDENTIAL_CACHE_MS: "2000" }, () => now);
    for (let i = 0; i < 50; i++) expect((await creds.resolve(token))?.kind).toBe("platform");
    expect(calls.n).toBe(1);
    cache.evict((p) => p.kind === "platform");
    await creds.resolve(token);
    expect(calls.n).toBe(2);
    now += 2500; // past the TTL: asked again, so other instances' revocations are seen
    await creds.resolve(token);
    expect(calls.n).toBe(3);
  });
  test("unknown credentials are never cached as valid", async () => {
    const { store, calls } = countingStore("pk-known-known-known-known");
    const { creds } = credentials(store, {}, () => 0);
    expect(await creds.resolve("pk-unknown-unknown-unknown")).toBeNull();
    expect(await creds.resolve("pk-unknown-unknown-unknown")).toBeNull();
    expect(calls.n).toBe(2);
    expect(await creds.resolve("zz-not-a-kiln-secret")).toBeNull();
  });
  test("cached() answers from memory only: what resolve would, or undefined when it would ask the store", async () => {
    const token = "pk-abcdefghijklmnopqrstuvwxyz";
    const { store, calls } = countingStore(token);
    let now = 1_000;
    const { creds, cache } = credentials(store, { KILN_CREDENTIAL_CACHE_MS: "2000" }, () => now);
    expect(creds.cached(token)).toBeUndefined();
    await creds.resolve(token);
    expect(creds.cached(token)?.kind).toBe("platform");
    expect(calls.n).toBe(1);
    cache.evict((p) => p.kind === "platform");
    expect(creds.cached(token)).toBeUndefined();
    await creds.resolve(token);
    now += 2500;
    expect(creds.cached(token)).toBeUndefined();
    expect(creds.cached("pk-unknown-unknown-unknown")).toBeUndefined();
    expect(calls.n).toBe(2);
  });
});
