import * as z from "zod";
import { timestamp, timestampInput } from "../http/common-schemas";
import { PG_VERSIONS, REGIONS } from "./service";
import { BRANCH_NAME, BRANCH_TTL } from "./branches";
import { BACKUP_NAME, SCHEDULE_ENTRIES_MAX } from "./backups";
import { RESTORE_HISTORY } from "./restores";

export const databaseParams = z.object({ projectId: z.string().min(1), databaseName: z.string().min(1) });

export const databaseSchema = z.object({
  id: z.string(),
  database_name: z.string(),
  status: z.enum(["provisioning", "active", "restoring", "failed", "deleting"]),
  connection_string: z
    .string()
    .optional()
    .describe("only while active; role service_client_<id>; application_name service_full_access (admin) or service_user_access:<user_id> (RLS as that user)"),
  region: z.string(),
  pg_version: z.number().int().describe("the PostgreSQL major version the database runs on (GET /databases/versions)"),
  requested_pg_version: z.number().int().describe("the pg_version asked for at create (14, 15 or 16), recorded; not what runs"),
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

export const dumpQuery = z.object({ format: z.enum(["custom", "plain"]).optional() });

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
  versions: z.array(z.number().int()).describe("values pg_version accepts at create (recorded as requested_pg_version)"),
  default: z.number().int(),
  runs: z.number().int().nullable().describe("the PostgreSQL major version databases here run on: every database's pg_version"),
  engine: z.object({
    kind: z.enum(["embedded", "postgres"]),
    server_versions: z.array(z.number().int()).describe("the PostgreSQL major version(s) that really run your queries"),
    note: z.string(),
  }),
  client_tools: z.string().describe("which pg_dump, pg_restore and psql work with these databases"),
});

export const queryParams = z.object({
  databaseName: z.string().min(1),
  operation: z.enum(["select", "insert", "update", "delete"]),
});
export const queryResultSchema = z.object({ data: z.array(z.record(z.string(), z.unknown())), count: z.number().int() });

// ---- branches -------------------------------------------------------------------------------------

export const branchParams = databaseParams.extend({ branchName: z.string().min(1) });

export const branchSchema = z.object({
  id: z.string(),
  database_id: z.string(),
  project_id: z.string(),
  name: z.string(),
  status: z.enum(["provisioning", "active", "failed", "deleting"]),
  connection_string: z
    .string()
    .optional()
    .describe("single get only, while active: the branch's own role service_client_<branch id> and password; application_name as for the parent"),
  ttl_seconds: z.number().int(),
  expires_at: timestamp,
  storage_bytes: z.number().int().describe("pages the branch holds that differ from its parent at the fork (its divergence), in bytes"),
  created_at: timestamp,
  updated_at: timestamp,
});
export const branchListSchema = z.object({ data: z.array(branchSchema) });

const ttlSeconds = z
  .number()
  .int("must be a whole number of seconds")
  .min(BRANCH_TTL.min, `must be ${BRANCH_TTL.min} to ${BRANCH_TTL.max} seconds`)
  .max(BRANCH_TTL.max, `must be ${BRANCH_TTL.min} to ${BRANCH_TTL.max} seconds`);

export const createBranchBody = z.object({
  name: z.string().regex(BRANCH_NAME, "must be 1 to 64 lowercase letters, digits and underscores"),
  ttl_seconds: ttlSeconds.optional().describe(`lifetime, ${BRANCH_TTL.min} to ${BRANCH_TTL.max} seconds; default ${BRANCH_TTL.default} (seven days)`),
});
export const extendBranchBody = z.object({
  ttl_seconds: ttlSeconds.describe("the new lifetime, counted from now; later resets use it too"),
});
export const branchDeletingSchema = z.object({ status: z.literal("deleting"), message: z.string() });

export const branchQueryParams = z.object({ databaseName: z.string().min(1), branchName: z.string().min(1) });

// ---- backups, schedule, restores ----------------------------------------------------------------

export const backupParams = databaseParams.extend({ backupName: z.string().min(1) });
export const restoreParams = databaseParams.extend({ restoreId: z.string().min(1) });

export const backupSchema = z.object({
  name: z.string(),
  source: z.enum(["manual", "scheduled"]),
  size_bytes: z.number().int().optional().describe("bytes the backup takes on disk"),
  expires_at: timestamp.nullable().describe("when a scheduled backup's retention ends; null for manual backups (kept until deleted)"),
  created_at: timestamp,
});
export const restoreWindowSchema = z.object({ earliest_restore_at: timestamp, latest_restore_at: timestamp });
export const backupListSchema = z.object({
  data: z.array(backupSchema).describe("newest first"),
  restore_window: restoreWindowSchema.optional().describe("the instants restore_to may name; absent where point-in-time restore is not available"),
});
export const createBackupBody = z.object({
  name: z.string().regex(BACKUP_NAME, "must be 1 to 63 lowercase letters, digits, underscores and hyphens"),
});
export const backupDeletedSchema = z.object({ status: z.literal("deleted"), message: z.string() });

