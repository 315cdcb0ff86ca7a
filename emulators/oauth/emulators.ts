import type { OAuthEmulatorKind, OAuthEmulators, OAuthEmulatorsOptions, OidcProviderKind } from "./api";
import { OAUTH_EMULATOR_MOUNT, oauthEmulatorEndpoints } from "./api";
import { ClientRegistry } from "./clients";
import { basicCredentials, GithubEmulator } from "./github";
import { IdentityStore, NextQueue } from "./identities";
import { renderErrorPage } from "./login-page";
import { OidcProviders } from "./oidc";

const PATH = /^\/_emulators\/oauth\/(google|microsoft|apple|github)(\/[^?]*)?$/;
const FORM_LIMIT = 64 * 1024;

/** The four providers in this process (see api.ts). oidc-provider loads on the first OIDC request. */
export function createOAuthEmulators(options: OAuthEmulatorsOptions): OAuthEmulators {
  const baseUrl = typeof options.baseUrl === "string" ? () => options.baseUrl as string : options.baseUrl;
  const identities = new IdentityStore();
  const next = new NextQueue(identities);
  const clients = { google: new ClientRegistry("google"), microsoft: new ClientRegistry("microsoft"), apple: new ClientRegistry("apple"), github: new ClientRegistry("github") };
  const github = new GithubEmulator(identities, next, clients.github);
  const oidc = new OidcProviders((kind) => oauthEmulatorEndpoints(baseUrl(), kind).issuer, { identities, next, clients });

  /** The front of an OIDC provider: client registration on first use, then oidc-provider. */
  async function oidcRequest(kind: OidcProviderKind, path: string, request: Request): Promise<Response> {
    const url = new URL(request.url);
    let body: string | undefined;
    if (request.method !== "GET" && request.method !== "HEAD") {
      body = await request.text();
      if (body.length > FORM_LIMIT) return new Response("request too large", { status: 413 });
    }
    const headers = new Headers(request.headers);
    if (path === "/auth") {
      const params = request.method === "POST" ? new URLSearchParams(body) : url.searchParams;
      const check = clients[kind].authorize(params.get("client_id") ?? "", params.get("redirect_uri") ?? "");
      // Never redirect to an unchecked URI: the page says what is wrong, as real providers do.
      if (!check.ok) return new Response(renderErrorPage(kind, check.description), { status: 400, headers: { "content-type": "text/html; charset=utf-8" } });
      // Apple answers `scope=name email` with an id_token too: it is always OpenID Connect.
      if (kind === "apple" && !(params.get("scope") ?? "").split(" ").includes("openid")) {
        params.set("scope", ["openid", ...(params.get("scope") ?? "").split(" ").filter(Boolean)].join(" "));
        if (request.method === "POST") body = params.toString();
      }
    } else if (path === "/token" && request.method === "POST") {
      // Client authentication in either form (Basic or the body) becomes client_secret_post, the
      // method every client is registered with, after the first secret of a new client is pinned.
      const form = new URLSearchParams(body);
      const [id, secret] = basicCredentials(headers.get("authorization"));
      if (id !== undefined) {
        headers.delete("authorization");
        form.set("client_id", id);
        form.set("client_secret", secret ?? "");
      }
      const auth = clients[kind].authenticate(form.get("client_id") ?? "", form.get("client_secret") ?? undefined);
      if (!auth.ok) return Response.json({ error: auth.error, error_description: auth.description }, { status: 401, headers: { "cache-control": "no-store" } });
      body = form.toString();
    }
    const port = await oidc.port();
    headers.set("x-forwarded-host", url.host);
    headers.set("x-forwarded-proto", url.protocol.slice(0, -1));
    headers.delete("content-length");
    headers.delete("accept-encoding");
    const target = `http://127.0.0.1:${port}${url.pathname}${url.search}`;
    const res = await fetch(target, { method: request.method, headers, body, redirect: "manual" });
    const out = new Headers(res.headers);
    out.delete("content-encoding");
    out.delete("content-length");
    out.delete("connection");
    out.delete("keep-alive");
    return new Response(request.method === "HEAD" ? null : await res.arrayBuffer(), { status: res.status, headers: out });
  }

  const emulators: OAuthEmulators = {
    async handle(request) {
      const m = PATH.exec(new URL(request.url).pathname);
      if (!m) return Response.json({ error: "not an OAuth emulator path" }, { status: 404 });
      const kind = m[1] as OAuthEmulatorKind;
      const path = m[2] || "/";
      if (kind === "github") return github.handle(request, path);
      return oidcRequest(kind, path, request);
    },
    endpoints: ((kind: OAuthEmulatorKind) => oauthEmulatorEndpoints(baseUrl(), kind)) as OAuthEmulators["endpoints"],
    identities: {
      list: () => identities.list(),
      upsert: (input) => identities.upsert(input),
      get: (idOrEmail) => identities.get(idOrEmail),
      remove: (id) => identities.remove(id),
    },
    queueNext(kind, nextAuthorization) {
      const q = next.queue(kind, nextAuthorization);
      return { identity: q.identity, deny: q.deny };
    },
    clearNext: (kind) => next.clear(kind),
    registerClient: (kind, client) => clients[kind].register(client),
    clients: (kind) => clients[kind].list(),
    stop: () => oidc.stop(),
  };
  return emulators;
}

export { OAUTH_EMULATOR_MOUNT };
