import * as z from "zod";
import type { OAuthEmulators } from "../../emulators/oauth/api";
import { OAUTH_EMULATOR_KINDS } from "../../emulators/oauth/api";
import { EmulatorInputError } from "../../emulators/oauth/identities";
import { errorSchema } from "../http/common-schemas";
import { badRequest, notFound } from "../http/errors";
import { reply, type AreaRouter } from "../http/route";

const tag = "Emulators: OAuth";

/** What the OAuth emulators' routes need: the emulators, or null where they are off (production profile). */
export interface OAuthEmulatorRouteDeps {
  oauthEmulators: OAuthEmulators | null;
}

const provider = z.enum(OAUTH_EMULATOR_KINDS as [string, ...string[]]).describe("google, microsoft, apple or github");

export const testIdentitySchema = z.object({
  id: z.string(),
  email: z.string(),
  name: z.string(),
  picture: z.string().nullable(),
  email_verified: z.boolean(),
  created_at: z.string(),
});
const identityInputSchema = z.object({
  email: z.string().describe("the identity's email; an existing identity with it is updated"),
  name: z.string().max(200).optional(),
  picture: z.string().max(2000).nullable().optional().describe("an http(s) image URL"),
  email_verified: z.boolean().optional().describe("default true"),
});
const nextSchema = z.object({
  identity: z.string().optional().describe("an identity's id or email"),
  email: z.string().optional().describe("instead of identity: create (or update) this identity and use it"),
  name: z.string().max(200).optional(),
  picture: z.string().max(2000).nullable().optional(),
  email_verified: z.boolean().optional(),
  deny: z.boolean().optional().describe("true: the next authorization is denied (error=access_denied)"),
  client_id: z.string().optional().describe("only this client's next authorization takes it"),
});
const clientSchema = z.object({
  client_id: z.string(),
  client_secret: z.string().nullable(),
  redirect_uris: z.array(z.string()),
  registered: z.enum(["api", "first-use"]),
});
const endpointsSchema = z.object({
  provider: z.string(),
  issuer: z.string().optional(),
  discovery: z.string().optional(),
  authorization: z.string(),
  token: z.string(),
  userinfo: z.string().optional(),
  jwks: z.string().optional(),
  base: z.string().optional(),
  user: z.string().optional(),
  emails: z.string().optional(),
});

function emulatorsOf(deps: OAuthEmulatorRouteDeps): OAuthEmulators {
  if (!deps.oauthEmulators) throw notFound("the OAuth emulators are off (production profile, or KILN_OAUTH_EMULATORS=off)");
  return deps.oauthEmulators;
}

/** Input the emulators refuse becomes a 400 with its message. */
function input<T>(f: () => T): T {
  try {
    return f();
  } catch (err) {
    if (err instanceof EmulatorInputError) throw badRequest(err.message);
    throw err;
  }
}

/**
 * The local OAuth / OpenID Connect providers (emulators/oauth): the identities API tests use, and
 * the providers' own endpoints and login pages under /_emulators/oauth/<provider>/. Open, like the
 * mail catcher in the embedded profile; absent in the production profile.
 */
