import type { ProjectRecord } from "../projects/record";
import type { Principal } from "../auth/principal";
import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { DatabaseRouteDeps } from "./query-runner";
import {
  backupDeletedSchema,
  backupListSchema,
  backupParams,
  backupSchema,
  createBackupBody,
  createRestoreBody,
  databaseParams,
  putScheduleBody,
  restoreListSchema,
  restoreParams,
  restoreSchema,
  scheduleSchema,
} from "./schemas";

const tag = "Database backups";
const errors = { 400: errorSchema, 401: errorSchema, 403: errorSchema, 404: errorSchema, 409: errorSchema };
const read = { kind: "project", access: "read" } as const;
const write = { kind: "project", access: "write" } as const;
const base = "/projects/{projectId}/databases/{databaseName}";

/** SUPERAGENT only (403 first, reads included), then the database (404). */
async function database(deps: DatabaseRouteDeps, principal: Principal, project: ProjectRecord, name: string) {
  return (await planAndDatabase(deps, principal, project, name)).d;
}

async function planAndDatabase(deps: DatabaseRouteDeps, principal: Principal, project: ProjectRecord, name: string) {
  const plan = await deps.accounts.ownerPlan(principal, project.account_id);
  deps.backups.requirePlan(plan);
  return { plan, d: await deps.databases.get(project.id, name) };
}

export function backupRoutes(r: AreaRouter<DatabaseRouteDeps>): void {
  r.add({
    method: "GET",
    path: `${base}/backups`,
    tag,
    summary: "Backups, newest first, and the point-in-time restore window (SUPERAGENT); readable during a restore",
    auth: read,
    params: databaseParams,
    responses: { 200: { description: "backups", schema: backupListSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      deps.backups.requireStorage(d);
      const window = await deps.restores.window(d);
      return reply.ok({
        data: (await deps.backups.list(d)).map((b) => deps.backups.view(b)),
        ...(window ? { restore_window: { earliest_restore_at: new Date(window.earliest).toISOString(), latest_restore_at: new Date(window.latest).toISOString() } } : {}),
      });
    },
  });

  r.add({
    method: "POST",
    path: `${base}/backups`,
    tag,
    summary: "Take a backup now (synchronous); at least a minute after the last; 50 manual backups per database",
    auth: write,
    params: databaseParams,
    body: createBackupBody,
    responses: { 201: { description: "the backup", schema: backupSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, principal, project, params, body }) => {
      const { plan, d } = await planAndDatabase(deps, principal, project, params.databaseName);
      return reply.created(deps.backups.view(await deps.backups.create(d, plan, body.name)));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/backups/{backupName}`,
    tag,
    summary: "One backup",
    auth: read,
    params: backupParams,
    responses: { 200: { description: "the backup", schema: backupSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      deps.backups.requireStorage(d);
      return reply.ok(deps.backups.view(await deps.backups.get(d, params.backupName)));
    },
  });

  r.add({
    method: "DELETE",
    path: `${base}/backups/{backupName}`,
    tag,
    summary: "Delete a backup (scheduled ones too); 409 while the database is being restored",
    auth: write,
    params: backupParams,
    responses: { 200: { description: "deleted", schema: backupDeletedSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      deps.backups.requireStorage(d);
      await deps.backups.delete(d, params.backupName);
      return reply.ok({ status: "deleted" as const, message: `backup '${params.backupName}' deleted` });
    },
  });

  r.add({
    method: "GET",
    path: `${base}/backup-schedule`,
    tag,
    summary: "The backup schedule; no entries means no automated backups",
    auth: read,
    params: databaseParams,
    responses: { 200: { description: "schedule", schema: scheduleSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      deps.backups.requireStorage(d);
      return reply.ok({ entries: await deps.backups.schedule(d) });
    },
  });

  r.add({
    method: "PUT",
    path: `${base}/backup-schedule`,
    tag,
    summary: "Replace the backup schedule wholesale; retention defaults to the plan's and is clamped to it",
    auth: write,
    params: databaseParams,
    body: putScheduleBody,
    responses: { 200: { description: "the stored schedule", schema: scheduleSchema }, ...errors },
    handler: async ({ deps, principal, project, params, body }) => {
      const plan = await deps.accounts.ownerPlan(principal, project.account_id);
      deps.backups.requirePlan(plan);
      const d = await deps.databases.get(project.id, params.databaseName);
      return reply.ok({ entries: await deps.backups.replaceSchedule(d, plan, body.entries) });
    },
  });

  r.add({
    method: "GET",
    path: `${base}/restores`,
    tag,
    summary: "Restore history, newest first, at most 50; readable during a restore",
    auth: read,
    params: databaseParams,
    responses: { 200: { description: "restores", schema: restoreListSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      return reply.ok({ data: (await deps.restores.list(d)).map((x) => deps.restores.view(x)) });
    },
  });

  r.add({
    method: "POST",
    path: `${base}/restores`,
    tag,
    summary:
      "Restore in place from a backup (backup_name) or to an instant (restore_to); destructive; the connection string stays; the data it replaces is kept as a pre-restore backup (202, pending)",
    auth: write,
    params: databaseParams,
    body: createRestoreBody,
    responses: { 202: { description: "pending", schema: restoreSchema }, ...errors, 503: errorSchema },
    handler: async ({ deps, principal, project, params, body }) => {
      const { plan, d } = await planAndDatabase(deps, principal, project, params.databaseName);
      return reply.accepted(deps.restores.view(await deps.restores.create(d, plan, body)));
    },
  });

  r.add({
    method: "GET",
    path: `${base}/restores/{restoreId}`,
    tag,
    summary: "One restore",
    auth: read,
    params: restoreParams,
    responses: { 200: { description: "the restore", schema: restoreSchema }, ...errors },
    handler: async ({ deps, principal, project, params }) => {
      const d = await database(deps, principal, project, params.databaseName);
      return reply.ok(deps.restores.view(await deps.restores.get(d, params.restoreId)));
    },
  });
}
