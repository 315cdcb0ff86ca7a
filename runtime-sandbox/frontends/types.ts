/**
 * The interface between the frontends area (server/frontends/, which owns deployments, storage of
 * builds, host routing and static serving) and a framework's builder and server (Next.js:
 * runtime-sandbox/frontends/nextjs.ts). The area never knows how a framework builds or serves; a
 * framework never knows about deployments, the control store or HTTP routing.
 *
 * Wiring: runtime-sandbox/frontends/nextjs.ts exports
 *   `export function createNextjsFramework(ctx: FrameworkContext): FrontendFramework`
 * and the area imports it lazily (a Kiln that hosts no Next.js app never loads it). Static sites are
 * the area's own (no builder: the app folder is the site).
 *
 * Directory contract of a deployment (`outDir`, made empty by the area, kept for as long as the
 * deployment may serve, removed by the area afterwards):
 *   - `result.staticDir` (relative to outDir): files laid out as URL paths, served by Kiln itself
 *     (`/_next/static/x.js` is `<staticDir>/_next/static/x.js`, `public/` files at their URL). Kiln
 *     answers from here first, with ETags, ranges, compression, and `immutable` caching under
 *     `result.immutablePrefixes` and for file names carrying a content hash.
 *   - `result.serverDir` (relative to outDir, kind "nextjs" only): a self-contained server (the
 *     standalone output), what `serve` is given back. Everything under outDir must be readable by the
 *     sandbox user (the area does not re-own files).
 */

/** One build-log line; the area stores it in the observability store (resource.type=frontend, the deployment's id). */
export type FrontendBuildLog = (level: "info" | "warn" | "error", line: string) => Promise<void>;

export type FrontendKind = "static" | "nextjs";

export interface FrameworkContext {
  /** Kiln's data dir: never visible to builds or servers. */
  hiddenPaths: string[];
  /** The sandbox builds and servers run in: the same choice as function workers'. */
  sandbox: { want: "auto" | "bubblewrap" | "namespaces"; allowUnsandboxed: boolean };
  /** Kiln's own warnings (not a deployment's). */
  warn: (message: string) => void;
  /**
   * Kiln's HTTP listener (host, port) and public URL once it listens: the one host address a
   * sandboxed server reaches besides the internet (a server component calling a Kiln function).
   */
  kiln?: () => { host: string; port: number; publicUrl: string } | null;
  /** `--function-runtime docker`: Next.js servers run as containers on this engine (builds stay in the local sandbox). */
  containers?: { host?: string; image?: string } | null;
  /** Timers on the platform clock (idle stops): tests move it instead of waiting. setTimeout when absent. */
  after?: (ms: number, run: () => void, label: string) => { cancel(): void };
}

export interface FrontendBuildInput {
  /** The unpacked archive root (a scratch copy: the builder may write in it, e.g. node_modules). */
  sourceDir: string;
  /** Relative POSIX path from sourceDir to the app ("" for the root); already checked to stay inside. */
  appRoot: string;
  /** Empty directory for the deployment's outputs (see the directory contract above). */
  outDir: string;
  /**
   * The selected project variables. The builder drops names its build reserves (logging one `warn`
   * line each) and keeps `NEXT_PUBLIC_*` out of the runtime (`result.runtimeEnv`).
   */
  env: Record<string, string>;
  log: FrontendBuildLog;
  /** Aborted when Kiln stops or the deployment is cancelled: end the build's processes and throw. */
  signal: AbortSignal;
}

export interface FrontendBuildResult {
  kind: FrontendKind;
  /** Relative to outDir; served by Kiln. */
  staticDir: string;
  /** URL path prefixes whose files never change (e.g. "/_next/static/"): `Cache-Control: immutable`. */
  immutablePrefixes: string[];
  /** Relative to outDir; kind "nextjs": the server `serve` starts. */
  serverDir?: string;
  /** Kind "nextjs": the Node major the server runs on ("22" or "24"). */
  nodeVersion?: "22" | "24";
  /** Kind "nextjs": the variables the server runtime sees (input env minus reserved and NEXT_PUBLIC_*). */
  runtimeEnv?: Record<string, string>;
  /** Lines also written to the build log; the deployment record keeps them. */
  warnings: string[];
}

/** A build that failed for a reason the user can act on: the message is the deployment's error. */
export class FrontendBuildError extends Error {
  override name = "FrontendBuildError";
}

export interface FrontendServeInput {
  /** The deployment's outDir and the build's result (as returned by `build`, persisted by the area as JSON). */
  deploymentDir: string;
  result: FrontendBuildResult;
  /** Request/stdout lines of the server, for the observability store. */
  log: (level: "info" | "warn" | "error", line: string) => void;
}

/**
 * A deployment's running server. Created by the area when the deployment becomes the serving one
 * (or at Kiln's start); the framework starts the process on the first `fetch`, stops it when idle,
 * restarts it if it dies. `fetch` gets the original request (its Host header and URL as the browser
 * sent them) and answers it; a server that cannot answer answers 502/503/504 itself rather than throw.
 */
export interface FrontendServer {
  fetch(request: Request): Promise<Response>;
  /**
   * A WebSocket's way in: the server started if it is not running, and the upstream socket's URL for
   * a path (`ws+unix://<socket>:<path>` for a sandboxed server, which has no host port); busy until
   * `release`. Kiln's proxy opens the upstream socket itself.
   */
  tunnel?(): Promise<{ websocketUrl: (pathAndQuery: string) => string; release: () => void }>;
  /** Stop the process (if running) and refuse further requests; resolves once it has exited. */
  stop(): Promise<void>;
}

export interface FrontendFramework {
  readonly kind: Exclude<FrontendKind, "static">;
  /** True when the app folder holds this framework's app (e.g. package.json depends on `next`). */
  detect(appDir: string): Promise<boolean>;
  /** Builds in the sandbox; throws FrontendBuildError (user's fault) or another error (Kiln's). */
  build(input: FrontendBuildInput): Promise<FrontendBuildResult>;
  serve(input: FrontendServeInput): FrontendServer;
  /** Kiln stops: every server this framework started. */
  close(): Promise<void>;
}
