import { resolve } from "node:path";

export type PlanName = "hobby" | "superagent";

/** Everything `kiln start` can be told, resolved from flags first, then environment, then defaults. */
export interface Config {
  host: string;
  port: number;
  dataDir: string;
  ephemeral: boolean;
  plan: PlanName;
  /** Regions this instance simulates; the first one serves requests (`X-Service-Region`). */
  regions: string[];
  /** Production profile: the control store lives in this PostgreSQL database. */
  databaseUrl?: string;
  platformToken?: string;
  adminToken?: string;
  /** CLIs older than this get 426. */
  minCliVersion?: string;
  /** Live (unrevoked) project access tokens per project. */
  accessTokenLimit: number;
  /** Unrecognized credentials accepted per source address per minute before 429. */
  authFailureLimit: number;
  /** OpenAPI description fetches per address per minute. */
  openapiFetchLimit: number;
  /** How long a verified credential is trusted without asking the store (other instances' revocations). */
  credentialCacheMs: number;
  /** Fault injection for tests: name -> how many times to fail. */
  faults: Record<string, number>;
  /** Send email through this SMTP server instead of the local catcher (self-hosting). */
  smtpUrl?: string;
  mailFrom: string;
  /**
   * Who reads the local mail catcher's pages (every project's mail, reset links included): anyone who
   * reaches Kiln (`open`, the embedded profile's default), only the instance account's platform token
   * (`token`, the production profile's default), or nobody: no catcher (`off`, needs `smtpUrl`).
   */
  mailCatcher: "open" | "token" | "off";
  /** SMTP port of the local mail catcher (0: a free one). */
  smtpPort: number;
  /** Serve the local OAuth providers at /_emulators/oauth (KILN_OAUTH_EMULATORS=on|off; default on, off in the production profile). */
  oauthEmulators: boolean;
  /** Base address for links in emails; default: the listening address. */
  publicUrl?: string;
  /** Production profile for managed databases: a PostgreSQL server that holds them. */
  postgresUrl?: string;
  /** Port of the PostgreSQL wire listener behind every connection string (0: a free one). */
  pgPort: number;
  /** The wire listener refuses plaintext sessions (sslmode=disable); TLS is offered either way. */
  pgRequireSsl: boolean;
  /** More names and addresses for the wire listener's certificate, besides localhost, 127.0.0.1, ::1 and --host. */
  pgTlsHosts: string[];
  /** Embedded databases: most PGlite instances open at once, and idle time before one closes. */
  dbMaxOpen: number;
  dbMemoryBudgetMb: number;
  dbIdleCloseMs: number;
  /** A wire client of an embedded database idle in a transaction this long is ended; 0: never. */
  dbIdleInTransactionTimeoutMs: number;
  /** SOURCE_ARCHIVE_SIZE_LIMIT_MB: uploaded and normalized function archives. */
  sourceArchiveLimitMb: number;
  /** Largest JSON request body a route reads (a route may declare its own); beyond: 413. */
  maxJsonBodyBytes: number;
  /** Largest function invocation request (RPC invoke route and function addresses); beyond: 413. */
  maxInvokeBodyBytes: number;
  /** Deepest nesting of arrays and objects a JSON request body may have; beyond: 400. */
  maxJsonDepth: number;
  /** HTTP-mode function addresses are `<name>.<project>.<functionsDomain>` (resolving to Kiln). */
  functionsDomain: string;
  /** Frontend sites are `<name>--<project>.<frontendsDomain>` (KILN_FRONTENDS_DOMAIN, default app.localhost). */
  frontendsDomain: string;
  /**
   * The site URL shown to users, a template with `{site}` (`<name>--<project>`): a self-hoster behind
   * a proxy sets `https://{site}.apps.example.com` (KILN_FRONTENDS_URL); default http on Kiln's port.
   */
  frontendsUrl?: string;
  /** HTTPS port for frontends (default URLs and custom domains, by SNI); null: none (`--frontends-tls-port`). */
  frontendsTlsPort: number | null;
  /** Limits of every function invocation. */
  functionMemoryMb: number;
  functionTimeoutMs: number;
  /** How long a stop (SIGTERM, SIGINT) may take before Kiln exits anyway, naming what it waited for. */
  stopTimeoutMs: number;
  /** A new worker's start (cold start) budget, apart from the time limit. */
  functionInitTimeoutMs: number;
  /** CPU time one invocation may use (all its threads and processes); default: the time limit. */
  functionCpuSeconds: number;
  /** Standard functions per project (403 beyond). */
  maxFunctions: number;
  /** Where function workers run: local processes (bubblewrap when available) or containers. */
  functionRuntime: "process" | "docker";
  /** The Docker or Podman engine API for the container runtime; default DOCKER_HOST, then the usual sockets. */
  dockerHost?: string;
  /** Base image of function containers (imported by Kiln when the engine lacks it). */
  functionImage: string;
  /** Which sandbox local function workers and builds use: the best that works here, or one named. */
  functionSandbox: "auto" | "bubblewrap" | "namespaces";
  /** Run function code and builds as plain host processes when no sandbox works (explicit opt-in). */
  allowUnsandboxedFunctions: boolean;
  /** Lets tests move time forward through /_kiln/clock. */
  controllableClock: boolean;
  /** A seed file applied at start and kept as the snapshot `seed` (server/snapshots/seed.ts). */
  seed?: string;
  /** Keep the state right after start as the snapshot `start`, for POST /_kiln/reset (a seed is kept instead). */
  resettable: boolean;
  /** Where the controllable clock starts (epoch ms), instead of the real time. */
  clockStartMs?: number;
  /** Object storage on an S3 endpoint instead of files under the data dir (production profile). */
  s3?: { endPoint: string; bucket: string; accessKey: string; secretKey: string; region?: string; prefix?: string };
  /** S3 downloads up to this size are copied to a file first and sent with their Content-Length. */
  s3SpoolMaxBytes: number;
  /** How long a spooled download's file is kept after it was written. */
  s3SpoolKeepMs: number;
  /** Log lines older than this many days are deleted by the log store's cleanup (platform clock). */
  logRetentionDays: number;
  /** Finished durable executions (and their journals) are kept this long after they finish. */
  durableRetentionDays: number;
  /** Per-minute metrics are kept this many days (the longest metrics window is 7). */
  metricsRetentionDays: number;
  /** Check every response against its declared schema (tests turn this on). */
  validateResponses: boolean;
}

