import * as z from "zod";
import { timestamp } from "../http/common-schemas";

/** Permission names Kiln knows; the spec names these two. */
export const KNOWN_PERMISSIONS = ["functions.invoke", "locks.manage"] as const;

const permission = z
  .string()
  .refine((p) => (KNOWN_PERMISSIONS as readonly string[]).includes(p), {
    error: (i) => `unknown permission '${String(i.input)}'; known permissions: ${KNOWN_PERMISSIONS.join(", ")}`,
  });
const permissions = z.array(permission).max(16).transform((a) => [...new Set(a)]);
const keyName = z.string().trim().min(1, "must not be empty").max(128, "must be at most 128 characters");

export const keyParams = z.object({ projectId: z.string().min(1), keyId: z.string().min(1) });

export const serviceKeySchema = z.object({
  id: z.string(),
  name: z.string(),
  key_prefix: z.string(),
  permissions: z.array(z.string()).nullable().describe("null: the full service role; a list: only these permissions"),
  created_at: timestamp,
  updated_at: timestamp,
});
export const createdServiceKeySchema = serviceKeySchema.extend({ key: z.string().describe("the secret (sk-...); shown only here") });
export const serviceKeyListSchema = z.object({ data: z.array(serviceKeySchema) });
export const createServiceKeyBody = z.object({ name: keyName, permissions: permissions.optional() });
export const updateServiceKeyBody = z.object({ name: keyName.optional(), permissions: permissions.nullable().optional() });

export const anonKeySchema = z.object({
  id: z.string(),
  name: z.string(),
  key: z.string().describe("ak-...; anon keys are publishable, but listing them is still a credential read"),
  permissions: z.array(z.string()),
  created_at: timestamp,
});
export const anonKeyListSchema = z.object({ data: z.array(anonKeySchema) });
export const createAnonKeyBody = z.object({ name: keyName, permissions: permissions.optional() });