export function oauthEmulatorRoutes(r: AreaRouter<OAuthEmulatorRouteDeps>): void {
  const auth = { kind: "none" } as const;
  const off = { 404: errorSchema };
  r.add({
    method: "GET",
    path: "/_emulators/oauth",
    tag,
    summary: "The emulated providers and their endpoints (issuer, discovery, authorization, token, userinfo, JWKS; GitHub's four URLs)",
    auth,
    responses: { 200: { description: "providers", schema: z.object({ providers: z.array(endpointsSchema) }) }, ...off },
    handler: ({ deps }) => {
      const e = emulatorsOf(deps);
      return reply.ok({ providers: OAUTH_EMULATOR_KINDS.map((k) => ({ provider: k, ...e.endpoints(k) })).map(({ kind: _k, ...rest }) => rest) });
    },
  });
  r.add({
    method: "GET",
    path: "/_emulators/oauth/identities",
    tag,
    summary: "The test identities every emulated provider offers",
    auth,
    responses: { 200: { description: "identities", schema: z.object({ identities: z.array(testIdentitySchema) }) }, ...off },
    handler: ({ deps }) => reply.ok({ identities: emulatorsOf(deps).identities.list() }),
  });
  r.add({
    method: "POST",
    path: "/_emulators/oauth/identities",
    tag,
    summary: "Create a test identity (201), or update the one with that email (200)",
    auth,
    body: identityInputSchema,
    responses: { 200: { description: "updated", schema: testIdentitySchema }, 201: { description: "created", schema: testIdentitySchema }, 400: errorSchema, ...off },
    handler: ({ deps, body }) => {
      const { identity, created } = input(() => emulatorsOf(deps).identities.upsert(body));
      return created ? reply.created(identity) : reply.ok(identity);
    },
  });
  r.add({
    method: "DELETE",
    path: "/_emulators/oauth/identities/{identityId}",
    tag,
    summary: "Delete a test identity (by id or email)",
    auth,
    params: z.object({ identityId: z.string() }),
    responses: { 204: { description: "deleted" }, ...off },
    handler: ({ deps, params }) => {
      if (!emulatorsOf(deps).identities.remove(params.identityId)) throw notFound("no such identity");
      return reply.noContent();
    },
  });
  r.add({
    method: "POST",
    path: "/_emulators/oauth/{provider}/next",
    tag,
    summary: "Decide the provider's next authorization without its login page: sign in as an identity, or deny",
    auth,
    params: z.object({ provider }),
    body: nextSchema,
    responses: {
      200: { description: "queued", schema: z.object({ provider: z.string(), identity: testIdentitySchema.nullable(), deny: z.boolean() }) },
      400: errorSchema,
      ...off,
    },
    handler: ({ deps, params, body }) => {
      const kind = params.provider as (typeof OAUTH_EMULATOR_KINDS)[number];
      const next = body.deny
        ? { deny: true as const, client_id: body.client_id }
        : body.identity
          ? { identity: body.identity, client_id: body.client_id }
          : { email: body.email ?? "", name: body.name, picture: body.picture, email_verified: body.email_verified, client_id: body.client_id };
      const q = input(() => emulatorsOf(deps).queueNext(kind, next));
      return reply.ok({ provider: kind, identity: q.identity, deny: q.deny });
    },
  });
  r.add({
    method: "DELETE",
    path: "/_emulators/oauth/{provider}/next",
    tag,
    summary: "Drop the provider's queued authorizations (the login page shows again)",
    auth,
    params: z.object({ provider }),
    responses: { 204: { description: "cleared" }, ...off },
    handler: ({ deps, params }) => {
      emulatorsOf(deps).clearNext(params.provider as (typeof OAUTH_EMULATOR_KINDS)[number]);
      return reply.noContent();
    },
  });
  r.add({
    method: "GET",
    path: "/_emulators/oauth/{provider}/clients",
    tag,
    summary: "The provider's clients: registered through this API, or on first use",
    auth,
    params: z.object({ provider }),
    responses: { 200: { description: "clients", schema: z.object({ clients: z.array(clientSchema) }) }, ...off },
    handler: ({ deps, params }) => reply.ok({ clients: emulatorsOf(deps).clients(params.provider as (typeof OAUTH_EMULATOR_KINDS)[number]) }),
  });
  r.add({
    method: "POST",
    path: "/_emulators/oauth/{provider}/clients",
    tag,
    summary: "Register a client up front: its secret is checked, and its redirect URIs when given (otherwise any client is registered on first use)",
    auth,
    params: z.object({ provider }),
    body: z.object({ client_id: z.string().min(1), client_secret: z.string().min(1), redirect_uris: z.array(z.string()).optional() }),
    responses: { 201: { description: "registered", schema: clientSchema }, 400: errorSchema, ...off },
    handler: ({ deps, params, body }) => reply.created(input(() => emulatorsOf(deps).registerClient(params.provider as (typeof OAUTH_EMULATOR_KINDS)[number], body))),
  });
  const protocol = {
    description:
      "the provider's own answer: OIDC discovery, JWKS, authorization (login page or redirect), token, userinfo; GitHub's authorize, access_token, /user, /user/emails",
  };
  for (const method of ["GET", "POST"] as const)
    r.add({
      method,
      path: "/_emulators/oauth/{provider}/{path+}",
      tag,
      summary: `The emulated provider's endpoints (${method}): see GET /_emulators/oauth for their URLs`,
      auth,
      params: z.object({ provider, path: z.string() }),
      responses: { 200: protocol, 302: { description: "redirect (GitHub)" }, 303: { description: "redirect (OIDC)" }, 400: protocol, 401: protocol, ...off },
      handler: ({ deps, request }) => emulatorsOf(deps).handle(request),
    });
}