export interface StartOptions {
  port?: string | number;
  host?: string;
  dataDir?: string;
  ephemeral?: boolean;
  plan?: string;
  regions?: string;
  databaseUrl?: string;
  minCliVersion?: string;
  smtpPort?: string | number;
  mailCatcher?: string;
  publicUrl?: string;
  controllableClock?: boolean;
  seed?: string;
  resettable?: boolean;
  clockStart?: string;
  s3Endpoint?: string;
  s3Bucket?: string;
  postgresUrl?: string;
  pgPort?: string | number;
  pgRequireSsl?: boolean;
  pgTlsHosts?: string;
  frontendsTlsPort?: string | number;
  functionRuntime?: string;
  dockerHost?: string;
  functionImage?: string;
  functionSandbox?: string;
  allowUnsandboxedFunctions?: boolean;
}

function intEnv(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === "") return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got "${v}"`);
  return n;
}

function positiveIntEnv(name: string, fallback: number): number {
  const n = intEnv(name, fallback);
  if (n < 1) throw new Error(`${name} must be at least 1, got "${process.env[name]}"`);
  return n;
}

/** Deeper limits than this would let JSON.stringify and friends overflow the stack on request data. */
function boundedIntEnv(name: string, fallback: number, min: number, max: number): number {
  const n = intEnv(name, fallback);
  if (n < min || n > max) throw new Error(`${name} must be ${min} to ${max}, got "${process.env[name]}"`);
  return n;
}

/** `KILN_FAULTS=project-cleanup:1,other:2` */
function parseFaults(spec: string | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of (spec ?? "").split(",").map((s) => s.trim()).filter(Boolean)) {
    const [name, count] = part.split(":");
    out[name!] = count ? Number(count) : 1;
  }
  return out;
}

const REGION_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;

export function resolveConfig(opts: StartOptions, env = process.env): Config {
  const port = Number(opts.port ?? env.KILN_PORT ?? 7070);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port must be 0-65535, got "${opts.port ?? env.KILN_PORT}"`);
  const plan = (opts.plan ?? env.KILN_PLAN ?? "superagent").toLowerCase();
  if (plan !== "hobby" && plan !== "superagent") throw new Error(`--plan must be hobby or superagent, got "${opts.plan ?? env.KILN_PLAN}"`);
  const regions = (opts.regions ?? env.KILN_REGIONS ?? "local").split(",").map((r) => r.trim()).filter(Boolean);
  if (regions.length === 0 || regions.some((r) => !REGION_RE.test(r)))
    throw new Error(`--regions must be a comma-separated list of lowercase labels, got "${opts.regions ?? env.KILN_REGIONS}"`);
  const platformToken = env.KILN_PLATFORM_TOKEN || undefined;
  if (platformToken && !/^pk-[A-Za-z0-9_-]{16,}$/.test(platformToken))
    throw new Error("KILN_PLATFORM_TOKEN must start with pk- followed by at least 16 letters or digits");
  const functionRuntime = (opts.functionRuntime ?? env.KILN_FUNCTION_RUNTIME ?? "process").toLowerCase();
  if (functionRuntime !== "process" && functionRuntime !== "docker")
    throw new Error(`--function-runtime must be process or docker (Docker or Podman engine), got "${opts.functionRuntime ?? env.KILN_FUNCTION_RUNTIME}"`);
  const functionSandbox = (opts.functionSandbox ?? env.KILN_FUNCTION_SANDBOX ?? "auto").toLowerCase();
  if (functionSandbox !== "auto" && functionSandbox !== "bubblewrap" && functionSandbox !== "namespaces")
    throw new Error(`--function-sandbox must be auto, bubblewrap or namespaces, got "${opts.functionSandbox ?? env.KILN_FUNCTION_SANDBOX}"`);
  return {
    host: opts.host ?? env.KILN_HOST ?? "127.0.0.1",
    port,
    dataDir: resolve(opts.dataDir ?? env.KILN_DATA_DIR ?? ".kiln"),
    ephemeral: Boolean(opts.ephemeral),
    plan,
    regions: [...new Set(regions)],
    databaseUrl: opts.databaseUrl ?? (env.KILN_DATABASE_URL || undefined),
    platformToken,
    adminToken: env.KILN_ADMIN_TOKEN || undefined,
    minCliVersion: opts.minCliVersion ?? (env.KILN_MIN_CLI_VERSION || undefined),
    accessTokenLimit: intEnv("KILN_ACCESS_TOKEN_LIMIT", 100),
    authFailureLimit: intEnv("KILN_AUTH_FAILURE_LIMIT", 60),
    openapiFetchLimit: intEnv("KILN_OPENAPI_FETCH_LIMIT", 30),
    credentialCacheMs: intEnv("KILN_CREDENTIAL_CACHE_MS", 2000),
    faults: parseFaults(env.KILN_FAULTS),
    validateResponses: env.KILN_VALIDATE_RESPONSES === "1",
    controllableClock: Boolean(opts.controllableClock) || env.KILN_CONTROLLABLE_CLOCK === "1" || Boolean(opts.clockStart ?? env.KILN_CLOCK_START),
    seed: opts.seed ?? (env.KILN_SEED || undefined),
    resettable: Boolean(opts.resettable) || env.KILN_RESETTABLE === "1",
    clockStartMs: clockStartOf(opts.clockStart ?? env.KILN_CLOCK_START),
    s3: s3Of(opts, env),
    s3SpoolMaxBytes: intEnv("KILN_S3_SPOOL_MAX_MB", 512) * 1024 * 1024,
    s3SpoolKeepMs: intEnv("KILN_S3_SPOOL_KEEP_MS", 60_000),
    postgresUrl: opts.postgresUrl ?? (env.KILN_POSTGRES_URL || undefined),
    pgPort: Number(opts.pgPort ?? env.KILN_PG_PORT ?? 7432),
    pgRequireSsl: Boolean(opts.pgRequireSsl) || env.KILN_PG_REQUIRE_SSL === "1",
    pgTlsHosts: (opts.pgTlsHosts ?? env.KILN_PG_TLS_HOSTS ?? "").split(",").map((h) => h.trim()).filter(Boolean),
    dbMaxOpen: intEnv("KILN_DB_MAX_OPEN", 10),
    dbMemoryBudgetMb: intEnv("KILN_DB_MEMORY_BUDGET_MB", 512),
    sourceArchiveLimitMb: intEnv("KILN_SOURCE_ARCHIVE_LIMIT_MB", 50),
    maxJsonBodyBytes: positiveIntEnv("KILN_MAX_JSON_BODY_BYTES", 1_048_576),
    maxInvokeBodyBytes: positiveIntEnv("KILN_MAX_INVOKE_BODY_BYTES", 6_291_456),
    maxJsonDepth: boundedIntEnv("KILN_MAX_JSON_DEPTH", 128, 1, 1000),
    maxFunctions: intEnv("KILN_FUNCTION_LIMIT", 10_000),
    logRetentionDays: positiveIntEnv("KILN_LOG_RETENTION_DAYS", 7),
    durableRetentionDays: positiveIntEnv("KILN_DURABLE_RETENTION_DAYS", 30),
    metricsRetentionDays: boundedIntEnv("KILN_METRICS_RETENTION_DAYS", 8, 8, 3650),
    functionRuntime,
    dockerHost: opts.dockerHost ?? (env.KILN_DOCKER_HOST || undefined),
    functionImage: opts.functionImage ?? (env.KILN_FUNCTION_IMAGE || "kiln-runtime:base"),
    functionSandbox,
    allowUnsandboxedFunctions: Boolean(opts.allowUnsandboxedFunctions) || env.KILN_ALLOW_UNSANDBOXED_FUNCTIONS === "1",
    functionMemoryMb: intEnv("KILN_FUNCTION_MEMORY_MB", 256),
    functionTimeoutMs: intEnv("KILN_FUNCTION_TIMEOUT_MS", 30_000),
    functionInitTimeoutMs: intEnv("KILN_FUNCTION_INIT_TIMEOUT_MS", 10_000),
    stopTimeoutMs: intEnv("KILN_STOP_TIMEOUT_MS", 30_000),
    functionCpuSeconds: intEnv("KILN_FUNCTION_CPU_SECONDS", Math.max(1, Math.ceil(intEnv("KILN_FUNCTION_TIMEOUT_MS", 30_000) / 1000))),
    functionsDomain: (env.KILN_FUNCTIONS_DOMAIN || "fn.localhost").toLowerCase(),
    frontendsDomain: (env.KILN_FRONTENDS_DOMAIN || "app.localhost").toLowerCase(),
    frontendsUrl: env.KILN_FRONTENDS_URL || undefined,
    frontendsTlsPort: tlsPortOf(opts.frontendsTlsPort ?? env.KILN_FRONTENDS_TLS_PORT),
    dbIdleCloseMs: intEnv("KILN_DB_IDLE_CLOSE_MS", 60_000),
    dbIdleInTransactionTimeoutMs: intEnv("KILN_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 60_000),
    smtpUrl: env.KILN_SMTP_URL || undefined,
    mailFrom: env.KILN_MAIL_FROM || "Kiln <no-reply@kiln.localhost>",
    mailCatcher: mailCatcherOf(opts, env),
    smtpPort: Number(opts.smtpPort ?? env.KILN_SMTP_PORT ?? 0),
    oauthEmulators: oauthEmulatorsOf(opts, env),
    publicUrl: (opts.publicUrl ?? env.KILN_PUBLIC_URL)?.replace(/\/+$/, "") || undefined,
  };
}

