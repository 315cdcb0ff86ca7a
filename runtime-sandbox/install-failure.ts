/**
 * Why a dependency install failed, for the deployment's `error`: network (the build could not reach
 * a registry), resolution (the registry answered, but has no such package or version) or compile
 * (a native extension did not build). An installer's last line often names only the symptom: pip
 * says "No matching distribution found" when the index could not even be resolved, so what the build
 * egress saw (a name it could not resolve, an address it could not connect to, a local address it
 * refused) decides first, then the installer's own words.
 */

export type InstallCause = "network" | "resolution" | "compile";

// The installers' own words per cause, most specific first (npm codes, pip's and bundler's phrases).
const NETWORK = /\b(ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNRESET|EHOSTUNREACH|ENETUNREACH|ERR_SOCKET_TIMEOUT)\b|Temporary failure in name resolution|Name or service not known|Failed to establish a new connection|ProxyError|Cannot connect to proxy|tunneling socket could not be established|ConnectTimeoutError|ReadTimeoutError|Connection refused|Could not reach|Network is unreachable|\b50[234] (Bad Gateway|Service Unavailable|Gateway Time-?out)\b|network (request|error)|Gem::RemoteFetcher::FetchError|Could not fetch specs/i;
const RESOLUTION = /\bE404\b|\bETARGET\b|\bERESOLVE\b|No matching version found|No matching distribution found|Could not find a version that satisfies|is not in this registry|404 Not Found|Could not find gem|Could not find '.*' \(.*\) in any of the|version solving failed|ResolutionImpossible|Could not resolve dependency/i;
const COMPILE = /gyp ERR!|node-gyp|Failed building wheel|Failed to build|subprocess-exited-with-error|error: command '.*' failed|Gem::Ext::BuildError|ERROR: Failed building|compilation terminated|fatal error: .*\.h: No such file/i;

export interface InstallDiagnosis {
  cause: InstallCause;
  /** The line that shows it (the egress's report, or the installer's). */
  evidence: string;
}

/**
 * `egress`: what the build egress reported during this install (its failures only); `lines`: the
 * installer's output, oldest first. Null when nothing says why.
 */
export function diagnoseInstall(lines: readonly string[], egress: readonly string[]): InstallDiagnosis | null {
  if (egress.length) return { cause: "network", evidence: egress[0]!.replace(/^build egress: /, "") };
  // Network first: a network failure is followed by resolution words ("No matching distribution").
  for (const [cause, re] of [["network", NETWORK], ["compile", COMPILE], ["resolution", RESOLUTION]] as const) {
    const hit = lines.find((l) => re.test(l));
    if (hit) return { cause, evidence: hit.trim() };
  }
  return null;
}

const SAYS: Record<InstallCause, string> = {
  network: "network: the build could not reach the registry",
  resolution: "resolution: the registry has no such package or version",
  compile: "compile: a native extension did not build",
};

/** The deployment error's cause part, e.g. `network: the build could not reach the registry (cannot resolve pypi.example)`. */
export function describeCause(d: InstallDiagnosis): string {
  return `${SAYS[d.cause]} (${d.evidence.slice(0, 300)})`;
}
