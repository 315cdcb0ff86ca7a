import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { userSchema } from "../end-users/schemas";
import { redirectUrlProblem } from "../end-users/redirect-url";
import { PROVIDER_IDS } from "./providers";

/** A URL under the spec's redirect URL rules; the 400 names the rule it breaks. */
export const redirectUrlInput = z.string().superRefine((u, ctx) => {
  const problem = redirectUrlProblem(u);
  if (problem) ctx.addIssue({ code: "custom", message: `'${u}' ${problem}` });
});

const issuerInput = z
  .string()
  .url()
  .refine((u) => /^https?:\/\//.test(u), "must be an http or https URL")
  .describe("Kiln: where the provider is (an OpenID issuer; GitHub's web address). Unset: the local emulator in the embedded profile, the real provider otherwise");

const scopes = z.array(z.string().min(1).max(200).regex(/^[\x21-\x7e]+$/, "a scope is printable ASCII without spaces")).max(50);
const clientId = z.string().min(1).max(512);
const clientSecret = z.string().min(1).max(4096);

export const providerParam = z.enum(PROVIDER_IDS, { error: `provider must be one of ${PROVIDER_IDS.join(", ")}` });

export const oauthConfigSchema = z.object({
  id: z.string(),
  provider: providerParam,
  client_id: z.string(),
  client_secret: z.string().optional().describe("masked: the first 4 and last 4 characters; never in lists"),
  enabled: z.boolean(),
  redirect_url: z.string().nullable().describe("the provider's callback: Kiln's /auth/oauth/{provider}/callback as registered with the provider"),
  scopes: z.array(z.string()),
  issuer: z.string().nullable(),
  uses: z.enum(["emulator", "provider"]).describe("Kiln: whether sign-ins go to the local emulator or to the provider at `issuer`"),
  created_at: timestamp,
  updated_at: timestamp,
});
export const oauthConfigListSchema = z.object({ configs: z.array(oauthConfigSchema.omit({ client_secret: true })) });

export const createConfigBody = z.object({
  provider: providerParam,
  client_id: clientId,
  client_secret: clientSecret.optional().describe("required for every provider but device"),
  redirect_url: redirectUrlInput.optional().describe("required for every provider but device"),
  scopes: scopes.optional().describe("default: the provider's default scopes"),
  enabled: z.boolean().optional().describe("default true"),
  issuer: issuerInput.optional(),
});
export const updateConfigBody = z.object({
  client_id: clientId.optional(),
  client_secret: clientSecret.optional(),
  redirect_url: redirectUrlInput.optional(),
  scopes: scopes.optional(),
  enabled: z.boolean().optional(),
  issuer: issuerInput.nullable().optional().describe("null: back to the default (emulator in the embedded profile)"),
});

export const configParams = z.object({ projectId: z.string().min(1), provider: providerParam });
export const deviceClientQuery = z.object({ client_id: z.string().min(1).optional().describe("the device client (provider device only)") });

export const providerCatalogueSchema = z.object({
  providers: z.array(z.object({ id: z.string(), name: z.string(), default_scopes: z.array(z.string()) })),
});

// ---- end users -------------------------------------------------------------------------------------

export const oauthUserSchema = userSchema;
export const authTokenResponseSchema = z.object({
  access_token: z.string(),
  token_type: z.literal("bearer"),
  expires_in: z.number().int(),
  refresh_token: z.string(),
  user: userSchema,
});

export const endUserProviderParams = z.object({ provider: z.string().min(1) });
/** An anon key passed in a URL: it becomes a Bearer header, so only the characters a header can carry. */
export const anonKeyParam = z
  .string()
  .min(1, "anon_key is required")
  .max(512, "anon_key is not a key")
  .regex(/^[\x21-\x7e]+$/, "anon_key is not a key")
  .describe("the project's anon key");
export const authorizeQuery = z.object({
  anon_key: anonKeyParam,
  redirect_url: z.string().optional().describe("an allowed_redirect_urls entry (exact, query included) or the managed page; omit for JSON from the callback"),
  client_state: z.string().max(1024).optional().describe("echoed back to redirect_url as client_state"),
  response_mode: z.literal("code").optional(),
});
export const callbackQuery = z.object({
  code: z.string().optional(),
  state: z.string().optional(),
  error: z.string().optional(),
  error_description: z.string().optional(),
  user: z.string().max(4096).optional().describe("Apple's form_post: the person's name, on the first authorization"),
});
export const exchangeBody = z.object({ code: z.string().min(1), redirect_url: z.string().min(1) });
export const linkQuery = z.object({ redirect_url: z.string().optional() });
export const linkedProviderSchema = z.object({ provider: z.string(), linked_at: timestamp, updated_at: timestamp });
export const linkedProvidersSchema = z.object({ providers: z.array(linkedProviderSchema) });
export const authorizationUrlSchema = z.object({ authorization_url: z.string() });