/** `--frontends-tls-port` (KILN_FRONTENDS_TLS_PORT): absent or empty, no HTTPS listener; 0 picks a free port. */
function tlsPortOf(v: string | number | undefined): number | null {
  if (v === undefined || v === "") return null;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new Error(`--frontends-tls-port must be a port number (0 picks a free one), got "${v}"`);
  return n;
}

/**
 * `--mail-catcher` (KILN_MAIL_CATCHER). The catcher holds every project's reset and confirmation
 * links, so a Kiln in the production profile (a shared server) guards it with the platform token
 * unless told otherwise; the embedded profile (one developer's machine) keeps it open.
 */
function mailCatcherOf(opts: StartOptions, env: Record<string, string | undefined>): Config["mailCatcher"] {
  const production = Boolean(opts.databaseUrl || env.KILN_DATABASE_URL || opts.postgresUrl || env.KILN_POSTGRES_URL);
  const given = opts.mailCatcher ?? (env.KILN_MAIL_CATCHER || undefined);
  const mode = (given ?? (production ? "token" : "open")).toLowerCase();
  if (mode !== "open" && mode !== "token" && mode !== "off") throw new Error(`--mail-catcher must be open, token or off, got "${given}"`);
  if (mode === "off" && !env.KILN_SMTP_URL)
    throw new Error("--mail-catcher off needs KILN_SMTP_URL: Kiln mails sign-up confirmations, email changes and password resets, and without the catcher they must go to a mail server");
  return mode;
}

