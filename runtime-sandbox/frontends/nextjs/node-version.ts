import { isMissing, resolveRuntime, type ResolvedRuntime } from "../../runtimes";

/**
 * The Node.js a Next.js app builds and runs on (spec rule 2): 22.x or 24.x, from the app's
 * `engines.node` (22 when absent; the older of the two when the range allows both, as when absent),
 * among the Node runtimes Kiln installs (`node@22`, `node@24`; runtimes.ts). Then the installed
 * Next.js's own `engines.node` must accept it.
 */

export const NODE_MAJORS = ["22", "24"] as const;
export type NodeMajor = (typeof NODE_MAJORS)[number];

export type NodeChoice = { major: NodeMajor; runtime: ResolvedRuntime; why: string } | { error: string };

export function satisfies(version: string, range: string): boolean {
  try {
    return Bun.semver.satisfies(version, range);
  } catch {
    return false;
  }
}

export async function chooseNode(engines: unknown): Promise<NodeChoice> {
  if (engines !== undefined && typeof engines !== "string") return { error: `package.json engines.node must be a string (a semver range such as "22.x"), got ${JSON.stringify(engines)}` };
  const range = typeof engines === "string" && engines.trim() ? engines.trim() : null;
  const seen: string[] = [];
  for (const major of NODE_MAJORS) {
    // Without a range, 22; a range first rules out whole majors (no install of a Node it cannot take),
    // then the installed version must satisfy it.
    if (!range && major !== "22") break;
    if (range && !majorIntersects(major, range)) continue;
    const rt = await resolveRuntime(`nodejs${major}.x`);
    if (isMissing(rt)) {
      seen.push(`Node.js ${major} is not available: ${rt.missing}`);
      continue;
    }
    if (range && !satisfies(rt.version, range)) {
      seen.push(`the installed Node.js ${rt.version} does not satisfy it`);
      continue;
    }
    return { major, runtime: rt, why: range ? `package.json engines.node "${range}"` : "package.json has no engines.node: the default" };
  }
  if (!range) return { error: `Node.js 22 is not available on this machine (${seen.join("; ")})` };
  return {
    error: `package.json engines.node "${range}" allows neither Node.js 22.x nor 24.x, the versions Kiln builds and runs Next.js apps on${seen.length ? ` (${seen.join("; ")})` : ""}: set engines.node to a range that includes 22 or 24, e.g. "22.x"`,
  };
}

/** Whether some version of the major satisfies the range (probes minors; ranges like ">=22.5 <23" included). */
function majorIntersects(major: string, range: string): boolean {
  for (let minor = 0; minor <= 40; minor++) for (const patch of [0, 99]) if (satisfies(`${major}.${minor}.${patch}`, range)) return true;
  return false;
}

/** Next.js's own engines.node against the chosen Node, with the message the build fails with. */
export function checkNextEngines(next: { version: string; engines?: { node?: string } }, node: ResolvedRuntime, why: string): string | null {
  const range = next.engines?.node;
  if (!range || satisfies(node.version, range)) return null;
  return `Next.js ${next.version} requires Node.js "${range}" (its package.json engines.node), but this app builds and runs on Node.js ${node.version} (${why}): change engines.node in package.json to a version Next.js ${next.version} supports, or use another Next.js version`;
}
