import { join } from "node:path";
import * as z from "zod";
import type { ProjectTokenPrincipal } from "../auth/principal";
import { DatabaseQueryError, type AccessMode } from "../backends/databases/engine";
import type { Platform } from "../platform";
import type { ProjectRecord } from "../projects/record";
import { parseManifestText, type ConfigService } from "../config/service";
import { badRequest, HttpError, notFound } from "../http/errors";
import type { DatabasesService } from "../databases/service";
import { queryBodies, QUERY_OPERATIONS, type QueryOperation } from "../databases/query-builder";
import { invoke, type InvokeDeps } from "../functions/invoke";
import { functionView, normalized } from "../functions/routes";
import { deployFields, RUNTIMES } from "../functions/schemas";
import type { FunctionRecord } from "../functions/service";
import { logSearchBody } from "../logs/schemas";
import type { LogsService } from "../logs/service";
import { createSchedulerBody, patchSchedulerBody } from "../schedulers/schemas";
import { schedulerView, type SchedulersService } from "../schedulers/service";
import { bucketView, type BucketsService } from "../storage/buckets";
import type { ObjectsService } from "../storage/objects";
import type { EndUsersService } from "../end-users/service";
import { inlineArchive } from "./inline-archive";
import { checkReadOnlySql, MAX_SQL_CHARS } from "./read-only-sql";

/** What the MCP tools call: the services of the areas they act on, never Kiln's own HTTP routes. */
export type McpDeps = Pick<Platform, "config" | "clock" | "log" | "address"> &
  InvokeDeps & {
    logs: LogsService;
    databases: DatabasesService;
    buckets: BucketsService;
    storageObjects: ObjectsService;
    schedulers: SchedulersService;
    configuration: ConfigService;
    endUsers: EndUsersService;
  };

/** A tool's failure beyond an API error (a build that failed): its message, and what the agent needs to see why. */
export class ToolFailure extends Error {
  constructor(
    message: string,
    readonly data: Record<string, unknown>,
  ) {
    super(message);
  }
}

/** One tool call: the project and token the request authenticated with. */
export interface ToolContext {
  deps: McpDeps;
  project: ProjectRecord;
  principal: ProjectTokenPrincipal;
}

/**
 * A tool: its zod input (the JSON Schema clients see is made from it), and whether it reads or
 * writes. `write` tools need a full-scope token, as the API's writes do: a read-only token does not
 * see them in tools/list, and calling one answers the API's 403 message as a tool error.
 */
export interface Tool<S extends z.ZodObject = z.ZodObject> {
  name: string;
  title: string;
  description: string;
  access: "read" | "write";
  input: S;
  run(ctx: ToolContext, args: z.output<S>): Promise<Record<string, unknown>>;
}

const tool = <S extends z.ZodObject>(t: Tool<S>): Tool => t as unknown as Tool;

const functionRef = z.string().min(1).max(128).describe("the function's name or id");
const databaseName = z.string().min(1).max(63).describe("the database's name (list_databases)");

/** A standard or durable function of the project by name (standard first) or id; 404 as the API says it. */
async function findFunction(ctx: ToolContext, ref: string, kinds: readonly ("standard" | "durable")[] = ["standard"]): Promise<FunctionRecord> {
  const { functions } = ctx.deps;
  for (const kind of kinds) {
    const byName = await functions.byName(ctx.project.id, ref, kind);
    if (byName && byName.status !== "deleted") return byName;
  }
  const byId = await functions.byId(ref);
  if (byId && byId.project_id === ctx.project.id && kinds.includes(byId.kind) && byId.status !== "deleted") return byId;
  throw notFound("function not found");
}

/** The function's deployments, newest first: its build outcome (status, error). */
async function latestDeployments(ctx: ToolContext, fn: FunctionRecord, n: number) {
  return (await ctx.deps.functions.deployments(fn.id)).slice(0, n);
}

const BUILD_WAIT_POLL_MS = 250;
/**
 * The longest a deploy waits for its build: the answer is one JSON body, sent when the tool ends, and
 * Kiln's server closes a connection idle for 60 s (server/http/server.ts).
 */
