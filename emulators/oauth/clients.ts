import { timingSafeEqual } from "node:crypto";
import type { ClientRegistration, EmulatorClient, OAuthEmulatorKind } from "./api";
import { EmulatorInputError } from "./identities";

const HTTP_URL = /^https?:\/\/[^\s]+$/i;

export type ClientCheck = { ok: true; client: EmulatorClient } | { ok: false; error: string; description: string };

/**
 * The clients of one provider. Unknown client_ids are registered on first use (any http(s)
 * redirect URI; the first secret presented at the token endpoint is pinned), so a Kiln config
 * works unchanged against the emulator and the real provider; clients registered up front are strict.
 */
export class ClientRegistry {
  private clients = new Map<string, EmulatorClient>();
  /** Clients that accept any http(s) redirect URI: those registered on first use, or through the API without redirect URIs. */
  private anyRedirect = new Map<string, boolean>();

  constructor(readonly kind: OAuthEmulatorKind) {}

  list(): EmulatorClient[] {
    return [...this.clients.values()].map((c) => ({ ...c, redirect_uris: [...c.redirect_uris] }));
  }

  get(clientId: string): EmulatorClient | undefined {
    return this.clients.get(clientId);
  }

  register(reg: ClientRegistration): EmulatorClient {
    if (!reg.client_id || typeof reg.client_id !== "string") throw new EmulatorInputError("client_id is required");
    if (!reg.client_secret || typeof reg.client_secret !== "string") throw new EmulatorInputError("client_secret is required");
    for (const uri of reg.redirect_uris ?? []) if (!HTTP_URL.test(uri)) throw new EmulatorInputError(`redirect URI must be an http(s) URL: '${uri}'`);
    const client = { client_id: reg.client_id, client_secret: reg.client_secret, redirect_uris: [...(reg.redirect_uris ?? [])], registered: "api" as const };
    this.clients.set(client.client_id, client);
    this.anyRedirect.set(client.client_id, !reg.redirect_uris?.length);
    return client;
  }

  /** An authorization request: registers an unknown client, accepts (and records) its redirect URI when allowed. */
  authorize(clientId: string, redirectUri: string): ClientCheck {
    if (!clientId) return { ok: false, error: "invalid_request", description: "client_id is required" };
    if (!HTTP_URL.test(redirectUri)) return { ok: false, error: "invalid_request", description: "redirect_uri must be an http(s) URL" };
    let client = this.clients.get(clientId);
    if (!client) {
      client = { client_id: clientId, client_secret: null, redirect_uris: [], registered: "first-use" };
      this.clients.set(clientId, client);
      this.anyRedirect.set(clientId, true);
    }
    if (!client.redirect_uris.includes(redirectUri)) {
      if (!this.anyRedirect.get(clientId)) return { ok: false, error: "invalid_request", description: `redirect_uri '${redirectUri}' is not registered for client '${clientId}'` };
      client.redirect_uris.push(redirectUri);
    }
    return { ok: true, client };
  }

  /** A token request's client authentication: pins the first secret of a client registered on first use. */
  authenticate(clientId: string, secret: string | undefined): ClientCheck {
    const client = this.clients.get(clientId);
    if (!client) return { ok: false, error: "invalid_client", description: `unknown client '${clientId}'` };
    if (!secret) return { ok: false, error: "invalid_client", description: "client authentication failed: no client_secret" };
    if (client.client_secret === null) client.client_secret = secret;
    if (!sameText(client.client_secret, secret)) return { ok: false, error: "invalid_client", description: "client authentication failed: wrong client_secret" };
    return { ok: true, client };
  }
}

function sameText(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}
