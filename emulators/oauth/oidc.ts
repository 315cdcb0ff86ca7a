import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { exportJWK, generateKeyPair } from "jose";
import type { OidcProviderKind, TestIdentity } from "./api";
import { OAUTH_EMULATOR_MOUNT } from "./api";
import type { ClientRegistry } from "./clients";
import { EmulatorInputError, subjectFor, type IdentityStore, type NextQueue, type QueuedAuthorization } from "./identities";
import { identityFromForm, renderErrorPage, renderLoginPage } from "./login-page";

type OidcModule = typeof import("oidc-provider");
type Provider = InstanceType<OidcModule["Provider"]>;

/** oidc-provider warns at import that Bun is not Node.js LTS; it runs here (its tests and ours pass), so that one line is dropped. */
let oidcModule: Promise<OidcModule> | null = null;
function loadOidcProvider(): Promise<OidcModule> {
  oidcModule ??= (async () => {
    const warn = console.warn;
    console.warn = (...args: unknown[]) => {
      if (typeof args[0] === "string" && args[0].includes("oidc-provider WARNING: Unsupported runtime")) return;
      warn(...args);
    };
    // Cookie signing (keygrip → tsscmp) calls crypto.pseudoRandomBytes, a deprecated alias of
    // randomBytes whose first call prints a deprecation warning into Kiln's output.
    const nodeCrypto = (await import("node:crypto")).default as unknown as Record<string, unknown>;
    if (nodeCrypto.pseudoRandomBytes !== nodeCrypto.randomBytes) {
      try {
        Object.defineProperty(nodeCrypto, "pseudoRandomBytes", { value: nodeCrypto.randomBytes, writable: true, configurable: true });
      } catch {
        // read-only here: the warning stays, nothing else changes
      }
    }
    try {
      return await import("oidc-provider");
    } finally {
      console.warn = warn;
    }
  })();
  return oidcModule;
}

/** Which claims each scope releases, per provider: what the real ones put in id_tokens and userinfo. */
const CLAIMS: Record<OidcProviderKind, Record<string, string[]>> = {
  google: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name", "picture", "given_name", "family_name"] },
  microsoft: { openid: ["sub", "oid", "tid"], email: ["email", "email_verified"], profile: ["name", "picture", "preferred_username"] },
  // Apple: `name` is a scope of its own; no picture.
  apple: { openid: ["sub"], email: ["email", "email_verified", "is_private_email"], name: ["name"] },
};
const SCOPES: Record<OidcProviderKind, string[]> = {
  google: ["openid", "email", "profile"],
  microsoft: ["openid", "email", "profile"],
  apple: ["openid", "email", "name"],
};
/** The consumer ("personal Microsoft accounts") tenant id, as in real tokens of such accounts. */
const MSA_TENANT = "9188040d-6c67-4c5b-b112-36a304b66dad";

interface Stored {
  payload: Record<string, unknown>;
  expiresAt: number | null;
}

export interface OidcProviderDeps {
  identities: IdentityStore;
  next: NextQueue;
  clients: Record<OidcProviderKind, ClientRegistry>;
}

/**
 * The three OpenID Connect providers: oidc-provider instances (one issuer each) behind one
 * loopback node:http server, which `OAuthEmulators.handle` forwards to. oidc-provider is a Koa
 * application, so it gets Node's request and response; the mount prefix is stripped the way
 * Express does it (`originalUrl`, `baseUrl`), which oidc-provider reads to build its URLs.
 */
export class OidcProviders {
  private providers = new Map<OidcProviderKind, Provider>();
  private server: http.Server | null = null;
  private starting: Promise<number> | null = null;
  /** Apple sends the name only the first time a person authorizes a client: grant id → first. */
  private appleFirstGrant = new Map<string, boolean>();
  private appleSeen = new Set<string>();
  /** sub → identity id, per provider (filled when a person signs in). */
  private subjects = new Map<string, string>();

  constructor(
    private issuerOf: (kind: OidcProviderKind) => string,
    private deps: OidcProviderDeps,
  ) {}

  /** The loopback port of the node:http server, started (and the providers made) on first use. */
  port(): Promise<number> {
    this.starting ??= this.start();
    return this.starting;
  }

