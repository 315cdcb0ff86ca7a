import * as z from "zod";
import { EARLIEST_TIMESTAMP_MS, errorSchema, timestampInput } from "../http/common-schemas";
import { forbidden, HttpError } from "../http/errors";
import { reply, type AreaRouter } from "../http/route";
import { projectIdParams } from "../projects/schemas";
import { plan as planOf } from "../accounts/plans";
import { queryBodies } from "./query-builder";
import {
  createDatabaseBody,
  createdDatabaseSchema,
  databaseListSchema,
  databaseParams,
  databaseSchema,
  dumpQuery,
  lintSchema,
  queryParams,
  queryResultSchema,
  regionsSchema,
  resetPasswordSchema,
  statsQuery,
  statsSchema,
  topQueriesQuery,
  topQuerySchema,
  versionsSchema,
} from "./schemas";
import { DEFAULT_PG_VERSION, PG_VERSIONS, REGIONS } from "./service";
import { QUERY_RESPONSES, runQuery, type DatabaseRouteDeps } from "./query-runner";

const tag = "Databases";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
/** Databases carry connection strings: read-only project tokens may not read them. */
const credentialRead = { kind: "project", access: "credential" } as const;
const write = { kind: "project", access: "write" } as const;

export function databaseRoutes(r: AreaRouter<DatabaseRouteDeps>): void {
  r.add({
    method: "GET",
    path: "/_kiln/ca.pem",
    tag,
    summary: "The certificate of Kiln's local CA, which signs the wire listener's TLS certificate (sslrootcert for sslmode=verify-full); public, no key in it",
    auth: { kind: "none" },
    responses: { 200: { description: "PEM (application/x-pem-file)" }, 503: errorSchema },
    handler: async ({ deps }) => {
      const tls = await deps.databaseWireTls().catch(() => {
        throw new HttpError(503, { error: "the wire listener's certificates could not be made; see Kiln's log" });
      });
      return new Response(tls.caPem, { headers: { "content-type": "application/x-pem-file", "x-kiln-ca-path": tls.caPath } });
    },
  });
  r.add({
    method: "GET",
    path: "/databases/regions",
    tag,
    summary: "Regions a database can be placed in",
    auth: { kind: "none" },
    responses: { 200: { description: "regions", schema: regionsSchema } },
    handler: () => reply.ok(REGIONS.map((x) => ({ id: x.id, name: x.name }))),
  });

  r.add({
    method: "GET",
    path: "/databases/versions",
    tag,
    summary: "PostgreSQL versions: what pg_version accepts and what actually runs here",
    auth: { kind: "none" },
    responses: { 200: { description: "versions", schema: versionsSchema } },
    handler: ({ deps }) => {
      const engine = deps.databases.engine;
      const runs = engine.serverVersions()[0] ?? null;
      return reply.ok({
        versions: [...PG_VERSIONS],
        default: DEFAULT_PG_VERSION,
        runs,
        engine: {
          kind: engine.kind,
          server_versions: engine.serverVersions(),
          note:
            engine.kind === "embedded"
              ? `The embedded engine (PGlite) runs PostgreSQL ${runs} for every database, whatever pg_version was asked for: a database's pg_version is ${runs}, and the version asked for is kept as requested_pg_version. Use the production profile (--postgres-url) to run on a server of your choice.`
              : `Databases run on the PostgreSQL server given by --postgres-url (${runs}): a database's pg_version is that server's version, and the version asked for is kept as requested_pg_version.`,
        },
        client_tools:
          `pg_dump and pg_restore refuse a server newer than themselves: use 'kiln db dump' (GET .../databases/{name}/dump), which runs a pg_dump ${runs} for you. ` +
          `Its plain format loads with psql into PostgreSQL ${engine.kind === "embedded" ? "15 or newer (objects PostgreSQL 18 has and the target lacks excepted)" : `${runs} or newer`}; ` +
          `its custom format needs pg_restore ${runs} or newer.`,
      });
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases",
    tag,
    summary: "List databases",
    auth: credentialRead,
    params: projectIdParams,
    responses: { 200: { description: "databases", schema: databaseListSchema }, ...errors },
    handler: async ({ deps, project }) => reply.ok({ data: (await deps.databases.list(project.id)).map((d) => deps.databases.view(d, { list: true })) }),
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/databases",
    tag,
    summary: "Create a database (provisioning, then active)",
    auth: write,
    params: projectIdParams,
    body: createDatabaseBody,
    responses: { 201: { description: "created", schema: createdDatabaseSchema }, ...errors },
    handler: async ({ deps, principal, project, body }) => {
      const d = await deps.databases.create(project.id, await deps.accounts.ownerPlan(principal, project.account_id), body);
      return reply.created({ ...deps.databases.view(d), name: d.name });
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases/{databaseName}",
    tag,
    summary: "Get a database (with its connection string while active)",
    auth: credentialRead,
    params: databaseParams,
    responses: { 200: { description: "database", schema: databaseSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(deps.databases.view(await deps.databases.get(project.id, params.databaseName))),
  });

  r.add({
    method: "DELETE",
    path: "/projects/{projectId}/databases/{databaseName}",
    tag,
    summary: "Delete a database permanently; its connections end (409 while a restore runs, 503 when that cannot be determined)",
    auth: write,
    params: databaseParams,
    responses: { 204: { description: "deleted" }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, params }) => {
      await deps.databases.delete(project.id, params.databaseName);
      return reply.noContent();
    },
  });

  r.add({
    method: "POST",
    path: "/projects/{projectId}/databases/{databaseName}/reset-password",
    tag,
    summary: "New client password; open connections continue, new ones need it (409 while a restore runs, 503 when that cannot be determined)",
    auth: write,
    params: databaseParams,
    responses: { 200: { description: "new credentials", schema: resetPasswordSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, params }) => reply.ok(await deps.databases.resetPassword(project.id, params.databaseName)),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases/{databaseName}/stats",
    tag,
    summary: "Storage, written and transferred bytes, compute and active time",
    auth: { kind: "project", access: "read" },
    params: databaseParams,
    // Times PostgreSQL cannot hold (year 0000, past 9999) are a 400 naming the parameter.
    query: statsQuery.extend({ from: timestampInput.optional(), to: timestampInput.optional() }),
    responses: { 200: { description: "stats", schema: statsSchema }, ...errors },
    handler: async ({ deps, project, params, query }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      const to = query.to ? new Date(query.to) : deps.clock.now();
      const from = query.from ? new Date(query.from) : new Date(Math.max(EARLIEST_TIMESTAMP_MS, to.getTime() - 86_400_000));
      if (from > to) throw new HttpError(400, { error: "from must not be after to" });
      const branches = await deps.branches.statsOf(d);
      const backupBytes = await deps.backups.totalBytes(d.id);
      return reply.ok(await deps.databases.stats(d, from, to, query.granularity ?? "hourly", { branches, backupBytes }));
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases/{databaseName}/lint",
    tag,
    summary: "Tables without row-level security, and those of them the anonymous or authenticated role can reach (exposed)",
    auth: { kind: "project", access: "read" },
    params: databaseParams,
    responses: { 200: { description: "lint", schema: lintSchema }, ...errors },
    handler: async ({ deps, project, params }) => reply.ok(await deps.databases.lint(await deps.databases.get(project.id, params.databaseName))),
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases/{databaseName}/queries",
    tag,
    summary: "Top queries by total execution time (SUPERAGENT)",
    auth: { kind: "project", access: "read" },
    params: databaseParams,
    query: topQueriesQuery,
    responses: { 200: { description: "top queries", schema: z.object({ data: z.array(topQuerySchema) }) }, ...errors },
    handler: async ({ deps, principal, project, params, query }) => {
      const plan = planOf(await deps.accounts.ownerPlan(principal, project.account_id));
      if (!plan.topQueries) throw forbidden(`top queries are not available on the ${plan.label} plan`);
      const d = await deps.databases.get(project.id, params.databaseName);
      return reply.ok({ data: await deps.databases.topQueries(d, query.limit ?? 10) });
    },
  });

  r.add({
    method: "GET",
    path: "/projects/{projectId}/databases/{databaseName}/dump",
    tag,
    summary: "A pg_dump of the database (query format: custom, the default, or plain SQL), streamed; taken from a consistent snapshot while the database serves",
    auth: credentialRead,
    params: databaseParams,
    query: dumpQuery,
    responses: { 200: { description: "the dump (application/octet-stream for custom, application/sql for plain)" }, ...errors, 503: errorSchema },
    handler: async ({ deps, project, params, query }) => {
      const d = await deps.databases.get(project.id, params.databaseName);
      const dump = await deps.dumps.dump(d, query.format ?? "custom");
      return new Response(dump.stream, {
        status: 200,
        headers: {
          "Content-Type": dump.contentType,
          // Bun sends a stream chunked (a Content-Length is dropped): the size is told here instead.
          "X-Kiln-Dump-Bytes": String(dump.sizeBytes),
          "Content-Disposition": `attachment; filename="${dump.fileName}"`,
          "X-Kiln-Pg-Version": String(deps.databases.runningVersion(d.pg_version)),
        },
      });
    },
  });

  for (const operation of ["select", "insert", "update", "delete"] as const) {
    r.add({
      method: "POST",
      path: `/databases/{databaseName}/query/${operation}`,
      tag: "Query API",
      summary: `${operation} rows: end-user token (as authenticated: the owner's grants, then RLS as that user), anon key (as anonymous: grants, then RLS) or service key (bypasses RLS)`,
      auth: { kind: "none" },
      params: queryParams.pick({ databaseName: true }),
      body: queryBodies[operation],
      // Checked by buildQuery after authentication, so a caller without a token always hears 401 first.
      bodyValidation: "handler",
      responses: QUERY_RESPONSES,
      handler: ({ deps, guard, request, ip, arrivedAt, params, body }) =>
        runQuery(deps, guard, request, ip, arrivedAt, params.databaseName, (access, started) =>
          deps.databases.query(access.projectId, params.databaseName, access.mode, operation, body, started),
        ),
    });
  }
}
