import type { DumpsService } from "./dumps";
import { errorSchema } from "../http/common-schemas";
import { queryResultSchema } from "./schemas";
import type { AccountsService } from "../accounts/service";
import type { AuthRule } from "../auth/principal";
import type { Guard } from "../auth/guard";
import type { Clock } from "../clock";
import type { Logger } from "../log";
import { forbidden, HttpError, jsonResponse } from "../http/errors";
import { DatabaseQueryError, type AccessMode } from "../backends/databases/engine";
import type { BackupsService } from "./backups";
import type { BranchesService } from "./branches";
import type { RestoresService } from "./restores";
import type { DatabasesService } from "./service";

/** What the database routes use. */
export interface DatabaseRouteDeps {
  databases: DatabasesService;
  branches: BranchesService;
  backups: BackupsService;
  restores: RestoresService;
  dumps: DumpsService;
  /** The wire listener's TLS material (its CA certificate is served at /_kiln/ca.pem). */
  databaseWireTls: () => Promise<{ caPem: string; caPath: string }>;
  accounts: AccountsService;
  clock: Clock;
  log: Logger;
}

/**
 * The query API's credentials: the application-credential rule, with the full service role for
 * service keys. Applied inside the handler (the route is `none`) because the spec puts the timing
 * headers on every query answer, refusals included.
 */
const QUERY_AUTH = {
  kind: "application",
  fullServiceRole: true,
  unauthenticated: "Authentication required for database queries",
  refused: "database queries need an end-user access token, an anon key or a service key; platform and project tokens are not accepted",
} as const satisfies AuthRule;

/** Who the statement runs as, for the caller's credential. */
export interface QueryAccess {
  projectId: string;
  mode: AccessMode;
}

async function accessOf(guard: Guard, request: Request, ip: string, anonAllowed: boolean): Promise<QueryAccess> {
  const { principal: p } = await guard.authorize(QUERY_AUTH, request, {}, ip);
  if (p.kind === "service_key") return { projectId: p.projectId, mode: { kind: "admin" } };
  if (p.kind === "user") return { projectId: p.projectId, mode: { kind: "user", userId: p.userId, email: p.email } };
  if (!anonAllowed) throw forbidden("anon keys are not accepted on branches: use a service key or an end-user access token");
  return { projectId: p.projectId, mode: { kind: "anonymous" } };
}

type QueryRun = (access: QueryAccess, started: () => void) => Promise<{ databaseId: string; rows: Record<string, unknown>[]; computeMs: number }>;

/**
 * One query API request (a database's or a branch's): credential, statement, errors as the spec
 * has them, and the timing headers on every answer. Branches refuse anon keys.
 */
export async function runQuery(
  deps: DatabaseRouteDeps,
  guard: Guard,
  request: Request,
  ip: string,
  arrivedAt: number,
  databaseName: string,
  run: QueryRun,
  opts: { anonAllowed?: boolean } = {},
) {
  const handlerStart = performance.now();
  let queryStart = handlerStart;
  let computeMs = 0;
  const timing = () => ({
    "X-Service-Proxy-Ms": String(Math.round(queryStart - arrivedAt)),
    "X-Service-Proxy-Handler-Ms": String(Math.round(queryStart - handlerStart)),
    "X-Service-Compute-Ms": String(Math.round(computeMs)),
  });
  try {
    const access = await accessOf(guard, request, ip, opts.anonAllowed ?? true);
    let result;
    try {
      result = await run(access, () => (queryStart = performance.now()));
    } catch (err) {
      if (err instanceof HttpError) throw err; // unknown database, bad body: raised before the query ran
      computeMs = performance.now() - queryStart;
      // 42501: a privilege the role lacks, or a row-level security check (403, like a storage policy denial).
      if (err instanceof DatabaseQueryError) throw new HttpError(err.code === "42501" ? 403 : 400, { error: err.message });
      const requestId = crypto.randomUUID();
      deps.log.error(`query on database ${databaseName} failed (request ${requestId})`, err);
      throw new HttpError(500, { error: "Query failed" }, { "X-Request-Id": requestId });
    }
    computeMs = result.computeMs;
    const text = JSON.stringify({ data: result.rows, count: result.rows.length });
    deps.databases.activity.recordUsage(result.databaseId, { transfer: text.length });
    return new Response(text, { status: 200, headers: { "Content-Type": "application/json; charset=utf-8", ...timing() } });
  } catch (err) {
    if (err instanceof HttpError) return jsonResponse(err.status, err.body, { ...err.headers, ...timing() });
    throw err;
  }
}

/** What every query route answers (the database's and its branches' twin). */
export const QUERY_RESPONSES = {
  200: { description: "rows", schema: queryResultSchema },
  400: errorSchema,
  401: errorSchema,
  403: errorSchema,
  404: errorSchema,
  409: errorSchema,
  500: errorSchema,
};