  private async start(): Promise<number> {
    const mod = await loadOidcProvider();
    for (const kind of ["google", "microsoft", "apple"] as const) this.providers.set(kind, await this.makeProvider(mod, kind));
    const server = http.createServer((req, res) => {
      this.serve(req, res).catch((err) => {
        if (!res.headersSent) {
          res.statusCode = 500;
          res.setHeader("content-type", "text/plain");
        }
        res.end(`oauth emulator: ${err instanceof Error ? err.message : String(err)}`);
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    this.server = server;
    return (server.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server) return;
    server.closeAllConnections?.();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private async makeProvider(mod: OidcModule, kind: OidcProviderKind): Promise<Provider> {
    const { privateKey } = await generateKeyPair("RS256", { extractable: true });
    const jwk = { ...(await exportJWK(privateKey)), kid: `${kind}-${randomBytes(6).toString("hex")}`, alg: "RS256", use: "sig" };
    const issuer = this.issuerOf(kind);
    const mount = new URL(issuer).pathname;
    const registry = this.deps.clients[kind];
    const store = new Map<string, Stored>();
    let writes = 0;
    const self = this;

    // oidc-provider's storage: in memory, and clients from the registry (registered on first use).
    class Adapter {
      constructor(private model: string) {}
      private key(id: string) {
        return `${this.model}:${id}`;
      }
      async upsert(id: string, payload: Record<string, unknown>, expiresIn?: number) {
        // Expired entries go when read, and in a sweep now and then: a long-running Kiln keeps no dead codes.
        if (++writes % 500 === 0) for (const [k, v] of store) if (v.expiresAt !== null && v.expiresAt < Date.now()) store.delete(k);
        store.set(this.key(id), { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : null });
      }
      async find(id: string) {
        if (this.model === "Client") {
          const c = registry.get(id);
          if (!c || !c.redirect_uris.length) return undefined;
          return {
            client_id: c.client_id,
            // Until the client first authenticates, no secret can match (the front pins the first one).
            client_secret: c.client_secret ?? `unset-${randomBytes(16).toString("hex")}`,
            redirect_uris: c.redirect_uris,
            response_types: ["code"],
            grant_types: ["authorization_code"],
            token_endpoint_auth_method: "client_secret_post",
          };
        }
        const s = store.get(this.key(id));
        if (!s) return undefined;
        if (s.expiresAt !== null && s.expiresAt < Date.now()) {
          store.delete(this.key(id));
          return undefined;
        }
        return s.payload;
      }
      async findByUid(uid: string) {
        for (const [k, s] of store) if (k.startsWith(`${this.model}:`) && s.payload.uid === uid) return this.find(k.slice(this.model.length + 1));
        return undefined;
      }
      async findByUserCode(code: string) {
        for (const [k, s] of store) if (k.startsWith(`${this.model}:`) && s.payload.userCode === code) return this.find(k.slice(this.model.length + 1));
        return undefined;
      }
      async consume(id: string) {
        const s = store.get(this.key(id));
        if (s) s.payload.consumed = Math.floor(Date.now() / 1000);
      }
      async destroy(id: string) {
        store.delete(this.key(id));
      }
      async revokeByGrantId(grantId: string) {
        for (const [k, s] of store) if (s.payload.grantId === grantId) store.delete(k);
      }
    }

    const policy = mod.interactionPolicy.base();
    // Every authorization asks (or takes the queued answer): a test or a person picks who signs in
    // each time, instead of the provider's session silently signing the last one in again.
    policy.get("login")!.checks.push(
      new mod.interactionPolicy.Check("emulator_asks", "the emulator asks at every authorization", (ctx) =>
        ctx.oidc.result?.login ? mod.interactionPolicy.Check.NO_NEED_TO_PROMPT : mod.interactionPolicy.Check.REQUEST_PROMPT,
      ),
    );

    const provider = new mod.Provider(issuer, {
      adapter: Adapter as never,
      clients: [],
      jwks: { keys: [jwk as never] },
      // Three providers share one host: each its own cookie names, so one's session never shadows another's.
      cookies: { keys: [randomBytes(32).toString("hex")], names: { session: `_${kind}_session`, interaction: `_${kind}_interaction`, resume: `_${kind}_resume` } },
      claims: CLAIMS[kind],
      scopes: SCOPES[kind],
      // The code flow's id_token carries the scopes' claims too (Google's, Microsoft's and Apple's do).
      conformIdTokenClaims: false,
      pkce: { required: () => true },
      responseTypes: ["code"],
      clientDefaults: { grant_types: ["authorization_code"], id_token_signed_response_alg: "RS256", response_types: ["code"], token_endpoint_auth_method: "client_secret_post" },
      features: { devInteractions: { enabled: false }, revocation: { enabled: true } },
      interactions: { policy, url: (_ctx, interaction) => `${mount}/interaction/${interaction.uid}` },
      ttl: { AccessToken: 3600, AuthorizationCode: 600, IdToken: 3600, Interaction: 3600, Session: 3600, Grant: 3600 },
      renderError: async (ctx, out) => {
        ctx.type = "html";
        ctx.body = renderErrorPage(kind, `${out.error}: ${out.error_description ?? ""}`);
      },
      findAccount: async (ctx, sub) => {
        const identityId = self.subjects.get(`${kind}:${sub}`);
        const identity = identityId ? self.deps.identities.get(identityId) : null;
        if (!identity) return undefined;
        const grantId = (ctx.oidc.entities as { Grant?: { jti: string }; AuthorizationCode?: { grantId?: string } }).AuthorizationCode?.grantId ?? ctx.oidc.entities.Grant?.jti;
        return { accountId: sub, claims: async () => self.claimsOf(kind, sub, identity, grantId) };
      },
    });
    provider.proxy = true;
    return provider;
  }

  private claimsOf(kind: OidcProviderKind, sub: string, i: TestIdentity, grantId: string | undefined): { sub: string; [claim: string]: unknown } {
    const [given, ...family] = i.name.split(" ");
    const picture = i.picture ?? undefined;
    switch (kind) {
      case "google":
        return { sub, email: i.email, email_verified: i.email_verified, name: i.name, picture, given_name: given, family_name: family.join(" ") || undefined };
      case "microsoft":
        return { sub, oid: sub, tid: MSA_TENANT, email: i.email, email_verified: i.email_verified, name: i.name, preferred_username: i.email, picture };
      case "apple":
        return {
          sub,
          email: i.email,
          email_verified: i.email_verified,
          is_private_email: false,
          ...(grantId && this.appleFirstGrant.get(grantId) ? { name: i.name } : {}),
        };
    }
  }

  private async serve(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = req.url ?? "/";
    const m = /^\/_emulators\/oauth\/(google|microsoft|apple)(\/[^?]*)?(\?.*)?$/.exec(url);
    const kind = m?.[1] as OidcProviderKind | undefined;
    const provider = kind && this.providers.get(kind);
    if (!kind || !provider) {
      res.statusCode = 404;
      res.end();
      return;
    }
    const rest = (m![2] || "/") + (m![3] ?? "");
    const interaction = /^\/interaction\/([\w-]+)(\/login|\/deny)?$/.exec(m![2] ?? "");
    if (interaction) return this.interaction(kind, provider, req, res, (interaction[2]?.slice(1) ?? "") as "" | "login" | "deny");
    // Mounted the Express way: oidc-provider builds its URLs from originalUrl less url (or baseUrl).
    Object.assign(req, { originalUrl: url, baseUrl: `${OAUTH_EMULATOR_MOUNT}/${kind}` });
    req.url = rest;
    await provider.callback()(req, res);
  }

  /** The login page, its two forms, and the queued answer that skips it. */
  private async interaction(kind: OidcProviderKind, provider: Provider, req: http.IncomingMessage, res: http.ServerResponse, action: "" | "login" | "deny") {
    let details;
    try {
      details = await provider.interactionDetails(req, res);
    } catch (err) {
      return sendHtml(res, 400, renderErrorPage(kind, `this sign-in has expired or is unknown; start again from the application (${err instanceof Error ? err.message : String(err)})`));
    }
    const clientId = String(details.params.client_id ?? "");
    const scopes = String(details.params.scope ?? "").split(" ").filter(Boolean);
    const finish = async (q: QueuedAuthorization) => {
      if (q.deny || !q.identity) {
        await provider.interactionFinished(req, res, { error: "access_denied", error_description: "the user denied the request" }, { mergeWithLastSubmission: false });
        return;
      }
      const sub = subjectFor(kind, q.identity.email);
      this.subjects.set(`${kind}:${sub}`, q.identity.id);
      const grant = new provider.Grant({ accountId: sub, clientId });
      grant.addOIDCScope(scopes.join(" "));
      const grantId = await grant.save();
      if (kind === "apple") {
        const key = `${sub}|${clientId}`;
        this.appleFirstGrant.set(grantId, !this.appleSeen.has(key));
        this.appleSeen.add(key);
      }
      await provider.interactionFinished(req, res, { login: { accountId: sub }, consent: { grantId } }, { mergeWithLastSubmission: false });
    };

    if (req.method === "GET" && action === "") {
      const queued = this.deps.next.take(kind, clientId);
      if (queued) return finish(queued);
      const loginHint = typeof details.params.login_hint === "string" ? details.params.login_hint : undefined;
      const base = `${OAUTH_EMULATOR_MOUNT}/${kind}/interaction/${details.uid}`;
      return sendHtml(res, 200, renderLoginPage({ kind, clientId, scopes, identities: this.deps.identities.list(), loginAction: `${base}/login`, denyAction: `${base}/deny`, loginHint }));
    }
    if (req.method !== "POST" || action === "") return sendHtml(res, 405, renderErrorPage(kind, "use the sign-in page's buttons"));
    if (action === "deny") return finish({ identity: null, deny: true });
    const form = new URLSearchParams(await readText(req));
    const picked = identityFromForm(form);
    try {
      const identity = "identity" in picked ? this.deps.identities.get(picked.identity) : this.deps.identities.upsert(picked).identity;
      if (!identity) throw new EmulatorInputError(`no identity '${(picked as { identity: string }).identity}'`);
      return finish({ identity, deny: false });
    } catch (err) {
      if (!(err instanceof EmulatorInputError)) throw err;
      const base = `${OAUTH_EMULATOR_MOUNT}/${kind}/interaction/${details.uid}`;
      return sendHtml(res, 400, renderLoginPage({ kind, clientId, scopes, identities: this.deps.identities.list(), loginAction: `${base}/login`, denyAction: `${base}/deny`, error: err.message }));
    }
  }
}

function sendHtml(res: http.ServerResponse, status: number, html: string): void {
  res.statusCode = status;
  res.setHeader("content-type", "text/html; charset=utf-8");
  res.setHeader("cache-control", "no-store");
  res.end(html);
}

async function readText(req: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > 64 * 1024) throw new EmulatorInputError("form too large");
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks).toString("utf8");
}
