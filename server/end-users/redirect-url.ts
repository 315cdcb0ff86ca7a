/**
 * The spec's redirect URL rules: http or https only; no `@`; no wildcards; plain http only for a
 * localhost address (development); `javascript:` and every other scheme refused.
 * Returns why a URL is refused, or null when it is acceptable.
 */
export function redirectUrlProblem(raw: string): string | null {
  if (raw.includes("@")) return "must not contain '@'";
  if (raw.includes("*")) return "must not contain wildcards";
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return "is not an absolute URL";
  }
  if (u.protocol !== "https:" && u.protocol !== "http:") return "must use http or https";
  if (!u.hostname) return "must have a host";
  if (u.protocol === "http:" && !isLocalhost(u.hostname)) return "may use plain http only for localhost addresses";
  return null;
}

export function isLocalhost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return h === "localhost" || h.endsWith(".localhost") || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}
