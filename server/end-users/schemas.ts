import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam, paginatedSchema } from "../http/pagination";

export const userSchema = z.object({
  id: z.string(),
  email: z.string(),
  email_confirmed: z.boolean(),
  raw_user_meta_data: z.record(z.string(), z.unknown()),
  status: z.string(),
  created_at: timestamp,
});

export const adminUserSchema = userSchema.extend({ updated_at: timestamp, last_sign_in_at: timestamp.nullable() });

export const tokenResponseSchema = z.object({
  access_token: z.string().describe("JWT (ES256) signed with the project's key; verify with /auth/jwks.json"),
  token_type: z.literal("bearer"),
  expires_in: z.number().int(),
  refresh_token: z.string().describe("opaque, single use"),
  user: userSchema,
});

export const signupPendingSchema = z.object({
  user: userSchema,
  confirmation_sent: z.literal(true).describe("the project requires email confirmation: no session until the mailed link is followed"),
});

const email = z.email({ error: "must be an email address" }).max(320);
const metadata = z.record(z.string(), z.unknown()).refine((d) => JSON.stringify(d).length <= 16_384, "must be at most 16 KiB as JSON");

export const signupBody = z.object({
  email,
  password: z.string(),
  data: metadata.optional(),
  redirect_url: z.string().optional().describe("where the confirmation link leads; must be an allowed redirect URL"),
});
export const signinBody = z.object({ email: z.string(), password: z.string() });
export const refreshBody = z.object({ refresh_token: z.string().min(1) });
export const forgotBody = z.object({ email, redirect_url: z.string().optional() });
export const resetBody = z.object({ token: z.string().min(1), password: z.string() });
export const updateUserBody = z.object({
  email: email.optional(),
  password: z.string().optional(),
  data: metadata.optional().describe("merged into raw_user_meta_data; a null value removes a key"),
  redirect_url: z.string().optional(),
});
export const updatedUserSchema = userSchema.extend({
  new_email: z.string().optional().describe("present while an email change waits for its confirmation link"),
});

export const tokenQuery = z.object({ token: z.string().min(1) });
export const jwksQuery = z.object({ project_id: z.string().min(1).optional() });
export const jwksSchema = z.object({ keys: z.array(z.record(z.string(), z.unknown())) });
export const messageSchema = z.object({ message: z.string() });

export const userParams = z.object({ projectId: z.string().min(1), userId: z.string().min(1) });
export const listUsersQuery = z.object({ page: pageParam.optional(), limit: limitParam.optional(), search: z.string().max(256).optional() });
export const userListSchema = paginatedSchema(adminUserSchema);
export const adminCreateUserBody = z.object({
  email,
  password: z.string().optional().describe("omit for a user who signs in another way"),
  data: metadata.optional(),
  email_confirmed: z.boolean().optional().describe("default true"),
});
export const rotatedKeySchema = z.object({ kid: z.string() });
