/**
 * Which of a frontend's selected variables the Next.js build and server see (spec, Frontends, build
 * and runtime rule 1): every one in the build except names the build reserves (dropped, with a
 * warning line each); in the server runtime the same minus `NEXT_PUBLIC_*`, whose values the build
 * inlined into the client bundle.
 */

// Names Kiln sets for the build or the server itself, or that would change what runs: the
// sandbox's basics, Node's and npm's own settings, the port the server listens on, Next.js's
// internal switches.
const RESERVED_NAMES = new Set(["PATH", "HOME", "TMPDIR", "LANG", "USER", "SHELL", "PWD", "NODE_ENV", "NODE_OPTIONS", "NODE_PATH", "NODE_EXTRA_CA_CERTS", "PORT", "HOSTNAME", "KEEP_ALIVE_TIMEOUT", "NEXT_RUNTIME", "NEXT_TELEMETRY_DISABLED", "NEXT_DEPLOYMENT_ID", "NEXT_IGNORE_INCORRECT_LOCKFILE", "LD_PRELOAD", "LD_LIBRARY_PATH"]);
const RESERVED_PREFIXES = [/^npm_/i, /^__NEXT_/, /^NEXT_PRIVATE_/, /^KILN_/, /^BUN_/];

export function isReservedName(name: string): boolean {
  return RESERVED_NAMES.has(name) || RESERVED_PREFIXES.some((r) => r.test(name));
}

export interface SplitVariables {
  /** What `next build` sees. */
  build: Record<string, string>;
  /** What the server runtime sees: no NEXT_PUBLIC_*. */
  runtime: Record<string, string>;
  /** One warning line per dropped name. */
  warnings: string[];
}

export function splitVariables(env: Record<string, string>): SplitVariables {
  const build: Record<string, string> = {};
  const runtime: Record<string, string> = {};
  const warnings: string[] = [];
  for (const [name, value] of Object.entries(env)) {
    if (isReservedName(name)) {
      warnings.push(`variable ${name} was not passed to the build or the server: the name is reserved by the Next.js build`);
      continue;
    }
    build[name] = value;
    if (!name.startsWith("NEXT_PUBLIC_")) runtime[name] = value;
  }
  return { build, runtime, warnings };
}
