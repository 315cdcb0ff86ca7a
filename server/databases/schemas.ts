import * as z from "zod";
import { timestamp } from "../http/common-schemas";
import { PG_VERSIONS, REGIONS } from "./service";

export const databaseParams = z.object({ projectId: z.string().min(1), databaseName: z.string().min(1) });

export const databaseSchema = z.object({
  id: z.string(),
  database_name: z.string(),
  status: z.enum(["provisioning", "active", "failed", "deleting"]),
  connection_string: z
    .string()
    .optional()
    .describe("only while active; role service_client_<id>; application_name service_full_access (admin) or service_user_access:<user_id> (RLS as that user)"),
  region: z.string(),
  pg_version: z.number().int(),
  storage_bytes: z.number().int().optional().describe("list only; sampled in the background"),
  created_at: timestamp,
  updated_at: timestamp,
});
export const createdDatabaseSchema = databaseSchema.extend({ name: z.string().describe("the normalized name") });
export const databaseListSchema = z.object({ data: z.array(databaseSchema) });

export const createDatabaseBody = z.object({
  name: z.string().min(1, "must not be empty").max(256),
  region: z.enum(REGIONS.map((r) => r.id) as [string, ...string[]]).optional(),
  pg_version: z
    .union([z.number().int(), z.string().regex(/^\d+$/).transform(Number)])
    .pipe(z.number().refine((v) => (PG_VERSIONS as readonly number[]).includes(v), "must be 14, 15 or 16"))
    .optional(),
});

export const resetPasswordSchema = z.object({
  message: z.string(),
  role_name: z.string(),
  new_password: z.string(),
  connection_string: z.string(),
});

export const statsQuery = z.object({
  from: z.iso.datetime({ offset: true }).optional(),
  to: z.iso.datetime({ offset: true }).optional(),
  granularity: z.enum(["hourly", "daily", "monthly"]).optional(),
});
export const statsSchema = z.object({
  current_storage_bytes: z.number().int(),
  current_storage_mb: z.number(),
  branches: z.array(z.object({ id: z.string(), name: z.string(), storage_bytes: z.number().int() })),
  backup_storage_bytes: z.number().int(),
  storage_bytes: z.number().int(),
  data_written_bytes: z.number().int(),
  data_transfer_bytes: z.number().int(),
  compute_time_seconds: z.number(),
  active_time_seconds: z.number(),
  time_range: z.string(),
  granularity: z.string(),
});

export const lintSchema = z.object({
  tables_without_rls: z
    .array(
      z.object({
        schema: z.string(),
        name: z.string(),
        kind: z.enum(["table", "partitioned table", "view", "materialized view", "foreign table"]),
        anonymous: z.array(z.enum(["SELECT", "INSERT", "UPDATE", "DELETE"])).describe("what the anon key's role may do to it"),
        authenticated: z.array(z.enum(["SELECT", "INSERT", "UPDATE", "DELETE"])).describe("what end users' role may do to it"),
        exposed: z.boolean().describe("anonymous or authenticated holds a privilege: its rows are open to that role with no row check"),
      }),
    )
    .describe("tables, views and the like that row-level security does not guard (views with security_invoker are left out)"),
  exposed_tables: z.array(z.string()).describe("schema.name of those that are exposed"),
});

export const topQueriesQuery = z.object({ limit: z.coerce.number().int().min(1, "must be 1 to 100").max(100, "must be 1 to 100").optional() });
export const topQuerySchema = z.object({
  query_id: z.string(),
  query: z.string(),
  database: z.object({ id: z.string(), name: z.string() }),
  role: z.string(),
  calls: z.number().int(),
  total_exec_time_seconds: z.number(),
  max_exec_time_seconds: z.number(),
  mean_exec_time_seconds: z.number(),
  min_exec_time_seconds: z.number(),
  rows_processed: z.number().int(),
});

export const regionsSchema = z.array(z.object({ id: z.string(), name: z.string() }));
export const versionsSchema = z.object({
  versions: z.array(z.number().int()).describe("values pg_version accepts"),
  default: z.number().int(),
  engine: z.object({
    kind: z.enum(["embedded", "postgres"]),
    server_versions: z.array(z.number().int()).describe("the PostgreSQL major version(s) that really run your queries"),
    note: z.string(),
  }),
});

export const queryParams = z.object({
  databaseName: z.string().min(1),
  operation: z.enum(["select", "insert", "update", "delete"]),
});
export const queryResultSchema = z.object({ data: z.array(z.record(z.string(), z.unknown())), count: z.number().int() });