/**
 * KILN_OAUTH_EMULATORS: the local OAuth providers let anyone sign in as anyone, so a Kiln in the
 * production profile (a shared server) serves them only when told to.
 */
function oauthEmulatorsOf(opts: StartOptions, env: Record<string, string | undefined>): boolean {
  const production = Boolean(opts.databaseUrl || env.KILN_DATABASE_URL || opts.postgresUrl || env.KILN_POSTGRES_URL);
  const given = (env.KILN_OAUTH_EMULATORS || "").toLowerCase();
  if (given && !["on", "off", "1", "0", "true", "false"].includes(given)) throw new Error(`KILN_OAUTH_EMULATORS must be on or off, got "${env.KILN_OAUTH_EMULATORS}"`);
  return given ? ["on", "1", "true"].includes(given) : !production;
}

/** `--s3-endpoint` (KILN_S3_ENDPOINT) with its bucket and credentials from the environment. */
function s3Of(opts: StartOptions, env: Record<string, string | undefined>): Config["s3"] {
  const endPoint = opts.s3Endpoint ?? env.KILN_S3_ENDPOINT;
  if (!endPoint) return undefined;
  if (!/^https?:\/\/[^/]+\/?$/.test(endPoint)) throw new Error(`--s3-endpoint must be http(s)://host:port (got '${endPoint}')`);
  const accessKey = env.KILN_S3_ACCESS_KEY ?? env.AWS_ACCESS_KEY_ID;
  const secretKey = env.KILN_S3_SECRET_KEY ?? env.AWS_SECRET_ACCESS_KEY;
  if (!accessKey || !secretKey) throw new Error("--s3-endpoint needs KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)");
  return { endPoint, bucket: opts.s3Bucket ?? env.KILN_S3_BUCKET ?? "kiln", accessKey, secretKey, region: env.KILN_S3_REGION, prefix: env.KILN_S3_PREFIX };
}

/** `--clock-start`: an RFC 3339 instant with an offset (or Z), years 1970-9999. */
function clockStartOf(v: string | undefined): number | undefined {
  if (!v) return undefined;
  const ms = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$/i.test(v) ? Date.parse(v) : NaN;
  if (!Number.isFinite(ms) || ms < 0 || ms > Date.UTC(9999, 11, 31)) throw new Error(`--clock-start must be an RFC 3339 instant such as 2028-02-29T00:00:00Z (got '${v}')`);
  return ms;
}

/** Takes one injected failure of the given name, if any are left. */
export function takeFault(config: Config, name: string): boolean {
  const left = config.faults[name] ?? 0;
  if (left <= 0) return false;
  config.faults[name] = left - 1;
  return true;
}
