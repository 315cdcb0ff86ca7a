import { readBodyText } from "../http/body";
import { errorSchema } from "../http/common-schemas";
import { parseInput, reply, type AreaRouter } from "../http/route";
import type { CallbackOutcome, OAuthFlowService } from "./flow";
import {
  authorizationUrlSchema,
  authorizeQuery,
  authTokenResponseSchema,
  callbackQuery,
  endUserProviderParams,
  exchangeBody,
  linkedProviderSchema,
  linkedProvidersSchema,
  linkQuery,
} from "./schemas";

const tag = "End-user OAuth";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema };

export interface OAuthEndUserRouteDeps {
  oauthFlow: OAuthFlowService;
}

const redirect = (status: 303 | 307, location: string) => new Response(null, { status, headers: { Location: location, "Cache-Control": "no-store" } });

/** The end-user side: authorize, callback, exchange, linked providers, link, unlink. */
export function oauthEndUserRoutes(r: AreaRouter<OAuthEndUserRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/auth/oauth/{provider}/authorize",
    tag,
    summary: "Start a sign-in: 307 to the provider (PKCE, a one-time state valid 10 minutes)",
    auth: { kind: "none" },
    params: endUserProviderParams,
    query: authorizeQuery,
    responses: { 307: { description: "to the provider's authorization page" }, ...errors, 409: errorSchema, 502: errorSchema },
    handler: async ({ deps, guard, request, ip, params, query }) => {
      // The anon key comes in the query (a browser navigates here): checked as a bearer would be.
      const asBearer = new Request(request.url, { headers: { authorization: `Bearer ${query.anon_key}` } });
      const { principal } = await guard.authorize({ kind: "anon" }, asBearer, {}, ip);
      const url = await deps.oauthFlow.authorize(principal.projectId, params.provider, { redirectUrl: query.redirect_url, clientState: query.client_state });
      return redirect(307, url);
    },
  });

  const callbackResponses = {
    200: { description: "signed in (an existing user), or a provider linked", schema: authTokenResponseSchema.or(linkedProviderSchema) },
    201: { description: "signed up: a new user", schema: authTokenResponseSchema },
    303: { description: "to the redirect URL with ?code= (or ?error=), and client_state" },
    ...errors,
    409: errorSchema,
    502: errorSchema,
  };
  const answer = (out: CallbackOutcome) => {
    if (out.kind === "redirect") return redirect(303, out.location);
    if (out.kind === "linked") return reply.ok(out.linked);
    return { status: out.created ? 201 : 200, body: out.tokens, headers: { "Cache-Control": "no-store" } };
  };

  r.add({
    method: "GET",
    path: "/auth/oauth/{provider}/callback",
    tag,
    summary: "Where the provider returns: 303 to the redirect URL with a single-use code, or the auth token response (201 new user, 200 existing)",
    auth: { kind: "none" },
    params: endUserProviderParams,
    query: callbackQuery,
    responses: callbackResponses,
    handler: async ({ deps, params, query }) => answer(await deps.oauthFlow.callback(params.provider, query)),
  });

  r.add({
    method: "POST",
    path: "/auth/oauth/{provider}/callback",
    tag,
    summary: "The callback as a form post (response_mode=form_post, which Apple uses): fields code, state, error, user",
    auth: { kind: "none" },
    params: endUserProviderParams,
    responses: callbackResponses,
    handler: async ({ deps, params, request, bodyLimit }) => {
      const form = Object.fromEntries(new URLSearchParams(await readBodyText(request, bodyLimit)));
      return answer(await deps.oauthFlow.callback(params.provider, parseInput(callbackQuery, form, "body")));
    },
  });

  r.add({
    method: "POST",
    path: "/auth/oauth/exchange",
    tag,
    summary: "Spend the code a sign-in redirect carried for the auth token response (anon key; once; same redirect_url)",
    auth: { kind: "anon" },
    body: exchangeBody,
    responses: {
      200: { description: "signed in: an existing user", schema: authTokenResponseSchema },
      201: { description: "signed up: a new user", schema: authTokenResponseSchema },
      ...errors,
      409: errorSchema,
    },
    handler: async ({ deps, principal, body }) => {
      const out = await deps.oauthFlow.exchange(principal.projectId, body.code, body.redirect_url);
      return { status: out.created ? 201 : 200, body: out.tokens, headers: { "Cache-Control": "no-store" } };
    },
  });

  r.add({
    method: "GET",
    path: "/auth/oauth/providers",
    tag,
    summary: "The providers linked to the signed-in user",
    auth: { kind: "user" },
    responses: { 200: { description: "linked providers", schema: linkedProvidersSchema }, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal }) => reply.ok({ providers: await deps.oauthFlow.linked(principal.projectId, principal.userId) }),
  });

  r.add({
    method: "POST",
    path: "/auth/oauth/{provider}/link",
    tag,
    summary: "Link a provider to the signed-in user: the authorization URL to send the user to",
    auth: { kind: "user" },
    params: endUserProviderParams,
    query: linkQuery,
    responses: { 200: { description: "where to send the user", schema: authorizationUrlSchema }, ...errors, 409: errorSchema, 502: errorSchema },
    handler: async ({ deps, principal, params, query }) =>
      reply.ok({
        authorization_url: await deps.oauthFlow.authorize(principal.projectId, params.provider, { redirectUrl: query.redirect_url, linkUserId: principal.userId }),
      }),
  });

  r.add({
    method: "DELETE",
    path: "/auth/oauth/{provider}/unlink",
    tag,
    summary: "Unlink a provider from the signed-in user (not the last way to sign in)",
    auth: { kind: "user" },
    params: endUserProviderParams,
    responses: { 204: { description: "unlinked" }, ...errors },
    handler: async ({ deps, principal, params }) => {
      await deps.oauthFlow.unlink(principal.projectId, principal.userId, params.provider);
      return reply.noContent();
    },
  });
}