export const scheduleEntryInput = z
  .object({
    frequency: z.enum(["daily", "weekly", "monthly"]),
    hour: z.number().int("must be a whole hour").min(0, "must be 0 to 23 (UTC)").max(23, "must be 0 to 23 (UTC)"),
    day: z.number().int("must be a whole number").optional().describe("weekly: 1-7 (Monday to Sunday); monthly: 1-28; ignored for daily"),
    retention_seconds: z.number().int("must be a whole number of seconds").positive("must be positive").optional().describe("defaults to the plan's retention and is clamped to it"),
  })
  .superRefine((e, ctx) => {
    if (e.frequency === "weekly" && (e.day === undefined || e.day < 1 || e.day > 7))
      ctx.addIssue({ code: "custom", path: ["day"], message: "weekly entries need day 1-7 (Monday to Sunday)" });
    if (e.frequency === "monthly" && (e.day === undefined || e.day < 1 || e.day > 28))
      ctx.addIssue({ code: "custom", path: ["day"], message: "monthly entries need day 1-28" });
  });
export const putScheduleBody = z.object({ entries: z.array(scheduleEntryInput).max(SCHEDULE_ENTRIES_MAX, `at most ${SCHEDULE_ENTRIES_MAX} entries`) });
export const scheduleSchema = z.object({
  entries: z.array(
    z.object({
      frequency: z.enum(["daily", "weekly", "monthly"]),
      hour: z.number().int(),
      day: z.number().int().optional(),
      retention_seconds: z.number().int().describe("as applied: the plan's retention when none was given, clamped to it"),
      next_run_at: timestamp.describe("when this entry takes its next backup"),
    }),
  ),
});

export const restoreSchema = z.object({
  id: z.string(),
  database_id: z.string(),
  project_id: z.string(),
  kind: z.enum(["snapshot", "point_in_time"]),
  status: z.enum(["pending", "running", "completed", "failed", "exhausted"]),
  backup_name: z.string().nullable().optional(),
  restore_to: timestamp.nullable().optional(),
  completed_at: timestamp.nullable(),
  error: z.string().nullable().describe("why the most recent attempt failed"),
  created_at: timestamp,
  updated_at: timestamp,
});
export const restoreListSchema = z.object({ data: z.array(restoreSchema).describe(`newest first, at most ${RESTORE_HISTORY}`) });
export const createRestoreBody = z.object({
  backup_name: z.string().min(1).optional(),
  restore_to: timestampInput.optional(),
});

// ---- the SQL API (a Kiln extension: docs/databases.md) --------------------------------------------

export const sqlBody = z.object({
  query: z.string().min(1).max(100_000).describe("one SQL statement; $1, $2 ... for params"),
  params: z
    .array(z.union([z.string(), z.number(), z.boolean(), z.null()]))
    .max(1000)
    .optional()
    .describe("values of $1, $2 ... (sent as text; PostgreSQL casts them to the parameter's type)"),
  max_rows: z.number().int().min(1).max(10_000).optional().describe("rows returned at most (default 1000); more sets `truncated`"),
  timeout_ms: z.number().int().min(1).max(60_000).optional().describe("statement timeout in milliseconds (default 15000)"),
});

export const sqlResultSchema = z.object({
  command: z.string().describe("the command tag's verb: SELECT, INSERT, CREATE TABLE, ..."),
  row_count: z.number().int().describe("rows the statement returned or changed (the rows returned, when truncated)"),
  columns: z.array(z.object({ name: z.string(), type: z.string().describe("PostgreSQL's name of the type (format_type)") })),
  rows: z.array(z.array(z.unknown())).describe("one array per row, in column order: int2/int4/float as numbers, bool, json/jsonb parsed, everything else as PostgreSQL's text"),
  truncated: z.boolean().describe("more rows than max_rows, or than 4 MiB of rows, were returned by PostgreSQL and left out"),
  notices: z.array(z.string()).describe("NOTICE and WARNING messages the statement raised"),
  read_only: z.boolean().describe("the statement ran in a READ ONLY transaction that was rolled back (read-only project tokens)"),
});

export const sqlErrorSchema = z.object({
  error: z.string().describe("PostgreSQL's message"),
  code: z.string().optional().describe("SQLSTATE (PostgreSQL errors)"),
  position: z.number().int().optional().describe("1-based character position in the query the error points at"),
  detail: z.string().optional(),
  hint: z.string().optional(),
});