const MAX_WAIT_SECONDS = 45;

/**
 * Waits for a deployment to end (succeeded, failed or superseded), polling the history: builds are
 * real processes, not platform-clock timers. Null when `timeoutMs` passed first.
 */
async function awaitDeployment(ctx: ToolContext, fn: FunctionRecord, deploymentId: string, timeoutMs: number) {
  const until = performance.now() + timeoutMs;
  for (;;) {
    const d = (await ctx.deps.functions.deployments(fn.id)).find((x) => x.id === deploymentId);
    if (!d || (d.status !== "queued" && d.status !== "building")) return d ?? null;
    if (performance.now() >= until) return null;
    await new Promise((r) => setTimeout(r, BUILD_WAIT_POLL_MS));
  }
}

/** A database statement's failure as the query API words it (400, or 403 for a privilege or RLS denial). */
function queryFailure(err: unknown): never {
  if (err instanceof DatabaseQueryError) throw new HttpError(err.code === "42501" ? 403 : 400, { error: err.message });
  throw err;
}

/** Who a statement runs as: the roles of the query API's three credentials. */
const as = {
  role: z
    .enum(["service", "anonymous", "authenticated"])
    .optional()
    .describe(
      "run as the service role (default: every row, row-level security bypassed, as with a service key), as `anonymous` (the owner's grants and RLS policies apply, as with the anon key), " +
        "or as `authenticated` for the end user `user_id` (grants and RLS as that user, as with their access token)",
    ),
  user_id: z.string().min(1).max(64).optional().describe("the end user to act as, with role `authenticated`"),
};

async function accessMode(ctx: ToolContext, a: { role?: "service" | "anonymous" | "authenticated"; user_id?: string }): Promise<AccessMode> {
  if (a.role === "authenticated") {
    if (!a.user_id) throw badRequest("invalid arguments: role 'authenticated' needs user_id (the end user to act as)");
    const user = await ctx.deps.endUsers.adminGet(ctx.project.id, a.user_id);
    return { kind: "user", userId: user.id, email: user.email };
  }
  if (a.user_id) throw badRequest("invalid arguments: user_id goes with role 'authenticated'");
  return a.role === "anonymous" ? { kind: "anonymous" } : { kind: "admin" };
}

/** One query API operation on an active database, counted as the query API counts it. */
async function runQueryOperation(ctx: ToolContext, database: string, mode: AccessMode, operation: QueryOperation, body: Record<string, unknown>) {
  let result;
  try {
    result = await ctx.deps.databases.query(ctx.project.id, database, mode, operation, body, () => {});
  } catch (err) {
    queryFailure(err);
  }
  const out = { data: result.rows, count: result.rows.length };
  ctx.deps.databases.activity.recordUsage(result.databaseId, { transfer: JSON.stringify(out).length });
  return out;
}

/** Fields left undefined are dropped: the query builder refuses a field of another operation even when empty. */
function defined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

const schedulerFields = {
  name: z.string().describe("the scheduler's name"),
  cron: z.string().describe("5-field cron expression in UTC (at most once a minute), e.g. '0 3 * * *'"),
  enabled: z.boolean().optional().describe("default true"),
  payload: z.record(z.string(), z.unknown()).optional().describe("the JSON object the function receives as its event"),
  regions: z.array(z.string()).optional().describe("exactly one deployed region; omit to let Kiln choose"),
};

