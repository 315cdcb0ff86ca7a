import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { limitParam, pageParam } from "../http/pagination";
import { projectIdParams } from "../projects/schemas";

const mimePattern = z.string().regex(/^([A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*|\*)\/([A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*|\*)$/, "a MIME type such as image/png, or a wildcard such as image/*");
const fileSizeLimit = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).nullable();

export const bucketSchema = z.object({
  id: z.string(),
  name: z.string(),
  project_id: z.string(),
  file_size_limit: z.number().int().nullable(),
  allowed_mime_types: z.array(z.string()),
  created_at: timestamp,
  updated_at: timestamp,
});
export const createBucketBody = z.object({ name: z.string(), file_size_limit: fileSizeLimit.optional(), allowed_mime_types: z.array(mimePattern).max(100).optional() });
export const patchBucketBody = z
  .object({ file_size_limit: fileSizeLimit.optional(), allowed_mime_types: z.array(mimePattern).max(100).optional() })
  .refine((b) => b.file_size_limit !== undefined || b.allowed_mime_types !== undefined, "send file_size_limit and/or allowed_mime_types");
export const bucketParams = projectIdParams.extend({ bucketName: z.string().min(1) });
export const bucketListSchema = z.object({ buckets: z.array(bucketSchema) });
export const messageSchema = z.object({ message: z.string() });

export const objectSchema = z.object({
  id: z.string(),
  bucket_id: z.string(),
  bucket_name: z.string().optional(),
  name: z.string(),
  owner_id: z.string().nullable(),
  size: z.number().int(),
  mime_type: z.string(),
  etag: z.string(),
  is_public: z.boolean(),
  metadata: z.record(z.string(), z.unknown()),
  created_at: timestamp,
  updated_at: timestamp,
});
export const adminObjectsQuery = z.object({ owner_id: z.string().optional(), page: pageParam.optional(), limit: limitParam.optional() });
export const adminObjectListSchema = z.object({ data: z.array(objectSchema), page: z.number().int(), limit: z.number().int(), total: z.number().int(), has_more: z.boolean() });
export const statsSchema = z.object({ bucket_count: z.number().int(), object_count: z.number().int(), total_size: z.number().int() });

export const policySchema = z.object({ id: z.string(), bucket_id: z.string(), name: z.string(), operation: z.enum(["SELECT", "INSERT", "UPDATE", "DELETE"]), definition: z.string(), created_at: timestamp });
export const createPolicyBody = z.object({
  name: z.string().trim().min(1, "name is required").max(128),
  operation: z.enum(["SELECT", "INSERT", "UPDATE", "DELETE"], { error: "operation must be one of SELECT, INSERT, UPDATE, DELETE" }),
  definition: z.string().max(4096),
});
export const policyParams = z.object({ bucketId: z.string().min(1) });
export const policyItemParams = policyParams.extend({ policyId: z.string().min(1) });
export const policyListSchema = z.object({ policies: z.array(policySchema) });

/** `{path+}`: the rest of the URL path, slashes included. */
export const objectParams = z.object({ bucketName: z.string().min(1), path: z.string() });
export const bucketOnlyParams = z.object({ bucketName: z.string().min(1) });
export const listObjectsQuery = z.object({
  prefix: z.string().max(1024).optional(),
  limit: z.coerce.number().int().min(1, "must be 1 or more").max(1000, "must be at most 1000").optional(),
  cursor: z.string().max(4096).optional(),
});
export const objectListSchema = z.object({ objects: z.array(objectSchema), next_cursor: z.string().nullable() });
export const moveBody = z.object({ from: z.string(), to: z.string() });
export const visibilityBody = z.object({ is_public: z.boolean() });

export const createSessionBody = z.object({
  content_type: z.string().min(1, "content_type is required").max(255),
  total_size: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  part_size: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
  metadata: z.record(z.string(), z.unknown()).optional(),
  upsert: z.boolean().optional(),
});
export const sessionCreatedSchema = z.object({ session_id: z.string(), part_size: z.number().int(), total_parts: z.number().int(), expires_at: timestamp });
export const sessionSchema = z.object({
  session_id: z.string(),
  status: z.literal("uploading"),
  path: z.string(),
  content_type: z.string(),
  total_size: z.number().int(),
  part_size: z.number().int(),
  total_parts: z.number().int(),
  parts_uploaded: z.number().int(),
  bytes_uploaded: z.number().int(),
  parts: z.array(z.object({ part_number: z.number().int(), etag: z.string(), size: z.number().int() })),
  expires_at: timestamp,
  created_at: timestamp,
});
export const partSchema = z.object({ part_number: z.number().int(), etag: z.string(), size: z.number().int() });
