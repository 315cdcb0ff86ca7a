import * as z from "zod";
import type { KeysService } from "../keys/service";
import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { OAuthConfigsService } from "./configs";
import type { OAuthFlowService } from "./flow";
import { deviceApprovalPage, deviceCodeEntryPage, hostedSignInPage } from "./pages";
import { DEVICE_GRANT_TYPE, type DeviceFlowService } from "./device";
import { PROVIDER_IDS, type ProviderId } from "./providers";
import { anonKeyParam, authTokenResponseSchema } from "./schemas";

const tag = "End-user OAuth: device flow (RFC 8628)";

const deviceCodeBody = z.object({ client_id: z.string().min(1), scope: z.string().max(1000).optional() });
const deviceAuthorizationSchema = z.object({
  device_code: z.string().describe("the device's secret to poll with"),
  user_code: z.string().describe("what the person types on the verification page, e.g. BCDF-GHJK"),
  verification_uri: z.string().describe("the project's device_verification_url, else Kiln's managed device page"),
  verification_uri_complete: z.string(),
  expires_in: z.number().int(),
  interval: z.number().int().describe("seconds between polls"),
});
const deviceTokenBody = z.object({
  grant_type: z.literal(DEVICE_GRANT_TYPE, { error: `grant_type must be ${DEVICE_GRANT_TYPE}` }),
  device_code: z.string().min(1),
  client_id: z.string().min(1),
});
const verifyBody = z.object({ user_code: z.string().min(1).max(32), action: z.enum(["approve", "deny"]) });
const verifySchema = z.object({ user_code: z.string(), status: z.enum(["approved", "denied"]) });
const hostedQuery = z.object({
  anon_key: anonKeyParam,
  redirect_url: z.string().optional().describe("the app's page the sign-ins return to (an allowed redirect URL); omit to come back here"),
  code: z.string().optional(),
  client_state: z.string().optional(),
  error: z.string().optional(),
});
const pageQuery = z.object({ user_code: z.string().max(32).optional(), code: z.string().optional(), client_state: z.string().optional(), error: z.string().optional() });
const grantErrorSchema = { description: "RFC 8628 error: authorization_pending, slow_down, expired_token, access_denied, invalid_grant", schema: z.object({ error: z.string(), error_description: z.string().optional() }) };

export interface DeviceRouteDeps {
  deviceFlow: DeviceFlowService;
  oauthFlow: OAuthFlowService;
  oauthConfigs: OAuthConfigsService;
  keys: KeysService;
  address: { publicUrl(): string };
}

const html = (body: string, status = 200) => new Response(body, { status, headers: { "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store" } });

export function deviceRoutes(r: AreaRouter<DeviceRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/auth/device/code",
    tag,
    summary: "A device asks to sign a user in: device code, user code, where the user goes (anon key; JSON or form-encoded body, as RFC 8628 clients send)",
    auth: { kind: "anon" },
    body: deviceCodeBody,
    formBody: true,
    responses: { 200: { description: "device authorization", schema: deviceAuthorizationSchema }, 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema },
    handler: async ({ deps, principal, body }) => reply.ok(await deps.deviceFlow.start(principal.projectId, body.client_id, body.scope), { "Cache-Control": "no-store" }),
  });

  r.add({
    method: "POST",
    path: "/auth/device/token",
    tag,
    summary: "The device polls: the auth token response once the user approved, else authorization_pending / slow_down / expired_token / access_denied",
    auth: { kind: "anon" },
    body: deviceTokenBody,
    formBody: true,
    responses: { 200: { description: "signed in", schema: authTokenResponseSchema }, 400: grantErrorSchema, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, principal, body }) => reply.ok(await deps.deviceFlow.poll(principal.projectId, body.client_id, body.device_code), { "Cache-Control": "no-store" }),
  });

  r.add({
    method: "POST",
    path: "/auth/device/verify",
    tag,
    summary: "The signed-in user approves or denies the device showing this user code (what a device_verification_url page calls)",
    auth: { kind: "user" },
    body: verifyBody,
    responses: { 200: { description: "answered", schema: verifySchema }, 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema },
    handler: async ({ deps, principal, body }) => reply.ok(await deps.deviceFlow.decide(principal.projectId, principal.userId, body.user_code, body.action === "approve")),
  });

  r.add({
    method: "GET",
    path: "/auth/device",
    tag,
    summary: "The managed device page: enter the user code, sign in (password or a provider), approve or deny",
    auth: { kind: "none" },
    query: pageQuery,
    responses: { 200: { description: "HTML page", contentType: "text/html" }, 400: errorSchema, 404: { description: "HTML page: unknown or expired code", contentType: "text/html" } },
    handler: async ({ deps, query }) => {
      // After a provider sign-in started here, the user code comes back as client_state.
      const code = query.user_code ?? query.client_state;
      if (!code) return html(deviceCodeEntryPage());
      const pending = await deps.deviceFlow.pending(code);
      if (!pending || pending.expired || pending.status !== "pending")
        return html(deviceCodeEntryPage(pending && !pending.expired && pending.status !== "pending" ? "This code has been answered already." : "This code is unknown or has expired: start again on your device."), 404);
      const [anon] = await deps.keys.listAnonKeys(pending.projectId);
      if (!anon) return html(deviceCodeEntryPage("This project has no anon key to sign in with."), 404);
      const providers = (await deps.oauthConfigs.list(pending.projectId)).filter((c) => c.enabled && c.provider !== "device").map((c) => c.provider);
      return html(
        deviceApprovalPage({
          userCode: pending.userCode,
          clientId: pending.clientId,
          anonKey: anon.key,
          selfUrl: `${deps.address.publicUrl()}/auth/device`,
          providers: PROVIDER_IDS.filter((p): p is ProviderId => providers.includes(p)),
          code: query.code,
          error: query.error,
        }),
      );
    },
  });
}

/** Kiln's managed sign-in page (GET /auth/oauth/hosted). */
export function hostedPageRoutes(r: AreaRouter<DeviceRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/auth/oauth/hosted",
    tag: "End-user OAuth",
    summary: "The managed sign-in page: a button per enabled provider, returning to redirect_url, or here (which then says who signed in)",
    auth: { kind: "none" },
    query: hostedQuery,
    responses: { 200: { description: "HTML page", contentType: "text/html" }, 400: errorSchema, 401: errorSchema, 403: errorSchema },
    handler: async ({ deps, guard, request, ip, query }) => {
      const asBearer = new Request(request.url, { headers: { authorization: `Bearer ${query.anon_key}` } });
      const { principal } = await guard.authorize({ kind: "anon" }, asBearer, {}, ip);
      if (query.redirect_url !== undefined) await deps.oauthFlow.checkRedirect(principal.projectId, query.redirect_url);
      const providers = (await deps.oauthConfigs.list(principal.projectId)).filter((c) => c.enabled && c.provider !== "device").map((c) => c.provider);
      return html(
        hostedSignInPage({
          anonKey: query.anon_key,
          selfUrl: `${deps.address.publicUrl()}/auth/oauth/hosted?anon_key=${encodeURIComponent(query.anon_key)}`,
          redirectUrl: query.redirect_url,
          providers: PROVIDER_IDS.filter((p): p is ProviderId => providers.includes(p)),
          code: query.code,
          error: query.error,
        }),
      );
    },
  });
}