export const TOOLS: readonly Tool[] = [
  // ---- functions ---------------------------------------------------------------------------------
  tool({
    name: "list_functions",
    title: "List functions",
    description: "The project's standard functions with their status (provisioning, active, failed, deleting), runtime and invoke URL.",
    access: "read",
    input: z.object({
      page: z.number().int().min(1).optional().describe("page, from 1"),
      limit: z.number().int().min(1).max(100).optional().describe("per page, default 50"),
    }),
    run: async (ctx, a) => {
      const page = a.page ?? 1;
      const limit = a.limit ?? 50;
      const res = await ctx.deps.functions.list(ctx.project.id, page, limit);
      return { data: res.data.map((f) => functionView(ctx.deps, f)), page, limit, total: res.total, has_more: page * limit < res.total };
    },
  }),
  tool({
    name: "get_function",
    title: "Get a function",
    description: "One function (by name or id) with its latest deployments: their status and build error, if any.",
    access: "read",
    input: z.object({ function: functionRef }),
    run: async (ctx, a) => {
      const fn = await findFunction(ctx, a.function);
      return { function: functionView(ctx.deps, fn), deployments: await latestDeployments(ctx, fn, 5) };
    },
  }),
  tool({
    name: "deploy_function",
    title: "Deploy a function",
    description:
      "Create or update a function from source files given inline (path → text content, e.g. {\"index.mjs\": \"export async function handler(event) { ... }\"}), " +
      "packed into the archive the deploy API takes and built the same way. Waits for the build by default and returns its outcome.",
    access: "write",
    input: z.object({
      name: deployFields.shape.name.describe("DNS-safe name: lowercase letters, digits and hyphens"),
      runtime: z.enum(RUNTIMES),
      files: z.record(z.string(), z.string()).describe("path (relative, '/'-separated) → file content as text"),
      handler: z.string().optional().describe("the exported function to call, default `handler`"),
      is_public: z.boolean().optional().describe("anon keys may invoke it (default false)"),
      invocation_mode: z.enum(["rpc", "http"]).optional(),
      wait: z.boolean().optional().describe("wait for the build to finish (default true)"),
      wait_seconds: z
        .number()
        .int()
        .min(1)
        .max(MAX_WAIT_SECONDS)
        .optional()
        .describe(`how long to wait for the build, default and at most ${MAX_WAIT_SECONDS} (then get_function tells the outcome)`),
    }),
    run: async (ctx, a) => {
      const { deps } = ctx;
      const fields = deployFields.pick({ name: true, handler: true }).safeParse({ name: a.name, handler: a.handler });
      if (!fields.success) throw badRequest(`invalid arguments: ${fields.error.issues.map((i) => `field '${i.path.join(".")}': ${i.message}`).join("; ")}`);
      const archive = await inlineArchive(a.files, join(deps.config.dataDir, "tmp"));
      const source = await normalized(deps, archive, a.runtime, a.handler);
      const { created, fn } = await deps.functions.deploy(ctx.project.id, { name: a.name, runtime: a.runtime, handler: a.handler, is_public: a.is_public, invocation_mode: a.invocation_mode }, source);
      // This deploy's deployment: the newest of the function with this source (ids are not returned by deploy).
      const mine = (await deps.functions.deployments(fn.id)).find((d) => d.kind === "deploy" && d.source_sha256 === source.sha256);
      let deployment = mine ?? null;
      let waited = false;
      if (a.wait !== false && mine) {
        const done = await awaitDeployment(ctx, fn, mine.id, (a.wait_seconds ?? MAX_WAIT_SECONDS) * 1000);
        waited = done !== null;
        if (done) deployment = done;
      }
      const now = await deps.functions.get(ctx.project.id, fn.id);
      if (deployment?.status === "failed") {
        // The build's last lines say why (the deployment's error is their summary).
        const lines = await deps.logs.search(ctx.project.id, { resourceType: "function", resourceIds: [fn.id], deploymentIds: [deployment.id], limit: 20 });
        throw new ToolFailure(`the build failed: ${deployment.error ?? "see build_log"}`, {
          function: functionView(deps, now),
          deployment,
          build_log: lines.data.reverse().map((l) => (typeof l.body === "string" ? l.body : JSON.stringify(l.body))),
        });
      }
      return {
        created,
        function: functionView(deps, now),
        deployment,
        ...(a.wait !== false && !waited ? { notice: "the build had not finished when the wait ended; get_function shows its outcome" } : {}),
      };
    },
  }),
  tool({
    name: "invoke_function",
    title: "Invoke a function",
    description:
      "Run a function once with a JSON payload (as a service key would: no end-user identity) and return its status and body. " +
      "A function that crashes, times out or has no successful deployment is a tool error.",
    access: "write",
    input: z.object({ function: functionRef, payload: z.unknown().optional().describe("any JSON value: the function's event") }),
    run: async (ctx, a) => {
      const fn = await findFunction(ctx, a.function);
      if (fn.status === "deleting") throw notFound("function not found");
      const t = performance.now();
      const res = await invoke(ctx.deps, fn, null, a.payload, t, t);
      const text = await res.text();
      let body: unknown = text;
      if (/json/i.test(res.headers.get("content-type") ?? "")) {
        try {
          body = JSON.parse(text);
        } catch {}
      }
      return { status: res.status, body, invocation_id: res.headers.get("X-Service-Invocation-Id"), content_type: res.headers.get("content-type") };
    },
  }),

  // ---- logs --------------------------------------------------------------------------------------
  tool({
    name: "search_logs",
    title: "Search logs",
    description:
      "Search the project's function log lines, newest first. q: free text, \"phrases\", level:(error OR warn), invocation.id:, deployment.id:, resource.name:, AND/OR/NOT, -negation. " +
      "Give `function` to search one function's lines, `deployment_id` for a deployment's build lines.",
    access: "read",
    input: z.object({
      q: logSearchBody.shape.q,
      function: functionRef.optional(),
      deployment_id: z.string().min(1).max(128).optional().describe("a deployment's build lines"),
      start_time: logSearchBody.shape.start_time,
      end_time: logSearchBody.shape.end_time,
      limit: logSearchBody.shape.limit.describe("lines per page, default 100, at most 1000"),
      cursor: logSearchBody.shape.cursor.describe("next_cursor of the previous page (same filters)"),
    }),
    run: async (ctx, a) => {
      const fn = a.function ? await findFunction(ctx, a.function, ["standard", "durable"]) : null;
      return {
        ...(await ctx.deps.logs.search(ctx.project.id, {
          resourceType: "function",
          resourceIds: fn ? [fn.id] : undefined,
          deploymentIds: a.deployment_id ? [a.deployment_id] : undefined,
          q: a.q,
          startTime: a.start_time,
          endTime: a.end_time,
          limit: a.limit,
          cursor: a.cursor,
        })),
      };
    },
  }),

  // ---- databases ---------------------------------------------------------------------------------
  tool({
    name: "list_databases",
    title: "List databases",
    description: "The project's databases: name, status, PostgreSQL version; the connection string only for a full-scope token (it is a credential).",
    access: "read",
    input: z.object({}),
    run: async (ctx) => {
      const list = await ctx.deps.databases.list(ctx.project.id);
      return {
        data: list.map((d) => {
          const { connection_string, ...rest } = ctx.deps.databases.view(d, { list: true });
          return ctx.principal.scope === "full" && connection_string ? { ...rest, connection_string } : rest;
        }),
      };
    },
  }),
  tool({
    name: "select_rows",
    title: "Select rows",
    description:
      "Read rows of a table through the query API's select (its rules and limits): table, select (columns), filters [{column, operator (eq, neq, gt, gte, lt, lte, like, ilike, is, in), value}], order [{column, ascending}], limit, offset.",
    access: "read",
    input: queryBodies.select.safeExtend({ database: databaseName, ...as }),
    run: async (ctx, a) => {
      const { database, role, user_id, ...body } = a as Record<string, unknown> & { database: string; role?: "service" | "anonymous" | "authenticated"; user_id?: string };
      return runQueryOperation(ctx, database, await accessMode(ctx, { role, user_id }), "select", body);
    },
  }),
  tool({
    name: "modify_rows",
    title: "Insert, update or delete rows",
    description:
      "Change rows through the query API (its rules: values for insert and update, filters required for update and delete); returns the rows written. " +
      "insert: values is one row (column → value) or an array of rows; update: values to set and filters; delete: filters.",
    access: "write",
    input: z.object({
      database: databaseName,
      operation: z.enum(QUERY_OPERATIONS.filter((o) => o !== "select") as ["insert", "update", "delete"]),
      table: z.string().describe("table name, optionally schema.table"),
      values: z.unknown().optional().describe("insert: a row or an array of rows; update: the columns to set"),
      filters: z.array(z.unknown()).optional().describe("[{column, operator, value}], all must match"),
      ...as,
    }),
    run: async (ctx, a) => runQueryOperation(ctx, a.database, await accessMode(ctx, a), a.operation, defined({ table: a.table, values: a.values, filters: a.filters })),
  }),
  tool({
    name: "run_readonly_sql",
    title: "Run read-only SQL",
    description:
      "Run one read-only SQL statement (SELECT, WITH ... SELECT, VALUES, TABLE, EXPLAIN, SHOW) on a database, in a READ ONLY transaction: PostgreSQL refuses any write. " +
      "Use $1, $2 ... with params for values. As the service role by default, or as `anonymous` or an end user to see what RLS lets them read.",
    access: "read",
    input: z.object({
      database: databaseName,
      sql: z.string().min(1).max(MAX_SQL_CHARS),
      params: z.array(z.union([z.string(), z.number(), z.boolean(), z.null()])).max(1000).optional().describe("values of $1, $2, ..."),
      ...as,
    }),
    run: async (ctx, a) => {
      await checkReadOnlySql(a.sql);
      const mode = await accessMode(ctx, a);
      const d = await ctx.deps.databases.activeByName(ctx.project.id, a.database);
      let result;
      try {
        result = await ctx.deps.databases.engine.run(d.id, { ...mode, readOnly: true }, a.sql, a.params ?? []);
      } catch (err) {
        queryFailure(err);
      }
      const out = { data: result.rows, count: result.rows.length };
      ctx.deps.databases.activity.recordUsage(d.id, { computeMs: result.computeMs, activeMs: result.computeMs, transfer: JSON.stringify(out).length });
      return out;
    },
  }),

  // ---- storage -----------------------------------------------------------------------------------
  tool({
    name: "list_buckets",
    title: "List storage buckets",
    description: "The project's storage buckets with their file size limit and allowed MIME types.",
    access: "read",
    input: z.object({}),
    run: async (ctx) => ({ buckets: (await ctx.deps.buckets.list(ctx.project.id)).map(bucketView) }),
  }),
  tool({
    name: "list_objects",
    title: "List objects",
    description: "Objects of a bucket by name (every object: policies do not apply to project tokens), under an optional prefix; page with next_cursor.",
    access: "read",
    input: z.object({
      bucket: z.string().min(1).max(64),
      prefix: z.string().max(1024).optional(),
      limit: z.number().int().min(1).max(1000).optional().describe("default 100"),
      cursor: z.string().max(2048).optional(),
    }),
    run: async (ctx, a) => {
      const bucket = await ctx.deps.buckets.byName(ctx.project.id, a.bucket);
      return ctx.deps.storageObjects.list({ kind: "service", projectId: ctx.project.id }, bucket, { prefix: a.prefix, limit: a.limit ?? 100, cursor: a.cursor });
    },
  }),

  // ---- schedulers --------------------------------------------------------------------------------
  tool({
    name: "list_schedulers",
    title: "List schedulers",
    description: "The project's schedulers (cron ticks that invoke a function), or one function's; each with its next and last run.",
    access: "read",
    input: z.object({
      function: functionRef.optional(),
      page: z.number().int().min(1).optional(),
      limit: z.number().int().min(1).max(100).optional().describe("default 50"),
    }),
    run: async (ctx, a) => {
      const page = a.page ?? 1;
      const limit = a.limit ?? 50;
      const res = a.function
        ? await ctx.deps.schedulers.list((await findFunction(ctx, a.function, ["standard", "durable"])).id, page, limit)
        : await ctx.deps.schedulers.listProject(ctx.project.id, page, limit);
      return { data: res.data.map(schedulerView), page, limit, total: res.total, has_more: page * limit < res.total };
    },
  }),
  tool({
    name: "create_scheduler",
    title: "Create a scheduler",
    description: "Invoke a function (standard or durable) on a cron schedule in UTC with a fixed JSON payload.",
    access: "write",
    input: z.object({ function: functionRef, ...schedulerFields }),
    run: async (ctx, a) => {
      const fn = await findFunction(ctx, a.function, ["standard", "durable"]);
      const body = parseBody(createSchedulerBody, defined({ name: a.name, enabled: a.enabled, schedule: { kind: "cron", cron_expression: a.cron }, payload: a.payload, regions: a.regions }));
      return { scheduler: schedulerView(await ctx.deps.schedulers.create(fn, fn.kind, body)) };
    },
  }),
  tool({
    name: "update_scheduler",
    title: "Update a scheduler",
    description: "Change a scheduler's name, cron, payload, regions or enabled flag (only the given fields change).",
    access: "write",
    input: z.object({
      function: functionRef,
      scheduler_id: z.string().min(1).describe("from list_schedulers"),
      name: schedulerFields.name.optional(),
      cron: schedulerFields.cron.optional(),
      enabled: schedulerFields.enabled,
      payload: schedulerFields.payload,
      regions: schedulerFields.regions,
    }),
    run: async (ctx, a) => {
      const fn = await findFunction(ctx, a.function, ["standard", "durable"]);
      const patch = parseBody(
        patchSchedulerBody,
        defined({ name: a.name, enabled: a.enabled, schedule: a.cron === undefined ? undefined : { kind: "cron", cron_expression: a.cron }, payload: a.payload, regions: a.regions }),
      );
      return { scheduler: schedulerView(await ctx.deps.schedulers.update(fn, a.scheduler_id, patch)) };
    },
  }),
  tool({
    name: "delete_scheduler",
    title: "Delete a scheduler",
    description: "Delete a scheduler and its run history.",
    access: "write",
    input: z.object({ function: functionRef, scheduler_id: z.string().min(1) }),
    run: async (ctx, a) => {
      const fn = await findFunction(ctx, a.function, ["standard", "durable"]);
      await ctx.deps.schedulers.delete(fn.id, a.scheduler_id);
      return { deleted: true, scheduler_id: a.scheduler_id };
    },
  }),

  // ---- configuration -----------------------------------------------------------------------------
  tool({
    name: "export_config",
    title: "Export the configuration",
    description:
      "The project's configuration as a manifest (the same as GET /projects/{id}/config): settings, regions, variables (values only for a full-scope token), auth, schedulers, buckets and policies, backup schedules. " +
      "Edit it and check the change with dry_run_config.",
    access: "read",
    input: z.object({ format: z.enum(["json", "yaml"]).optional().describe("json (default) or yaml: yaml adds the manifest as YAML text") }),
    run: async (ctx, a) => {
      const out = await ctx.deps.configuration.exportConfig(ctx.project.id, ctx.principal, a.format ?? "json");
      return a.format === "yaml" ? { manifest: out.manifest, yaml: out.text } : { manifest: out.manifest };
    },
  }),
  tool({
    name: "dry_run_config",
    title: "Dry-run a configuration change",
    description:
      "What applying a manifest would change (PUT /projects/{id}/config?dry_run=true): the report of created, updated, deleted and unchanged entries, skipped and missing resources; nothing changes. " +
      "An invalid manifest is an error listing every problem by path. Applying is left to `kiln config apply` (reviewed like code).",
    access: "write",
    input: z.object({
      manifest: z.union([z.record(z.string(), z.unknown()), z.string()]).describe("the manifest: an object, or its JSON or YAML text"),
    }),
    run: async (ctx, a) => {
      const value = typeof a.manifest === "string" ? parseManifestText(a.manifest, null) : a.manifest;
      try {
        return { ...(await ctx.deps.configuration.applyConfig(ctx.project.id, ctx.principal, value, { dryRun: true })) };
      } catch (err) {
        // The 422's list of problems (path and message) is what the agent needs to fix the manifest.
        const errors = err instanceof HttpError ? (err.body as { errors?: unknown }).errors : undefined;
        if (err instanceof HttpError && Array.isArray(errors)) throw new ToolFailure((err.body as { error: string }).error, { status: err.status, errors });
        throw err;
      }
    },
  }),
];

/** A body through the API's own schema, its messages as the API words them. */
function parseBody<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value);
  if (!r.success) throw badRequest(r.error.issues.map((i) => i.message).join("; "));
  return r.data;
}
